"""The KV cache of decoding many rows at once (generated data, the walk's reference continuations): transformers'
DynamicCache, its layers growing in place."""

from __future__ import annotations

from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


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
