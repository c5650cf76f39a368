"""OLMoE (OLMoE-1B-7B).

Each block: pre-norm attention whose whole q and k projections are RMS-normalised before
being split into heads, NEOX RoPE; then SwiGLU experts with softmax routing, top-k, and
no renormalisation of the k weights.
"""
from __future__ import annotations

from swapmoe.runtime import layers
from swapmoe.runtime.models.base import Transformer


class OLMoE(Transformer):
    def __init__(self, gguf, store, hp=None):
        super().__init__(gguf, store, hp)
        self.rope = self.hp.rope(neox=True)
        self.blocks = [{
            **self.attention_weights(i, q_norm=True, k_norm=True),
            "attn_norm": self.w.vector(f"blk.{i}.attn_norm.weight"),
            "ffn_norm": self.w.vector(f"blk.{i}.ffn_norm.weight"),
            "router": self.w.matrix(f"blk.{i}.ffn_gate_inp.weight"),
        } for i in range(self.hp.n_layer)]

    def block(self, i, h, positions, cache):
        b, eps = self.blocks[i], self.hp.rms_eps
        h = h + self.gqa_attention(b, layers.rms_norm(h, b["attn_norm"], eps), positions, cache,
                                   qk_norm_per_head=False)
        x = layers.rms_norm(h, b["ffn_norm"], eps)
        return h + self.softmax_moe(i, b["router"], x, renormalize=False)
