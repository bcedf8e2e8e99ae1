"""What `envkit data synthesize` keeps of what a target writes: its filters and the held-out rule, on real strings
(the command end to end, against the chat target served by `envkit serve`, is in test_chat_target.py)."""

from __future__ import annotations

import pytest

from envkit.prompts.identity import is_held_out, normalised, prompt_id
from envkit.prompts.quality import degenerate, template_markers
from envkit.regen.synthesize import SynthRequest, rejection

pytestmark = pytest.mark.unit

CHATML = {"before_user": "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n",
          "user_to_assistant": "<|im_end|>\n<|im_start|>assistant\n",
          "assistant_to_user": "<|im_end|>\n<|im_start|>user\n", "user_stop": "<|im_end|>", "composable": True,
          "template_sha256": "0" * 64}


def request(**changes) -> SynthRequest:
    return SynthRequest(("http://127.0.0.1:1",), None, 16, CHATML, "T", **changes)


@pytest.mark.parametrize("text", [
    "the the the the the the the the the cat",  # one word over half
    "Hi\nHi\nHi\nok\nHi",  # one line over half
    "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!??",  # one character
    "Can you help me plan a trip to Japan? " * 12,  # a loop: compresses to almost nothing
])
def test_degenerate_continuations_are_caught(text):
    assert degenerate(text)
    assert rejection(text, "stop", request(), template_markers(CHATML)) == "degenerate"


@pytest.mark.parametrize("text", [
    "Can you help me plan a five-day trip to Japan in April on a small budget?",
    "Write a Python function that merges two sorted lists into one sorted list.",
    "I'm planning a garden: which vegetables grow well together in a small, shady backyard?",
])
def test_sensible_requests_are_kept(text):
    assert not degenerate(text) and rejection(text, "stop", request(), template_markers(CHATML)) is None


def test_each_rejection_has_its_reason():
    markers = template_markers(CHATML)
    assert "<|im_start|>user" in markers and "<|im_end|>" in markers
    assert rejection("A long request that ran out of tokens", "length", request(), markers) == "unfinished"
    assert rejection("", "stop", request(), markers) == "empty"
    assert rejection("Plan my day<|im_end|>\n<|im_start|>assistant\nSure", "stop", request(), markers) == "template"
    assert rejection("Hi?", "stop", request(), markers) == "too_short"
    assert rejection("x y " * 3000, "stop", request(max_chars=100), markers) == "too_long"


def test_uniqueness_and_the_held_out_split_follow_the_normalised_text():
    assert normalised("  Can you HELP me?\n") == normalised("can you help   me") == "can you help me"
    assert prompt_id(["Can you HELP me?"]) == prompt_id(["can you help me"])
    assert prompt_id(["a", "b"]) != prompt_id(["a b"])
    ids = [prompt_id([f"request number {n}"]) for n in range(4000)]
    held = [row_id for row_id in ids if is_held_out(row_id, 0.05)]
    assert 120 < len(held) < 280  # about 5%, decided by the digest alone
    assert held == [row_id for row_id in ids if is_held_out(row_id, 0.05)]  # and the same every time
