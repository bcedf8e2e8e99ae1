"""Where a run stands in a Slurm allocation: nodes, this node's rank and where the nodes meet, from SLURM_*.

Under `srun` (one envkit task per node) every node runs the same command line; the rendezvous endpoint is
the first host of SLURM_JOB_NODELIST, expanded as `scontrol show hostnames` does, so nothing per node has
to be typed. Outside a job step nothing is derived.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from envkit.errors import RunError
from envkit.support.text import printable

DEFAULT_RDZV_PORT = 29500  # torchrun's own default master port


@dataclass(frozen=True)
class SlurmPlacement:
    job_id: str
    nnodes: int
    node_rank: int
    head: str  # the first host of the allocation: node 0, where the rendezvous store runs
    gpus_on_node: int | None

    def endpoint(self, port: int | None) -> str:
        host = f"[{self.head}]" if ":" in self.head else self.head
        return f"{host}:{port or DEFAULT_RDZV_PORT}"


def _split_top_level(text: str) -> list[str]:
    """Split at commas outside brackets: "a[1-2,4],b" -> ["a[1-2,4]", "b"]."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += (char == "[") - (char == "]")
        if depth < 0:
            raise ValueError("unbalanced ']'")
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if depth:
        raise ValueError("unbalanced '['")
    return parts + [current]


def _range(spec: str) -> list[str]:
    """"01-03" -> ["01", "02", "03"] (the width of the first bound is kept, as Slurm does); "7" -> ["7"]."""
    low, dash, high = spec.partition("-")
    if not low.isdigit() or (dash and not high.isdigit()):
        raise ValueError(f"bad range {spec!r}")
    if not dash:
        return [low]
    if int(high) < int(low) or int(high) - int(low) > 100_000:
        raise ValueError(f"bad range {spec!r}")
    return [str(n).zfill(len(low)) for n in range(int(low), int(high) + 1)]


def _expand_one(name: str) -> list[str]:
    """One host expression, each bracket group in turn: "r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2."""
    start = name.find("[")
    if start < 0:
        return [name]
    end = name.index("]", start)
    tails = _expand_one(name[end + 1:])
    return [name[:start] + value + tail for spec in name[start + 1:end].split(",") for value in _range(spec)
            for tail in tails]


def expand_hostlist(text: str) -> list[str]:
    """SLURM_JOB_NODELIST ("gpu[01-03,07],login1") as a list of host names, in Slurm's order."""
    try:
        hosts = [host for part in _split_top_level(text.strip()) if part for host in _expand_one(part)]
    except ValueError as exc:
        raise RunError(f"SLURM_JOB_NODELIST {printable(text)!r} cannot be read ({exc}); give --nnodes, --node-rank "
                       f"and --rdzv-endpoint yourself") from None
    if not hosts:
        raise RunError("SLURM_JOB_NODELIST is empty; give --nnodes, --node-rank and --rdzv-endpoint yourself")
    return hosts


def _count(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name, "").split("(", 1)[0]  # SLURM_TASKS_PER_NODE-style "2(x3)" forms
    return int(value) if value.isdigit() else None


def placement(environ: Mapping[str, str]) -> SlurmPlacement | None:
    """This task's place in the job step, or None outside `srun` (no job step: nothing to derive)."""
    if "SLURM_JOB_ID" not in environ or "SLURM_STEP_ID" not in environ or "SLURM_NODEID" not in environ:
        return None
    hosts = expand_hostlist(environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST", ""))
    nnodes = _count(environ, "SLURM_JOB_NUM_NODES") or _count(environ, "SLURM_NNODES") or len(hosts)
    node_rank = _count(environ, "SLURM_NODEID")
    if node_rank is None or node_rank >= nnodes:
        raise RunError(f"SLURM_NODEID {printable(environ['SLURM_NODEID'])!r} is not a node of this {nnodes}-node job")
    tasks = _count(environ, "SLURM_NTASKS") or _count(environ, "SLURM_STEP_NUM_TASKS")
    if tasks and tasks > nnodes:
        raise RunError(f"this job step runs {tasks} tasks on {nnodes} nodes; envkit needs one per node "
                       f"(`srun --ntasks-per-node=1`): torchrun starts the per-GPU processes")
    return SlurmPlacement(environ["SLURM_JOB_ID"], nnodes, node_rank, hosts[0], _count(environ, "SLURM_GPUS_ON_NODE"))


def launch_options(environ: Mapping[str, str], *, nproc_per_node=None, nnodes=None, node_rank=None,
                   rdzv_endpoint=None, rdzv_id=None, rdzv_port=None) -> dict:
    """torchrun's options with what the user gave winning, the rest derived from the Slurm job step."""
    given = {"nproc_per_node": nproc_per_node, "nnodes": nnodes, "node_rank": node_rank,
             "rdzv_endpoint": rdzv_endpoint, "rdzv_id": rdzv_id}
    where = placement(environ)
    if where is None:
        return given
    derived = {"nproc_per_node": where.gpus_on_node, "nnodes": where.nnodes, "node_rank": where.node_rank,
               "rdzv_endpoint": where.endpoint(rdzv_port) if where.nnodes > 1 else None,
               "rdzv_id": f"slurm-{where.job_id}"}
    return {key: value if value is not None else derived[key] for key, value in given.items()}


def placement_env(environ: Mapping[str, str], rdzv_port: int | None = None) -> dict[str, str]:
    """What `envkit run` tells a command of its place in a job step (empty outside one): the variables
    torch.distributed's env:// init and torchrun's options read."""
    where = placement(environ)
    if where is None:
        return {}
    endpoint = where.endpoint(rdzv_port)
    return {"MASTER_ADDR": where.head, "MASTER_PORT": endpoint.rpartition(":")[2], "ENVKIT_NNODES": str(where.nnodes),
            "ENVKIT_NODE_RANK": str(where.node_rank), "ENVKIT_RDZV_ENDPOINT": endpoint,
            "ENVKIT_RDZV_ID": f"slurm-{where.job_id}"}


def run_name(environ: Mapping[str, str], name: str | None) -> str | None:
    """Under a multi-node job step each node gets its own run dir, `<name>-node<R>` (the runs dir is usually
    on a shared file system); the default name is the job's."""
    where = placement(environ)
    if where is None:
        return name
    base = name or f"slurm-{where.job_id}"
    return f"{base}-node{where.node_rank}" if where.nnodes > 1 else base
