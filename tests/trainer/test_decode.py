"""The trainer's batched decoder (trainer/data/greedy_decode.py): over its preallocated cache (static_decode.py) for
every family it supports, each row is the prompt's own greedy decoding as transformers' full forwards give it;
sampling draws from the seeded generator and, with top-p that keeps one token, is greedy."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from trainer.data import greedy_decode  # noqa: E402
from trainer.data.static_decode import BUCKET, Sampling, supports  # noqa: E402


def small_model(model_type: str):
    config = transformers.AutoConfig.for_model(
        model_type, vocab_size=300, hidden_size=72, intermediate_size=96, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=2, head_dim=12, max_position_embeddings=512, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(4)  # peaked logits: greedy choices far from ties
    return model


@torch.no_grad()
def full_forward_greedy(model, prompt: list[int], new_tokens: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(new_tokens):
        tokens.append(int(model(input_ids=torch.tensor([tokens])).logits[0, -1].argmax()))
    return tokens[len(prompt):]


def prompts(seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 300, (length,), generator=generator).tolist() for length in (9, 14, 5, 21)]


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "mistral", "qwen3"])
def test_every_supported_family_decodes_as_full_forwards(model_type):
    model = small_model(model_type)
    assert supports(model)
    # Past one width bucket: the attention's width grows mid-decode.
    new_tokens = BUCKET - 5
    alone = [full_forward_greedy(model, prompt, new_tokens) for prompt in prompts(1)]
    assert greedy_decode.padded_greedy(model, prompts(1), new_tokens, batch=3) == alone


def test_an_unsupported_model_decodes_through_transformers_forward(monkeypatch):
    model = small_model("llama")
    alone = [full_forward_greedy(model, prompt, 20) for prompt in prompts(2)]
    monkeypatch.setattr(greedy_decode, "supports", lambda target: False)
    assert greedy_decode.padded_greedy(model, prompts(2), 20, batch=4) == alone


@pytest.mark.parametrize("fast", [True, False])
def test_sampling_draws_from_the_seeded_generator(fast, monkeypatch):
    model = small_model("llama")
    monkeypatch.setattr(greedy_decode, "supports", lambda target: fast)

    def draw(seed: int, sampling: Sampling) -> list[list[int]]:
        torch.manual_seed(seed)
        return greedy_decode.padded_decode(model, prompts(3), 24, 4, sampling=sampling)

    drawn = draw(7, Sampling(1.0, 0.95))
    assert drawn == draw(7, Sampling(1.0, 0.95)) and drawn != draw(8, Sampling(1.0, 0.95))
    assert drawn != greedy_decode.padded_greedy(model, prompts(3), 24, 4)
    # Top-p that keeps only the most likely token is greedy, whatever the draw.
    assert draw(9, Sampling(1.0, 1e-6)) == greedy_decode.padded_greedy(model, prompts(3), 24, 4)
