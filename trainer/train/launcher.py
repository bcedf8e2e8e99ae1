"""Several processes, on one node or many: torch's own launcher (torchrun), never one written here.

`python -m trainer train --nproc-per-node K [--nnodes N --node-rank R --rdzv-endpoint HOST:PORT]
[--max-restarts M]` runs `python -m torch.distributed.run` with those options and the rest of the
command line, forwards SIGINT and SIGTERM to it (torchrun hands them to every worker, which stop
after the same step; rank 0 checkpoints), and exits 130/143 when it was signalled, else with
torchrun's status. One node is `--standalone`; several meet through c10d rendezvous at the endpoint.

Inside a worker, `pin_local_gpu()` runs before torch is imported: each rank sees only its own GPU,
as cuda:0. Compiled graphs carry the device index in their cache key, so a cache warmed on cuda:0
misses every entry as cuda:1 and hits every entry from a process whose only GPU is that one
(bench/RESULTS.md): this is what lets one warm cache serve every rank on every node.
"""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys

from trainer.common.children import killed_with_parent

# The options this module hands to torchrun, with their argparse dests; everything else goes to the workers.
LAUNCH_OPTIONS = {"--nproc-per-node": "nproc_per_node", "--gpus": "nproc_per_node", "--nnodes": "nnodes",
                  "--node-rank": "node_rank", "--rdzv-endpoint": "rdzv_endpoint", "--rdzv-id": "rdzv_id",
                  "--max-restarts": "max_restarts"}


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ


def wants_launch(args) -> bool:
    """Whether this command must start torchrun: more than one process, node or attempt."""
    return not under_torchrun() and ((args.nproc_per_node or 1) > 1 or (args.nnodes or 1) > 1
                                     or (args.max_restarts or 0) > 0)


def torchrun_command(args, worker_argv: list[str]) -> list[str]:
    """`python -m torch.distributed.run ... -m trainer WORKER_ARGV`."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(args.nnodes or 1),
               "--nproc-per-node", str(args.nproc_per_node or 1), "--max-restarts", str(args.max_restarts or 0)]
    if (args.nnodes or 1) == 1 and not args.rdzv_endpoint:
        command.append("--standalone")
    else:
        # c10d ranks the nodes in the order the rendezvous settles (torchrun ignores --node-rank there), so
        # the writer, global rank 0, is wherever that puts it; every node's node.json says which node it was.
        command += ["--rdzv-backend", "c10d", "--rdzv-endpoint", args.rdzv_endpoint,
                    "--rdzv-id", args.rdzv_id or "envkit"]
    return [*command, "-m", "trainer", *worker_argv]


def strip_launch_options(argv: list[str]) -> list[str]:
    """argv without the options torchrun takes (`--gpus 2`, `--nnodes=2`, ...): what every worker runs."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in LAUNCH_OPTIONS:
            skip = True
        elif arg.split("=", 1)[0] not in LAUNCH_OPTIONS:
            out.append(arg)
    return out


def launch(args, argv: list[str]) -> int:
    """Run torchrun for this command line; its exit status (130/143 when a signal stopped it)."""
    # Workers of a restarted group must not read the previous attempt's addresses from the rendezvous store
    # (pytorch/pytorch#135712: "Connection refused" on the restart); a store of their own per round avoids it.
    env = dict(os.environ, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    proc = subprocess.Popen(torchrun_command(args, strip_launch_options(argv)), preexec_fn=killed_with_parent, env=env)
    signalled: list[int] = []

    def forward(signum, frame):
        signalled.append(signum)
        if proc.poll() is None:
            proc.send_signal(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, forward)
    code = proc.wait()
    if signalled:
        return 143 if signalled[0] == signal.SIGTERM else 130
    return code


def pin_local_gpu() -> None:
    """Under torchrun, before torch starts CUDA: this rank's GPU becomes the only one it sees (cuda:0)."""
    if not under_torchrun() or "ENVKIT_GPU_PINNED" in os.environ:
        return
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = [d for d in visible.split(",") if d.strip()] if visible is not None else [str(i) for i in range(local_world)]
    if local_rank < len(devices):
        os.environ["CUDA_VISIBLE_DEVICES"] = devices[local_rank]
        os.environ["ENVKIT_GPU_PINNED"] = devices[local_rank]


# How long the other ranks wait at the end for rank 0's final evaluation, checkpoint and walk.
FINISH_TIMEOUT = datetime.timedelta(hours=4)
_finish_group = None  # the group close_distributed waits on (init_distributed makes it)


def init_distributed():
    """This process's torch.distributed under torchrun (NCCL on GPUs, gloo on CPU), else None."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    import torch
    import torch.distributed as dist

    if torch.cuda.is_available():
        # One visible GPU when pinned; otherwise (threads over several GPUs in a rank) the rank's first.
        torch.cuda.set_device(0 if "ENVKIT_GPU_PINNED" in os.environ else int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    global _finish_group
    # Made here, where every rank makes its groups in the same order; gloo, so that waiting is no GPU work.
    _finish_group = dist.new_group(backend="gloo", timeout=FINISH_TIMEOUT)
    return dist


def close_distributed(together: bool = False) -> None:
    """destroy_process_group at exit: NCCL warns about (and may leak) a group never destroyed. `together`
    (a finished run): every rank first waits for the others. Rank 0 evaluates and checkpoints after the last
    collective; a gloo rank that tore its group down meanwhile was seen to abort ("terminate called without
    an active exception", about one run in five on CPU)."""
    try:
        import torch.distributed as dist
    except ImportError:
        return
    if dist.is_available() and dist.is_initialized():
        if together and _finish_group is not None:
            dist.barrier(group=_finish_group)
        dist.destroy_process_group()


def restart_count() -> int:
    """How many times torchrun restarted this worker group (0 on the first attempt)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
