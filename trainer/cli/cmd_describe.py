"""`python -m trainer describe`: the resolved config and what decides the compile cache's key, as JSON."""

from __future__ import annotations

import json

from trainer.cli.options import add_run_options, config_from
from trainer.common import torch_build

NAME = "describe"
HELP = "print the resolved config and what decides the compile cache's key (JSON)"


def add_parser(sub) -> None:
    add_run_options(sub.add_parser(NAME, allow_abbrev=False, help=HELP, description=HELP), NAME)


def _torch_build() -> dict:
    """torch's own account of its build and the device it would run on (an accelerator build needs torch)."""
    import torch

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        device = f"{name} (sm_{''.join(map(str, torch.cuda.get_device_capability(0)))})"
    else:
        device = f"cpu ({torch.backends.cpu.get_cpu_capability()})"
    return {"torch": str(torch.__version__), "cuda": torch.version.cuda, "device": device}


def run(args) -> int:
    """What decides compile-cache reuse here: versions, device, and the preset's compile-relevant config."""
    import platform
    from importlib import metadata

    cfg = config_from(args)  # a bad config is answered before torch is read
    build = torch_build.without_import() or _torch_build()
    try:
        triton = metadata.version("triton")
    except metadata.PackageNotFoundError:
        triton = None
    print(json.dumps({**build, "triton": triton, "python": platform.python_version(), "preset": cfg.preset,
                      "config": cfg.compile_key(), "full_config": cfg.to_dict()}, sort_keys=True))
    return 0
