"""Does the drafter use the target? Per preset, a drafter trained as DFlash does (on the target's tapped
states), then its decoding walk fed the states of every other target layer (a tap error) and all-zero
features; and a second drafter trained with the features zeroed (what it learns alone). On a trained
target (`code`) a wrong tap must cost acceptance; on a random one (`tiny`) the layers' states are
nearly the same, so a tap error goes unseen there.

    python bench/ablation.py [--presets code,tiny] [--steps N]

Runs `python -m trainer` in this interpreter (ENVKIT_HOME decides where code_tiny is built).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent


def trainer(*args: str) -> str:
    return subprocess.run([sys.executable, "-m", "trainer", *args], capture_output=True, text=True, cwd=PROJECT,
                          check=True).stdout


def train(preset: str, change: dict, steps: int | None) -> tuple[Path, dict, float]:
    out = Path(tempfile.mkdtemp(prefix="envkit-ablation-"))
    (out / "config.json").write_text(json.dumps({"preset": preset, **change}))
    started = time.perf_counter()
    trainer("train", "--config", str(out / "config.json"), "--out", str(out / "run"),
            *(["--steps", str(steps)] if steps else []))
    return out / "run", json.loads((out / "run" / "summary.json").read_text()), time.perf_counter() - started


def walk(run: Path, *ablation: str) -> float:
    return json.loads(trainer("eval", "--ckpt", str(run / "checkpoint.pt"), "--walk", *ablation))["walk_tau"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="code,tiny")
    parser.add_argument("--steps", type=int)
    args = parser.parse_args()
    for preset in args.presets.split(","):
        run, summary, wall = train(preset, {}, args.steps)
        import torch

        state = torch.load(run / "checkpoint.pt", weights_only=True)
        taps, layers = state["layer_ids"], state["config"]["target"]["num_layers"]
        rows = {f"taps {taps} (trained on)": walk(run)}
        for layer in range(layers):
            if [layer] * len(taps) != taps:
                rows[f"taps {[layer] * len(taps)} (a tap error)"] = walk(run, "--taps", ",".join([str(layer)] * len(taps)))
        rows["zeroed features at the walk"] = walk(run, "--zero-context")
        _, zeros, _ = train(preset, {"drafter": {"context": "zeros"}}, args.steps)
        rows["trained with zeroed features"] = zeros["walk_tau"]
        print(json.dumps({"preset": preset, "wall_s": round(wall, 1), "summary": summary, "walks": rows}), flush=True)
        base = rows[f"taps {taps} (trained on)"]
        print(f"{preset}: walk tau; repeat-anchor rule {summary['walk_repeat_tau']:.2f}, copy rule "
              f"{summary['walk_copy_tau']:.2f}")
        for name, tau in rows.items():
            print(f"  {name:34} {tau:.2f}  ({tau / base - 1:+.0%})", flush=True)


if __name__ == "__main__":
    main()
