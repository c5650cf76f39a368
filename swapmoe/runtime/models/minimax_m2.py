"""MiniMax-M2 (MiniMax-M2, M2.1: 230B-A10B).

Each block: pre-norm GQA attention whose whole q and k projections are RMS-normalised before
being split into heads; NEOX RoPE on only the first `rope.dimension_count` dims of each head
(64 of 128); then SwiGLU experts chosen by sigmoid scores plus a per-expert selection bias
(`exp_probs_b`), weighted by the unbiased scores renormalised to sum to one.
"""

from __future__ import annotations

from gguf import Keys

from swapmoe.errors import SwapmoeError
from swapmoe.runtime import layers
from swapmoe.runtime.models.base import Gating, Router, Transformer


class MiniMaxM2(Transformer):
    router = Router(Gating.SIGMOID, normalize=True)

    def setup(self):
        gating = self.gguf.arch_get(Keys.LLM.EXPERT_GATING_FUNC)
        if gating != Gating.SIGMOID:  # llama.cpp aborts without the key too
            raise SwapmoeError(f"{self.gguf.path}: minimax-m2 needs expert_gating_func = 2 (sigmoid), found {gating}")
        self.rope = self.hp.rope(neox=True)  # n_rot < head_dim: the rest of each head passes through

    def load_block(self, i):
        return self.w.block(i, self.w.attention(i, qk_norm=True), self.w.moe(i, selection_bias=True))

    def block(self, i, h, step, cache):
        b, eps = self.blocks[i], self.hp.rms_eps
        h = h + self.gqa_attention(
            b.attn, layers.rms_norm(h, b.attn_norm, eps), step.positions, cache, qk_norm_per_head=False
        )
        return h + self.moe(i, layers.rms_norm(h, b.ffn_norm, eps), step)
