"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-30B).

Each block: pre-norm GQA attention whose q and k are RMS-normalised per head before NEOX
RoPE, then a mixture of SwiGLU experts: softmax over all experts, top-k, the k weights
renormalised to sum to one.
"""

from __future__ import annotations

from swapmoe.runtime import layers
from swapmoe.runtime.models.base import Gating, Router, Transformer


class Qwen3MoE(Transformer):
    router = Router(Gating.SOFTMAX, normalize=True)

    def setup(self):
        self.rope = self.hp.rope(neox=True)

    def load_block(self, i):
        return self.w.block(i, self.w.attention(i, qk_norm=True), self.w.moe(i))

    def block(self, i, h, step, cache):
        b, eps = self.blocks[i], self.hp.rms_eps
        h = h + self.gqa_attention(
            b.attn, layers.rms_norm(h, b.attn_norm, eps), step.positions, cache, qk_norm_per_head=True
        )
        return h + self.moe(i, layers.rms_norm(h, b.ffn_norm, eps), step)
