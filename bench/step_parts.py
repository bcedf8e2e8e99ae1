"""Where a packed step's time goes, the parts timed alone on one device (median of N, synchronised):

    python bench/step_parts.py --preset qwen3_8b --repeat 10      # CUDA
    python bench/step_parts.py --preset tiny --repeat 3           # CPU, a smoke run

The target's forward through SDPA and transformers' dense block-diagonal mask against flex over a
document BlockMask (trainer/model/target_attention.py), and the drafter's BlockMask through
create_block_mask against the tiles computed from the anchors (trainer/model/masks.py). Rows are packed
from the chat length mix at the largest bucket. Prints one JSON line; --out appends it to a file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))


def timed(fn, repeat: int, sync) -> float:
    """Median milliseconds of fn() over `repeat` runs after one untimed run (compiles, caches)."""
    fn()
    sync()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - started) * 1e3)
    return round(statistics.median(times), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--out")
    args = parser.parse_args()

    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    from trainer.config.schema import preset
    from trainer.train.setup import build
    from trainer.model.masks import flex_block_mask, make_mask_mod
    from trainer.model.target import tapped_states

    cfg = preset(args.preset)
    cfg.data.source, cfg.data.packing, cfg.data.num_sequences, cfg.data.eval_sequences = "chat_lengths", True, 384, 1
    cfg.compile = False  # the drafter's step is not timed here
    setup = build(cfg, drafters=[None], targets=[None], log=lambda m: print(m, file=sys.stderr))
    device = setup.target_device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    bucket = cfg.data.buckets[-1]
    from trainer.data.datasets import collate

    # The rows of the largest bucket with the most documents: what packing makes of short conversations.
    data = setup.train_data
    rows = sorted(data.by_bucket[bucket], key=lambda r: len(data.rows[r]), reverse=True)[:cfg.batch_size]
    batch = collate([data.row(r) for r in rows], bucket)
    batch = {k: v.to(device) for k, v in batch.items()}
    ids, positions, doc_ids = batch["input_ids"], batch["positions"], batch["doc_ids"]
    generator = torch.Generator().manual_seed(0)
    from trainer.model.loss import sample_anchors

    anchors = sample_anchors(batch["loss_mask"].cpu(), batch["lengths"].cpu(), cfg.num_anchors,
                             cfg.drafter.block_size, generator, doc_ids.cpu()).to(device)
    block, q_len = cfg.drafter.block_size, cfg.num_anchors * cfg.drafter.block_size
    layers = setup.layer_ids
    parts = {
        "target_sdpa_dense_ms": lambda: tapped_states(setup.target, ids, None, layers, positions),
        "target_flex_documents_ms": lambda: tapped_states(setup.target, ids, None, layers, positions, doc_ids),
        "drafter_mask_create_block_mask_ms": lambda: create_block_mask(
            make_mask_mod(anchors, bucket, block, doc_ids), cfg.batch_size, None, q_len, bucket + q_len,
            device=device),
        "drafter_mask_tiles_ms": lambda: flex_block_mask(anchors, bucket, block, doc_ids),
    }
    result = {"preset": args.preset, "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "bucket": bucket, "batch_size": cfg.batch_size,
              "documents_per_row": [int(row.max()) + 1 for row in doc_ids], "useful_tokens": int(batch["lengths"].sum()),
              "repeat": args.repeat}
    for name, fn in parts.items():
        result[name] = timed(fn, args.repeat, sync)
        print(f"{name:36} {result[name]:9.2f}", file=sys.stderr)
    print(json.dumps(result), flush=True)
    if args.out:
        with open(args.out, "a") as handle:
            handle.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
