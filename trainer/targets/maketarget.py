"""Trained targets built here: a small Qwen3 causal LM and a byte-level BPE tokenizer, both trained on the
interpreter's standard-library sources (trainer/data/corpus.py), written as an HF model dir.

A random target cannot tell a right tap from a wrong one (its layers' states are near-identical), so
the drafter is proven on one that has learned code. `python -m trainer make-target --recipe NAME` builds
one; a preset naming a recipe (`code`) builds it on first use into ENVKIT_HOME/targets/NAME-KEY, KEY
being a digest of the recipe and the corpus, and reuses it after, checked against the digests its build
recorded outside the target dir (ENVKIT_HOME/targets/.records/NAME-KEY-WHERE.json, private to the user): a target
dir's own envkit-target.json is its word, not proof. A link, subdirectory or special file in it is refused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shlex
import shutil
import stat
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from trainer.common.errors import TrainerInputError
from trainer.data import corpus
from trainer.common.files import (atomic_write, envkit_home, ExclusiveLock, file_sha256, follow_umask,
                                  permission_problem, read_json_record)
from trainer.common.hf_logging import quiet_transformers

TARGET_MANIFEST = "envkit-target.json"
EOS, MASK = "<|endoftext|>", "<|mask|>"  # ids 0 and 1: the drafter's mask token is a row no text uses


@dataclass(frozen=True)
class Recipe:
    description: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    seq_len: int  # training windows of the token stream
    batch_size: int
    steps: int
    lr: float
    device: str  # cpu | cuda
    dtype: str = "float32"  # autocast dtype on cuda
    seed: int = 0


RECIPES = {
    # 360 steps of 16 windows: half the compute of 32-window batches for a held-out loss of 3.58-3.78 against
    # 3.18, and drafters trained on it lead the copy rule by 22-50% (15% on the 32-window target) and lose
    # 12-22% to a tap error (10%): bench/RESULTS.md "A cheaper code_tiny".
    "code_tiny": Recipe("1M parameters, 4 layers; about a minute on two CPU cores", vocab_size=1024,
                        hidden_size=128, intermediate_size=384, num_layers=4, num_heads=4, num_kv_heads=2,
                        head_dim=32, seq_len=128, batch_size=16, steps=360, lr=3e-3, device="cpu"),
    "code_small": Recipe("about 220M parameters, 16 layers; minutes on one H200", vocab_size=8192,
                         hidden_size=1024, intermediate_size=3072, num_layers=16, num_heads=16, num_kv_heads=8,
                         head_dim=64, seq_len=512, batch_size=64, steps=400, lr=3e-4, device="cuda",
                         dtype="bfloat16"),
}


def recipe(name: str, seed: int = 0) -> Recipe:
    """The named recipe, its weights and batches drawn from `seed` (0: the recipe as shipped, its own seed kept)."""
    if name not in RECIPES:
        raise TrainerInputError(f"unknown target recipe {name!r}; known: {', '.join(RECIPES)}")
    return dataclasses.replace(RECIPES[name], seed=seed) if seed else RECIPES[name]


def targets_dir() -> Path:
    """ENVKIT_HOME/targets."""
    return envkit_home() / "targets"


def recipe_key(name: str, corpus_digest: str, seed: int = 0) -> str:
    spec = json.dumps({"name": name, **dataclasses.asdict(recipe(name, seed)), "corpus": corpus_digest},
                      sort_keys=True)
    return hashlib.sha256(spec.encode()).hexdigest()[:12]


def _file_digests(root: Path) -> dict[str, str]:
    """{name: sha256} of every file in a target dir; anything but a regular file (a link transformers would
    follow, a FIFO that would hang the hash, a subdirectory) is an error naming it."""
    digests = {}
    for path in sorted(root.iterdir()):
        info = path.lstat()
        if not stat.S_ISREG(info.st_mode):
            raise TrainerInputError(f"the built target {str(root)!r} holds {path.name!r}, which is not a regular file "
                                    f"(a link, directory or special file); remove the target (`rm -r "
                                    f"{shlex.quote(str(root))}`) and it is built again on next use")
        if path.name != TARGET_MANIFEST:
            digests[path.name] = file_sha256(path)
    return digests


def read_manifest(target_dir: Path) -> dict | None:
    """The build record a target dir carries (its recipe, losses, corpus): shown, never trusted as proof."""
    return read_json_record(target_dir / TARGET_MANIFEST)


def records_dir() -> Path:
    return targets_dir() / ".records"


def _record_path(target_dir: Path) -> Path:
    """Keyed by the dir's name (NAME-KEY: the recipe key) and its absolute path (a --out build elsewhere)."""
    where = hashlib.sha256(str(Path(target_dir).absolute()).encode()).hexdigest()[:12]
    return records_dir() / f"{target_dir.name}-{where}.json"


def _remember(target_dir: Path, record: dict) -> None:
    """The build's digests, kept where the target dir cannot write (a private dir beside the targets)."""
    records_dir().mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(records_dir(), 0o700)
    atomic_write(_record_path(target_dir), json.dumps(record, indent=2) + "\n", mode=0o600)


def _recorded(target_dir: Path) -> dict | None:
    """The record this machine's build wrote for the target dir, or None (absent, or possibly not ours)."""
    path = _record_path(target_dir)
    for entry in (records_dir(), path):
        try:
            if permission_problem(entry):
                return None
        except OSError:
            return None
    return read_json_record(path)


def check_built(target_dir: Path) -> dict:
    """The target dir as its build left it: every file its build recorded (outside the dir), nothing added."""
    rm = f"`rm -r {shlex.quote(str(target_dir))}`"
    record = _recorded(target_dir)
    files = record.get("files") if record else None
    if not (isinstance(files, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in files.items())):
        raise TrainerInputError(f"the target {str(target_dir)!r} has no build record of yours in "
                                f"{str(records_dir())!r} (private to you): it was not built here; remove it ({rm}) "
                                f"and it is built again on next use")
    found = _file_digests(target_dir)
    if found != files:
        changed = sorted(set(found.items()) ^ set(files.items()))[0][0]
        raise TrainerInputError(f"the built target {str(target_dir)!r} changed since it was built ({changed!r}); "
                                f"remove it ({rm}) and it is built again on next use")
    return record


def install(built: Path, out: Path, record: dict) -> dict:
    """Move a finished target dir into place as `out` (a rename within targets_dir()): its file digests added to
    `record`, which is written into it and kept outside it first, so a target that exists always has its record.
    Used by builds here and by pretrained targets' conversions."""
    record = record | {"files": _file_digests(built)}
    (built / TARGET_MANIFEST).write_text(json.dumps(record, indent=2) + "\n")
    follow_umask(built)
    _remember(out, record)
    os.rename(built, out)
    return record


_checked: dict[tuple[str, Path], Path] = {}  # what this process already found built and intact


def ensure(name: str, seed: int = 0, log=print) -> Path:
    """The cached target of a recipe built from `seed`: built on first use (under a lock, so ranks and runs build
    it once), checked once per process (setup, the tokenizer and the export card all ask for it)."""
    if (name, seed, targets_dir()) in _checked:
        return _checked[name, seed, targets_dir()]
    chosen = recipe(name, seed)
    files = corpus.files()
    key = recipe_key(name, corpus.digest(files), seed)
    root = targets_dir()
    out = root / f"{name}-{key}"
    if not out.exists():
        root.mkdir(parents=True, exist_ok=True)
        try:
            lock = ExclusiveLock(root / f".{name}-{key}.lock")
        except ValueError as exc:
            raise TrainerInputError(str(exc)) from None
        with lock:
            if not out.exists():
                log(f"target {name}: not built yet on this machine; building it once into {out} ({chosen.description})")
                build(name, out, seed=seed, log=log, corpus_files=files)
    check_built(out)
    _checked[name, seed, root] = out
    return out


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS, MASK], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=EOS, pad_token=EOS, mask_token=MASK)


def _token_stream(tokenizer, texts: list[str]):
    import torch

    ids: list[int] = []
    for encoded in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids += encoded + [tokenizer.eos_token_id]
    return torch.tensor(ids, dtype=torch.long)


def _model(chosen: Recipe, device):
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(vocab_size=chosen.vocab_size, hidden_size=chosen.hidden_size,
                         intermediate_size=chosen.intermediate_size, num_hidden_layers=chosen.num_layers,
                         num_attention_heads=chosen.num_heads, num_key_value_heads=chosen.num_kv_heads,
                         head_dim=chosen.head_dim, max_position_embeddings=4096, tie_word_embeddings=False,
                         eos_token_id=0, pad_token_id=0, bos_token_id=None)
    config._attn_implementation = "sdpa"
    torch.manual_seed(chosen.seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config)


def _windows(stream, count: int, length: int, generator):
    import torch

    starts = torch.randint(len(stream) - length, (count,), generator=generator)
    return torch.stack([stream[s:s + length] for s in starts.tolist()])


def _heldout_loss(model, stream, chosen: Recipe, device) -> float:
    import torch

    windows = _windows(stream, 32, chosen.seq_len, torch.Generator().manual_seed(1)).to(device)
    with torch.no_grad(), _autocast(chosen, device):
        return float(model(input_ids=windows, labels=windows).loss)


def _autocast(chosen: Recipe, device):
    import torch

    dtype = getattr(torch, chosen.dtype)
    return torch.autocast(device.type, dtype=dtype, enabled=device.type == "cuda" and dtype != torch.float32)


def build(name: str, out: Path, *, seed: int = 0, log=print, corpus_files: list | None = None) -> dict:
    """Train the recipe's tokenizer and model on the corpus's training files and write an HF model dir at
    `out` (atomically: a temporary sibling renamed into place). Returns the build record."""
    import torch


    quiet_transformers()
    chosen = recipe(name, seed)
    device = torch.device(chosen.device if chosen.device == "cpu" or torch.cuda.is_available() else "cpu")
    if chosen.device == "cuda" and device.type != "cuda":
        raise TrainerInputError(f"recipe {name} trains on a GPU and this machine has none; use code_tiny on CPU")
    out = Path(out).absolute()
    if out.exists() or out.is_symlink():
        raise TrainerInputError(f"{out} already exists; choose another --out")
    started = time.perf_counter()
    files = corpus_files if corpus_files is not None else corpus.files()
    train_files = [f for f in files if not f.held_out]
    held_files = [f for f in files if f.held_out]
    train_texts = [corpus.read(f) for f in train_files]
    tokenizer = train_tokenizer(train_texts, chosen.vocab_size)
    stream = _token_stream(tokenizer, train_texts)
    held_stream = _token_stream(tokenizer, [corpus.read(f) for f in held_files])
    log(f"target {name}: tokenizer of {len(tokenizer)} tokens; {len(train_files)} training files "
        f"({len(stream):,} tokens), {len(held_files)} held out ({len(held_stream):,} tokens)")

    model = _model(chosen, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=chosen.lr, betas=(0.9, 0.95), weight_decay=0.01)
    generator = torch.Generator().manual_seed(chosen.seed)
    warmup = max(1, chosen.steps // 12)
    loss, skipped = float("nan"), 0
    for step in range(chosen.steps):
        lr = chosen.lr * min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / chosen.steps))
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = _windows(stream, chosen.batch_size, chosen.seq_len, generator).to(device)
        with _autocast(chosen, device):
            step_loss = model(input_ids=batch, labels=batch).loss
        step_loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if torch.isfinite(norm):
            optimizer.step()
        else:  # one bad batch's gradients would make every weight NaN; skip it and say so
            skipped += 1
        optimizer.zero_grad(set_to_none=True)
        if step % 40 == 0 or step == chosen.steps - 1:
            loss = float(step_loss.detach())
            if not math.isfinite(loss):  # nothing after it is worth writing
                raise RuntimeError(f"target {name} diverged: loss {loss} at step {step + 1}; nothing was written")
            seconds = time.perf_counter() - started
            log(f"target {name}: step {step + 1}/{chosen.steps} loss {loss:.3f} ({seconds:.0f}s"
                + (f", {skipped} steps skipped: non-finite gradients" if skipped else "") + ")")
    model.eval()
    held_loss = _heldout_loss(model, held_stream, chosen, device)
    if not math.isfinite(held_loss):
        raise RuntimeError(f"target {name}: the held-out loss is {held_loss}; nothing was written")
    log(f"target {name}: held-out loss {held_loss:.3f} (train {loss:.3f}) in {time.perf_counter() - started:.0f}s")

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        model.config.architectures = [type(model).__name__]
        model.to("cpu").save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        record = {
            "recipe": name, **dataclasses.asdict(chosen), "key": recipe_key(name, corpus.digest(files), seed),
            "corpus": {"source": "python stdlib", "python": sys.version.split()[0], "root": str(corpus.stdlib_root()),
                       "digest": corpus.digest(files), "train_files": len(train_files), "held_out_files": len(held_files),
                       "train_tokens": len(stream), "held_out_tokens": len(held_stream),
                       "held_out": [f.relpath for f in held_files]},
            "train_loss": round(loss, 4), "held_out_loss": round(held_loss, 4), "skipped_steps": skipped,
            "parameters": sum(p.numel() for p in model.parameters()), "torch": torch.__version__,
            "seconds": round(time.perf_counter() - started, 1),
        }
        record = install(tmp, out, record)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return record

