"""TensorBoard event files in the run dir (`tensorboard --logdir runs/`), when tensorboard is installed."""

from __future__ import annotations

from pathlib import Path


class Board:
    """Every numeric field of a metrics row as a scalar: train/*, eval_teacher_forced/*, eval_walk/*."""

    def __init__(self, out_dir: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard is optional outside the lock profiles
            self.writer = None
        else:
            self.writer = SummaryWriter(log_dir=str(out_dir / "tensorboard"))

    def write(self, row: dict) -> None:
        if self.writer is None:
            return
        group = f"eval_{row.get('method', 'teacher_forced')}" if row.get("eval") else "train"
        for key, value in row.items():
            if key in ("step", "eval") or isinstance(value, bool):
                continue
            values = value.items() if isinstance(value, dict) else [("", value)]
            for part, number in values:  # per-device memory and per-thread rates are dicts
                if isinstance(number, (int, float)) and not isinstance(number, bool):
                    self.writer.add_scalar(f"{group}/{key}" + (f"/{part}" if part else ""), number, row["step"])
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
