"""OLMoE (OLMoE-1B-7B).

Each block: pre-norm attention whose whole q and k projections are RMS-normalised before
being split into heads, NEOX RoPE; then SwiGLU experts with softmax routing, top-k, and
no renormalisation of the k weights.
"""

from __future__ import annotations

from swapmoe.runtime import layers
from swapmoe.runtime.models.base import Gating, Router, Transformer


class OLMoE(Transformer):
    router = Router(Gating.SOFTMAX, normalize=False)

    def setup(self):
        self.rope = self.hp.rope(neox=True)

    def load_block(self, i):
        return self.w.block(i, self.w.attention(i, qk_norm=True), self.w.moe(i))

    def block(self, i, h, step, cache):
        b, eps = self.blocks[i], self.hp.rms_eps
        h = h + self.gqa_attention(
            b.attn, layers.rms_norm(h, b.attn_norm, eps), step.positions, cache, qk_norm_per_head=False
        )
        return h + self.moe(i, layers.rms_norm(h, b.ffn_norm, eps), step)
