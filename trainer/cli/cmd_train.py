"""`python -m trainer train`: a DFlash drafter trained into a run dir (metrics.jsonl, checkpoint.pt,
summary.json), sequentially, in threads, or one process per GPU under torchrun."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from trainer.cli.options import add_run_options, config_from
from trainer.common.errors import TrainerInputError
from trainer.common.files import atomic_write
from trainer.common.records import headline
from trainer.train.faults import Faults
from trainer.train.launcher import close_distributed, launch, wants_launch

NAME = "train"
HELP = "train a DFlash drafter (the run dir gets metrics.jsonl, checkpoint.pt, summary.json)"


def add_parser(sub) -> None:
    add_run_options(sub.add_parser(NAME, allow_abbrev=False, help=HELP, description=HELP), NAME)


def run(args) -> int:
    cfg = config_from(args)
    if wants_launch(args):
        if args.gpus:
            import torch

            if torch.cuda.device_count() < args.gpus:
                raise TrainerInputError(f"--gpus {args.gpus}: this machine has {torch.cuda.device_count()} CUDA "
                                        f"devices (--nproc-per-node starts processes without asking for GPUs)")
        return launch(args, args.argv)
    code = None
    try:
        _record_node(Path(args.out))
        code = _train(args, cfg)
        return code
    finally:
        close_distributed(together=code == 0)


class Stop(Exception):
    """A second signal, or one outside the step loop: leave now, writing no checkpoint (the main thread may be
    anywhere, even inside an optimizer step, so the state in memory may not be any step's)."""


def _stop_at_step_boundary(trainer, received: list[int]):
    """The first SIGINT/SIGTERM sets the trainer's flag: it stops at the next step boundary and checkpoints
    there. A second one (or one while no step loop runs) raises Stop wherever the main thread is."""
    def handler(signum, frame):
        first = not received
        received.append(signum)
        if not (first and trainer.request_stop()):
            raise Stop

    return handler


def _make_trainer(args, cfg, log):
    """The sequential loop, or the threaded executor for --targets/--drafters and for each rank of --gpus
    or torchrun. A flag a layout cannot honour is refused, never ignored."""

    import torch

    from trainer.train.launcher import init_distributed
    from trainer.train.loop import Trainer

    if args.device and (args.targets or args.drafters):
        raise TrainerInputError("give --device or --targets/--drafters (which name every device), not both")
    dist = init_distributed()
    if not (args.targets or args.drafters or dist):
        if args.no_mitigations:
            raise TrainerInputError("--no-mitigations switches off the thread-safety mitigations, which only the "
                                    "threaded layouts use (--targets/--drafters, --gpus); this run has no threads")
        if args.fail_at:
            raise TrainerInputError("--fail-at injects a failure into a worker thread; give --targets/--drafters")
        return Trainer.sequential(cfg, Path(args.out), device=args.device, resume=args.resume, log=log,
                                  strict_compile=args.strict_compile)
    # Under torchrun each rank sees only its own GPU, as cuda:0 (launcher.pin_local_gpu).
    default = [args.device or ("cuda" if torch.cuda.is_available() else "cpu")]
    targets = args.targets.split(",") if args.targets else default
    drafters = args.drafters.split(",") if args.drafters else default
    return Trainer.threaded(cfg, Path(args.out), targets=targets, drafters=drafters,
                            mitigations=not args.no_mitigations, strict_compile=args.strict_compile,
                            faults=Faults.parse(args.fail_at), resume=args.resume, log=log, dist=dist)


def _log_line(message: str) -> None:
    """One write per line: torchrun's ranks share stdout, and a pipe keeps a short write whole."""
    sys.stdout.write(message + "\n")
    sys.stdout.flush()


def _record_node(out: Path) -> None:
    """Under torchrun, local rank 0 writes OUT/node.json: which node this is in the rendezvous, and whether
    the run's writer (global rank 0, wherever the rendezvous put it) is here. envkit copies it to run.json."""
    if "GROUP_RANK" not in os.environ or os.environ.get("LOCAL_RANK") != "0":
        return
    import socket

    out.mkdir(parents=True, exist_ok=True)
    node = {"group_rank": int(os.environ["GROUP_RANK"]), "nnodes": int(os.environ.get("GROUP_WORLD_SIZE", "1")),
            "world_size": int(os.environ.get("WORLD_SIZE", "1")), "host": socket.gethostname(),
            "writer": os.environ.get("RANK") == "0",
            "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))}
    atomic_write(out / "node.json", json.dumps(node, indent=2) + "\n")


def _train(args, cfg) -> int:
    from trainer.train.loop import Interrupted

    trainer = _make_trainer(args, cfg, _log_line)
    received: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _stop_at_step_boundary(trainer, received))
    try:
        summary = trainer.train()
    except Interrupted:
        path = trainer.save_checkpoint()
        print(f"interrupted at step {trainer.step_count}; checkpoint {path}", flush=True)
        return 143 if received and received[0] == signal.SIGTERM else 130
    except Stop:
        kept = Path(args.out) / "checkpoint.pt"
        print(f"stopped at once by a {'second ' if len(received) > 1 else ''}signal; no checkpoint written"
              + (f" (the last one, {kept}, is untouched)" if kept.exists() else ""), flush=True)
        return 143 if received and received[0] == signal.SIGTERM else 130
    finally:
        trainer.close()
    write_summary(Path(args.out), summary)
    if not summary:  # a torchrun rank other than 0: rank 0 reports
        return 0
    print(json.dumps(summary), flush=True)
    print(headline(summary), flush=True)
    return 0


def write_summary(out: Path, summary: dict) -> None:
    """Results are a file: envkit reads summary.json, never the log."""
    if not summary:
        return
    atomic_write(out / "summary.json", json.dumps(summary, indent=2, sort_keys=True) + "\n")
