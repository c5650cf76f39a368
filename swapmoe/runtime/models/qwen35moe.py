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


class Qwen35MoE(Transformer):
    router = Router(Gating.SOFTMAX, normalize=True)

    def setup(self):
        g, hp = self.gguf, self.hp
        self.rope = hp.rope(neox=True)
        self.d_conv = g.arch_get(Keys.SSM.CONV_KERNEL)
        self.head_k = g.arch_get(Keys.SSM.STATE_SIZE)
        self.n_k = g.arch_get(Keys.SSM.GROUP_COUNT)
        self.n_v = g.arch_get(Keys.SSM.TIME_STEP_RANK)
        self.head_v = g.arch_get(Keys.SSM.INNER_SIZE) // self.n_v
        flags = g.arch_get(RECURRENT_LAYERS)
        if flags is None:
            interval = g.arch_get(Keys.LLM.FULL_ATTENTION_INTERVAL, 4)
            flags = [(i + 1) % interval != 0 for i in range(hp.n_layer)]
        self.recurrent = [bool(f) for f in flags[:hp.n_layer]]

    def load_block(self, i):
        mixer = self.load_delta_net(i) if self.recurrent[i] else self.w.attention(i, qk_norm=True)
        return self.w.block(i, mixer, self.w.moe(i, shared=True, shared_gate=True), ffn_norm="post_attention_norm")

    def load_delta_net(self, i) -> DeltaNet:
        w, p = self.w, f"blk.{i}."
        return DeltaNet(
            qkv=w.matrix(p + "attn_qkv.weight"), z=w.matrix(p + "attn_gate.weight"),
            beta=w.matrix(p + "ssm_beta.weight"), alpha=w.matrix(p + "ssm_alpha.weight"),
            dt_bias=w.vector(p + "ssm_dt.bias"), a=w.vector(p + "ssm_a"),
            conv=w.vector(p + "ssm_conv1d.weight").reshape(-1, self.d_conv),
            norm=w.vector(p + "ssm_norm.weight"), out=w.matrix(p + "ssm_out.weight"))

    def new_cache(self, n_ctx):
        hp, conv_dim = self.hp, 2 * self.head_k * self.n_k + self.head_v * self.n_v
        return [layers.RecurrentState(self.d_conv, conv_dim, self.n_v, self.head_k, self.head_v) if recurrent
                else layers.KVCache(n_ctx, hp.n_head_kv, hp.head_dim, hp.v_head_dim) for recurrent in self.recurrent]

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
        key_dim = self.head_k * self.n_k
        qkv, z, beta, alpha = self.delta_inputs(d, x)
        beta = layers.sigmoid(beta)
        decay = layers.softplus(alpha + d.dt_bias) * d.a
        mixed = np.empty_like(qkv)
        causal_conv(state.conv, qkv, d.conv, mixed)
        mixed = layers.silu(mixed)
        q = self.k_heads(_l2_norm(mixed[:, :key_dim].reshape(T_, self.n_k, self.head_k), eps))
        k = self.k_heads(_l2_norm(mixed[:, key_dim:2 * key_dim].reshape(T_, self.n_k, self.head_k), eps))
        v = np.ascontiguousarray(mixed[:, 2 * key_dim:].reshape(T_, self.n_v, self.head_v))
        out = np.empty_like(v)
        gated_delta_rule(state.ssm, q, k, v, np.ascontiguousarray(decay), np.ascontiguousarray(beta), out)
        state.length += T_
        out = layers.rms_norm(out, d.norm, eps) * layers.silu(z.reshape(T_, self.n_v, self.head_v))
        return linear(d.out, out.reshape(T_, -1))

    def block(self, i, h, positions, cache):
        b, eps = self.blocks[i], self.hp.rms_eps
        x = layers.rms_norm(h, b.attn_norm, eps)
        if self.recurrent[i]:
            h = h + self.delta_net(b.attn, x, cache)
        else:
            h = h + self.gated_attention(b.attn, x, positions, cache)
        x = layers.rms_norm(h, b.ffn_norm, eps)
        shared_gate = layers.sigmoid(linear(b.ffn.shared_gate, x))
        return h + (self.moe(i, x) + b.ffn.shared(x) * shared_gate)


def _l2_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """x / ‖x‖ per row of the last axis, as llama.cpp builds it: rms_norm with eps/n, times 1/√n."""
    n = F32(x.shape[-1])
    return np.ascontiguousarray(layers.rms_norm(x, None, float(F32(eps) / n)) * (F32(1.0) / F32(np.sqrt(n))))
