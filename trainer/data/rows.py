"""One data line to token ids and a loss mask: JSONL rows (`input_ids`/`loss_mask`, `text`, `conversations`) and
plain text, checked where they are read. Torch-free: the token store's worker processes import only this.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.common.errors import TrainerInputError
from trainer.common.files import loads_json
from trainer.data.regenerated import shape_of

NEEDS_TOKENIZER = {"completion": "prompt/completion", "text": "text", "conversations": "conversation"}


@dataclass
class Sequence:
    input_ids: list[int]
    loss_mask: list[int]


class OutsideVocabulary(ValueError):
    """A token id the vocabulary the data is checked against does not hold: the file's or the vocabulary's fault."""


def token_ids(values, vocab_size: int | None, what: str) -> list[int]:
    """Whole numbers in [0, vocab): an id outside the vocabulary would crash a step (a device assert on CUDA)
    at whatever step first draws it; here it is the line's error."""
    if not isinstance(values, list):
        raise ValueError(f"{what} must be a list")
    if not values:
        return values
    # The checks in C (set, min, max) for the common case; the loop below only finds the value to name.
    if set(map(type, values)) != {int} or min(values) < 0 or (vocab_size is not None and max(values) >= vocab_size):
        for value in values:
            if type(value) is not int:
                raise ValueError(f"{what} holds {value!r:.40}, not a token id")
            if value < 0 or (vocab_size is not None and value >= vocab_size):
                raise OutsideVocabulary(f"token id {value} is outside the vocabulary (0..{(vocab_size or 1) - 1})")
    return values


def parse_line(line: bytes, vocab_size: int | None, tokenizer, template_kwargs: dict | None) -> Sequence:
    """A JSONL line's tokens; ValueError (and friends) for a malformed line, TrainerInputError for a setup error."""
    row = loads_json(line)  # not UTF-8 or nested too deeply: a ValueError, the line's error
    if not isinstance(row, dict):
        raise ValueError("expected a JSON object")
    shape = shape_of(row)  # the one order every reader and regenerate's writer share (regenerated.py)
    if shape == "input_ids":
        ids = token_ids(row["input_ids"], vocab_size, "input_ids")
        mask = row.get("loss_mask", [1] * len(ids))
        if not isinstance(mask, list) or len(mask) != len(ids):
            raise ValueError("loss_mask and input_ids differ in length")
        return Sequence(ids, mask if set(mask) <= {0, 1} else [int(bool(m)) for m in mask])
    if shape is not None and tokenizer is None:
        raise TrainerInputError(f"{NEEDS_TOKENIZER[shape]} data needs a tokenizer; give --tokenizer PATH or --target PATH")
    if shape == "completion":
        if not isinstance(row["prompt"], str) or not isinstance(row["completion"], str):
            raise ValueError("prompt and completion must be strings")
        return completion_tokens(tokenizer, row["prompt"], row["completion"], vocab_size)
    if shape == "text":
        if not isinstance(row["text"], str):
            raise ValueError("text must be a string")
        return text_tokens(tokenizer, row["text"], vocab_size)
    if shape == "conversations":
        seq = conversation_tokens(tokenizer, row["conversations"], template_kwargs)
        token_ids(seq.input_ids, vocab_size, "the tokenized conversation")
        return seq
    raise ValueError("expected `input_ids`, `prompt` and `completion`, `text` or `conversations`")


def text_tokens(tokenizer, text: str, vocab_size: int | None) -> Sequence:
    """Plain text, every token supervised (no prompt: the drafter learns the text as it is)."""
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    token_ids(ids, vocab_size, "the tokenized text")
    return Sequence(ids, [1] * len(ids))


def completion_tokens(tokenizer, prompt: str, completion: str, vocab_size: int | None) -> Sequence:
    """A prompt and the target's continuation: the prompt's tokens then the completion's, as a serving engine
    tokenized the one and generated the other; only the completion is supervised."""
    prompt_ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    completion_ids = list(tokenizer(completion, add_special_tokens=False)["input_ids"])
    ids = token_ids(prompt_ids + completion_ids, vocab_size, "the tokenized prompt and completion")
    return Sequence(ids, [0] * len(prompt_ids) + [1] * len(completion_ids))


def conversation_tokens(tokenizer, messages, template_kwargs: dict | None) -> Sequence:
    """Token ids of the chat-templated conversation; loss mask on assistant tokens only.

    Each turn's tokens are the difference between the rendered prefixes, which is only right when each
    rendering is a prefix of the next (templates that rewrite earlier turns, such as Qwen3's thinking
    blocks, break that): such a conversation is refused rather than mislabelled.
    """
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ValueError("conversations must be a list of messages (objects with role and content)")
    ids: list[int] = []
    mask: list[int] = []
    for i, message in enumerate(messages):
        prefix = tokenizer.apply_chat_template(messages[: i + 1], tokenize=True, **(template_kwargs or {}))
        prefix = list(prefix if isinstance(prefix, list) else prefix["input_ids"])  # v5 returns a BatchEncoding
        if prefix[: len(ids)] != ids:
            raise TrainerInputError(f"the chat template renders turn {i + 1} so that the earlier turns change (rendered "
                                    f"prefixes must extend each other); fix the conversation or the template kwargs")
        new = prefix[len(ids):]
        ids += new
        mask += [1 if message.get("role") == "assistant" else 0] * len(new)
    return Sequence(ids, mask)


def read_prompts(path: str, tokenizer, template_kwargs: dict | None, limit: int) -> list[list[int]]:
    """A user's benchmark prompts (JSONL: `prompt` or `text` strings, or `conversations` rendered up to the assistant
    turn that follows, as serving would), tokenized; a bad line is `FILE:LINE`."""
    if tokenizer is None:
        raise TrainerInputError("--prompts needs a tokenizer: a run with --target/--tokenizer or a recipe target")
    prompts = []
    try:
        handle = open(path, "rb")
    except OSError as exc:
        raise TrainerInputError(f"--prompts {path}: {exc.strerror}") from None
    with handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = loads_json(line)
                if not isinstance(row, dict):
                    raise ValueError("expected a JSON object")
                text = row.get("prompt", row.get("text"))
                if isinstance(text, str):
                    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
                elif isinstance(row.get("conversations"), list):
                    messages = row["conversations"]
                    if messages and isinstance(messages[-1], dict) and messages[-1].get("role") == "assistant":
                        messages = messages[:-1]  # the answer is what the walk generates
                    rendered = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                                             **(template_kwargs or {}))
                    ids = list(rendered if isinstance(rendered, list) else rendered["input_ids"])
                else:
                    raise ValueError("expected `prompt`, `text` or `conversations`")
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                raise TrainerInputError(f"{path}:{number}: {exc}") from None
            if not ids:
                raise TrainerInputError(f"{path}:{number}: the prompt is empty once tokenized")
            prompts.append(ids)
            if len(prompts) == limit:
                break
    if not prompts:
        raise TrainerInputError(f"--prompts {path} holds no prompt")
    return prompts


def read_walk_prompts(path: str, tokenizer, template_kwargs: dict | None, limit: int, new_tokens: int,
                      positions: int) -> list[list[int]]:
    """read_prompts, each prompt checked to fit the target's positions with `new_tokens` generated after it."""
    prompts = read_prompts(path, tokenizer, template_kwargs, limit)
    too_long = [i for i, prompt in enumerate(prompts, 1) if len(prompt) + new_tokens > positions]
    if too_long:
        raise TrainerInputError(f"--prompts {path}: prompt {too_long[0]} ({len(prompts[too_long[0] - 1])} tokens) "
                                f"with {new_tokens} new tokens exceeds the target's {positions} positions; shorten "
                                f"it or pass a smaller --new-tokens")
    return prompts
