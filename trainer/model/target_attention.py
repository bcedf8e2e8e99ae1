"""The target's attention for packed rows: flex_attention over a document-causal BlockMask.

transformers' own packed format (position_ids restarting per document) builds a dense (S, S) mask
and SDPA then runs its masked kernel over every query-key pair; a packed 3072-token row of a few
documents needs only the blocks inside each document's causal triangle. This attention function,
registered with transformers under NAME, runs compiled flex_attention when the model is handed a
BlockMask and is transformers' SDPA function for everything else (unpacked rows, the walk, eval),
so one model serves both.
"""

from __future__ import annotations

import functools

import torch

from trainer.model.masks import FLEX_BLOCK, block_mask_from_tiles, document_starts

NAME = "envkit_documents"


_COMPILED_FLEX = []  # filled once, outside any traced region


def _compiled_flex():
    """torch.compile(flex_attention), made once: one graph per bucket shape, compiled in warm-up like the drafter's.
    Not functools.cache: a compiled target inlines this call, and dynamo warns on every lru_cache-wrapped call it
    traces (it cannot know the cache is pure)."""
    if not _COMPILED_FLEX:
        from torch.nn.attention.flex_attention import flex_attention

        _COMPILED_FLEX.append(torch.compile(flex_attention, dynamic=False))
    return _COMPILED_FLEX[0]


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function contract: (B, heads, S, d) inputs -> ((B, S, heads, d), weights)."""
    from torch.nn.attention.flex_attention import BlockMask
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if not isinstance(attention_mask, BlockMask):
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    out = _compiled_flex()(query, key, value, block_mask=attention_mask, scale=scaling,
                           enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


@functools.cache
def install() -> str:
    """Register NAME with transformers (attention and mask functions); returns NAME."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)  # masks for unpacked calls are SDPA's
    return NAME


def document_mask(doc_ids: torch.Tensor):
    """doc_ids (B, S), -1 = padding (a document of its own) -> BlockMask: a query sees keys of its own
    document at or before it. Tiles from the document boundaries (no pass over all S^2 pairs)."""
    from torch.nn.attention.flex_attention import create_block_mask

    def same_document_causal(b, h, q_idx, kv_idx):
        return (doc_ids[b, q_idx] == doc_ids[b, kv_idx]) & (kv_idx <= q_idx)

    batch, length = doc_ids.shape
    if length % FLEX_BLOCK:
        return create_block_mask(same_document_causal, batch, None, length, length, device=doc_ids.device)
    tiles = length // FLEX_BLOCK
    first = torch.arange(tiles, device=doc_ids.device) * FLEX_BLOCK  # each tile's first and last position
    last = first + FLEX_BLOCK - 1
    # Query tile i sees keys from the start of its first query's document to its last query.
    seen_from = document_starts(doc_ids)[:, first]  # (B, Qt)
    partial = (first[None, None, :] <= last[None, :, None]) & (last[None, None, :] >= seen_from[:, :, None])
    # A key tile strictly before the query tile, all of one document that every query of the tile is in.
    one_doc = (doc_ids[:, first] == doc_ids[:, last])  # (B, T)
    same = doc_ids[:, first][:, :, None] == doc_ids[:, first][:, None, :]  # (B, Qt, Kt)
    before = first[None, None, :] < first[None, :, None]
    full = before & same & one_doc[:, :, None] & one_doc[:, None, :]
    return block_mask_from_tiles(partial, full, same_document_causal, length, length)
