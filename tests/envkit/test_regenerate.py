"""`envkit data regenerate` against servers of the test's own (tests/tools/openai_server.py: instant, deterministic
answers; refusals, deaths and hostile replies on request): every turn, failures set aside, several servers, kills
resumed to the same bytes, and what the manifest vouches for. The target's own answers through `transformers serve`
are test_serve.py's."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import PROJECT, one_line_error, run_envkit
from trainer.data.regenerated import TRAINING_KEYS, shape_of

SERVER = PROJECT / "tests" / "tools" / "openai_server.py"


@pytest.fixture
def servers(tmp_path):
    """start(*args) -> (url, process); every server is killed at the end."""
    started: list[subprocess.Popen] = []

    def start(*args: str) -> tuple[str, subprocess.Popen]:
        port_file = tmp_path / f"port-{len(started)}"
        proc = subprocess.Popen([sys.executable, str(SERVER), "--port-file", str(port_file), *args])
        started.append(proc)
        deadline = time.monotonic() + 30
        while not port_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the test server did not start"
            time.sleep(0.02)
        return f"http://127.0.0.1:{port_file.read_text()}", proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def answer(asked) -> str:
    """What the test server answers to these messages (or this prompt)."""
    return " answer-" + hashlib.sha256(json.dumps(asked, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:12]


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def regenerate(url: str, prompts: Path, out: Path, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_envkit("data", "regenerate", "--server", url, "--data", str(prompts), "--out", str(out), *extra,
                      timeout=timeout)


def mixed_rows(count: int, refuse_every: int = 0) -> list[dict]:
    rows = []
    for i in range(count):
        mark = " REFUSE" if refuse_every and i % refuse_every == refuse_every - 1 else ""
        if i % 2:
            rows.append({"id": i, "prompt": f"def f{i}(x):{mark}"})
        else:
            rows.append({"id": i, "conversations": [{"role": "user", "content": f"q{i}{mark}"},
                                                    {"role": "assistant", "content": "human"},
                                                    {"role": "user", "content": "and then?"}]})
    return rows


def manifest(out: Path) -> dict:
    return json.loads(out.with_name(out.name + ".manifest.json").read_text())


def test_every_assistant_turn_is_answered_given_the_answers_before_it(servers, tmp_path):
    url, _ = servers()
    conversation = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "one"},
                    {"role": "assistant", "content": "human 1"}, {"role": "user", "content": "two"},
                    {"role": "tool", "content": "tool output"}, {"role": "assistant", "content": "human 2"}]
    # Rows prepared for training carry rendered keys; regenerating must not leave them for the reader to prefer.
    prompts = write_rows(tmp_path / "p.jsonl", [
        {"id": "c", "conversations": conversation, "text": "OLD RENDERED", "input_ids": [1, 2], "loss_mask": [1, 1]},
        {"id": "p", "prompt": "def f(x):", "completion": "OLD", "input_ids": [3]},
        {"id": "t", "text": "import os"}])
    out = tmp_path / "all.jsonl"
    assert regenerate(url, prompts, out).returncode == 0
    chat, completion, text = [json.loads(line) for line in out.read_text().splitlines()]

    history = []
    for turn in conversation:
        history.append({"role": "assistant", "content": answer(history)} if turn["role"] == "assistant" else turn)
    assert chat == {"id": "c", "conversations": history}  # the second answer was asked given the first
    assert completion == {"id": "p", "prompt": "def f(x):", "completion": answer("def f(x):")}
    assert text == {"id": "t", "prompt": "import os", "completion": answer("import os")}
    for row in (chat, completion, text):  # the reader trains on the new answer, nothing older survives
        assert shape_of(row) in ("conversations", "completion")
        assert not (set(row) & TRAINING_KEYS) - {"conversations", "prompt", "completion"}
    record = manifest(out)
    assert record["settings"]["turns"] == "all" and record["observed"]["requests"] == 4
    assert record["observed"]["finish_reasons"] == {"stop": 4} and record["status"] == "complete"

    last = tmp_path / "last.jsonl"
    assert regenerate(url, prompts, last, "--turns", "last").returncode == 0
    kept = json.loads(last.read_text().splitlines()[0])["conversations"]
    assert kept[:5] == conversation[:5] and kept[5] == {"role": "assistant", "content": answer(conversation[:5])}


def test_refused_rows_are_set_aside_and_the_rest_kept_in_order(servers, tmp_path):
    url, _ = servers("--refuse", "REFUSE")
    rows = mixed_rows(60, refuse_every=7)
    prompts = write_rows(tmp_path / "p.jsonl", rows)
    out = tmp_path / "out.jsonl"
    done = regenerate(url, prompts, out, "--concurrency", "4")
    assert done.returncode == 0, done.stderr
    refused = [i + 1 for i, row in enumerate(rows) if "REFUSE" in json.dumps(row)]
    errors = [json.loads(line) for line in (tmp_path / "out.jsonl.errors.jsonl").read_text().splitlines()]
    assert [error["line"] for error in errors] == refused
    assert all("HTTP 400" in error["reason"] and error["server"] == url for error in errors)
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == \
        [row["id"] for i, row in enumerate(rows) if i + 1 not in refused]
    record = manifest(out)
    assert (record["rows"], record["failed"], record["total"]) == (60 - len(refused), len(refused), 60)
    assert f"{len(refused)} set aside" in done.stdout

    # More than --max-failures: one line, the rows settled kept, and a resume that knows where it stopped.
    bounded = tmp_path / "bounded.jsonl"
    stopped = regenerate(url, prompts, bounded, "--max-failures", "3")
    assert "--max-failures 3" in one_line_error(stopped) and "--resume" in one_line_error(stopped)
    assert manifest(bounded)["status"] == "stopped" and manifest(bounded)["failed"] == 4
    assert "--max-failures" in one_line_error(regenerate(url, prompts, tmp_path / "x.jsonl", "--max-failures", "5%"))

    # The rows set aside, asked again of a server that answers them, merge into the file of a run with no refusal.
    fine, _ = servers()
    whole = tmp_path / "whole.jsonl"
    assert regenerate(fine, prompts, whole).returncode == 0
    retried = regenerate(fine, prompts, out, "--retry-failed")
    assert retried.returncode == 0, retried.stderr
    assert out.read_bytes() == whole.read_bytes()
    assert (tmp_path / "out.jsonl.errors.jsonl").read_bytes() == b""
    assert manifest(out)["rows"] == 60 and manifest(out)["output_sha256"] == manifest(whole)["output_sha256"]


def test_kills_at_random_points_resume_to_the_bytes_of_an_uninterrupted_run(servers, tmp_path):
    url, _ = servers("--refuse", "REFUSE", "--delay", "0.04")  # ~5 s for the whole file
    prompts = write_rows(tmp_path / "p.jsonl", mixed_rows(400, refuse_every=11))
    whole, cut = tmp_path / "whole.jsonl", tmp_path / "cut.jsonl"
    assert regenerate(url, prompts, whole, "--concurrency", "3").returncode == 0
    command = [sys.executable, "-m", "envkit", "data", "regenerate", "--server", url, "--data", str(prompts),
               "--out", str(cut), "--concurrency", "3", "--resume"]
    chance = random.Random(os.getpid())
    for _ in range(4):
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(chance.uniform(0.3, 1.0))
        proc.kill()
        proc.wait()
    assert cut.read_bytes() != whole.read_bytes()  # the kills left it unfinished
    assert regenerate(url, prompts, cut, "--concurrency", "3", "--resume").returncode == 0
    assert cut.read_bytes() == whole.read_bytes()
    assert (tmp_path / "cut.jsonl.errors.jsonl").read_bytes() == (tmp_path / "whole.jsonl.errors.jsonl").read_bytes()
    assert manifest(cut)["status"] == "complete" and manifest(cut)["rows"] == manifest(whole)["rows"]


def test_one_of_two_servers_dies_and_the_other_finishes(servers, tmp_path):
    lasting, _ = servers("--delay", "0.01")
    dying, _ = servers("--die-after", "40")
    prompts = write_rows(tmp_path / "p.jsonl", mixed_rows(300))
    out, alone = tmp_path / "out.jsonl", tmp_path / "alone.jsonl"
    done = regenerate(f"{lasting},{dying}", prompts, out, "--concurrency", "2", "--retries", "1")
    assert done.returncode == 0, done.stderr
    assert f"{dying} stopped answering" in done.stderr
    assert regenerate(lasting, prompts, alone).returncode == 0
    assert out.read_bytes() == alone.read_bytes()  # the same rows whichever server answered them
    record = manifest(out)
    assert set(record["dead_servers"]) == {dying} and record["observed"]["answered_by"][dying] >= 1
    assert sum(record["observed"]["answered_by"].values()) == 300 and set(record["engines"]) == {lasting, dying}

    gone = regenerate(dying, prompts, tmp_path / "gone.jsonl", "--connect-timeout", "1")
    assert "no model list from" in one_line_error(gone)


@pytest.mark.parametrize("hostile, reason", [("endless", "at most"), ("bad-gzip", "does not decode"),
                                             ("deep", "no choices[0] text"), ("surrogate", "lone surrogate"),
                                             ("overlong", "for max_tokens 16"), ("nan", "no choices[0] text"),
                                             ("negative-chunk", "not a well-formed HTTP/1.1 reply")])
def test_a_hostile_reply_sets_its_row_aside_in_bounded_time_and_memory(servers, tmp_path, hostile, reason):
    url, _ = servers("--hostile", hostile)
    prompts = write_rows(tmp_path / "p.jsonl", mixed_rows(3))
    out = tmp_path / "out.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "envkit", "data", "regenerate", "--server", url, "--data",
                             str(prompts), "--out", str(out), "--max-tokens", "16", "--concurrency", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    while proc.poll() is None:
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text()
            peak = max(peak, int(status.split("VmRSS:")[1].split()[0]))
        except (OSError, IndexError):
            pass
        time.sleep(0.05)
    _, stderr = proc.communicate(timeout=60)
    # Every row set aside: the run is whole (its manifest complete) but nothing came of it, so it does not exit 0.
    assert proc.returncode == 1 and "Traceback" not in stderr and "every row was set aside" in stderr, stderr
    errors = [json.loads(line) for line in (tmp_path / "out.jsonl.errors.jsonl").read_text().splitlines()]
    assert len(errors) == 3 and all(reason in error["reason"] for error in errors), errors
    assert peak < 400 << 10, peak  # kB: an endless body stops at the cap, never grows the process
    assert manifest(out)["status"] == "complete" and manifest(out)["rows"] == 0


def test_a_trickling_peer_is_held_to_its_deadline_and_ctrl_c_does_not_wait(servers, tmp_path):
    prompts = write_rows(tmp_path / "p.jsonl", mixed_rows(4))
    url, _ = servers("--hostile", "trickle-models")
    started = time.monotonic()
    refused = regenerate(url, prompts, tmp_path / "o.jsonl", "--connect-timeout", "2")
    assert "within 2s" in one_line_error(refused) and time.monotonic() - started < 15
    url, _ = servers("--hostile", "trickle-version")
    assert regenerate(url, prompts, tmp_path / "v.jsonl").returncode == 0  # /version is asked within 5 s

    slow, _ = servers("--delay", "600")
    out = tmp_path / "slow.jsonl"
    # Ctrl-C as at a terminal: a suite started in the background of a shell script inherits SIGINT ignored (POSIX),
    # and a Python started so leaves it ignored, which once made this test hang.
    proc = subprocess.Popen([sys.executable, "-m", "envkit", "data", "regenerate", "--server", slow, "--data",
                             str(prompts), "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    while not out.with_name("slow.jsonl.manifest.json").exists():
        time.sleep(0.05)
    time.sleep(0.5)
    second = regenerate(slow, prompts, out, "--resume")  # a second writer of the same OUT, while the first lives
    assert "being written by another" in one_line_error(second)
    interrupted = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "Interrupted." in stderr and time.monotonic() - interrupted < 10
    assert manifest(out)["status"] == "interrupted"


def test_what_the_manifest_vouches_for_is_what_was_observed(servers, tmp_path):
    url, _ = servers("--delay", "0.05")
    prompts = write_rows(tmp_path / "p.jsonl", mixed_rows(10))
    original = prompts.read_bytes()
    credentials = url.replace("http://", "http://alice:s3cret@")
    out = tmp_path / "out.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "envkit", "data", "regenerate", "--server", credentials,
                             "--data", str(prompts), "--out", str(out), "--concurrency", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while not out.with_name("out.jsonl.manifest.json").exists():
        time.sleep(0.02)
    with prompts.open("ab") as handle:  # rows appended while the run reads the file
        handle.write(b"".join(json.dumps(row).encode() + b"\n" for row in mixed_rows(5)))
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    record = manifest(out)
    assert (record["rows"], record["total"]) == (10, 10) and len(out.read_text().splitlines()) == 10
    assert record["prompts_sha256"] == hashlib.sha256(original).hexdigest()  # the bytes answered
    assert "s3cret" not in out.with_name("out.jsonl.manifest.json").read_text() and record["servers"] == [url]

    # A complete output edited or cut by hand is not re-stamped complete.
    prompts.write_bytes(original)
    lines = out.read_text().splitlines(keepends=True)
    for broken in ("".join(lines[:-1]), "".join(lines).replace("answer-", "answer+", 1)):
        copy = tmp_path / "copy.jsonl"
        copy.write_text(broken)
        copy.with_name("copy.jsonl.manifest.json").write_text(out.with_name("out.jsonl.manifest.json").read_text())
        copy.with_name("copy.jsonl.errors.jsonl").write_bytes(b"")
        refused = regenerate(url, prompts, copy, "--resume")
        assert "regenerate wrote" in one_line_error(refused) or "were removed" in one_line_error(refused)
        assert manifest(copy)["status"] == "complete" and copy.read_text() == broken  # nothing touched


@pytest.mark.parametrize("args, needle", [
    (("--temperature", "nan"), "--temperature"), (("--temperature", "inf"), "--temperature"),
    (("--chat-template-kwargs", '{"x": NaN}'), "NaN"), (("--max-failures", "ten"), "--max-failures"),
    (("--server", "http://[::1"), "--server"), (("--server", "http://127.0.0.1:99999"), "--server"),
    (("--server", "ftp://127.0.0.1"), "--server")])
def test_bad_options_are_one_line(tmp_path, args, needle):
    prompts = write_rows(tmp_path / "p.jsonl", mixed_rows(2))
    base = {"--server": "http://127.0.0.1:9", "--data": str(prompts), "--out": str(tmp_path / "o.jsonl")}
    options = base | dict(zip(args[::2], args[1::2]))
    proc = run_envkit("data", "regenerate", *[item for option in options.items() for item in option])
    assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr, proc.stderr
    assert needle in proc.stderr and not (tmp_path / "o.jsonl").exists()


def test_bad_prompt_rows_stop_with_their_line_and_keep_what_came_before(servers, tmp_path):
    url, _ = servers()
    rows = [json.dumps(row) for row in mixed_rows(6)]
    for bad, needle in (('{"prompt": "\\ud800 lone"}', "lone surrogate"), ("[1, 2]", "JSON object"),
                        ('{"conversations": [{"role": "assistant", "content": "x"}]}', "turn 1"),
                        ('{"prompt": "p", "weight": NaN}', "NaN is not a JSON value"),
                        ('{"prompt": "p", "weight": 1e999}', "overflows to infinity")):
        prompts = tmp_path / "p.jsonl"
        prompts.write_text("\n".join(rows[:4] + [bad] + rows[4:]) + "\n")
        out = tmp_path / "o.jsonl"
        for path in tmp_path.glob("o.jsonl*"):
            path.unlink()
        proc = regenerate(url, prompts, out)
        assert f"{prompts}:5" in one_line_error(proc) and needle in one_line_error(proc)
        assert len(out.read_text().splitlines()) == 4 and manifest(out)["status"] == "stopped"


def test_rows_with_tools_or_tool_calls_are_set_aside_never_rewritten(servers, tmp_path):
    url, _ = servers()
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    rows = [{"id": 0, "conversations": [{"role": "user", "content": "What is 6 x 7?"},
                                        {"role": "assistant", "content": "", "tool_calls": [call]},
                                        {"role": "tool", "content": "42"},
                                        {"role": "assistant", "content": "It is 42."}]},
            {"id": 1, "conversations": [{"role": "user", "content": "hello"}]},
            {"id": 2, "tools": [{"type": "function", "function": {"name": "lookup"}}],
             "conversations": [{"role": "user", "content": "Look it up."}]}]
    out = tmp_path / "out.jsonl"
    done = regenerate(url, write_rows(tmp_path / "p.jsonl", rows), out)
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == [1]  # nothing rewritten as text
    errors = [json.loads(line) for line in (tmp_path / "out.jsonl.errors.jsonl").read_text().splitlines()]
    assert [error["line"] for error in errors] == [1, 3] and all("tool" in error["reason"] for error in errors)
    assert manifest(out)["observed"]["requests"] == 1  # the set-aside rows were never sent


def test_a_row_a_server_chokes_on_is_set_aside_not_the_servers(servers, tmp_path):
    """Blame by evidence: both servers drop the one row's request while answering every other; the row is set aside
    with its reason, no server is declared dead, and a run of only such rows is not a success."""
    first, _ = servers("--drop", "CHOKE")
    second, _ = servers("--drop", "CHOKE")
    rows = mixed_rows(24)
    rows[9] = {"id": 9, "conversations": [{"role": "user", "content": "CHOKE on this"}]}
    out = tmp_path / "out.jsonl"
    done = regenerate(f"{first},{second}", write_rows(tmp_path / "p.jsonl", rows), out, "--retries", "1")
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == [r["id"] for r in rows if r["id"] != 9]
    errors = [json.loads(line) for line in (tmp_path / "out.jsonl.errors.jsonl").read_text().splitlines()]
    assert [error["line"] for error in errors] == [10] and "the row, not the server" in errors[0]["reason"]
    assert manifest(out)["dead_servers"] == {}

    only = write_rows(tmp_path / "only.jsonl", [rows[9]])
    failed = regenerate(first, only, tmp_path / "only-out.jsonl", "--retries", "0")
    assert "every row was set aside" in one_line_error(failed)


def test_retry_after_is_honoured_within_the_rows_deadline(servers, tmp_path):
    patient, _ = servers("--busy", "2", "--retry-after", "1")
    out = tmp_path / "out.jsonl"
    done = regenerate(patient, write_rows(tmp_path / "p.jsonl", mixed_rows(3)), out, "--concurrency", "1",
                      "--retries", "2")
    assert done.returncode == 0, done.stderr
    assert len(out.read_text().splitlines()) == 3  # the 429s waited out, every row answered
    # A Retry-After past the row's deadline is not waited for past it: the row is set aside in bounded time.
    stubborn, _ = servers("--busy", "1000", "--retry-after", "3600")
    bounded = regenerate(stubborn, write_rows(tmp_path / "q.jsonl", mixed_rows(1)), tmp_path / "q-out.jsonl",
                         "--retries", "3", "--request-timeout", "2", timeout=60)
    assert "every row was set aside" in one_line_error(bounded)


@pytest.mark.parametrize("instant", ["before-commit", "mid-rename", "after-commit"])
def test_a_retry_killed_at_any_instant_of_its_merge_is_finished_or_undone_by_the_next_run(servers, tmp_path, instant):
    refusing, _ = servers("--refuse", "REFUSE")
    fine, _ = servers()
    prompts = write_rows(tmp_path / "p.jsonl", mixed_rows(30, refuse_every=7))
    out, whole = tmp_path / "out.jsonl", tmp_path / "whole.jsonl"
    assert regenerate(refusing, prompts, out).returncode == 0
    assert regenerate(fine, prompts, whole).returncode == 0
    before = {path.name: path.read_bytes() for path in (out, tmp_path / "out.jsonl.errors.jsonl")}
    killed = subprocess.run([sys.executable, "-m", "envkit", "data", "regenerate", "--server", fine, "--data",
                             str(prompts), "--out", str(out), "--retry-failed"], capture_output=True, text=True,
                            env=dict(os.environ, ENVKIT_TEST_KILL_MERGE=instant), timeout=120)
    assert killed.returncode == -9, killed.stderr
    if instant == "before-commit":  # nothing committed: the files are the old ones, whole
        assert {name: (tmp_path / name).read_bytes() for name in before} == before
    # The next run finishes the merge or undoes it, cleans the scratch files, and the result is the merged one.
    again = regenerate(fine, prompts, out, "--retry-failed")
    assert again.returncode == 0, again.stderr
    assert out.read_bytes() == whole.read_bytes() and (tmp_path / "out.jsonl.errors.jsonl").read_bytes() == b""
    record = manifest(out)
    assert record["status"] == "complete" and record["rows"] == 30 and record["failed"] == 0
    assert record["output_sha256"] == manifest(whole)["output_sha256"]
    assert sum(record["observed"]["answered_by"].values()) == 30  # every run that answered, the retry's included
    assert regenerate(fine, prompts, out, "--resume").returncode == 0  # the manifest vouches for the files
    assert not [path.name for path in tmp_path.iterdir() if path.name.startswith(".out.jsonl")]


def test_bytes_after_a_whole_reply_are_never_read_as_the_next_one(servers, tmp_path):
    url, _ = servers("--hostile", "surplus")
    rows = mixed_rows(6)
    out = tmp_path / "out.jsonl"
    done = regenerate(url, write_rows(tmp_path / "p.jsonl", rows), out, "--concurrency", "1")
    assert done.returncode == 0, done.stderr
    injected = answer("INJECTED")
    answered = out.read_text()
    assert len(answered.splitlines()) == 6 and injected.strip() not in answered
