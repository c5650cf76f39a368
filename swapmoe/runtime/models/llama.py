"""Llama with experts (Mixtral-8x7B, Mixtral-8x22B).

Each block: pre-norm GQA attention with adjacent-pair (NORM) RoPE — the converter permutes
Q/K rows so this equals Hugging Face's rotate-half — and optional llama3-style frequency
factors; then SwiGLU experts (softmax, top-k, renormalised), or a dense SwiGLU FFN on
layers without a router.
"""
from __future__ import annotations

from swapmoe.runtime import layers
from swapmoe.runtime.models.base import Transformer


class Llama(Transformer):
    def __init__(self, gguf, store, hp=None):
        super().__init__(gguf, store, hp)
        w = self.w
        self.rope = self.hp.rope(neox=False, freq_factors=w.optional_vector("rope_freqs.weight"))
        self.blocks = []
        for i in range(self.hp.n_layer):
            b = {**self.attention_weights(i), "attn_norm": w.vector(f"blk.{i}.attn_norm.weight"),
                 "ffn_norm": w.vector(f"blk.{i}.ffn_norm.weight")}
            if w.has(f"blk.{i}.ffn_gate_inp.weight"):
                b["router"] = w.matrix(f"blk.{i}.ffn_gate_inp.weight")
            else:
                b["dense"] = [w.matrix(f"blk.{i}.ffn_{p}.weight") for p in ("gate", "up", "down")]
            self.blocks.append(b)

    def block(self, i, h, positions, cache):
        b, eps = self.blocks[i], self.hp.rms_eps
        h = h + self.gqa_attention(b, layers.rms_norm(h, b["attn_norm"], eps), positions, cache)
        x = layers.rms_norm(h, b["ffn_norm"], eps)
        if "router" in b:
            return h + self.softmax_moe(i, b["router"], x, renormalize=True)
        return h + self.dense_ffn(*b["dense"], x)
