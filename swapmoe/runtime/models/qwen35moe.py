"""Qwen3.5-MoE (Qwen3.5-35B-A3B, Qwen3.5-122B-A10B): a hybrid of gated DeltaNet and gated attention.

Each block: x += mixer(rms(x)), then x += ffn(rms(x)) with the post-attention norm. The mixer is
full attention on every `full_attention_interval`-th layer (3, 7, 11, … by default; or the file's
`attention.recurrent_layers` flags) and a gated DeltaNet on the others.

Gated attention: the q projection gives, per head, a query and an output gate; q and k are
RMS-normed per head, rotated by NEOX RoPE on the first `rope.dimension_count` dims (llama.cpp's
IMROPE, which for text positions is exactly that), and the heads' output is multiplied by
sigmoid(gate) before the output projection.

Gated DeltaNet (per token, sequential as llama.cpp's CPU runs it): one projection gives q, k, v
for a depthwise causal convolution over the last `ssm.conv_kernel` tokens, then SiLU; q and k
are L2-normed per K-head; each V-head h (reading K-head h % n_k) updates its state with decay
exp(softplus(alpha + dt_bias) · a) and strength sigmoid(beta), reads it with q; its output is
RMS-normed and gated by silu(z) before the output projection.

FFN: softmax routing over all experts, top-k, weights renormalised; plus a shared SwiGLU expert
scaled by sigmoid(ffn_gate_inp_shexp · x). The bundled multi-token-prediction block (the last
`nextn_predict_layers` blocks) is not part of the forward pass and is never loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import Keys

from swapmoe.runtime import layers
from swapmoe.runtime.kernels.deltanet import causal_conv, gated_delta_rule
from swapmoe.runtime.linear import Weight, linear, linear_each
from swapmoe.runtime.models.base import Attention, Gating, Router, Transformer

F32 = np.float32
RECURRENT_LAYERS = "{arch}.attention.recurrent_layers"  # llama.cpp's key; gguf-py has no name for it


@dataclass(frozen=True)
class DeltaNet:
    """A gated DeltaNet layer's weights."""

    qkv: Weight  # attn_qkv: the convolution's input, [q | k | v]
    z: Weight  # attn_gate: the output gate
    beta: Weight  # ssm_beta
    alpha: Weight  # ssm_alpha
    dt_bias: np.ndarray  # ssm_dt.bias
    a: np.ndarray  # ssm_a: -exp(A_log), per V-head
    conv: np.ndarray  # ssm_conv1d [conv_dim, d_conv]
    norm: np.ndarray  # ssm_norm [head_v]
    out: Weight  # ssm_out


@dataclass(frozen=True)
class DeltaNetShape:
    """The DeltaNet geometry of a file: which layers are recurrent, and their sizes."""

    recurrent: tuple[bool, ...]  # per layer: gated DeltaNet (else gated attention)
    d_conv: int  # ssm.conv_kernel
    head_k: int  # ssm.state_size
    n_k: int  # ssm.group_count: K-heads
    n_v: int  # ssm.time_step_rank: V-heads
    head_v: int  # ssm.inner_size / n_v

    @classmethod
    def from_gguf(cls, g, n_layer: int) -> "DeltaNetShape":
        flags = g.arch_get(RECURRENT_LAYERS)
        if flags is None:
            interval = g.arch_get(Keys.LLM.FULL_ATTENTION_INTERVAL, 4)
            flags = [(i + 1) % interval != 0 for i in range(n_layer)]
        n_v = g.arch_get(Keys.SSM.TIME_STEP_RANK)
        return cls(
            tuple(bool(f) for f in flags[:n_layer]),
            g.arch_get(Keys.SSM.CONV_KERNEL),
            g.arch_get(Keys.SSM.STATE_SIZE),
            g.arch_get(Keys.SSM.GROUP_COUNT),
            n_v,
            g.arch_get(Keys.SSM.INNER_SIZE) // n_v,
        )

    @property
    def conv_dim(self) -> int:
        return 2 * self.head_k * self.n_k + self.head_v * self.n_v

    @property
    def state_bytes(self) -> int:
        """One recurrent layer's state: the convolution's rows and the f32 matrices."""
        return 4 * ((self.d_conv - 1) * self.conv_dim + self.n_v * self.head_v * self.head_k)

    def state(self) -> layers.RecurrentState:
        return layers.RecurrentState(self.d_conv, self.conv_dim, self.n_v, self.head_k, self.head_v)


class Qwen35MoE(Transformer):
    router = Router(Gating.SOFTMAX, normalize=True)

    def setup(self):
        self.rope = self.hp.rope(neox=True)
        self.shape = DeltaNetShape.from_gguf(self.gguf, self.hp.n_layer)

    @classmethod
    def cache_bytes(cls, gguf, hp, n_ctx):
        """Keys and values for the attention layers, the fixed state for the recurrent ones."""
        shape = DeltaNetShape.from_gguf(gguf, hp.n_layer)
        per_attention_layer = hp.kv_cache_bytes(n_ctx) // hp.n_layer
        return sum(shape.state_bytes if recurrent else per_attention_layer for recurrent in shape.recurrent)

    def load_block(self, i):
        mixer = self.load_delta_net(i) if self.shape.recurrent[i] else self.w.attention(i, qk_norm=True)
        return self.w.block(i, mixer, self.w.moe(i, shared=True, shared_gate=True), ffn_norm="post_attention_norm")

    def load_delta_net(self, i) -> DeltaNet:
        w, p = self.w, f"blk.{i}."
        return DeltaNet(
            qkv=w.matrix(p + "attn_qkv.weight"),
            z=w.matrix(p + "attn_gate.weight"),
            beta=w.matrix(p + "ssm_beta.weight"),
            alpha=w.matrix(p + "ssm_alpha.weight"),
            dt_bias=w.vector(p + "ssm_dt.bias"),
            a=w.vector(p + "ssm_a"),
            conv=w.vector(p + "ssm_conv1d.weight").reshape(-1, self.shape.d_conv),
            norm=w.vector(p + "ssm_norm.weight"),
            out=w.matrix(p + "ssm_out.weight"),
        )

    def new_cache(self, n_ctx):
        hp = self.hp
        return [
            self.shape.state() if recurrent else layers.KVCache(n_ctx, hp.n_head_kv, hp.head_dim, hp.v_head_dim)
            for recurrent in self.shape.recurrent
        ]

    def gated_attention(self, a: Attention, x, positions, cache):
        T_, hp = len(x), self.hp
        q_and_gate, k, v = self.project_qkv(a, x)
        q_and_gate = q_and_gate.reshape(T_, hp.n_head, 2, hp.head_dim)
        q, gate = q_and_gate[:, :, 0].reshape(T_, -1), q_and_gate[:, :, 1].reshape(T_, -1)
        out = self.attend(a, q, k, v, positions, cache, qk_norm_per_head=True)
        return linear(a.wo, out * layers.sigmoid(gate))

    def delta_inputs(self, d: DeltaNet, x):
        """The DeltaNet's input projections: the convolution's input [q | k | v], the output gate z,
        and the beta and alpha logits per V-head."""
        return linear_each(x, d.qkv, d.z, d.beta, d.alpha)

    def k_heads(self, x):
        """q or k [T, n_k, hk] as the delta rule reads them: here as they are, V-head h taking
        K-head h % n_k (the converter put the V heads in that tiled order)."""
        return x

    def delta_net(self, d, x, state: layers.RecurrentState):
        T_, eps = len(x), self.hp.rms_eps
        shape = self.shape
        key_dim = shape.head_k * shape.n_k
        qkv, z, beta, alpha = self.delta_inputs(d, x)
        beta = layers.sigmoid(beta)
        decay = layers.softplus(alpha + d.dt_bias) * d.a
        mixed = np.empty_like(qkv)
        causal_conv(state.conv, qkv, d.conv, mixed)
        mixed = layers.silu(mixed)
        q = self.k_heads(_l2_norm(mixed[:, :key_dim].reshape(T_, shape.n_k, shape.head_k), eps))
        k = self.k_heads(_l2_norm(mixed[:, key_dim : 2 * key_dim].reshape(T_, shape.n_k, shape.head_k), eps))
        v = np.ascontiguousarray(mixed[:, 2 * key_dim :].reshape(T_, shape.n_v, shape.head_v))
        out = np.empty_like(v)
        gated_delta_rule(state.ssm, q, k, v, np.ascontiguousarray(decay), np.ascontiguousarray(beta), out)
        state.length += T_
        out = layers.rms_norm(out, d.norm, eps) * layers.silu(z.reshape(T_, shape.n_v, shape.head_v))
        return linear(d.out, out.reshape(T_, -1))

    def block(self, i, h, step, cache):
        b, eps = self.blocks[i], self.hp.rms_eps
        x = layers.rms_norm(h, b.attn_norm, eps)
        if self.shape.recurrent[i]:
            h = h + self.delta_net(b.attn, x, cache)
        else:
            h = h + self.gated_attention(b.attn, x, step.positions, cache)
        x = layers.rms_norm(h, b.ffn_norm, eps)
        shared_gate = layers.sigmoid(linear(b.ffn.shared_gate, x))
        return h + (self.moe(i, x, step) + b.ffn.shared(x) * shared_gate)


def _l2_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """x / ‖x‖ per row of the last axis, as llama.cpp builds it: rms_norm with eps/n, times 1/√n."""
    n = F32(x.shape[-1])
    return np.ascontiguousarray(layers.rms_norm(x, None, float(F32(eps) / n)) * (F32(1.0) / F32(np.sqrt(n))))
