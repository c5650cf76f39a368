"""DeepSeek-V2 / V2-Lite / V2.5 / V3 / R1 (and Kimi-K2, which shares the architecture).

Each block: pre-norm multi-head latent attention (MLA), then a dense SwiGLU FFN on the first
`leading_dense_block_count` layers and a mixture of experts on the rest.

Attention. q = W_qb·rms(W_qa·x) (or W_q·x in the "lite" models without a q LoRA), per head
[nope | rope] dims. One projection gives the shared latent c = rms(W_kva·x)[:kv_lora] and one
shared RoPE key k_pe; RoPE (adjacent pairs) rotates q_pe and k_pe only. Files converted since
llama.cpp's MLA support hold per-head attn_k_b / attn_v_b: the nope part of each query head is
absorbed into the latent space (W_kb[h]·q_nope[h]), every head attends over the cached
[c | k_pe] rows as one shared KV head with c as the value, and W_vb[h] maps each head's
result back. Older files hold attn_kv_b instead, which expands c into per-head k_nope and v
for ordinary multi-head attention. Both use kq_scale = mscale²/√(nope + rope), where YaRN's
mscale — (1 + 0.1·ln f) times (1 + 0.1·mscale_all_dim·ln f) — is moved from RoPE into it.

Experts. Softmax (V2) or sigmoid (V3) scores; V3 adds a per-expert bias for choosing only,
keeps the best `expert_group_used_count` of `expert_group_count` groups (ranked by their two
best scores), takes the top-k, renormalises the unbiased scores if `expert_weights_norm` and
multiplies by `expert_weights_scale`. Always-on shared experts are added to the routed sum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from gguf import Keys

from swapmoe.errors import SwapmoeError
from swapmoe.runtime import layers
from swapmoe.runtime.kernels import ggml_math
from swapmoe.runtime.linear import Weight, linear, linear_each, linear_per_group
from swapmoe.runtime.models.base import Gating, MoE, Router, Transformer

F32 = np.float32


@dataclass(frozen=True)
class LatentAttention:
    """MLA weights: the query path (a q LoRA q_a → norm → q_b, or one wq in the lite models), the
    shared latent + RoPE key projection kv_a and its norm, the output; and either the absorbed
    per-head k_b / v_b or the legacy kv_b."""

    kv_a: Weight
    kv_a_norm: np.ndarray
    wo: Weight
    q_a: Weight | None = None
    q_a_norm: np.ndarray | None = None
    q_b: Weight | None = None
    wq: Weight | None = None
    k_b: Weight | None = None
    v_b: Weight | None = None
    kv_b: Weight | None = None


class DeepSeek2(Transformer):
    def setup(self):
        g, hp = self.gguf, self.hp
        if g.arch_get(Keys.Attention.TEMPERATURE_SCALE, 0.0):
            raise SwapmoeError(f"{g.path}: deepseek2 attention temperature scaling (Mistral-Large-3) is not supported")
        k_mla, v_mla = g.arch_get(Keys.Attention.KEY_LENGTH_MLA, 0), g.arch_get(Keys.Attention.VALUE_LENGTH_MLA, 0)
        self.mla = bool(k_mla and v_mla)  # absorbed attn_k_b/attn_v_b, else the legacy attn_kv_b
        self.k_head = k_mla if self.mla else hp.head_dim  # nope + rope dims of a query head
        self.v_head = v_mla if self.mla else hp.v_head_dim
        self.n_nope = self.k_head - hp.n_rot
        self.kv_lora = g.arch_get(Keys.Attention.KV_LORA_RANK)
        self.n_dense = g.arch_get(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, 0)
        gating = self._gating_func()
        if gating not in (Gating.SOFTMAX, Gating.SIGMOID):
            raise SwapmoeError(f"{g.path}: unsupported expert_gating_func {gating}")
        self.router = Router(
            Gating(gating),
            normalize=bool(g.arch_get(Keys.LLM.EXPERT_WEIGHTS_NORM, False)),
            scale=g.arch_get(Keys.LLM.EXPERT_WEIGHTS_SCALE, 0.0),
            n_groups=g.arch_get(Keys.LLM.EXPERT_GROUP_COUNT, 0),
            n_groups_used=g.arch_get(Keys.LLM.EXPERT_GROUP_USED_COUNT, 0),
        )
        self.rope, self.kq_scale = self._rope_and_kq_scale()

    def _gating_func(self) -> int:
        """expert_gating_func, or llama.cpp's fallback for files without it (V2/V2.5: softmax;
        GLM-4.7-Lite, recognised by its shape: sigmoid)."""
        func = self.gguf.arch_get(Keys.LLM.EXPERT_GATING_FUNC, 0)
        if func:
            return func
        return Gating.SIGMOID if self.hp.n_layer in (47, 48) and self.n_vocab == 154880 else Gating.SOFTMAX

    def _rope_and_kq_scale(self) -> tuple[layers.Rope, float]:
        """RoPE and the attention scale with DeepSeek's YaRN rules, in f32 as llama.cpp computes them.

        The file stores 0.1·mscale_all_dim as yarn_log_multiplier. With it, the context attn
        factor is get_mscale(f, m)/get_mscale(f, m_all) = 1 before cancelling the kernel's boost,
        so RoPE keeps magnitude rope.scaling.attn_factor and the YaRN mscale lands in kq_scale."""
        hp = self.hp
        log_mul = F32(self.gguf.arch_get(Keys.Rope.SCALING_YARN_LOG_MUL, 0.0)) / F32(0.1)
        # llama.cpp takes mscale = mscale_all_dim for deepseek2 (both 1 when it is 1)
        attn_factor = hp.context_attn_factor(float(log_mul), float(log_mul)) if log_mul else hp.context_attn_factor()
        ln_f = F32(math.log(F32(1.0) / F32(hp.rope_freq_scale)))
        attn_factor_org = F32(attn_factor) * (F32(1.0) + F32(0.1) * ln_f)
        mscale = attn_factor_org * (F32(1.0) + F32(0.1) * log_mul * ln_f)
        kq_scale = mscale * mscale / F32(math.sqrt(self.k_head))
        return hp.rope(neox=False, attn_factor=attn_factor), float(kq_scale)

    def load_block(self, i):
        w, p = self.w, f"blk.{i}."
        if w.has(p + "attn_q_a.weight"):
            query = dict(
                q_a=w.matrix(p + "attn_q_a.weight"),
                q_a_norm=w.vector(p + "attn_q_a_norm.weight"),
                q_b=w.matrix(p + "attn_q_b.weight"),
            )
        else:  # lite: no q LoRA
            query = dict(wq=w.matrix(p + "attn_q.weight"))
        if self.mla:
            values = dict(k_b=w.matrix(p + "attn_k_b.weight"), v_b=w.matrix(p + "attn_v_b.weight"))
        else:
            values = dict(kv_b=w.matrix(p + "attn_kv_b.weight"))
        attn = LatentAttention(
            kv_a=w.matrix(p + "attn_kv_a_mqa.weight"),
            kv_a_norm=w.vector(p + "attn_kv_a_norm.weight"),
            wo=w.matrix(p + "attn_output.weight"),
            **query,
            **values,
        )
        if i < self.n_dense:
            return w.block(i, attn, w.dense_ffn(i))
        return w.block(i, attn, w.moe(i, selection_bias=w.has(p + "exp_probs_b.bias"), shared=True))

    def new_cache(self, n_ctx: int) -> list[layers.KVCache]:
        """MLA caches only the [latent | k_pe] rows (the value is their latent part); the legacy
        layout caches per-head keys and values."""
        hp = self.hp
        if self.mla:
            return [layers.KVCache(n_ctx, 1, self.kv_lora + hp.n_rot, 0) for _ in range(hp.n_layer)]
        return [layers.KVCache(n_ctx, hp.n_head, self.k_head, self.v_head) for _ in range(hp.n_layer)]

    def attention(self, a: LatentAttention, x: np.ndarray, positions: np.ndarray, cache: layers.KVCache) -> np.ndarray:
        hp, T_, eps, c = self.hp, len(x), self.hp.rms_eps, self.kv_lora
        kv, q = linear_each(x, a.kv_a, a.q_a if a.q_a is not None else a.wq)
        if a.q_a is not None:
            q = linear(a.q_b, layers.rms_norm(q, a.q_a_norm, eps))
        q = q.reshape(T_, hp.n_head, self.k_head)
        latent = layers.rms_norm(kv[:, :c], a.kv_a_norm, eps)
        cos, sin = self.rope.tables(positions)
        k_pe = self.rope.apply(kv[:, None, c:], cos, sin)  # [T, 1, rope], shared by all heads
        q_pe = self.rope.apply(q[..., self.n_nope :], cos, sin)
        q_nope = q[..., : self.n_nope]
        if self.mla:
            q_latent = linear_per_group(a.k_b, q_nope)  # [T, H, c]
            keys, _ = cache.append(np.concatenate([latent[:, None, :], k_pe], axis=-1), np.empty((T_, 1, 0), F32))
            out = layers.attention(
                np.concatenate([q_latent, q_pe], axis=-1),
                keys,
                ggml_math.transposed_values(keys[..., :c]),
                positions,
                self.kq_scale,
            ).reshape(T_, hp.n_head, c)
            out = linear_per_group(a.v_b, out).reshape(T_, -1)
        else:
            kv_heads = linear(a.kv_b, latent).reshape(T_, hp.n_head, self.n_nope + self.v_head)
            k = np.concatenate([kv_heads[..., : self.n_nope], np.broadcast_to(k_pe, (T_, hp.n_head, hp.n_rot))], -1)
            keys, values = cache.append(k, kv_heads[..., self.n_nope :])
            out = layers.attention(np.concatenate([q_nope, q_pe], axis=-1), keys, values, positions, self.kq_scale)
        return linear(a.wo, out)

    def block(self, i, h, step, cache):
        b, eps = self.blocks[i], self.hp.rms_eps
        h = h + self.attention(b.attn, layers.rms_norm(h, b.attn_norm, eps), step.positions, cache)
        x = layers.rms_norm(h, b.ffn_norm, eps)
        if not isinstance(b.ffn, MoE):
            return h + b.ffn(x)
        return h + (self.moe(i, x, step) + b.ffn.shared(x))
