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


NODELIST_LIMIT = 64 << 10  # characters: a real allocation's list is far shorter
HOST_LIMIT = 1 << 16  # names expand_hostlist will write out; placement only counts them


def _split_top_level(text: str) -> list[str]:
    """Split at commas outside brackets: "a[1-2,4],b" -> ["a[1-2,4]", "b"]."""
    parts, depth, current = [], 0, []
    for char in text:
        depth += (char == "[") - (char == "]")
        if depth < 0 or depth > 1:
            raise ValueError("unbalanced or nested brackets")
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth:
        raise ValueError("unbalanced '['")
    return parts + ["".join(current)]


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()  # not "²" or "١": str.isdigit() takes them, int() or Slurm does not


def _range(spec: str) -> tuple[int, int, int]:
    """"01-03" -> (1, 3, 2): the bounds and the width of the first, which Slurm keeps; "7" -> (7, 7, 1)."""
    low, dash, high = spec.partition("-")
    if not _digits(low) or (dash and not _digits(high)) or len(spec) > 40:
        raise ValueError(f"bad range {spec!r}")
    if dash and int(high) < int(low):
        raise ValueError(f"bad range {spec!r}")
    return int(low), int(high) if dash else int(low), len(low)


def _segments(name: str) -> list:
    """"r[1-2]n7" -> ["r", [(1, 2, 1)], "n7"]: literal text and bracket groups, parsed without recursion."""
    segments, position = [], 0
    while (start := name.find("[", position)) >= 0:
        end = name.find("]", start)
        segments += [name[position:start], [_range(spec) for spec in name[start + 1:end].split(",")]]
        position = end + 1
    return segments + [name[position:]]


def _count(segments: list) -> int:
    count = 1
    for segment in segments:
        if isinstance(segment, list):
            count *= sum(high - low + 1 for low, high, _ in segment)
    return count


def _first(segments: list) -> str:
    return "".join(s if isinstance(s, str) else str(s[0][0]).zfill(s[0][2]) for s in segments)


def _parse(text: str) -> list[list]:
    if len(text) > NODELIST_LIMIT:
        raise ValueError(f"{len(text)} characters; Slurm writes far fewer")
    return [_segments(part) for part in _split_top_level(text.strip()) if part]


def _unreadable(text: str, why: object) -> RunError:
    return RunError(f"SLURM_JOB_NODELIST {printable(text[:200])!r} cannot be read ({why}); give --nnodes, "
                    f"--node-rank and --rdzv-endpoint yourself")


def head_and_count(text: str) -> tuple[str, int]:
    """The first host of SLURM_JOB_NODELIST and how many it names, without writing the others out (a short list
    can name 10^10 hosts)."""
    try:
        parts = _parse(text)
    except ValueError as exc:
        raise _unreadable(text, exc) from None
    if not parts:
        raise RunError("SLURM_JOB_NODELIST is empty; give --nnodes, --node-rank and --rdzv-endpoint yourself")
    return _first(parts[0]), sum(_count(part) for part in parts)


def expand_hostlist(text: str) -> list[str]:
    """SLURM_JOB_NODELIST ("gpu[01-03,07],login1") as a list of host names, in Slurm's order (at most HOST_LIMIT)."""
    _, count = head_and_count(text)
    if count > HOST_LIMIT:
        raise _unreadable(text, f"{count} hosts; envkit writes out at most {HOST_LIMIT}")
    hosts = []
    for segments in _parse(text):
        names = [""]
        for segment in segments:
            values = [segment] if isinstance(segment, str) else [
                str(n).zfill(width) for low, high, width in segment for n in range(low, high + 1)]
            names = [name + value for name in names for value in values]
        hosts += names
    return hosts


def _number(environ: Mapping[str, str], name: str) -> int | None:
    """A count Slurm set (None when unset); anything but ASCII digits is one line, not a guess."""
    value = environ.get(name, "").split("(", 1)[0]  # SLURM_TASKS_PER_NODE-style "2(x3)" forms
    if not value:
        return None
    if not _digits(value) or len(value) > 9:
        raise RunError(f"{name} {printable(value[:40])!r} is not a count; unset it or give --nnodes, --node-rank "
                       f"and --rdzv-endpoint yourself")
    return int(value)


def placement(environ: Mapping[str, str]) -> SlurmPlacement | None:
    """This task's place in the job step, or None outside `srun` (no job step: nothing to derive)."""
    if "SLURM_JOB_ID" not in environ or "SLURM_STEP_ID" not in environ or "SLURM_NODEID" not in environ:
        return None
    head, hosts = head_and_count(environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST", ""))
    nnodes = _number(environ, "SLURM_JOB_NUM_NODES") or _number(environ, "SLURM_NNODES") or hosts
    node_rank = _number(environ, "SLURM_NODEID")
    if node_rank is None or node_rank >= nnodes:
        raise RunError(f"SLURM_NODEID {printable(environ['SLURM_NODEID'])!r} is not a node of this {nnodes}-node job")
    tasks = _number(environ, "SLURM_NTASKS") or _number(environ, "SLURM_STEP_NUM_TASKS")
    if tasks and tasks > nnodes:
        raise RunError(f"this job step runs {tasks} tasks on {nnodes} nodes; envkit needs one per node "
                       f"(`srun --ntasks-per-node=1`): torchrun starts the per-GPU processes")
    return SlurmPlacement(environ["SLURM_JOB_ID"], nnodes, node_rank, head, _number(environ, "SLURM_GPUS_ON_NODE"))


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
