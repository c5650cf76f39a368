"""DeepSeek-V4's own CPU ops, computed as llama.cpp's CPU backend computes them (ggml-cpu/ops.cpp):
the hyper-connection mixing of the residual streams (ggml_dsv4_hc_comb / _pre / _post), the
normalised Walsh–Hadamard transform (ggml's fwht) and the lightning indexer's scores.

Where llama.cpp's build of these loops fuses a multiply and an add (checked against its tensors
with tools/llama_trace.py), `fma32` does too: in the Sinkhorn op, not in the stream sums.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from ._jit import fma32
from .simd import vec_dot_f32

F32 = np.float32
HC = 4  # streams: llama.cpp accepts no other count


@njit(cache=True)
def _sigmoid(x):
    return F32(1.0) / (F32(1.0) + F32(math.exp(-x)))


@njit(cache=True, nogil=True)
def hc_split(mixes, scale, base, eps, iters, pre, post, comb):
    """The 24 mixes of each token [T, 24] → pre [T, 4] (weights that collapse the streams into the
    layer's input), post [T, 4] (how much of the layer's output each stream gets) and comb
    [T, 4, 4] (comb[t, dst, src]: how stream src flows into stream dst), a Sinkhorn-normalised
    mixing matrix: softmax over dst of each src, + eps, columns normalised, then `iters - 1`
    rounds of rows then columns, each sum started at eps."""
    T = mixes.shape[0]
    m = np.empty(HC * HC, F32)  # m[dst + HC*src], as ggml lays it out
    for t in range(T):
        for h in range(HC):  # ggml_mul then ggml_add: two roundings
            pre[t, h] = _sigmoid(F32(mixes[t, h] * scale[0]) + base[h]) + F32(eps)
            post[t, h] = F32(2.0) * _sigmoid(F32(mixes[t, HC + h] * scale[1]) + base[HC + h])
        for src in range(HC):
            top = -np.inf
            for dst in range(HC):
                i = dst + HC * src
                m[i] = fma32(mixes[t, 2 * HC + i], scale[2], base[2 * HC + i])
                top = max(top, m[i])
            total = F32(0.0)
            for dst in range(HC):
                i = dst + HC * src
                m[i] = F32(math.exp(F32(m[i] - top)))
                total += m[i]
            inv = F32(1.0) / total
            for dst in range(HC):
                i = dst + HC * src
                m[i] = fma32(m[i], inv, F32(eps))
        for it in range(iters):
            if it > 0:
                for src in range(HC):  # rows
                    total = F32(eps)
                    for dst in range(HC):
                        total += m[dst + HC * src]
                    inv = F32(1.0) / total
                    for dst in range(HC):
                        m[dst + HC * src] *= inv
            for dst in range(HC):  # columns
                total = F32(eps)
                for src in range(HC):
                    total += m[dst + HC * src]
                inv = F32(1.0) / total
                for src in range(HC):
                    m[dst + HC * src] *= inv
        for dst in range(HC):
            for src in range(HC):
                comb[t, dst, src] = m[dst + HC * src]


@njit(cache=True, nogil=True, parallel=True)
def hc_collapse(x, weights, out):
    """out[t] = Σ_h weights[t, h] · x[t, h] over the streams x [T, 4, D]."""
    T, H, D = x.shape
    for t in prange(T):
        for e in range(D):
            total = F32(x[t, 0, e] * weights[t, 0])
            for h in range(1, H):
                total = total + F32(x[t, h, e] * weights[t, h])
            out[t, e] = total


@njit(cache=True, nogil=True, parallel=True)
def hc_expand(y, residual, post, comb, out):
    """The streams after a layer [T, 4, D]: out[t, d] = post[t, d]·y[t] + Σ_s comb[t, d, s]·residual[t, s]."""
    T, H, D = residual.shape
    for t in prange(T):
        for d in range(H):
            for e in range(D):
                total = F32(y[t, e] * post[t, d])
                for s in range(H):
                    total = total + F32(residual[t, s, e] * comb[t, d, s])
                out[t, d, e] = total


@njit(cache=True, nogil=True)
def fwht(x, n, out):
    """The normalised Walsh–Hadamard transform of every consecutive n values of x [..] (n a power
    of two): scaled by 1/√n first, then butterflies of width 1, 2, 4, ..."""
    flat_in, flat_out = x.reshape(-1), out.reshape(-1)
    scale = F32(1.0) / F32(math.sqrt(F32(n)))
    for start in range(0, flat_in.size, n):
        row = flat_out[start : start + n]
        for j in range(n):
            row[j] = flat_in[start + j] * scale
        width = 1
        while width < n:
            for i in range(0, n, 2 * width):
                for j in range(i, i + width):
                    u, v = row[j], row[j + width]
                    row[j], row[j + width] = u + v, u - v
            width *= 2


@njit(cache=True, nogil=True, parallel=True)
def indexer_scores(q, keys, weights, n_visible, out):
    """The lightning indexer: out[t, j] = Σ_h weights[t, h]·relu(q[t, h]·keys[j]) for the rows
    j < n_visible[t] a token may see, -inf for the others. q [T, Hi, d], keys [R, d]."""
    T, Hi, d = q.shape
    R = keys.shape[0]
    for t in prange(T):
        for j in range(R):
            if j >= n_visible[t]:
                out[t, j] = -np.inf
                continue
            total = F32(0.0)
            for h in range(Hi):
                total = total + F32(max(vec_dot_f32(q[t, h], keys[j], d, d), F32(0.0)) * weights[t, h])
            out[t, j] = total
