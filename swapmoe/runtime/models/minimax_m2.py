"""MiniMax-M2 (MiniMax-M2, M2.1: 230B-A10B).

Each block: pre-norm GQA attention whose whole q and k projections are RMS-normalised before
being split into heads; NEOX RoPE on only the first `rope.dimension_count` dims of each head
(64 of 128); then SwiGLU experts chosen by sigmoid scores plus a per-expert selection bias
(`exp_probs_b`), weighted by the unbiased scores renormalised to sum to one.
"""
from __future__ import annotations

from swapmoe.errors import SwapmoeError
from swapmoe.runtime import layers
from swapmoe.runtime.linear import linear
from swapmoe.runtime.models.base import Transformer

GATING_SIGMOID = 2  # llama.cpp's expert_gating_func value; the only one MiniMax-M2 uses


class MiniMaxM2(Transformer):
    def __init__(self, gguf, store, hp=None):
        super().__init__(gguf, store, hp)
        gating = gguf.arch_get("expert_gating_func")
        if gating != GATING_SIGMOID:  # llama.cpp aborts without the key too
            raise SwapmoeError(f"{gguf.path}: minimax-m2 needs expert_gating_func = 2 (sigmoid), found {gating}")
        self.rope = self.hp.rope(neox=True)  # n_rot < head_dim: the rest of each head passes through
        w = self.w
        self.blocks = [{
            **self.attention_weights(i, q_norm=True, k_norm=True),
            "attn_norm": w.vector(f"blk.{i}.attn_norm.weight"),
            "ffn_norm": w.vector(f"blk.{i}.ffn_norm.weight"),
            "router": w.matrix(f"blk.{i}.ffn_gate_inp.weight"),
            "selection_bias": w.vector(f"blk.{i}.exp_probs_b.bias"),
        } for i in range(self.hp.n_layer)]

    def block(self, i, h, positions, cache):
        b, eps = self.blocks[i], self.hp.rms_eps
        h = h + self.gqa_attention(b, layers.rms_norm(h, b["attn_norm"], eps), positions, cache,
                                   qk_norm_per_head=False)
        x = layers.rms_norm(h, b["ffn_norm"], eps)
        return h + self.moe(i, linear(b["router"], x), x, "sigmoid", selection_bias=b["selection_bias"],
                            normalize=True)
