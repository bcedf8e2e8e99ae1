"""Model FLOPs of one training sequence, for MFU: the matmul work the step must do, nothing recomputed.

For a sequence of S tokens with N anchors of block size B (Q = N*B block positions), hidden H,
vocab V, target layers L_t with per-layer weights P_t, drafter layers L_d with P_d, taps T:

    target forward      2 * P_t * L_t * S  +  attention 2 * S^2 * H_q * L_t        (causal: half of 4*S^2*H_q)
    drafter fwd + bwd   3 * [2 * P_d * L_d * Q  +  2 * P_kv * L_d * S  +  2 * T*H*H * S  +  attention]
    LM head             2 * H * V * Q forward  +  2 * H * V * Q input gradient (frozen: no weight gradient)

H_q = heads * head_dim, P_kv = the k/v projections (they also run over the S context positions),
drafter attention = 2 * 2 * H_q * (visible keys summed over queries) with about S/2 + B visible
keys per query. Qwen3-8B, S=3072, N=512, B=16: target 45.5 TFLOP, drafter 52.9, head 20.4:
118.7 TFLOP (the issue's estimate of 127 counts the target's 8.2B parameters, embedding and LM
head included, where the step only runs its 36 decoder layers: 2 x 1.2B x 3072 = 7.5 TFLOP).
"""

from __future__ import annotations

from trainer.config.schema import TrainConfig


def _layer_weights(hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int) -> tuple[int, int]:
    q_o = 2 * hidden * heads * head_dim
    kv = 2 * hidden * kv_heads * head_dim
    mlp = 3 * hidden * intermediate
    return q_o + kv + mlp, kv


def sequence_flops(cfg: TrainConfig, seq_len: int, anchors: int | None = None) -> dict[str, float]:
    """One unpacked sequence of seq_len tokens filling its row."""
    anchors = cfg.num_anchors if anchors is None else anchors
    return _flops(cfg, seq_len, seq_len ** 2, anchors)


def useful_flops(cfg: TrainConfig, useful_tokens: int, doc_tokens_sq: int, anchors: int) -> float:
    """Model FLOPs of the real work in a (packed) batch: tokens that are not padding, each document's own
    causal attention (sum of squared lengths), and the anchors actually placed. Padding and attention
    across documents count nothing, so MFU on this is useful-token MFU."""
    return _flops(cfg, useful_tokens, doc_tokens_sq, anchors)["total"]


def _flops(cfg: TrainConfig, tokens: int, doc_tokens_sq: int, anchors: int) -> dict[str, float]:
    """An anchor's expected context is half its document, weighted by length: doc_tokens_sq / (2 * tokens)."""
    t, d = cfg.target, cfg.drafter
    q_positions = anchors * d.block_size
    hq = t.num_heads * t.head_dim
    target_layer, _ = _layer_weights(t.hidden_size, t.num_heads, t.num_kv_heads, t.head_dim, t.intermediate_size)
    drafter_layer, kv = _layer_weights(t.hidden_size, t.num_heads, t.num_kv_heads, t.head_dim,
                                       d.intermediate_size or t.intermediate_size)
    taps = len(d.target_layer_ids) if d.target_layer_ids else d.num_layers
    target = 2 * target_layer * t.num_layers * tokens + 2 * doc_tokens_sq * hq * t.num_layers
    visible = q_positions * (doc_tokens_sq / (2 * max(tokens, 1)) + d.block_size)
    drafter_fwd = (2 * drafter_layer * d.num_layers * q_positions + 2 * kv * d.num_layers * tokens
                   + 2 * taps * t.hidden_size * t.hidden_size * tokens + 4 * hq * visible * d.num_layers)
    head = 4 * t.hidden_size * t.vocab_size * q_positions
    return {"target": float(target), "drafter": float(3 * drafter_fwd), "lm_head": float(head),
            "total": float(target + 3 * drafter_fwd + head)}
