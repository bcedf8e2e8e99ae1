"""The one seam between envkit and the bundled trainer's torch-free helpers: envkit imports `trainer` only here.

Everything named here is importable without torch (tests/envkit check that `envkit --help` loads no torch); what is
heavy to import (the standard-library corpus) is reached through a function, so envkit's start-up does not pay it.
"""

from trainer.common.children import die_with_parent
from trainer.common.errors import TrainerInputError
from trainer.common.files import (ExclusiveLock, atomic_write, envkit_home, file_sha256, loads_exchanged_json,
                                  loads_json, open_lock_file, permission_problem, read_json_file)
from trainer.common.mitigations import MITIGATIONS, WARM_LOCK_ENV
from trainer.common.records import EXPORT_MANIFEST, details
from trainer.common.template_kwargs import parse_template_kwargs
from trainer.config import presets_help
from trainer.data import INSTRUCTION_KINDS
from trainer.data.regenerated import completion_row, conversation_row
from trainer.data.source_digest import source_sha256
from trainer.eval.report_files import check_out as check_report_dir
from trainer.targets import maketarget, pretrained

__all__ = ["EXPORT_MANIFEST", "ExclusiveLock", "INSTRUCTION_KINDS", "MITIGATIONS", "TrainerInputError", "WARM_LOCK_ENV", "atomic_write",
           "check_report_dir", "completion_row", "conversation_row", "details", "die_with_parent", "envkit_home", "file_sha256",
           "instructions", "loads_exchanged_json", "loads_json", "maketarget", "open_lock_file", "parse_template_kwargs",
           "permission_problem", "presets_help", "pretrained", "read_json_file", "source_sha256"]


def instructions(held_out: bool, count: int, seed: int, kinds: tuple[str, ...]) -> list[str]:
    """Instructions derived from the standard library (trainer/data/corpus.py), imported only when asked for."""
    from trainer.data import corpus

    return corpus.instructions(held_out, count, seed, kinds)
