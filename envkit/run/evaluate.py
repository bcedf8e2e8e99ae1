"""`envkit eval`: what a trained drafter accepts on a user's own prompts, measured by the bundled trainer in a
training venv after the preflight `envkit train` makes (the venv made if missing, doctor), from a run's checkpoint
or from an export as a serving engine loads it. The trainer walks, verifies and writes the report
(trainer/cli/cmd_evaluate.py); envkit checks the input, picks the venv and renders the table."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from envkit.errors import RunError
from envkit.run.export import resolve_run, run_venv
from envkit.run.preflight import preflight_doctor, preflight_venv
from envkit.run.rundir import RUN_JSON, read_run
from envkit.support.progress import Phases
from envkit.support.text import printable
from envkit.support.trainer_helpers import EXPORT_MANIFEST, TrainerInputError, check_report_dir
from envkit.trainerproc.process import stream_trainer, trainer_env


@dataclass(frozen=True)
class EvalRequest:
    source: str  # a run name, a run dir, or an export dir
    prompts: tuple[str, ...]
    target: str | None = None
    new_tokens: int | None = None
    max_prompts: int = 0
    out: str | None = None
    venv_path: str | None = None
    profile_name: str | None = None
    runs_dir: str | None = None
    allow_warn: bool = False


def evaluate(request: EvalRequest) -> dict:
    check_inputs(request)
    phases = Phases(3)
    source, profile = Path(request.source), request.profile_name
    if (source / EXPORT_MANIFEST).is_file() and not (source / RUN_JSON).exists():
        flag, weights = "--export", source.absolute()
        venv = preflight_venv(request.venv_path, profile, phases)
    else:
        run_dir = resolve_run(request.source, Path(request.runs_dir) if request.runs_dir else None)
        record = read_run(run_dir)
        flag, weights = "--ckpt", run_dir / "checkpoint.pt"
        if not weights.is_file() or weights.is_symlink():
            raise RunError(f"run {printable(run_dir.name)} has no checkpoint.pt yet (status "
                           f"{printable(record.get('status'))}); evaluate a run that has saved one")
        with phases.phase("venv", "the run's own"):
            venv = run_venv(record, run_dir)
        recorded = record.get("profile")
        profile = profile or (recorded if isinstance(recorded, str) else None)
    preflight_doctor(venv, profile, request.allow_warn, phases)
    args = ["evaluate", flag, str(weights)]
    for prompts in request.prompts:
        args += ["--prompts", str(Path(prompts).absolute())]
    args += ["--target", str(Path(request.target).absolute())] if request.target else []
    args += ["--new-tokens", str(request.new_tokens)] if request.new_tokens else []
    args += ["--max-prompts", str(request.max_prompts)] if request.max_prompts else []
    args += ["--out", str(Path(request.out).absolute())] if request.out else []
    with phases.phase("evaluate", f"{len(request.prompts)} prompt file(s)"):
        stdout = stream_trainer(venv, args, trainer_env(venv, None), shown="eval", error=RunError)
    return json.loads(stdout.strip().splitlines()[-1])


def check_inputs(request: EvalRequest) -> None:
    """What can be refused before a venv is touched: prompt files that are not readable files, a clash of names,
    an --out that is not a new directory in one that exists, a --target that is not a directory."""
    for path in request.prompts:
        shown = printable(path)
        if not os.path.isfile(path):
            raise RunError(f"--prompts {shown}: no such file (a JSONL file of prompt, text or conversations rows)")
        if not os.access(path, os.R_OK):
            raise RunError(f"--prompts {shown}: not readable")
    names = [Path(path).name for path in request.prompts]
    if len(set(names)) < len(names):
        raise RunError("--prompts: two files share a name; give each kind of traffic its own file name")
    if request.target and not Path(request.target).is_dir():
        raise RunError(f"--target {printable(request.target)} is not a directory (a Hugging Face model dir)")
    if request.out:
        try:
            check_report_dir(Path(request.out).absolute())  # the trainer's own check, before a venv is touched
        except TrainerInputError as exc:
            raise RunError(printable(str(exc))) from None


def describe(result: dict) -> list[str]:
    """The terminal's table: per file the drafter beside the two rules and the speedup estimate, then the
    positions curve, the estimate's terms and the lossless check."""
    lines = [f"{'file':28} {'prompts':>7} {'tau':>6} {'median':>6} {'copy':>6} {'repeat':>6} {'speedup':>8} "
             f"{'copy':>6}"]
    for name, f in result["files"].items():
        speedup = result["speedup"][name]
        lines.append(f"{printable(name)[:28]:28} {f['walk_counted']:>7} {f['walk_tau']:>6.2f} "
                     f"{f['walk_median_tau']:>6.2f} {f['walk_copy_tau']:>6.2f} {f['walk_repeat_tau']:>6.2f} "
                     f"{speedup['drafter']:>7.2f}x {speedup['copy']:>5.2f}x")
    for name, f in result["files"].items():
        curve = " ".join(f"{value:.2f}" for value in f["walk_positions"])
        lines.append(f"positions {printable(name)}: {curve}  (share of forwards accepting draft slots 1..k)")
        if f["walk_degenerate"]:
            lines.append(f"  {f['walk_degenerate']} of {f['walk_prompts']} prompts continued degenerately by the "
                         f"target: left out")
        lines.append(f"  lossless: {f['walk_verified']} prompts decoded block by block with the target verifying, "
                     f"equal to its greedy decoding ({f['walk_near_ties']} near-ties)")
    cost = result["cost"]
    lines.append(f"speedup estimate on {printable(cost['device'])}: {cost['formula']} with t_decode "
                 f"{cost['t_decode_s'] * 1e3:.2f} ms, t_verify {cost['t_verify_s'] * 1e3:.2f} ms, t_draft "
                 f"{cost['t_draft_s'] * 1e3:.2f} ms (docs/cli.md, `envkit eval`)")
    reference = result.get("reference_dflash") or {}
    if reference.get("installed"):
        lines.append(f"reference dflash {printable(reference['installed'])}, {reference['prompts']} prompts: tau "
                     f"{reference['tau']:.2f}, {reference['equal_to_target_greedy']} equal to the target's greedy "
                     f"decoding, {reference['tokens_per_s']:.1f} tokens/s against the target's own "
                     f"{reference['target_tokens_per_s']:.1f} (measured: {reference['speedup']:.2f}x)")
    return lines
