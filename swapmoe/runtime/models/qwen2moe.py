"""Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B).

Each block: pre-norm GQA attention with q/k/v biases and NEOX RoPE; then routed SwiGLU
experts (softmax over all, top-k, weights *not* renormalised) plus an always-on shared
expert scaled by a per-token sigmoid gate.
"""
from __future__ import annotations

from swapmoe.runtime import layers
from swapmoe.runtime.linear import linear
from swapmoe.runtime.models.base import Transformer


class Qwen2MoE(Transformer):
    def __init__(self, gguf, store, hp=None):
        super().__init__(gguf, store, hp)
        self.rope = self.hp.rope(neox=True)
        w = self.w
        self.blocks = [{
            **self.attention_weights(i),
            "attn_norm": w.vector(f"blk.{i}.attn_norm.weight"),
            "ffn_norm": w.vector(f"blk.{i}.ffn_norm.weight"),
            "router": w.matrix(f"blk.{i}.ffn_gate_inp.weight"),
            "shared_gate": w.matrix(f"blk.{i}.ffn_gate_inp_shexp.weight"),
            "shared": [w.matrix(f"blk.{i}.ffn_{p}_shexp.weight") for p in ("gate", "up", "down")],
        } for i in range(self.hp.n_layer)]

    def block(self, i, h, positions, cache):
        b, eps = self.blocks[i], self.hp.rms_eps
        h = h + self.gqa_attention(b, layers.rms_norm(h, b["attn_norm"], eps), positions, cache)
        x = layers.rms_norm(h, b["ffn_norm"], eps)
        routed = self.softmax_moe(i, b["router"], x, renormalize=False)
        g = linear(b["shared_gate"], x)
        gate = layers.silu(g) / g  # llama.cpp's sigmoid for this gate (NaN at exactly 0, as there)
        return h + (routed + self.dense_ffn(*b["shared"], x) * gate)
