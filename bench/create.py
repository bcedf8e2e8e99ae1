"""Benchmark `envkit create` against raw uv on the same lock (warm uv cache), no-op, and --help.

    python bench/create.py [--profile cpu] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from envkit.lock import profile as profiles  # noqa: E402

from envkit.lock import wheelhouse
from envkit.lock.resolve import source_args  # noqa: E402
from envkit.lock.uvtool import uv_bin, uv_version  # noqa: E402


def timed(cmd: list[str], env=None) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    profile = profiles.load(args.profile)
    links = wheelhouse.find_links()
    work = Path(tempfile.mkdtemp(prefix="envkit-bench-"))
    env = dict(os.environ, ENVKIT_HOME=str(work / "home"))
    reqs = work / "reqs.txt"
    reqs.write_text(profile.requirements_txt())
    envkit = [sys.executable, "-m", "envkit"]
    raw_venv = work / "raw"
    # One untimed run of each warms uv's cache.
    subprocess.run([*envkit, "create", "--profile", args.profile], check=True, capture_output=True, env=env)

    # Both build into a new path each time: the same work (replacing a venv adds the old one's
    # removal to either, about 0.2 s for the cpu profile's 900 MB of hard links).
    def raw_uv() -> float:
        shutil.rmtree(raw_venv, ignore_errors=True)
        start = time.perf_counter()
        subprocess.run([uv_bin(), "venv", str(raw_venv), "--python", profile.python, "-q"], check=True)
        subprocess.run([uv_bin(), "pip", "sync", str(reqs), "--require-hashes", "-q", "--python",
                        str(raw_venv / "bin" / "python"), *source_args(profile, links, offline=False, no_index=False)],
                       check=True)
        return time.perf_counter() - start

    def envkit_fresh(index: int) -> float:
        target = work / f"envkit-{index}"
        seconds = timed([*envkit, "create", "--profile", args.profile, "--venv", str(target)], env)
        shutil.rmtree(target)
        return seconds

    create = [envkit_fresh(i) for i in range(args.repeat)]
    replace = [timed([*envkit, "create", "--profile", args.profile, "--force"], env) for _ in range(args.repeat)]
    raw = [raw_uv() for _ in range(args.repeat)]
    noop = [timed([*envkit, "create", "--profile", args.profile], env) for _ in range(args.repeat)]
    help_times = [timed(["envkit", "--help"]) for _ in range(args.repeat)]
    result = {
        "profile": args.profile, "packages": len(profile.packages), "uv": uv_version(), "repeat": args.repeat,
        "envkit_create_s": round(statistics.median(create), 3), "raw_uv_s": round(statistics.median(raw), 3),
        "ratio": round(statistics.median(create) / statistics.median(raw), 2),
        "envkit_force_replace_s": round(statistics.median(replace), 3),
        "noop_create_s": round(statistics.median(noop), 3), "help_s": round(statistics.median(help_times), 3),
    }
    print(json.dumps(result))
    print(f"{'envkit create (new path)':28} {result['envkit_create_s']:7.2f} s (median of {args.repeat})")
    print(f"{'uv venv + uv pip sync':28} {result['raw_uv_s']:7.2f} s   ratio {result['ratio']:.2f}")
    print(f"{'envkit create --force':28} {result['envkit_force_replace_s']:7.2f} s (replaces the venv)")
    print(f"{'no-op create':28} {result['noop_create_s']:7.2f} s")
    print(f"{'envkit --help':28} {result['help_s']:7.3f} s")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
