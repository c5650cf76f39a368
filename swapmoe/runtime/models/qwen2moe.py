"""Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B).

Each block: pre-norm GQA attention with q/k/v biases and NEOX RoPE; then routed SwiGLU
experts (softmax over all, top-k, weights *not* renormalised) plus an always-on shared
expert scaled by a per-token sigmoid gate.
"""

from __future__ import annotations

from swapmoe.runtime import layers
from swapmoe.runtime.linear import linear
from swapmoe.runtime.models.base import Gating, Router, Transformer


class Qwen2MoE(Transformer):
    router = Router(Gating.SOFTMAX, normalize=False)

    def setup(self):
        self.rope = self.hp.rope(neox=True)

    def load_block(self, i):
        return self.w.block(i, self.w.attention(i), self.w.moe(i, shared=True, shared_gate=True))

    def block(self, i, h, step, cache):
        b, eps = self.blocks[i], self.hp.rms_eps
        h = h + self.gqa_attention(b.attn, layers.rms_norm(h, b.attn_norm, eps), step.positions, cache)
        x = layers.rms_norm(h, b.ffn_norm, eps)
        routed = self.moe(i, x, step)
        g = linear(b.ffn.shared_gate, x)
        gate = layers.silu(g) / g  # llama.cpp's sigmoid for this gate (NaN at exactly 0, as there)
        return h + (routed + b.ffn.shared(x) * gate)
