"""The regenerate client's own ceiling: `envkit data regenerate` against servers that answer at once
(tests/tools/openai_server.py), so every second measured is the client's. Rows/s and the client's peak RSS at
each size, with one and with two servers, and `--resume` of the largest output (complete, and killed near its end).

    python3 bench/regenerate_client.py --rows 10000 1000000 --servers 1 2 [--concurrency 32]

Prompt rows alternate a two-turn conversation (two requests, --turns all) and a completion prompt; the figure
beside rows/s is requests/s. An engine's own throughput is bench/regenerate.py's.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
SERVER = PROJECT / "tests" / "tools" / "openai_server.py"


def write_prompts(path: Path, rows: int) -> None:
    with path.open("w") as handle:
        for i in range(rows):
            if i % 2:
                row = {"id": i, "prompt": f"def function_{i}(values):\n    \"\"\"Return the values sorted.\"\"\"\n"}
            else:
                row = {"id": i, "conversations": [{"role": "user", "content": f"Write function {i}."},
                                                  {"role": "assistant", "content": "old"},
                                                  {"role": "user", "content": "Now add a docstring."}]}
            handle.write(json.dumps(row) + "\n")


def start_servers(count: int, work: Path) -> tuple[list[str], list[subprocess.Popen]]:
    urls, procs = [], []
    for index in range(count):
        port_file = work / f"port-{index}"
        port_file.unlink(missing_ok=True)
        procs.append(subprocess.Popen([sys.executable, str(SERVER), "--port-file", str(port_file)]))
        while not port_file.exists():
            time.sleep(0.02)
        urls.append(f"http://127.0.0.1:{port_file.read_text()}")
    return urls, procs


def regenerate(urls: list[str], prompts: Path, out: Path, concurrency: int, *extra: str,
               kill_after_rows: int | None = None) -> dict:
    """Run the client; its peak RSS from the kernel's account of the child (wait4)."""
    command = [sys.executable, "-m", "envkit", "data", "regenerate", "--server", ",".join(urls), "--data",
               str(prompts), "--out", str(out), "--concurrency", str(concurrency), "--json", *extra]
    started = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=PROJECT)
    if kill_after_rows is not None:
        manifest = out.with_name(out.name + ".manifest.json")
        while True:
            try:
                if json.loads(manifest.read_text()).get("rows", 0) >= kill_after_rows:
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.monotonic() - started
    stdout = proc.stdout.read()
    result = json.loads(stdout) if stdout.strip() and os.waitstatus_to_exitcode(status) == 0 else {}
    return {**result, "seconds": round(seconds, 2), "peak_rss_mib": round(usage.ru_maxrss / 1024, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 1_000_000])
    parser.add_argument("--servers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--concurrency", type=int, default=32, help="per server")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="envkit-regen-bench-"))
    table = []
    for rows in args.rows:
        prompts = work / f"prompts-{rows}.jsonl"
        write_prompts(prompts, rows)
        for count in args.servers:
            urls, procs = start_servers(count, work)
            try:
                out = work / f"out-{rows}-{count}.jsonl"
                result = regenerate(urls, prompts, out, args.concurrency)
                requests = rows + rows // 2 + rows % 2  # a conversation asks twice
                line = {"rows": rows, "servers": count, "seconds": result["seconds"],
                        "rows_per_s": round(rows / result["seconds"], 1),
                        "requests_per_s": round(requests / result["seconds"], 1),
                        "peak_rss_mib": result["peak_rss_mib"], "failed": result.get("failed")}
                print(json.dumps(line), flush=True)
                table.append(line)
                if rows == max(args.rows) and count == max(args.servers):
                    done = regenerate(urls, prompts, out, args.concurrency, "--resume")
                    print(json.dumps({"resume of a complete output": rows, "seconds": done["seconds"],
                                      "peak_rss_mib": done["peak_rss_mib"]}), flush=True)
                    for path in out.parent.glob(out.name + "*"):
                        path.unlink()
                    regenerate(urls, prompts, out, args.concurrency, kill_after_rows=int(rows * 0.9))
                    size = out.stat().st_size
                    resumed = regenerate(urls, prompts, out, args.concurrency, "--resume")
                    print(json.dumps({"resume after a SIGKILL at 90%": rows, "output_bytes_at_kill": size,
                                      "seconds": resumed["seconds"], "peak_rss_mib": resumed["peak_rss_mib"],
                                      "written_now": resumed.get("written_now")}), flush=True)
            finally:
                for proc in procs:
                    proc.kill()
            for path in work.glob("out-*"):
                path.unlink()
    subprocess.run(["rm", "-rf", str(work)])


if __name__ == "__main__":
    main()
