"""`--gpus N`: N trainer processes, one GPU each (data parallel), started as torchrun would start them.

On two H200s two processes gave 2.0x one GPU where one process driving both GPUs from threads gave
1.7x (bench/RESULTS.md): threads share one interpreter lock, and an eager target's forward needs it
for every kernel launch. The launcher forwards SIGINT and SIGTERM to every rank (they agree on the
step to stop after, and rank 0 checkpoints), ends the others when one fails, and exits with rank
0's status, or with the failing rank's. Each rank joins the process group through init_distributed,
as under torchrun.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time

GRACE_S = 60.0  # after a rank fails, how long the others get to exit before they are killed
POLL_S = 0.2


def launch(argv: list[str], processes: int) -> int:
    """Run `python -m trainer ARGV` as `processes` ranks on this machine; returns the exit status."""
    base = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(processes),
                LOCAL_WORLD_SIZE=str(processes))
    ranks = [subprocess.Popen([sys.executable, "-m", "trainer", *argv], preexec_fn=_die_with_parent,
                              env=dict(base, RANK=str(rank), LOCAL_RANK=str(rank))) for rank in range(processes)]
    signalled: list[int] = []

    def forward(signum, frame):
        signalled.append(signum)
        for proc in ranks:
            if proc.poll() is None:
                proc.send_signal(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, forward)
    failed = None
    while any(proc.poll() is None for proc in ranks):
        failed = failed or next((p for p in ranks if p.returncode not in (None, 0) and not signalled), None)
        if failed:  # the others would wait for it in their next all-reduce
            _end(ranks)
            break
        time.sleep(POLL_S)
    for proc in ranks:
        proc.wait()
    failed = failed or next((p for p in ranks if p.returncode != 0 and not signalled), None)
    return failed.returncode if failed else ranks[0].returncode


def init_distributed():
    """This process's torch.distributed under torchrun or `--gpus` (NCCL on GPUs, gloo on CPU), else None."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    import torch
    import torch.distributed as dist

    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))  # NCCL's communicator on this rank's GPU
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist


def strip_gpus(argv: list[str]) -> list[str]:
    """argv without `--gpus N` / `--gpus=N`: each rank runs one GPU."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--gpus":
            skip = True
        elif not arg.startswith("--gpus="):
            out.append(arg)
    return out


def _end(ranks: list[subprocess.Popen]) -> None:
    for proc in ranks:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and any(proc.poll() is None for proc in ranks):
        time.sleep(POLL_S)
    for proc in ranks:
        if proc.poll() is None:
            proc.kill()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:
    """Ranks get SIGKILL if the launcher dies: no orphan holding a GPU."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
