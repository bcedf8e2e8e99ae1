"""transformers' KV cache as every supported version spells it (5.6.0, the training lock's, to 5.25.0, the newest):
the one module that touches its API, so a change upstream is read and fixed here (docs/trainer.md, "transformers").

- The forward's cache argument is `past_key_values` through 5.2x's deprecation and `cache` after (5.2x warns on
  the old name, 5.40 removes it): the name is read off the model's own signature, never off a version number.
- `crop(n)` took the length to keep until 5.17 deprecated it and 5.18 refused a positive n; a negative n, the
  number of positions to drop, means the same in every version.
- Decoding many rows at once (generated data, the walk's reference continuations) grows each layer in place.
"""

from __future__ import annotations

import functools
import inspect

from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


@functools.lru_cache(maxsize=None)
def _cache_argument(model_class: type) -> str:
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def forward_cached(model, input_ids, cache, **inputs):
    """The model's forward over `input_ids` appended to `cache` (filled in place), as this transformers names it;
    `inputs` (attention_mask, position_ids of left-padded rows) pass through."""
    unwrapped = getattr(model, "_orig_mod", model)  # a torch.compile'd module's forward takes *args, **kwargs
    return model(input_ids=input_ids, use_cache=True, **{_cache_argument(type(unwrapped)): cache}, **inputs)


def new_cache() -> DynamicCache:
    return DynamicCache()


def drop_last(cache: DynamicCache, positions: int) -> None:
    """Forget the cache's last `positions` positions (a rejected draft's)."""
    if positions > 0:
        cache.crop(-positions)


class GrowingLayer(DynamicLayer):
    """A DynamicLayer whose keys and values live in a buffer with room to grow. DynamicLayer copies the whole
    cache into a new tensor at every step (torch.cat: 46% of generating the tiny preset's data, 256 rows a
    chunk); here a step writes its position in place and attention reads a view of the filled part: the same
    values, so the same tokens. Only for a cache that only grows: crop() would leave the buffer's fill behind."""

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self.filled, self.key_buffer, self.value_buffer = 0, None, None
        end = self.filled + key_states.shape[-2]
        if self.key_buffer is None or end > self.key_buffer.shape[-2]:
            self.key_buffer = self._grown(self.key_buffer, key_states, 2 * end)
            self.value_buffer = self._grown(self.value_buffer, value_states, 2 * end)
        self.key_buffer[..., self.filled:end, :] = key_states
        self.value_buffer[..., self.filled:end, :] = value_states
        self.filled = end
        self.keys, self.values = self.key_buffer[..., :end, :], self.value_buffer[..., :end, :]
        return self.keys, self.values

    def _grown(self, buffer, states, room: int):
        grown = states.new_empty(*states.shape[:-2], room, states.shape[-1])
        if self.filled:
            grown[..., :self.filled, :] = buffer[..., :self.filled, :]
        return grown


def growing_cache() -> DynamicCache:
    """A DynamicCache that makes a GrowingLayer for each layer it meets (a transformers without the
    `layer_class_to_replicate` hook makes its own layers: slower, the same tokens)."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = GrowingLayer
    return cache
