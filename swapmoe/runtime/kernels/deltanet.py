"""The gated DeltaNet recurrence of Qwen3.5 / Qwen3-Next, computed as llama.cpp's CPU backend does
it (ggml_ssm_conv and ggml_gated_delta_net, ggml-cpu/ops.cpp): token by token, in float32.

The state of one V-head is a matrix S [hk, hv], stored transposed as ggml stores it
(state[h, j, i] = S[i][j]), so that every product the recurrence needs is a contiguous dot
product summed in ggml_vec_dot_f32's lanes.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from ._jit import fma32
from .simd import vec_dot_f32

F32 = np.float32


@njit(cache=True, nogil=True)
def causal_conv(state, x, weight, out):
    """Depthwise causal convolution over time: out[t, c] = Σ_k window_t[k, c] · weight[c, k], where
    window_t is rows t .. t+d_conv-1 of [state; x]. state [d_conv-1, C] holds the raw (pre-SiLU)
    inputs of the previous tokens and becomes the last d_conv-1 rows of [state; x]. Each sum is
    one multiply-add chain, as GCC contracts ssm_conv's loop."""
    n_keep, C = state.shape
    T = x.shape[0]
    d_conv = n_keep + 1
    window = np.empty((n_keep + T, C), F32)
    window[:n_keep] = state
    window[n_keep:] = x
    for t in range(T):
        for c in range(C):
            total = F32(0.0)
            for k in range(d_conv):
                total = fma32(window[t + k, c], weight[c, k], total)
            out[t, c] = total
    state[:] = window[T:]


@njit(cache=True, nogil=True, parallel=True)
def gated_delta_rule(state, q, k, v, g, beta, out):
    """The delta rule with a per-head decay, for T tokens in order. state [H, hv, hk] (transposed
    S per V-head, updated in place); q, k [T, Hk, hk]; v [T, H, hv]; g (log decay, < 0) and beta
    [T, H]; out [T, H, hv]. V-head h reads K-head h % Hk (the converter tiles the V heads). Per
    token: S *= exp(g); δ = (v - Sᵀk)·β; S += k δᵀ; o = Sᵀq / √hk."""
    T, H, hv = v.shape
    n_k, hk = k.shape[1], k.shape[2]
    scale = F32(1.0) / F32(math.sqrt(F32(hk)))
    for h in prange(H):
        s = state[h]
        kh = h % n_k
        delta = np.empty(hv, F32)
        for t in range(T):
            decay = F32(math.exp(g[t, h]))
            for j in range(hv):
                for i in range(hk):
                    s[j, i] = s[j, i] * decay
            b = beta[t, h]
            for j in range(hv):
                delta[j] = (v[t, h, j] - vec_dot_f32(s[j], k[t, kh], hk, hk)) * b
            for j in range(hv):
                for i in range(hk):
                    s[j, i] = fma32(k[t, kh, i], delta[j], s[j, i])
            for j in range(hv):
                out[t, h, j] = vec_dot_f32(s[j], q[t, kh], hk, hk) * scale
