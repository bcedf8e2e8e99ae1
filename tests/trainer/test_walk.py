"""The decoding walk with the target's KV cache (issue 30): what it verifies is what full forwards verify."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from trainer.config.schema import tiny  # noqa: E402
from trainer.data.greedy_decode import padded_greedy  # noqa: E402
from trainer.eval import walk  # noqa: E402
from trainer.model.target import build_target  # noqa: E402


@pytest.fixture(scope="module")
def target():
    return build_target(tiny().target).eval()


def full_forward_greedy(model, prompt: list[int], new_tokens: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(new_tokens):
        tokens.append(int(model(input_ids=torch.tensor([tokens])).logits[0, -1].argmax()))
    return tokens[len(prompt):]


@torch.no_grad()
def test_cached_greedy_decoding_and_walks_match_full_forwards(target):
    prompt = torch.randint(0, 500, (20,), generator=torch.Generator().manual_seed(1)).tolist()
    greedy, logits = walk.greedy_continuation(target, prompt, 40)
    assert greedy == full_forward_greedy(target, prompt, 40) and len(logits) == 40
    for propose in (walk.copy_proposer(8), walk.repeat_proposer(8)):
        walked, per_forward = walk.walk(target, propose, prompt, 40, 8, [1, 2])
        # The verified walk (cache, crops after each rejection) accepts exactly what the rule's walk against
        # the greedy continuation accepts: no cached position of a rejected draft leaks into a later forward.
        assert walked == greedy and per_forward == walk.rule_walk(propose, prompt, greedy, 40)

    def oracle(tokens, context):  # drafts the continuation itself: every slot accepted
        assert context.shape[1] == len(tokens) - 1  # the states of every position before the anchor
        done = len(tokens) - len(prompt)
        return (greedy + [0] * 8)[done:done + 7]

    walked, per_forward = walk.walk(target, oracle, prompt, 40, 8, [1, 2])
    assert walked == greedy and per_forward == [8, 8, 8, 8, 7]


@torch.no_grad()
def test_a_wrong_draft_is_cropped_from_the_cache(target):
    prompt = torch.randint(0, 500, (12,), generator=torch.Generator().manual_seed(2)).tolist()
    greedy, _ = walk.greedy_continuation(target, prompt, 24)

    def half_right(tokens, context):  # the first three slots right, then garbage the target must reject
        done = len(tokens) - len(prompt)
        right = (greedy + [0] * 8)[done:done + 3]
        return right + [(t + 7) % 500 for t in (greedy + [0] * 8)[done + 3:done + 7]]

    walked, per_forward = walk.walk(target, half_right, prompt, 24, 8, [1, 2])
    assert walked == greedy and per_forward[:-1] == [4] * (len(per_forward) - 1)


@torch.no_grad()
def test_continuations_decoded_together_are_each_prompts_own(target, monkeypatch):
    """A walk's reference continuations decode prompts of one length as a batch (and in chunks when their logits
    would not fit): each row is the prompt's own greedy decoding, as full forwards give it."""
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 500, (length,), generator=generator).tolist() for length in (9, 14, 9, 9, 14)]
    monkeypatch.setattr(walk, "CONTINUATION_LOGITS_BYTES", 2 * 24 * 512 * 4)  # two rows a batch: 9, 9 | 9 | 14, 14
    together = list(walk.greedy_continuations(target, prompts, 24))
    assert sorted(index for index, _, _ in together) == list(range(len(prompts)))
    for index, greedy, logits in together:
        prompt = prompts[index]
        assert greedy == full_forward_greedy(target, prompt, 24) and logits.shape == (24, 512)
        assert greedy == logits.argmax(-1).tolist()


@torch.no_grad()
def test_prompts_of_every_length_decode_together_as_each_alone(target):
    """The walk's continuations: prompts of different lengths in one left-padded batch, each row the prompt's own
    greedy decoding as full forwards give it (the padding masked, positions from each row's first token)."""
    generator = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 500, (length,), generator=generator).tolist() for length in (9, 14, 5, 21)]
    alone = [full_forward_greedy(target, p, 20) for p in prompts]
    assert padded_greedy(target, prompts, 20, batch=3) == alone
    # As the recipe answers: batches of like lengths, each row cut before its first stop token, order kept.
    stop = alone[0][5]
    cut = [row[:row.index(stop)] if stop in row else row for row in alone]
    seen = []
    assert padded_greedy(target, prompts, 20, batch=2, stop_ids=(stop,), by_length=True,
                         progress=lambda done, total, tokens: seen.append((done, total, tokens))) == cut
    assert seen[-1] == (4, 4, sum(map(len, cut)))


@torch.no_grad()
def test_the_batched_walk_accepts_what_the_verified_walk_accepts(target):
    """walk_along drafts every prompt's block in one call from one forward's states: for a rule, for a drafter
    that must see the right context (an oracle that checks it), and for the trainer's drafter, each prompt's
    acceptance equals the walk a serving engine runs (target verifying each block, its cache cropped)."""
    from trainer.config.schema import tiny as tiny_config
    from trainer.model.drafter import SdpaAttention, build_drafter

    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 500, (length,), generator=generator).tolist() for length in (7, 16, 11)]
    greedy = padded_greedy(target, prompts, 30)
    cfg = tiny_config()
    drafter = build_drafter(cfg.drafter, cfg.target, num_taps=2).eval()
    head = target.get_output_embeddings().weight
    trained_kind = walk.DrafterProposer(drafter, SdpaAttention, target.get_input_embeddings().weight, head,
                                         mask_token_id=3, dtype=torch.float32)

    def oracle(tokens, context):  # right from the continuation while it is shown exactly the states before its anchor
        index = next(i for i, p in enumerate(prompts) if tokens[:len(p)] == p and len(tokens) - len(p) <= 30)
        expected = full_states(prompts[index] + greedy[index])[:, :len(tokens) - 1]
        assert torch.allclose(context, expected, atol=1e-5)
        done = len(tokens) - len(prompts[index])
        return (greedy[index] + [0] * 8)[done:done + 7]

    def full_states(tokens):
        with walk.recorded_taps(target, [1, 2]) as states:
            target(input_ids=torch.tensor([tokens]))
            return states()

    for propose in (walk.copy_proposer(8), oracle, trained_kind):
        result = walk.evaluate_walk(target, propose, prompts, 30, 8, [1, 2], verified=len(prompts))
        assert result["walk_verified"] == result["walk_verified_agree"] == 3 and result["walk_near_ties"] == 0
        alone = [walk.walk(target, propose, p, 30, 8, [1, 2])[1] for p in prompts]
        assert result["walk_tau_by_prompt"] == [round(sum(f) / len(f), 3) for f in alone]
