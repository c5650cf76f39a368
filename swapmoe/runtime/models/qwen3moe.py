"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-30B).

Each block: pre-norm GQA attention whose q and k are RMS-normalised per head before NEOX
RoPE, then a mixture of SwiGLU experts: softmax over all experts, top-k, the k weights
renormalised to sum to one.
"""
from __future__ import annotations

from swapmoe.runtime import layers
from swapmoe.runtime.models.base import Transformer


class Qwen3MoE(Transformer):
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
        h = h + self.gqa_attention(b, layers.rms_norm(h, b["attn_norm"], eps), positions, cache, qk_norm_per_head=True)
        x = layers.rms_norm(h, b["ffn_norm"], eps)
        return h + self.softmax_moe(i, b["router"], x, renormalize=True)
