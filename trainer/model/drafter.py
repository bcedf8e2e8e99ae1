"""The DFlash drafter: fused target context, Qwen3-style layers with KV injection, shared frozen head.

Shapes: B batch, S context (bucket) length, N blocks per sequence, bs block size, Q = N*bs,
H hidden, h heads, kvh kv heads, d head dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainer.common.errors import TrainerInputError
from trainer.config.schema import TrainConfig
from trainer.model.masks import dense_mask, flex_block_mask


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        # The input's dtype out: under bf16 autocast q, k and v must share one dtype for attention.
        return (self.weight * x.to(dtype)).to(dtype)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding as Qwen3 applies it (rotate_half). x (B, heads, T, d), positions (B, T)."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))  # (d/2,)
    angles = positions.float()[..., None] * inv_freq  # (B, T, d/2)
    emb = torch.cat([angles, angles], dim=-1)[:, None]  # (B, 1, T, d)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class SdpaAttention:
    """Dense boolean mask through scaled_dot_product_attention: CPU, and any device as a fallback."""

    name = "sdpa"

    @staticmethod
    def prepare(anchors: torch.Tensor, context_len: int, block_size: int, doc_ids: torch.Tensor | None = None):
        """Built once per step, outside the compiled region, shared by every layer."""
        mask = dense_mask(anchors, context_len, block_size, doc_ids)  # (B, Q, S+Q)
        # A padding block's rows see nothing; give them one key so softmax stays finite, zero them after.
        empty = ~mask.any(-1, keepdim=True)  # (B, Q, 1)
        mask = mask | (empty & (torch.arange(mask.shape[-1], device=mask.device) == 0))
        return mask[:, None], empty[:, None]  # (B, 1, Q, S+Q), (B, 1, Q, 1)

    @staticmethod
    def attend(q, k, v, prepared):
        mask, empty = prepared
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return out.masked_fill(empty, 0.0)


class FlexAttention:
    """flex_attention with a BlockMask built from the same rule (fused and sparse when compiled)."""

    name = "flex"

    @staticmethod
    def prepare(anchors: torch.Tensor, context_len: int, block_size: int, doc_ids: torch.Tensor | None = None):
        return flex_block_mask(anchors, context_len, block_size, doc_ids)

    @staticmethod
    def attend(q, k, v, block_mask):
        from torch.nn.attention.flex_attention import flex_attention

        return flex_attention(q, k, v, block_mask=block_mask, enable_gqa=True)


BACKENDS = {"sdpa": SdpaAttention, "flex": FlexAttention}
# Evaluation and the walk run the drafter outside the compiled loss: flex_attention there would run eager,
# materialising every score (HAZARDS.md H8, and torch warns so); SDPA with the dense mask of the same rule runs
# fused kernels uncompiled, on every device (both backends agree: tests/trainer/test_model.py).
EVAL_ATTENTION = SdpaAttention


class DrafterAttention(nn.Module):
    """The attention's weights, named as Qwen3's `self_attn` (the reference DFlash model loads them by these names).
    The layer runs them: the same k/v projections serve the block and the injected context."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, eps: float):
        super().__init__()
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)


class DrafterMLP(nn.Module):
    """SwiGLU, named as Qwen3's `mlp`."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class DrafterLayer(nn.Module):
    # Modules are made in the order of the first layout (norm, attention, norm, MLP): the same seed draws the same
    # weights, and an optimizer state saved by it (parameters by index) still lines up.
    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int, theta: float,
                 eps: float):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.theta = heads, kv_heads, head_dim, theta
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = DrafterAttention(hidden, heads, kv_heads, head_dim, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = DrafterMLP(hidden, intermediate)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, n, self.head_dim).transpose(1, 2)  # (B, n, T, d)

    def forward(self, x, context, ctx_pos, block_pos, attention, prepared):
        # x (B, Q, H) block stream; context (B, S, H) fused target states, already normalised.
        attn = self.self_attn
        h = self.input_layernorm(x)
        q = rope(attn.q_norm(self._heads(attn.q_proj(h), self.heads)), block_pos, self.theta)  # (B, h, Q, d)
        # KV injection: the same k/v projections over the target context and over the block tokens.
        k_ctx = rope(attn.k_norm(self._heads(attn.k_proj(context), self.kv_heads)), ctx_pos, self.theta)
        k_blk = rope(attn.k_norm(self._heads(attn.k_proj(h), self.kv_heads)), block_pos, self.theta)
        v_ctx = self._heads(attn.v_proj(context), self.kv_heads)
        v_blk = self._heads(attn.v_proj(h), self.kv_heads)
        k = torch.cat([k_ctx, k_blk], dim=2)  # (B, kvh, S+Q, d)
        v = torch.cat([v_ctx, v_blk], dim=2)
        out = attention.attend(q, k, v, prepared)  # (B, h, Q, d)
        x = x + attn.o_proj(out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1))
        return x + self.mlp(self.post_attention_layernorm(x))


class Drafter(nn.Module):
    """Predicts block slots 1..bs-1 from the anchor token and the target's tapped hidden states."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int, theta: float,
                 num_layers: int, num_taps: int, block_size: int, eps: float = 1e-6):
        super().__init__()
        self.block_size = block_size
        # Named as the reference DFlash model names them: fc and hidden_norm fuse the tapped states, norm ends.
        self.fc = nn.Linear(num_taps * hidden, hidden, bias=False)
        self.hidden_norm = RMSNorm(hidden, eps)
        self.layers = nn.ModuleList(DrafterLayer(hidden, heads, kv_heads, head_dim, intermediate, theta, eps)
                                    for _ in range(num_layers))
        self.norm = RMSNorm(hidden, eps)

    def forward(self, tapped: torch.Tensor, block_embeds: torch.Tensor, anchors: torch.Tensor, attention,
                prepared=None, positions: torch.Tensor | None = None) -> torch.Tensor:
        """tapped (B, S, taps*H), block_embeds (B, Q, H) from the shared embedding -> hidden (B, Q, H).

        `prepared` is attention.prepare(anchors, S, bs, doc_ids), built outside any compiled region.
        `positions` (B, S) are RoPE positions, restarting at each document of a packed row (default 0..S-1).
        """
        if prepared is None:
            prepared = attention.prepare(anchors, tapped.shape[1], self.block_size)
        batch, context_len, _ = tapped.shape
        context = self.hidden_norm(self.fc(tapped))  # (B, S, H)
        if positions is None:  # one document from 0; the anchor may lie just past the context (decoding)
            ctx_pos = torch.arange(context_len, device=tapped.device).expand(batch, -1)  # (B, S)
            anchor_pos = anchors.clamp(min=0)  # (B, N)
        else:
            ctx_pos = positions
            anchor_pos = positions.gather(1, anchors.clamp(min=0))  # (B, N): the anchor's position in its document
        slot = torch.arange(self.block_size, device=tapped.device).repeat(anchors.shape[1])  # (Q,)
        block_pos = anchor_pos.repeat_interleave(self.block_size, dim=1) + slot  # (B, Q)
        x = block_embeds
        for layer in self.layers:
            x = layer(x, context, ctx_pos, block_pos, attention, prepared)
        return self.norm(x)


def build_drafter(cfg, target_cfg, num_taps: int) -> Drafter:
    return Drafter(hidden=target_cfg.hidden_size, heads=target_cfg.num_heads, kv_heads=target_cfg.num_kv_heads,
                   head_dim=target_cfg.head_dim, intermediate=cfg.intermediate_size or target_cfg.intermediate_size,
                   theta=target_cfg.rope_theta, num_layers=cfg.num_layers, num_taps=num_taps,
                   block_size=cfg.block_size, eps=target_cfg.rms_norm_eps)


def pick_attention(cfg: TrainConfig, device: torch.device):
    backend = cfg.attention
    if backend == "auto":
        backend = "flex" if device.type == "cuda" else "sdpa"
    if backend == "flex" and device.type == "cpu":
        raise TrainerInputError("flex_attention has no backward on CPU (HAZARDS.md H7); use --attention sdpa")
    return backend, BACKENDS[backend]
