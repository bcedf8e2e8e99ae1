"""A drafter evaluated during and after training: teacher-forced tau on held-out blocks, and the greedy
speculative decoding walk on held-out (or given) prompts, each beside the two rules that learn nothing.

The loop (trainer/train/loop.py) owns one and asks it at eval steps; `python -m trainer eval` asks it of a
checkpoint. It reads the run's Setup and never changes the weights."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import torch

from trainer.common.errors import TrainerInputError
from trainer.common.records import EvalRow, WalkRow
from trainer.data import datasets
from trainer.eval import teacher_forced, walk
from trainer.metrics.monitor import CompileMonitor
from trainer.model import fp8
from trainer.model.drafter import EVAL_ATTENTION
from trainer.model.target import eager_target
from trainer.train.setup import Setup
from trainer.train.steps import step_inputs


# What the summary keeps of each walk_files walk.
WALK_FIGURES = ("walk_tau", "walk_repeat_tau", "walk_copy_tau", "walk_prompts", "walk_counted", "walk_degenerate")


class Evaluator:
    def __init__(self, setup: Setup, monitor: CompileMonitor, log=print):
        self.setup, self.cfg, self.monitor, self.log = setup, setup.cfg, monitor, log

    def teacher_forced(self, step: int) -> EvalRow:
        """Teacher-forced tau of the drafter and of the two rules on the same held-out positions."""
        with self.monitor.excluding():
            return self._teacher_forced(step)

    @torch.no_grad()
    def _teacher_forced(self, step: int) -> EvalRow:
        self.setup.replica.drafter.eval()
        generator = torch.Generator().manual_seed(12_345)  # the same positions at every eval
        # Teacher-forced against the bf16 target, as serving verifies, whatever the target trains with (its
        # compiled layers were made for the FP8 path: the switched target runs eager).
        eager = eager_target() if self.cfg.fp8 in ("target", "both") else nullcontext()
        with fp8.bf16_target(self.setup.target), eager:
            scores = self._score_eval_blocks(generator)
        return EvalRow(step=step, eval=True, **teacher_forced.summarise(scores))

    def _score_eval_blocks(self, generator: torch.Generator) -> dict:
        cfg, setup = self.cfg, self.setup
        replica = setup.replica
        scores = {"drafter": [], "repeat": [], "copy": []}
        for bucket, members in sorted(setup.eval_data.by_bucket.items()):
            for start in range(0, len(members), cfg.batch_size):
                rows = [setup.eval_data.row(i) for i in members[start:start + cfg.batch_size]]
                batch = datasets.collate(rows, bucket)
                inputs = step_inputs(setup, batch, generator).to(replica.device)
                anchors = inputs.anchors
                draft = replica.draft(inputs.tapped, inputs.block_ids, anchors, inputs.positions, inputs.doc_ids)  # (B, Q)
                draft = draft.view(anchors.shape[0], anchors.shape[1], cfg.drafter.block_size)
                for name, values in teacher_forced.score_blocks(draft, batch["input_ids"], batch["lengths"], anchors.cpu(),
                                                          cfg.drafter.block_size).items():
                    scores[name] += values
        return scores

    def held_out_prompts(self) -> list[list[int]]:
        """Held-out prompts: each sequence up to its first supervised token (the part the target continues)."""
        prompts = []
        for seq in self.setup.eval_data.sequences[: self.cfg.walk_prompts]:
            first = next((i for i, m in enumerate(seq.loss_mask) if m), len(seq.input_ids))
            prompts.append(seq.input_ids[: max(1, first)])
        return prompts

    def walk(self, step: int, taps: list[int] | None = None, zero_context: bool = False,
             prompts: list[list[int]] | None = None) -> WalkRow:
        """Greedy speculative decoding with the drafter and the two no-learning rules, each checked lossless.
        `taps` (other target layers than trained with) and `zero_context` feed the drafter wrong context
        features: the ablations that show whether its acceptance comes from the target."""
        setup = self.setup
        if taps is not None and len(taps) != len(setup.layer_ids):
            raise TrainerInputError(f"--taps needs {len(setup.layer_ids)} layer ids (the drafter was trained on "
                                    f"{setup.layer_ids}), not {taps}")
        if taps is not None and not all(0 <= t < self.cfg.target.num_layers for t in taps):
            raise TrainerInputError(f"--taps {taps} outside the target's {self.cfg.target.num_layers} layers")
        # The walk verifies against the bf16 target, as serving does, whatever the target trained with.
        with self.monitor.excluding(), torch.no_grad(), fp8.bf16_target(setup.target):
            block = self.cfg.drafter.block_size
            result = walk.evaluate_walk(setup.target, self._drafter_proposer(zero_context), prompts or self.held_out_prompts(),
                                        self.cfg.walk_new_tokens, block, setup.layer_ids if taps is None else taps,
                                        setup.dtype)
        return WalkRow(step=step, eval=True, method="walk", **result)

    def read_walk_files(self) -> dict[str, list[list[int]]]:
        """Config walk_files' prompts, tokenized, by file name: read when the run starts, so that a missing file or a
        bad line stops it then, not after its last step."""
        from trainer.data.rows import read_prompts

        if not self.cfg.walk_files:
            return {}
        tokenizer = self._tokenizer()
        return {Path(path).name: read_prompts(path, tokenizer, self.cfg.data.chat_template_kwargs, self.cfg.walk_prompts)
                for path in self.cfg.walk_files}

    def walk_files(self, step: int, prompts_by_file: dict[str, list[list[int]]]) -> dict:
        """The walk on each file's prompts, by file name: acceptance per kind of traffic."""
        by_file = {}
        for name, prompts in prompts_by_file.items():
            row = self.walk(step, prompts=prompts)
            by_file[name] = {key: row[key] for key in WALK_FIGURES}
        return by_file

    def _tokenizer(self):
        if not self.setup.tokenizer_path:
            raise TrainerInputError("config walk_files needs a tokenizer: a run with --target/--tokenizer or a recipe "
                                    "target")
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.setup.tokenizer_path, local_files_only=True)

    def _drafter_proposer(self, zero_context: bool = False):
        replica = self.setup.replica
        replica.drafter.eval()
        return walk.DrafterProposer(replica.drafter, EVAL_ATTENTION, replica.embed_weight, replica.head_weight,
                                     self.setup.mask_token_id, self.setup.dtype,
                                     zero_context=zero_context or self.cfg.drafter.context == "zeros")

    def log_walk_example(self, tau_by_prompt: list[float]) -> None:
        """The walk of the held-out prompt with the median acceptance, drafted blocks marked accepted or
        rejected: what speculation did, for data with a tokenizer to show it."""
        setup = self.setup
        if not setup.tokenizer_path or not tau_by_prompt:
            return
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(setup.tokenizer_path, local_files_only=True)
        index = sorted(range(len(tau_by_prompt)), key=tau_by_prompt.__getitem__)[len(tau_by_prompt) // 2]
        prompt = self.held_out_prompts()[index]
        trace: list[walk.Forward] = []
        with self.monitor.excluding(), torch.no_grad():
            walk.walk(setup.target, self._drafter_proposer(), prompt, self.cfg.walk_new_tokens,
                      self.cfg.drafter.block_size, setup.layer_ids, trace)
        self.log(f"walk example (held-out prompt {index + 1}, the median: {tau_by_prompt[index]:.2f} tokens per "
                 f"target forward; {len(trace)} forwards):")
        for line in walk.render_example(tokenizer, prompt, trace):
            self.log("  " + line)


def describe_eval(row: dict) -> str:
    return (f"eval step {row['step']}: tau {row['acceptance_length']:.2f} (repeat-anchor "
            f"{row['baseline_repeat_tau']:.2f}, copy {row['baseline_copy_tau']:.2f}) over "
            f"{row['eval_positions']} positions")


def describe_walk(row: dict) -> list[str]:
    lines = [f"walk step {row['step']}: tau {row['walk_tau']:.2f} (repeat-anchor {row['walk_repeat_tau']:.2f}, "
             f"copy {row['walk_copy_tau']:.2f}) over {row['walk_counted']} prompts x {row['walk_new_tokens']} "
             f"tokens ({row['walk_verified']} verified block by block: lossless, {row['walk_verified_agree']} "
             f"accepting what the batched walk did; {row['walk_near_ties']} near-ties)"]
    if row["walk_degenerate"]:
        left = ("left out of these figures" if row["walk_counted"] < row["walk_prompts"] else
                "every prompt: the figures are over them all and measure the loop, not the drafter")
        lines.append(f"walk: the target continued {row['walk_degenerate']} of {row['walk_prompts']} prompts "
                     f"degenerately (one token over half of the continuation): {left}")
    return lines
