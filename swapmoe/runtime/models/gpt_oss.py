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

from gguf import Keys

from swapmoe.runtime import layers
from swapmoe.runtime.models.base import Gating, Hparams, Router, Transformer, sliding_window_layers


class GptOss(Transformer):
    router = Router(Gating.SOFTMAX_WEIGHT)

    def expert_activation(self, layer, gate, up):
        return layers.swiglu_oai(gate, up)

    @classmethod
    def hparams(cls, gguf):  # llama.cpp sizes gpt-oss heads by rope.dimension_count, not key_length
        hp = Hparams.from_gguf(gguf)
        return replace(hp, head_dim=hp.n_rot, v_head_dim=hp.n_rot)

    def setup(self):
        self.window = self.gguf.arch_get(Keys.Attention.SLIDING_WINDOW)
        self.is_swa = sliding_window_layers(self.gguf, self.hp.n_layer, 2, dense_first=False)
        self.rope = self.hp.rope(neox=True)
        self.swa_rope = self.hp.rope(neox=True, base=self.gguf.arch_get(Keys.Rope.FREQ_BASE_SWA, self.hp.rope_base))

    def load_block(self, i):
        w = self.w
        return w.block(i, w.attention(i, sinks=True), w.moe(i, router_bias=True), ffn_norm="post_attention_norm")

    def block(self, i, h, step, cache):
        b, eps, swa = self.blocks[i], self.hp.rms_eps, self.is_swa[i]
        h = h + self.gqa_attention(
            b.attn,
            layers.rms_norm(h, b.attn_norm, eps),
            step.positions,
            cache,
            window=self.window if swa else None,
            rope=self.swa_rope if swa else self.rope,
        )
        return h + self.moe(i, layers.rms_norm(h, b.ffn_norm, eps), step)
