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


FLEX_BLOCK = 128  # flex_attention's default tile, rows and columns


def flex_block_mask(anchors: torch.Tensor, context_len: int, block_size: int, doc_ids: torch.Tensor | None = None):
    """A BlockMask for flex_attention, built on the anchors' device.

    create_block_mask evaluates mask_mod at every (query, key) pair: for 512 anchors x 16 over a
    3072-token context that is 92 M points, several milliseconds of a step on an H200. The tiles
    are known from the anchors alone (a tile of queries sees the context tiles its anchors' ranges
    touch, and its own diagonal tile of block keys), so when the tiles line up they are computed
    directly; mask_mod still decides inside each tile.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    batch, num_blocks = anchors.shape
    q_len = num_blocks * block_size
    mask_mod = make_mask_mod(anchors, context_len, block_size, doc_ids)
    if context_len % FLEX_BLOCK or q_len % FLEX_BLOCK or FLEX_BLOCK % block_size:
        return create_block_mask(mask_mod, batch, None, q_len, context_len + q_len, device=anchors.device)
    return _tiles_from_anchors(anchors, context_len, block_size, doc_ids, mask_mod)


def document_starts(doc_ids: torch.Tensor) -> torch.Tensor:
    """doc_ids (B, S) -> (B, S): the position at which each position's document begins."""
    positions = torch.arange(doc_ids.shape[1], device=doc_ids.device).expand_as(doc_ids)
    begins = torch.ones_like(doc_ids, dtype=torch.bool)
    begins[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    return torch.where(begins, positions, torch.zeros_like(positions)).cummax(dim=1).values


def _tiles_from_anchors(anchors, context_len, block_size, doc_ids, mask_mod):
    batch, num_blocks = anchors.shape
    q_tiles = num_blocks * block_size // FLEX_BLOCK
    ctx_tiles = context_len // FLEX_BLOCK
    valid = anchors >= 0
    anchor = anchors.clamp(min=0)
    start = document_starts(doc_ids).gather(1, anchor) if doc_ids is not None else torch.zeros_like(anchor)
    # Anchor j sees context [start_j, anchor_j); tile c spans [c*T, (c+1)*T).
    tile_lo = torch.arange(ctx_tiles, device=anchors.device) * FLEX_BLOCK
    tile_hi = tile_lo + FLEX_BLOCK
    touches = valid[..., None] & (start[..., None] < tile_hi) & (anchor[..., None] > tile_lo)  # (B, N, C)
    covers = valid[..., None] & (start[..., None] <= tile_lo) & (anchor[..., None] >= tile_hi)
    per_tile = FLEX_BLOCK // block_size  # anchors whose blocks make one tile of queries
    touches = touches.view(batch, q_tiles, per_tile, ctx_tiles)
    covers = covers.view(batch, q_tiles, per_tile, ctx_tiles)
    full_ctx = covers.all(2)  # (B, Qt, C)
    partial_ctx = touches.any(2)
    # Block keys: query tile i meets only key tile i of the block part (block-diagonal inside it).
    own = torch.eye(q_tiles, dtype=torch.bool, device=anchors.device).expand(batch, -1, -1)
    own = own & valid.view(batch, q_tiles, per_tile).any(2)[..., None]
    partial = torch.cat([partial_ctx, own], dim=2)  # (B, Qt, C + Qt)
    full = torch.cat([full_ctx, torch.zeros_like(own)], dim=2)
    return block_mask_from_tiles(partial, full, mask_mod, num_blocks * block_size, context_len + num_blocks * block_size)


def block_mask_from_tiles(partial: torch.Tensor, full: torch.Tensor, mask_mod, q_len: int, kv_len: int):
    """(B, Qt, Kt) bool tiles -> BlockMask. `partial` tiles run mask_mod; `full` tiles (disjoint from
    partial) are known all-visible and skip it; every other tile is skipped."""
    from torch.nn.attention.flex_attention import BlockMask

    def ordered(tiles):  # per query tile: the count of its key tiles, and their indices first
        tiles = tiles[:, None]  # (B, 1, Qt, Kt): one mask for every head
        counts = tiles.sum(-1, dtype=torch.int32)
        return counts, torch.argsort(tiles.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)

    partial = partial & ~full
    return BlockMask.from_kv_blocks(*ordered(partial), *ordered(full), BLOCK_SIZE=FLEX_BLOCK, mask_mod=mask_mod,
                                    seq_lengths=(q_len, kv_len))
