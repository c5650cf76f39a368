"""gpt-oss (gpt-oss-20b, gpt-oss-120b).

Each block: pre-norm GQA attention with q/k/v/output biases, NEOX RoPE with YaRN, and a
learned per-head sink logit that joins the softmax denominator; every other layer (the even
ones, by default) only sees the last `attention.sliding_window` positions and may use its own
RoPE base. Then a mixture of experts: the router (with a bias) picks the top-k logits, their
softmax weighs the experts, and each expert is a clamped SwiGLU with per-expert biases,
g·σ(1.702·g)·(u + 1) with g = min(gate, 7), u = clamp(up, ±7). The experts ship as MXFP4.
"""
from __future__ import annotations

from dataclasses import replace

from swapmoe.runtime import layers
from swapmoe.runtime.linear import linear
from swapmoe.runtime.models.base import Hparams, Transformer


def sliding_window_layers(gguf, n_layer: int) -> list[bool]:
    """Which layers use sliding-window attention: the file's per-layer flags, or every layer
    il with il % n < n - 1 for the pattern n (default 2: the even layers), as llama.cpp reads it."""
    pattern = gguf.arch_get("attention.sliding_window_pattern", 2)
    if isinstance(pattern, list):
        return [bool(p) for p in pattern[:n_layer]]
    return [pattern == 0 or il % pattern < pattern - 1 for il in range(n_layer)]


class GptOss(Transformer):
    expert_activation = staticmethod(layers.swiglu_oai)

    def __init__(self, gguf, store, hp=None):
        if hp is None:  # llama.cpp sizes gpt-oss heads by rope.dimension_count, not key_length
            hp = Hparams.from_gguf(gguf)
            hp = replace(hp, head_dim=hp.n_rot, v_head_dim=hp.n_rot)
        super().__init__(gguf, store, hp)
        self.window = gguf.arch_get("attention.sliding_window")
        self.is_swa = sliding_window_layers(gguf, self.hp.n_layer)
        self.rope = self.hp.rope(neox=True)
        swa_base = gguf.arch_get("rope.freq_base_swa", self.hp.rope_base)
        self.swa_rope = self.hp.rope(neox=True, base=swa_base)
        w = self.w
        self.blocks = [{
            **self.attention_weights(i),
            "attn_norm": w.vector(f"blk.{i}.attn_norm.weight"),
            "sinks": w.vector(f"blk.{i}.attn_sinks.weight"),
            "ffn_norm": w.vector(f"blk.{i}.post_attention_norm.weight"),  # the norm before the experts
            "router": w.matrix(f"blk.{i}.ffn_gate_inp.weight"),
            "router_bias": w.vector(f"blk.{i}.ffn_gate_inp.bias"),
        } for i in range(self.hp.n_layer)]

    def block(self, i, h, positions, cache):
        b, eps, swa = self.blocks[i], self.hp.rms_eps, self.is_swa[i]
        h = h + self.gqa_attention(b, layers.rms_norm(h, b["attn_norm"], eps), positions, cache,
                                   window=self.window if swa else None, sinks=b["sinks"],
                                   rope=self.swa_rope if swa else self.rope)
        x = layers.rms_norm(h, b["ffn_norm"], eps)
        return h + self.moe(i, linear(b["router"], x) + b["router_bias"], x, "softmax_weight")

