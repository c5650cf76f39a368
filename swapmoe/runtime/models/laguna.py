"""Laguna (poolside Laguna-XS.2, S-2.1, M.1).

Each block: pre-norm GQA attention whose head count may differ per layer, q and k RMS-normed per
head, NEOX RoPE; the heads' output times softplus(W_gate·x) — one scalar per head or one per
element, told apart by the gate's width — then the output projection. With a sliding window,
layers alternate between full attention (YaRN, `rope.dimension_count`, `rope.freq_base`) and
sliding-window attention (plain RoPE with `rope.dimension_count_swa`, `rope.freq_base_swa`); the
file's `attention.sliding_window_pattern` says which, else every 4th layer is full, from layer 0.
The first `leading_dense_block_count` layers have a dense SwiGLU FFN; the others sigmoid-routed
experts with a selection bias, weights renormalised and scaled, plus an always-on shared expert.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from gguf import Keys

from swapmoe.errors import SwapmoeError
from swapmoe.runtime import layers
from swapmoe.runtime.linear import Weight, linear, linear_each
from swapmoe.runtime.models.base import Attention, Gating, MoE, Router, Transformer, _per_layer, sliding_window_layers

F32 = np.float32


@dataclass(frozen=True)
class GatedAttention:
    """GQA weights and the output gate: `gate` has one row per head (per_head) or per element."""

    attn: Attention
    gate: Weight
    per_head: bool


class Laguna(Transformer):
    def setup(self):
        g, hp = self.gguf, self.hp
        gating = g.arch_get(Keys.LLM.EXPERT_GATING_FUNC, Gating.SIGMOID)
        if gating != Gating.SIGMOID:
            raise SwapmoeError(f"{g.path}: laguna expects sigmoid expert gating (2), not {gating}")
        self.router = Router(
            Gating.SIGMOID,
            normalize=bool(g.arch_get(Keys.LLM.EXPERT_WEIGHTS_NORM, False)),
            scale=g.arch_get(Keys.LLM.EXPERT_WEIGHTS_SCALE, 0.0),
        )
        self.n_heads = _per_layer(g.arch_get(Keys.Attention.HEAD_COUNT), hp.n_layer)
        self.n_dense = g.arch_get(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, 0)
        self.window = g.arch_get(Keys.Attention.SLIDING_WINDOW, 0)
        self.is_swa = sliding_window_layers(g, hp.n_layer, 4, dense_first=True) if self.window else [False] * hp.n_layer
        self.rope = hp.rope(neox=True)
        self.swa_rope = layers.Rope(
            g.arch_get(Keys.Rope.DIMENSION_COUNT_SWA, hp.n_rot),
            g.arch_get(Keys.Rope.FREQ_BASE_SWA, hp.rope_base),
            neox=True,
        )

    def load_block(self, i):
        w, p = self.w, f"blk.{i}."
        gate = w.matrix(p + "attn_gate.weight")
        H, hd = self.n_heads[i], self.hp.head_dim
        if gate.rows not in (H, H * hd):
            raise SwapmoeError(
                f"{self.gguf.path}: {p}attn_gate.weight has {gate.rows} rows; expected {H} (per head) "
                f"or {H * hd} (per element)"
            )
        attn = GatedAttention(w.attention(i, qk_norm=True), gate, per_head=gate.rows == H)
        if i < self.n_dense:
            return w.block(i, attn, w.dense_ffn(i))
        return w.block(i, attn, w.moe(i, selection_bias=True, shared=True))

    def block(self, i, h, step, cache):
        b, eps = self.blocks[i], self.hp.rms_eps
        h = h + self.attention(i, b.attn, layers.rms_norm(h, b.attn_norm, eps), step.positions, cache)
        x = layers.rms_norm(h, b.ffn_norm, eps)
        if not isinstance(b.ffn, MoE):
            return h + b.ffn(x)
        return h + (self.moe(i, x, step) + b.ffn.shared(x))

    def attention(self, i: int, ga: GatedAttention, x, positions, cache: layers.KVCache):
        """GQA with layer i's head count and RoPE, its output gated by softplus(W_gate·x)."""
        hp, a, T_ = self.hp, ga.attn, len(x)
        H, hd = self.n_heads[i], hp.head_dim
        q, k, v, gate = linear_each(x, a.wq, a.wk, a.wv, ga.gate)
        q = layers.rms_norm(q.reshape(T_, H, hd), a.q_norm, hp.rms_eps)
        k = layers.rms_norm(k.reshape(T_, hp.n_head_kv, hd), a.k_norm, hp.rms_eps)
        rope = self.swa_rope if self.is_swa[i] else self.rope
        cos, sin = rope.tables(positions)
        keys, values = cache.append(rope.apply(k, cos, sin), v.reshape(T_, hp.n_head_kv, hd))
        out = layers.attention(
            rope.apply(q, cos, sin),
            keys,
            values,
            positions,
            1.0 / math.sqrt(hd),
            self.window if self.is_swa[i] else None,
        )
        gate = layers.softplus(gate)
        out = out.reshape(T_, H, hd) * gate[:, :, None] if ga.per_head else out * gate
        return linear(a.wo, out.reshape(T_, H * hd))
