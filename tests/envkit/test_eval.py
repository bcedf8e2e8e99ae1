"""`envkit eval` on the code preset's trained run (conftest.py code_run) and on its export, as a user runs it: the
same acceptance from both, checked lossless, a report that holds its figures and plots and opens offline, and bad
input refused in one line."""

from __future__ import annotations

import csv
import json
from html.parser import HTMLParser

import pytest

from helpers import one_line_error, run_envkit, run_trainer

CODE = ["def add(a, b):\n    return", "import os\n\nclass Path:\n    def __init__(self", "for item in items:\n    if item"]
OTHER = ["def greet(name):\n    print(", "while True:\n    line = input("]


def write_prompts(path, texts):
    path.write_text("".join(json.dumps({"prompt": text}) + "\n" for text in texts))
    return path


@pytest.fixture(scope="module")
def evaluated(code_run, cpu_venv, tmp_path_factory):
    """The run and its export evaluated on the same two prompt files; the run's with --out."""
    run_dir, env, _, _ = code_run
    tmp = tmp_path_factory.mktemp("eval")
    files = [write_prompts(tmp / "code.jsonl", CODE), write_prompts(tmp / "other.jsonl", OTHER)]
    prompt_args = [arg for path in files for arg in ("--prompts", str(path))]
    exported = run_envkit("export", str(run_dir), "--out", str(tmp / "export"), env=env)
    assert exported.returncode == 0, exported.stderr[-2000:]
    of_run = run_envkit("eval", "code", *prompt_args, "--out", str(tmp / "report"), env=env, timeout=900)
    assert of_run.returncode == 0, of_run.stderr[-3000:]
    of_export = run_envkit("eval", str(tmp / "export"), "--venv", str(cpu_venv), "--profile", "cpu", *prompt_args,
                           "--json", env=env, timeout=900)
    assert of_export.returncode == 0, of_export.stderr[-3000:]
    return tmp, of_run, json.loads(of_export.stdout), env, cpu_venv


def test_a_run_and_its_export_accept_alike_lossless_with_a_positions_curve(evaluated):
    tmp, of_run, of_export, _, _ = evaluated
    report = json.loads((tmp / "report" / "eval.json").read_text())
    assert (report["kind"], of_export["kind"]) == ("checkpoint", "export")
    assert set(report["files"]) == {"code.jsonl", "other.jsonl"}
    for name, figures in report["files"].items():
        served = of_export["files"][name]
        for key in ("walk_tau", "walk_copy_tau", "walk_repeat_tau", "walk_positions", "walk_median_tau"):
            assert figures[key] == served[key], (name, key)  # the weights a server loads, the same acceptance
        assert figures["walk_verified"] == figures["walk_prompts"] == len(CODE if name == "code.jsonl" else OTHER)
        assert len(figures["walk_positions"]) == report["block_size"] - 1
        assert all(0.0 <= share <= 1.0 for share in figures["walk_positions"])
        assert figures["walk_positions"][0] > 0  # a trained drafter's first slot is accepted at times
        assert figures["worst"] and "forward" in figures["worst"][0]["walk"][1]
    code = report["files"]["code.jsonl"]
    assert code["walk_tau"] > code["walk_repeat_tau"]  # the trained drafter beats repeating the anchor
    cost = report["cost"]
    assert min(cost["t_decode_s"], cost["t_verify_s"], cost["t_draft_s"]) > 0 and "t_draft" in cost["formula"]
    assert report["speedup"]["code.jsonl"]["drafter"] == pytest.approx(
        code["walk_tau"] * cost["t_decode_s"] / (cost["t_draft_s"] + cost["t_verify_s"]), abs=0.01)
    # The terminal's table: one row a file, the curve and the lossless check.
    assert "code.jsonl" in of_run.stdout and "positions code.jsonl:" in of_run.stdout and "lossless" in of_run.stdout
    assert "eval code.jsonl: 3/3 prompts walked" in of_run.stderr  # progress as it goes
    assert of_export["reference_dflash"] == {"installed": False}  # the training lock holds no dflash


def test_the_reference_dflash_decodes_the_export_as_the_walk_does(evaluated):
    """Where the venv has Z Lab's dflash (the test venv: make test installs it), the export is also decoded by it:
    the target's own greedy tokens, at the acceptance the walk measured on the same prompts."""
    tmp = evaluated[0]
    proc = run_trainer("evaluate", "--export", str(tmp / "export"), "--prompts", str(tmp / "code.jsonl"),
                       env=evaluated[3])
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    reference = result["reference_dflash"]
    assert reference["installed"] and reference["prompts"] == len(CODE)
    assert reference["equal_to_target_greedy"] == len(CODE)  # lossless through the loader engines follow
    assert reference["tau"] == pytest.approx(result["files"]["code.jsonl"]["walk_tau"], abs=0.1)
    assert reference["tokens_per_s"] > 0 and reference["target_tokens_per_s"] > 0


class Report(HTMLParser):
    def __init__(self):
        super().__init__()
        self.svgs, self.cells, self.fetches, self.scripts, self._in_cell = 0, [], [], 0, False

    def handle_starttag(self, tag, attrs):
        self.svgs += tag == "svg"
        self.scripts += tag == "script"
        self._in_cell = tag == "td"
        self.fetches += [value for name, value in attrs if name in ("src", "href") and value
                         and not value.startswith("#")]

    def handle_data(self, data):
        if self._in_cell:
            self.cells.append(data.strip())
            self._in_cell = False


def test_the_report_holds_its_figures_and_plots_and_opens_offline(evaluated):
    tmp = evaluated[0]
    report = json.loads((tmp / "report" / "eval.json").read_text())
    page = Report()
    page.feed((tmp / "report" / "report.html").read_text())
    assert page.svgs == 3 and page.scripts == 0 and page.fetches == []  # positions, per prompt, per file; no CDN
    for name, figures in report["files"].items():
        row = page.cells[page.cells.index(name):][:9]
        assert row[1] == f"{figures['walk_tau']:.2f}" and row[3] == f"{figures['walk_copy_tau']:.2f}"
    with (tmp / "report" / "per_prompt.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == len(CODE) + len(OTHER)
    code = [float(row["tau"]) for row in rows if row["file"] == "code.jsonl" and row["degenerate"] == "False"]
    assert sum(code) / len(code) == pytest.approx(report["files"]["code.jsonl"]["walk_tau"], abs=1e-3)


def test_bad_input_is_one_line_and_writes_nothing(evaluated, tmp_path):
    tmp, _, _, env, cpu_venv = evaluated
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert "holds no prompt" in one_line_error(run_envkit("eval", "code", "--prompts", str(empty), env=env))
    long = write_prompts(tmp_path / "long.jsonl", ["x = 1\n" * 3000])
    assert "exceeds the target's" in one_line_error(run_envkit("eval", "code", "--prompts", str(long), env=env))
    other_target = tmp_path / "other-target"
    from transformers import LlamaConfig, LlamaForCausalLM

    LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=2, num_key_value_heads=1)).save_pretrained(other_target)
    wrong = run_envkit("eval", str(tmp / "export"), "--venv", str(cpu_venv), "--profile", "cpu", "--target",
                       str(other_target), "--prompts", str(tmp / "code.jsonl"), "--out", str(tmp_path / "out"), env=env)
    assert "not the target this export was trained against" in one_line_error(wrong)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.tmp-*"))
    taken = run_envkit("eval", "code", "--prompts", str(tmp / "code.jsonl"), "--out", str(tmp / "report"), env=env)
    assert "not an empty directory" in one_line_error(taken)
    missing = run_envkit("eval", "code", "--prompts", str(tmp_path / "nope.jsonl"), env=env)
    assert "no such file" in one_line_error(missing)
