"""`envkit data mix`: sources in one training file, a held-out file per source chosen by each prompt's digest (the
rule synthesize uses), duplicates kept once, bad rows one line."""

from __future__ import annotations

import json

import pytest

from envkit.prompts.identity import is_held_out, prompt_id
from helpers import one_line_error, run_envkit

pytestmark = pytest.mark.unit


def write(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_sources_mix_into_one_file_held_out_per_source_by_digest(tmp_path):
    asked = [f"Plan a {days}-day trip to city number {city}" for days in range(1, 9) for city in range(40)]
    synthesized = write(tmp_path / "synth.jsonl", [{"conversations": [{"role": "user", "content": text}]}
                                                   for text in asked[:200]])
    code = write(tmp_path / "code.jsonl", [{"prompt": f"def function_{n}(x):"} for n in range(100)])
    mine = write(tmp_path / "mine.jsonl", [{"text": "  plan a 1-DAY trip to city number 0 "},  # synthesized's first
                                           {"conversations": [{"role": "system", "content": "Be brief."},
                                                              {"role": "user", "content": "Hello there"}]}])
    out = tmp_path / "mixed.jsonl"
    proc = run_envkit("data", "mix", "--source", f"synthesized={synthesized}", "--source", f"code={code}",
                      "--source", f"mine={mine}", "--out", str(out), "--held-out", "0.2", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    train = [json.loads(line) for line in out.read_text().splitlines()]
    held = {name: [json.loads(line) for line in (tmp_path / f"mixed.held-out.{name}.jsonl").read_text().splitlines()]
            for name in ("synthesized", "code", "mine")}
    assert result["sources"]["mine"]["duplicates"] == 1 and result["sources"]["synthesized"]["duplicates"] == 0
    everything = train + [row for rows in held.values() for row in rows]
    assert len(everything) == len({row["id"] for row in everything}) == 301  # 200 + 100 + 2, one duplicate
    for row in everything:
        texts = [turn["content"] for turn in row["conversations"] if turn["role"] == "user"] \
            if "conversations" in row else [row.get("prompt", row.get("text"))]
        assert row["id"] == prompt_id(texts)
        assert is_held_out(row["id"], 0.2) == (row in held[row["source"]])  # the digest decides, per source
    assert 20 <= len(held["synthesized"]) <= 60 and result["train_rows"] == len(train)
    manifest = json.loads((tmp_path / "mixed.jsonl.manifest.json").read_text())
    assert manifest["sources"]["code"]["rows"] == 100 and len(manifest["sources"]["code"]["sha256"]) == 64


def test_bad_sources_are_one_line_and_write_nothing(tmp_path):
    good = write(tmp_path / "good.jsonl", [{"prompt": "hello there"}])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"completion": "no prompt here"}\n')
    out = tmp_path / "out.jsonl"
    assert "bad.jsonl:2: not a prompt row" in one_line_error(
        run_envkit("data", "mix", "--source", f"a={good}", "--source", f"b={bad}", "--out", str(out)))
    assert "names must differ" in one_line_error(
        run_envkit("data", "mix", "--source", f"a={good}", "--source", f"a={good}", "--out", str(out)))
    assert "NAME=FILE" in one_line_error(run_envkit("data", "mix", "--source", str(good), "--out", str(out)))
    assert "does not exist" in one_line_error(
        run_envkit("data", "mix", "--source", f"a={good}", "--out", str(tmp_path / "missing" / "out.jsonl")))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["bad.jsonl", "good.jsonl"]  # nothing half-written
