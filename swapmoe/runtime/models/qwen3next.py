"""Qwen3-Next (Qwen3-Next-80B-A3B): Qwen3.5-MoE's hybrid with its DeltaNet heads in grouped order.

The same blocks as qwen35moe (gated attention every `full_attention_interval`-th layer, gated
DeltaNet elsewhere, softmax-routed experts plus a sigmoid-gated shared expert), with three
differences in the DeltaNet as llama.cpp builds it: the converter keeps the V-heads grouped by
K-head, so q and k are repeated per group (V-head h reads K-head h // (n_v / n_k)); beta and
alpha come from one projection, per K-head [beta of its V-heads | alpha of its V-heads]; and
older files hold q, k, v and z in one projection `ssm_in`, per K-head [q | k | v | z].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from swapmoe.runtime.linear import Weight, linear_each
from swapmoe.runtime.models.qwen35moe import Qwen35MoE


@dataclass(frozen=True)
class NextDeltaNet:
    """A Qwen3-Next DeltaNet layer's weights: attn_qkv and attn_gate, or the older ssm_in."""

    beta_alpha: Weight  # ssm_ba
    dt_bias: np.ndarray
    a: np.ndarray
    conv: np.ndarray
    norm: np.ndarray
    out: Weight
    qkv: Weight | None = None
    z: Weight | None = None
    qkvz: Weight | None = None  # ssm_in


class Qwen3Next(Qwen35MoE):
    def load_delta_net(self, i) -> NextDeltaNet:
        w, p = self.w, f"blk.{i}."
        if w.has(p + "ssm_in.weight"):
            inputs = dict(qkvz=w.matrix(p + "ssm_in.weight"))
        else:
            inputs = dict(qkv=w.matrix(p + "attn_qkv.weight"), z=w.matrix(p + "attn_gate.weight"))
        return NextDeltaNet(
            beta_alpha=w.matrix(p + "ssm_ba.weight"),
            dt_bias=w.vector(p + "ssm_dt.bias"),
            a=w.vector(p + "ssm_a"),
            conv=w.vector(p + "ssm_conv1d.weight").reshape(-1, self.shape.d_conv),
            norm=w.vector(p + "ssm_norm.weight"),
            out=w.matrix(p + "ssm_out.weight"),
            **inputs,
        )

    def delta_inputs(self, d: NextDeltaNet, x):
        T_, shape = len(x), self.shape
        n_k, per_k = shape.n_k, shape.n_v // shape.n_k
        if d.qkvz is not None:
            hk, group_v = shape.head_k, per_k * shape.head_v
            qkvz, beta_alpha = linear_each(x, d.qkvz, d.beta_alpha)
            qkvz = qkvz.reshape(T_, n_k, 2 * hk + 2 * group_v)
            q, k = qkvz[..., :hk], qkvz[..., hk : 2 * hk]
            v, z = qkvz[..., 2 * hk : 2 * hk + group_v], qkvz[..., 2 * hk + group_v :]
            qkv = np.concatenate([q.reshape(T_, -1), k.reshape(T_, -1), v.reshape(T_, -1)], axis=1)
            z = np.ascontiguousarray(z).reshape(T_, -1)
        else:
            qkv, z, beta_alpha = linear_each(x, d.qkv, d.z, d.beta_alpha)
        beta_alpha = beta_alpha.reshape(T_, n_k, 2 * per_k)
        beta = np.ascontiguousarray(beta_alpha[..., :per_k]).reshape(T_, -1)
        alpha = np.ascontiguousarray(beta_alpha[..., per_k:]).reshape(T_, -1)
        return qkv, z, beta, alpha

    def k_heads(self, x):
        """Each K-head repeated for its group of V-heads (grouped order)."""
        return np.ascontiguousarray(np.repeat(x, self.shape.n_v // self.shape.n_k, axis=1))
