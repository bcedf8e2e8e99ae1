"""Acceptance length by a greedy speculative decoding walk, as a serving engine measures it.

Per step, a proposer drafts block slots 1..B-1 after the anchor (the last accepted token); the target
verifies the block in one forward; the accepted prefix plus the target's own next token are kept.
tau of a prompt = mean of (accepted + 1) per target forward; the figure = mean of per-prompt taus (as
the reference `dflash` reports it). The same walk runs the two rules that learn nothing.

A lossless walk's tokens are the target's greedy continuation, and what a draft may see (the tokens and the
target's tapped states before its anchor) is then fixed by that continuation: one forward of the target over
prompt + continuation gives every state any step of the walk reads. So the walk runs along the continuation
(`walk_along`), every prompt's step in one drafter forward, with the continuations decoded together
(`padded_greedy`): 64 prompts cost about 96 + 40 batched forwards, not 64 x 140 single ones. The first
`VERIFIED_PROMPTS` prompts are also walked as an engine runs it (`walk`: the target verifies each block with its
KV cache, rejected positions cropped) and checked lossless: a divergence is a bug, except at a near-tie of the
target's two best logits, where forwards of different shapes round apart. Their acceptance is compared with the
batched walk's and the prompts that agree are counted (all of them in float32 on CPU; in bf16 the two paths'
states round apart too, so a draft may differ).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trainer.data.greedy_decode import padded_greedy
from trainer.eval.teacher_forced import copy_baseline
from trainer.model.target import recorded_taps

WALK_METHOD = "greedy speculative decoding walk: accepted + 1 per target forward, mean of per-prompt means"
# Prompts decoded, and walked, together: one forward serves this many rows.
WALK_BATCH = 64
# Prompts also walked one at a time with the target verifying each block, as a serving engine does.
VERIFIED_PROMPTS = 8
# A mismatch whose two candidates' target logits differ by less than this is rounding, not a bug.
# A divergence at a near-tie is rounding, not a bug: the greedy pass and the verification pass run
# different lengths, so different kernels and summation orders. Near means within an absolute floor or
# within 8 units in the last place of the dtype at the logits' magnitude (an 8B bf16 target's logits
# differ by 0.19 between the two passes on an H200; 8 ulps of bf16 at 20 is 0.6).
NEAR_TIE = {torch.float32: 1e-3, torch.bfloat16: 0.1, torch.float16: 0.02}
NEAR_TIE_ULPS = 8


class LosslessError(RuntimeError):
    """A speculative walk diverged from the target's greedy decoding: the drafter's verification is broken."""


@dataclass
class TargetPass:
    logits: torch.Tensor  # (T, V) float, on the target's device
    context: torch.Tensor  # (1, T, taps*H): tapped states, the drafter's context features


class CachedTarget:
    """The target decoding one sequence with its KV cache, as a serving engine verifies: each forward feeds
    only the positions not yet cached, and a rejected draft's positions are cropped from the cache."""

    def __init__(self, target, layer_ids: list[int]):
        from trainer.data import decode_cache  # transformers: imported where a target decodes

        self.hf = decode_cache

        self.target, self.layer_ids = target, layer_ids
        self.device = next(target.parameters()).device
        self.cache = decode_cache.new_cache()
        self.cached = 0  # positions in the cache

    def feed(self, tokens: list[int] | torch.Tensor) -> TargetPass:
        """Logits and tapped states of `tokens` (a list, or a (1, T) tensor already on the device), appended
        after the cached positions."""
        ids = tokens if isinstance(tokens, torch.Tensor) else torch.tensor([tokens], device=self.device)
        with recorded_taps(self.target, self.layer_ids) as states:
            out = self.hf.forward_cached(self.target, ids, self.cache)
            self.cached += ids.shape[1]
            return TargetPass(out.logits[0].float(), states() if self.layer_ids else None)

    def keep(self, positions: int) -> None:
        """Forget every cached position from `positions` on (a rejected draft's)."""
        if positions < self.cached:
            self.hf.drop_last(self.cache, self.cached - positions)
            self.cached = positions


# The reference continuations of a walk are decoded together, at most this many bytes of their logits at a time
# (each row keeps (new_tokens, vocab) float32 logits for the lossless check: 39 MB a row for Qwen3's vocabulary).
CONTINUATION_LOGITS_BYTES = 256 << 20


@torch.no_grad()
def greedy_continuations(target, prompts: list[list[int]], new_tokens: int) -> Iterator[tuple[int, list[int], torch.Tensor]]:
    """The target's own greedy decoding of each prompt (KV cache, one position a forward, tokens kept on the
    device) and the logits behind each choice: yields (prompt index, tokens, (new_tokens, V) logits), a batch at
    a time, so a caller done with a batch frees its logits. Prompts of one length decode as one batch, one forward
    a token for all of them (16 prompts: 64 forwards, not 1,024); a row's logits may round apart from a lone
    decode's in the last bits, which check_lossless calls a near-tie."""
    from trainer.data.decode_cache import forward_cached, growing_cache  # transformers: imported where a target decodes

    device = next(target.parameters()).device
    vocab = target.get_output_embeddings().weight.shape[0]
    rows = max(1, CONTINUATION_LOGITS_BYTES // (new_tokens * vocab * 4))
    by_length: dict[int, list[int]] = {}
    for index, prompt in enumerate(prompts):
        by_length.setdefault(len(prompt), []).append(index)
    for indices in by_length.values():
        for start in range(0, len(indices), rows):
            batch = indices[start:start + rows]
            cache, step_input, logits = growing_cache(), torch.tensor([prompts[i] for i in batch], device=device), []
            for _ in range(new_tokens):
                logits.append(forward_cached(target, step_input, cache).logits[:, -1].float())
                step_input = logits[-1].argmax(-1, keepdim=True)  # (rows, 1)
            stacked = torch.stack(logits, dim=1)  # (rows, new_tokens, V)
            chosen = stacked.argmax(-1).tolist()
            for row, index in enumerate(batch):
                yield index, chosen[row], stacked[row]


def greedy_continuation(target, prompt: list[int], new_tokens: int) -> tuple[list[int], torch.Tensor]:
    """One prompt's greedy continuation and its logits (greedy_continuations of one prompt)."""
    _index, tokens, logits = next(greedy_continuations(target, [prompt], new_tokens))
    return tokens, logits


def repeat_proposer(block_size: int):
    def propose(tokens: list[int], context: torch.Tensor) -> list[int]:
        return [tokens[-1]] * (block_size - 1)

    return propose


def copy_proposer(block_size: int):
    def propose(tokens: list[int], context: torch.Tensor) -> list[int]:
        return copy_baseline(torch.tensor(tokens), len(tokens) - 1, block_size - 1).tolist()

    return propose


class DrafterProposer:
    """Drafts with the trainer's drafter: context = tapped states of every position before the anchor (zeros
    for a drafter trained with drafter.context "zeros"). Called with one prompt's tokens, as `walk` proposes, or
    on many rows at once through `blocks`, as `walk_along` does."""

    def __init__(self, drafter, attention, embed_weight: torch.Tensor, head_weight: torch.Tensor, mask_token_id: int,
                 dtype: torch.dtype, zero_context: bool = False):
        self.drafter, self.attention, self.dtype, self.zero_context = drafter, attention, dtype, zero_context
        self.embed_weight, self.head_weight, self.mask_token_id = embed_weight, head_weight, mask_token_id
        self.block_size = drafter.block_size

    def blocks(self, sequences: torch.Tensor, context: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        """sequences (B, S) token ids, context (B, S', taps*H) the tapped states of at least every position before
        each row's anchor (the drafter sees none from the anchor on), anchors (B,) -> (B, bs-1) drafted ids."""
        device = self.embed_weight.device
        if self.zero_context:
            context = torch.zeros_like(context)
        block = torch.full((sequences.shape[0], self.block_size), self.mask_token_id, device=device)
        block[:, 0] = sequences.to(device).gather(1, anchors.to(device)[:, None])[:, 0]  # the anchor's token
        with torch.autocast(device.type, dtype=self.dtype, enabled=self.dtype != torch.float32):
            hidden = self.drafter(context.to(device, self.dtype), F.embedding(block, self.embed_weight).float(),
                                  anchors.to(device)[:, None], self.attention)  # (B, bs, H)
            logits = hidden[:, 1:] @ self.head_weight.t()  # (B, bs-1, V)
        return logits.argmax(-1)

    def __call__(self, tokens: list[int], context: torch.Tensor) -> list[int]:
        anchor = len(tokens) - 1
        return self.blocks(torch.tensor([tokens]), context[:, :anchor], torch.tensor([anchor]))[0].tolist()


@dataclass
class Forward:
    """One verification forward of a walk: the drafted block, how much of it the target accepted, and the
    token the target chose itself after the accepted prefix."""
    draft: list[int]
    accepted: int
    target_token: int


@torch.no_grad()
def walk(target, propose, prompt: list[int], new_tokens: int, block_size: int,
         layer_ids: list[int], trace: list[Forward] | None = None) -> tuple[list[int], list[int]]:
    """One prompt's walk: -> (accepted + 1) per target forward, each forward appended to `trace` when given.
    The target keeps a KV cache: a verification forward feeds the anchor and the draft only."""
    decoder = CachedTarget(target, layer_ids)
    first = decoder.feed(prompt)
    tokens = list(prompt) + [int(first.logits[-1].argmax())]
    context = first.context  # the tapped states of every position before the anchor (the last token, not yet fed)
    per_forward = []
    while len(tokens) - len(prompt) < new_tokens:
        draft = propose(tokens, context)
        anchor = len(tokens) - 1
        verified = decoder.feed([tokens[-1]] + [max(t, 0) for t in draft])  # an unknown slot (-1) never matches
        posterior = verified.logits.argmax(-1).tolist()  # (bs,) the target's choice after each slot
        accepted = 0
        while accepted < len(draft) and draft[accepted] == posterior[accepted]:
            accepted += 1
        room = new_tokens - (len(tokens) - len(prompt))
        produced = min(accepted + 1, room)
        tokens += (draft[:accepted] + [posterior[accepted]])[:produced]
        per_forward.append(produced)
        if trace is not None:
            trace.append(Forward(draft, accepted, posterior[accepted]))
        # Causal: the anchor's and the accepted slots' states and cache entries are exact; the rest is dropped.
        kept = len(tokens) - 1 - anchor
        context = torch.cat([context, verified.context[:, :kept]], dim=1)
        decoder.keep(anchor + kept)
    return tokens[len(prompt):len(prompt) + new_tokens], per_forward


def near_tie(logits: torch.Tensor, dtype) -> float:
    """The largest logit gap that rounding in `dtype` can explain, for logits of this magnitude."""
    ulp = torch.finfo(dtype).eps * float(logits.abs().max())
    return max(NEAR_TIE.get(dtype, 1e-3), NEAR_TIE_ULPS * ulp)


def check_lossless(walked: list[int], greedy: list[int], logits, dtype,
                   what: str = "speculative walk diverged from greedy decoding") -> bool:
    """True when identical; False at a near-tie (counted); raises LosslessError on a real divergence.
    logits[i]: the target's logits behind greedy[i]."""
    for index, (got, want) in enumerate(zip(walked, greedy)):
        if got != want:
            gap = float(logits[index][want] - logits[index][got])
            if gap <= near_tie(logits[index], dtype):
                return False
            raise LosslessError(f"{what} at new token {index}: {got} != {want} (logit gap {gap:.4g}); the "
                                f"target's decoding or the drafter's verification path is broken")
    return True


def rule_walk(propose, prompt: list[int], greedy: list[int], new_tokens: int) -> list[int]:
    """A rule's walk against the target's greedy continuation -> (accepted + 1) per target forward. A draft
    slot is accepted while the draft so far equals the continuation: the target would verify exactly that."""
    tokens, done, per_forward = list(prompt) + greedy[:1], 1, []
    while done < new_tokens:
        draft = propose(tokens, None)
        accepted = 0
        while accepted < len(draft) and done + accepted < new_tokens and draft[accepted] == greedy[done + accepted]:
            accepted += 1
        produced = min(accepted + 1, new_tokens - done)
        tokens += greedy[done:done + produced]
        done += produced
        per_forward.append(produced)
    return per_forward


def degenerate(continuation: list[int]) -> bool:
    """A continuation one token makes over half of (a loop of blank lines, one repeated symbol): acceptance there
    measures how predictable the loop is, not the drafter."""
    return bool(continuation) and 2 * max(Counter(continuation).values()) > len(continuation)


def block_proposer(propose):
    """A one-prompt proposer (tokens, context) -> draft as a `blocks` function over many rows."""
    if hasattr(propose, "blocks"):
        return propose.blocks

    def blocks(sequences: torch.Tensor, context: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        drafts = [propose(sequences[row, :anchor + 1].tolist(), context[row:row + 1, :anchor])
                  for row, anchor in enumerate(anchors.tolist())]
        return torch.tensor(drafts)

    return blocks


def walk_along(blocks, sequences: torch.Tensor, context: torch.Tensor, starts: list[int], new_tokens: int,
               block_size: int, positions: list["Positions"] | None = None) -> list[list[int]]:
    """Every row's walk along its greedy continuation -> (accepted + 1) per target forward, for each row.
    sequences (B, S): prompt + continuation, right-padded; starts: each prompt's length; context (B, S, taps*H):
    the target's tapped states over the sequences. Each step drafts every unfinished row's block in one call; a
    draft slot is accepted while it equals the continuation, which is what the target would verify. `positions`
    (one a row) counts, per draft slot, the forwards that could accept it and those that did."""
    rows = sequences.shape[0]
    truth, done = sequences.tolist(), [1] * rows  # the target's first token comes with the prompt's forward
    per_forward: list[list[int]] = [[] for _ in range(rows)]
    while active := [r for r in range(rows) if done[r] < new_tokens]:
        anchors = [starts[r] + done[r] - 1 for r in active]
        picked = torch.tensor(active, device=sequences.device)
        every = len(active) == rows
        drafts = blocks(sequences if every else sequences[picked], context if every else context[picked],
                        torch.tensor(anchors, device=sequences.device)).tolist()
        for row, anchor, draft in zip(active, anchors, drafts):
            room = new_tokens - done[row]
            want = truth[row][anchor + 1:anchor + 1 + min(room, block_size - 1)]
            accepted = 0
            while accepted < len(want) and draft[accepted] == want[accepted]:
                accepted += 1
            produced = min(accepted + 1, room)
            done[row] += produced
            per_forward[row].append(produced)
            if positions is not None:
                positions[row].count(len(want), accepted)
    return per_forward


@dataclass
class Positions:
    """Per draft slot k (1..block_size-1): the forwards whose draft reached slot k (the continuation still had room)
    and those that accepted every slot through k. accepted[k] / tried[k] is the positions curve."""
    tried: list[int]
    accepted: list[int]

    @classmethod
    def empty(cls, block_size: int) -> "Positions":
        return cls([0] * (block_size - 1), [0] * (block_size - 1))

    def count(self, slots: int, accepted: int) -> None:
        for slot in range(slots):
            self.tried[slot] += 1
            self.accepted[slot] += slot < accepted

    def add(self, other: "Positions") -> None:
        self.tried = [a + b for a, b in zip(self.tried, other.tried)]
        self.accepted = [a + b for a, b in zip(self.accepted, other.accepted)]

    def curve(self) -> list[float]:
        return [round(a / t, 4) if t else 0.0 for a, t in zip(self.accepted, self.tried)]


def check_full_forward(logits: torch.Tensor, sequence: list[int], start: int, new_tokens: int, dtype) -> bool:
    """The target's one forward over prompt + continuation picks every continuation token as the cached decoding
    did: True when it does; False at a near-tie (counted); raises LosslessError otherwise. logits (S, V)."""
    picked = logits[start - 1:start - 1 + new_tokens].argmax(-1).tolist()
    return check_lossless(picked, sequence[start:start + new_tokens], logits[start - 1:start - 1 + new_tokens], dtype,
                          what="the target's forward over prompt and continuation disagrees with its cached decoding")


def evaluate_walk(target, drafter, prompts: list[list[int]], new_tokens: int, block_size: int,
                  layer_ids: list[int], dtype=torch.float32, verified: int = VERIFIED_PROMPTS,
                  progress=None) -> dict:
    """Walk tau of the drafter and of the two rules over the same prompts, the first `verified` prompts also
    walked with the target verifying each block and checked lossless. Prompts the target continues degenerately
    are counted and left out of the headline figures (a target that loops is named, not flattered); when every
    prompt is, the figures are over all of them. `progress(done, total)` is told after each batch of prompts."""
    rules = {"repeat": repeat_proposer(block_size), "copy": copy_proposer(block_size)}
    per_prompt = {name: [0.0] * len(prompts) for name in ("drafter", *rules)}
    positions = [Positions.empty(block_size) for _ in prompts]
    near_ties, looping, agree = 0, set(), 0
    continuations = padded_greedy(target, prompts, new_tokens, WALK_BATCH)
    device = next(target.parameters()).device
    head = target.get_output_embeddings()
    width = max(map(len, prompts)) + new_tokens
    blocks = block_proposer(drafter)
    for start in range(0, len(prompts), WALK_BATCH):
        indices = range(start, min(start + WALK_BATCH, len(prompts)))
        sequences = [list(prompts[i]) + continuations[i] for i in indices]
        padded = torch.tensor([seq + [0] * (width - len(seq)) for seq in sequences], device=device)
        with recorded_taps(target, layer_ids) as states:  # right padding: causal, so no row position sees it
            hidden = target.model(input_ids=padded, use_cache=False).last_hidden_state  # (rows, S, H)
            context = states()
        walks = walk_along(blocks, padded, context, [len(prompts[i]) for i in indices], new_tokens, block_size,
                           positions[start:start + len(indices)])
        for row, index in enumerate(indices):
            prompt, greedy = prompts[index], continuations[index]
            logits = head(hidden[row]).float()  # (S, V): one row's at a time (64 rows of 49K-token logits: 2.5 GB)
            tie = not check_full_forward(logits, sequences[row], len(prompt), new_tokens, dtype)
            if index < verified:
                walked, per_forward = walk(target, drafter, prompt, new_tokens, block_size, layer_ids)
                tie |= not check_lossless(walked, greedy, logits[len(prompt) - 1:], dtype)
                agree += per_forward == walks[row]
            near_ties += tie
            if degenerate(greedy):
                looping.add(index)
            for name, propose in rules.items():
                per_forward_rule = rule_walk(propose, prompt, greedy, new_tokens)
                per_prompt[name][index] = sum(per_forward_rule) / len(per_forward_rule) if per_forward_rule else 1.0
            per_prompt["drafter"][index] = sum(walks[row]) / len(walks[row]) if walks[row] else 1.0
        if progress is not None:
            progress(indices[-1] + 1, len(prompts))

    counted = [i for i in range(len(prompts)) if i not in looping] or list(range(len(prompts)))
    over_counted = Positions.empty(block_size)
    for index in counted:
        over_counted.add(positions[index])

    def mean(values):
        kept = [values[i] for i in counted]
        return round(sum(kept) / len(kept), 4) if kept else 0.0

    return {"walk_tau": mean(per_prompt["drafter"]), "walk_repeat_tau": mean(per_prompt["repeat"]),
            "walk_copy_tau": mean(per_prompt["copy"]), "walk_prompts": len(prompts), "walk_new_tokens": new_tokens,
            "walk_degenerate": len(looping), "walk_counted": len(counted), "walk_near_ties": near_ties,
            "walk_verified": min(verified, len(prompts)), "walk_verified_agree": agree,
            "walk_method": WALK_METHOD,
            "walk_tau_by_prompt": [round(tau, 3) for tau in per_prompt["drafter"]],
            "walk_positions": over_counted.curve(),
            "walk_copy_tau_by_prompt": [round(tau, 3) for tau in per_prompt["copy"]],
            "walk_repeat_tau_by_prompt": [round(tau, 3) for tau in per_prompt["repeat"]],
            "walk_degenerate_prompts": sorted(looping)}


def render_example(tokenizer, prompt: list[int], trace: list[Forward], limit: int = 12) -> list[str]:
    """A walk as a person reads it: per target forward, the drafted tokens the target accepted, those it
    rejected, and its own next token. Text is shown as Python literals, so nothing reaches a terminal raw."""
    def text(ids: list[int]) -> str:
        return repr(tokenizer.decode([max(i, 0) for i in ids]))

    lines = [f"prompt {text(prompt[-24:])}"]
    for index, step in enumerate(trace[:limit], 1):
        rejected = step.draft[step.accepted:]
        lines.append(f"forward {index:2d}: accepted {text(step.draft[:step.accepted]):<28} rejected "
                     f"{text(rejected):<28} target {text([step.target_token])}")
    if len(trace) > limit:
        lines.append(f"... {len(trace) - limit} more forwards")
    return lines
