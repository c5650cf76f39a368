"""Llama with experts (Mixtral-8x7B, Mixtral-8x22B).

Each block: pre-norm GQA attention with adjacent-pair (NORM) RoPE — the converter permutes
Q/K rows so this equals Hugging Face's rotate-half — and optional llama3-style frequency
factors; then SwiGLU experts (softmax, top-k, renormalised), or a dense SwiGLU FFN on
layers without a router.
"""

from __future__ import annotations

from swapmoe.runtime import layers
from swapmoe.runtime.models.base import Gating, MoE, Router, Transformer


class Llama(Transformer):
    router = Router(Gating.SOFTMAX, normalize=True)

    def setup(self):
        self.rope = self.hp.rope(neox=False, freq_factors=self.w.optional_vector("rope_freqs.weight"))

    def load_block(self, i):
        w = self.w
        ffn = w.moe(i) if w.has(f"blk.{i}.ffn_gate_inp.weight") else w.dense_ffn(i)
        return w.block(i, w.attention(i), ffn)

    def block(self, i, h, step, cache):
        b, eps = self.blocks[i], self.hp.rms_eps
        h = h + self.gqa_attention(b.attn, layers.rms_norm(h, b.attn_norm, eps), step.positions, cache)
        x = layers.rms_norm(h, b.ffn_norm, eps)
        return h + (self.moe(i, x, step) if isinstance(b.ffn, MoE) else b.ffn(x))
