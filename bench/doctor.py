"""Benchmark `envkit doctor` on the cpu profile venv, clean and polluted, beside `uv pip check` and `pip check`.

    python bench/doctor.py [--repeat 5]
    python bench/doctor.py --story     # the original job's pollution: causes, history, lines (issue 16)

Pollutes a fresh copy of the cpu venv with the faults of a real training venv and counts how many
of them each tool names.
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
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from envkit.lock.uvtool import uv_bin  # noqa: E402
from wheels import build_wheel  # noqa: E402


def timed(cmd, env=None) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    return time.perf_counter() - start, proc


def pollute_outside_packages(sp: Path, work: Path) -> dict:
    """Faults both scenarios share: a stale second numpy dist-info, an unowned .pth, and an environment with
    PYTHONPATH set and a 0777 inductor cache (returned)."""
    dup = sp / "numpy-2.0.0.dist-info"
    shutil.copytree(next(sp.glob("numpy-*.dist-info")), dup)
    (dup / "METADATA").write_text("Metadata-Version: 2.1\nName: numpy\nVersion: 2.0.0\n")
    (sp / "zz_injected.pth").write_text("import os\n")
    cache = work / "open-cache"
    cache.mkdir()
    cache.chmod(0o777)
    return dict(os.environ, PYTHONPATH=str(work / "elsewhere"), TORCHINDUCTOR_CACHE_DIR=str(cache))


def pollute(venv: Path, work: Path) -> tuple[dict, dict[str, str]]:
    """Inject faults; return the environment and {fault: the word a report must contain to name it}."""
    py = str(venv / "bin" / "python")
    sp = next((venv / "lib").glob("python3*/site-packages"))
    house = work / "wheels"
    build_wheel(house, "sglang", "0.0.1")
    run = lambda *a: subprocess.run([uv_bin(), "pip", *a, "--python", py], check=True, capture_output=True)  # noqa: E731
    run("install", "pip")  # uv venvs have no pip; `pip check` needs one (doctor sees it as lock.extra)
    run("install", "--no-index", "--find-links", str(house), "sglang==0.0.1")
    run("install", "transformers==5.8.1", "--no-deps")
    run("uninstall", "tqdm")
    target = sp / "torch" / "nn" / "functional.py"
    target.write_text(target.read_text() + "\n# hand patch\n")  # hard link: see doctor's message
    env = pollute_outside_packages(sp, work)
    faults = {"stray sglang": "sglang", "transformers drifted": "transformers", "tqdm missing": "tqdm",
              "torch file edited": "functional.py", "duplicate dist-info": "numpy", ".pth injected": "zz_injected",
              "PYTHONPATH leak": "PYTHONPATH", "world-writable cache": "open-cache"}
    return env, faults


def pollute_like_the_original_job(venv: Path, work: Path) -> tuple[dict, dict[str, str]]:
    """The original job's venv (issue 16): a serving stack's kernel package and a torch swap by pip, a
    drifted transformers, a hotfix appended inside torch, a stale numpy dist-info, an unowned .pth,
    safetensors removed, PYTHONPATH set, a 0777 inductor cache. -> (environment, {event: word})."""
    py = str(venv / "bin" / "python")
    sp = next((venv / "lib").glob("python3*/site-packages"))
    subprocess.run([uv_bin(), "pip", "install", "pip", "--python", py], check=True, capture_output=True)
    pip = lambda *a: subprocess.run([py, "-m", "pip", "-q", *a], check=True, capture_output=True)  # noqa: E731
    time.sleep(2)  # after the create, as days later
    pip("install", "--no-deps", "flashinfer-python==0.7.2.post1")
    pip("install", "--no-deps", "torch==2.14.1")
    pip("install", "--no-deps", "transformers==5.8.1")
    pip("uninstall", "-y", "safetensors")
    target = sp / "torch" / "fx" / "_symbolic_trace.py"
    target.write_text(target.read_text() + "\n_is_fx_tracing_flag = False  # hotfix\n")
    env = pollute_outside_packages(sp, work)
    events = {"flashinfer installed": "flashinfer-python", "torch replaced": "torch 2.13.0+cpu replaced",
              "transformers drifted": "transformers 5.6.0 replaced", "hotfix in torch": "_symbolic_trace.py edited",
              "stale numpy dist-info": "dist-info of numpy", ".pth": "zz_injected.pth", "safetensors removed":
              "safetensors", "PYTHONPATH": "PYTHONPATH", "0777 cache": "compile cache"}
    return env, events


def story(args) -> None:
    """How the polluted venv reads: lines of the default report, causes, history, and doctor's time."""
    work = Path(tempfile.mkdtemp(prefix="envkit-bench-story-"))
    env = dict(os.environ, ENVKIT_HOME=str(work / "home"))
    envkit = [sys.executable, "-m", "envkit"]
    subprocess.run([*envkit, "create", "--profile", "cpu"], check=True, capture_output=True, env=env)
    venv = work / "home" / "venvs" / "cpu"
    bad_env, events = pollute_like_the_original_job(venv, work)
    bad_env["ENVKIT_HOME"] = env["ENVKIT_HOME"]
    runs = [timed([*envkit, "doctor", "--venv", str(venv)], bad_env) for _ in range(args.repeat)]
    text = runs[0][1].stdout
    report = json.loads(timed([*envkit, "doctor", "--venv", str(venv), "--json"], bad_env)[1].stdout)
    bad = [i for i, f in enumerate(report["findings"]) if f["status"] != "ok"]
    covered = sorted(i for c in report["causes"] for i in c["findings"])
    print(text)
    print(timed([*envkit, "doctor", "--venv", str(venv), "--history"], bad_env)[1].stdout)
    print(json.dumps({"lines": len(text.splitlines()), "causes": len(report["causes"]), "findings_not_ok": len(bad),
                      "each_in_one_cause": covered == bad, "polluted_doctor_s": round(statistics.median(
                          t for t, _ in runs), 3), "named": sorted(e for e, w in events.items() if w in text)}))
    shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--story", action="store_true",
                        help="the original job's pollution (issue 16): how doctor's report reads")
    args = parser.parse_args()
    if args.story:
        return story(args)
    work = Path(tempfile.mkdtemp(prefix="envkit-bench-doctor-"))
    env = dict(os.environ, ENVKIT_HOME=str(work / "home"), UV_CACHE_DIR=str(work / "uv-cache"))
    envkit = [sys.executable, "-m", "envkit"]
    subprocess.run([*envkit, "create", "--profile", "cpu"], check=True, capture_output=True, env=env)
    venv = work / "home" / "venvs" / "cpu"

    clean = [timed([*envkit, "doctor", "--venv", str(venv), "--json"], env)[0] for _ in range(args.repeat)]
    import_only = [timed([sys.executable, "-c", "import envkit.cli, envkit.doctor"], env)[0] for _ in range(args.repeat)]
    deep_s, _ = timed([*envkit, "doctor", "--venv", str(venv), "--deep", "--json"], env)
    size = sum(f.stat().st_size for f in venv.rglob("*") if f.is_file() and not f.is_symlink())

    bad_env, faults = pollute(venv, work)
    bad_env["UV_CACHE_DIR"] = env["UV_CACHE_DIR"]
    tools = {
        "envkit doctor": [*envkit, "doctor", "--venv", str(venv)],
        "uv pip check": [uv_bin(), "pip", "check", "--python", str(venv / "bin" / "python")],
        "pip check": [str(venv / "bin" / "python"), "-m", "pip", "check"],
    }
    named = {}
    times = {}
    for tool, cmd in tools.items():
        runs = [timed(cmd, bad_env) for _ in range(args.repeat)]
        times[tool] = round(statistics.median(t for t, _ in runs), 3)
        output = runs[0][1].stdout + runs[0][1].stderr
        named[tool] = sorted(f for f, word in faults.items() if word in output)
    result = {
        "doctor_clean_s": round(statistics.median(clean), 3),
        "import_s": round(statistics.median(import_only), 3),
        "checks_s": round(statistics.median(clean) - statistics.median(import_only), 3),
        "deep_s": round(deep_s, 3), "venv_gb": round(size / 1e9, 2), "deep_gb_per_s": round(size / 1e9 / deep_s, 2),
        "polluted_s": times, "faults": len(faults), "named": {t: len(n) for t, n in named.items()},
        "named_detail": named,
    }
    print(json.dumps(result))
    print(f"doctor (clean cpu venv): {result['doctor_clean_s']:.2f} s whole process, ~{result['checks_s']:.2f} s "
          f"beyond start-up; --deep {deep_s:.1f} s over {result['venv_gb']} GB = {result['deep_gb_per_s']} GB/s")
    for tool in tools:
        print(f"{tool:14} {times[tool]:6.2f} s  names {len(named[tool])}/{len(faults)}: {', '.join(named[tool])}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
