"""The drafter's attention mask, as a dense boolean tensor (SDPA) and as a mask_mod (flex_attention).

Keys/values are laid out as [context (S) | block_0 | block_1 | ... ], each block `block_size` long.
A query in block j sees context positions strictly before anchor j that belong to anchor j's
document (a packed row holds several; `doc_ids` (B, S) names each position's), and every position
of its own block; nothing else. A padding block (anchor < 0) sees nothing.
"""

from __future__ import annotations

import torch


def dense_mask(anchors: torch.Tensor, context_len: int, block_size: int,
               doc_ids: torch.Tensor | None = None) -> torch.Tensor:
    """anchors (B, N) long, negative = padding -> bool (B, N*block_size, context_len + N*block_size)."""
    batch, num_blocks = anchors.shape
    q_block = torch.arange(num_blocks * block_size, device=anchors.device) // block_size  # (Q,)
    q_anchor = anchors[:, q_block]  # (B, Q)
    ctx_pos = torch.arange(context_len, device=anchors.device)  # (S,)
    sees_ctx = ctx_pos[None, None, :] < q_anchor[:, :, None]  # (B, Q, S)
    if doc_ids is not None:
        anchor_doc = doc_ids.gather(1, q_anchor.clamp(min=0))  # (B, Q)
        sees_ctx = sees_ctx & (doc_ids[:, None, :] == anchor_doc[:, :, None])
    kv_block = torch.arange(num_blocks * block_size, device=anchors.device) // block_size
    sees_block = (q_block[:, None] == kv_block[None, :]).expand(batch, -1, -1)  # (B, Q, N*bs)
    mask = torch.cat([sees_ctx, sees_block], dim=-1)
    return mask & (q_anchor >= 0)[:, :, None]


def make_mask_mod(anchors: torch.Tensor, context_len: int, block_size: int, doc_ids: torch.Tensor | None = None):
    """The same rule as `dense_mask`, as a flex_attention mask_mod(b, h, q_idx, kv_idx)."""

    def mask_mod(b, h, q_idx, kv_idx):
        block = q_idx // block_size
        anchor = anchors[b, block]
        in_ctx = kv_idx < context_len
        sees_ctx = in_ctx & (kv_idx < anchor)
        if doc_ids is not None:
            same_doc = doc_ids[b, kv_idx.clamp(max=context_len - 1)] == doc_ids[b, anchor.clamp(min=0)]
            sees_ctx = sees_ctx & same_doc
        sees_block = (~in_ctx) & ((kv_idx - context_len) // block_size == block)
        return (anchor >= 0) & (sees_ctx | sees_block)

    return mask_mod


def flex_block_mask(anchors: torch.Tensor, context_len: int, block_size: int, doc_ids: torch.Tensor | None = None):
    """A BlockMask for flex_attention, built on the anchors' device."""
    from torch.nn.attention.flex_attention import create_block_mask

    batch, num_blocks = anchors.shape
    q_len = num_blocks * block_size
    return create_block_mask(make_mask_mod(anchors, context_len, block_size, doc_ids), batch, None, q_len,
                             context_len + q_len, device=anchors.device)
