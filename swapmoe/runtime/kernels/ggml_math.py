"""ggml's vectorised exp, the SiLU / SwiGLU / softmax exponentials built on it, and the
RMS-norm sum: element-wise math that must round exactly as llama.cpp's CPU backend does.

llama.cpp's CPU backend does not call libm's expf for SiLU, SwiGLU and softmax: it uses a
polynomial (ggml_v_expf, max error ~1.5 ulp) on blocks of 16 floats (AVX-512) and libm only
for the tail of a row. A one-ulp difference is harmless by itself, but the result is then
rounded to 8-bit activations for the next quantized matmul, and one value on the other side
of a rounding boundary changes a logit by ~1e-2. Computing the same polynomial removes that.

Fused multiply-adds are LLVM's (`_jit.fma32`, rounded once); the f32 dot products' FMA lanes
are simd.sgemm_dot / simd.vec_dot_f32 (true FMAs on 16-float vectors, in ggml's lane order).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from ._jit import fma32, hsum16
from .simd import sgemm_dot, vec_dot_f32

F32 = np.float32
LANES = 16  # AVX-512 floats per vector: the tail of a row past a multiple of 16 uses libm's expf

_SHIFT = F32(float.fromhex("0x1.8p23"))
_LOG2E = F32(float.fromhex("0x1.715476p+0"))
_LN2_HI = F32(float.fromhex("0x1.62e4p-1"))
_LN2_LO = F32(float.fromhex("0x1.7f7d1cp-20"))
_C1 = F32(float.fromhex("0x1.ffffecp-1"))
_C2 = F32(float.fromhex("0x1.fffdb6p-2"))
_C3 = F32(float.fromhex("0x1.555e66p-3"))
_C4 = F32(float.fromhex("0x1.573e2ep-5"))
_C5 = F32(float.fromhex("0x1.0e4020p-7"))
_POW2 = np.array([2.0**e for e in range(-126, 128)], F32)  # the normal powers of two


@njit(cache=True)
def ggml_expf(x):
    """exp(x) for one float32, bit for bit as ggml_v_expf (AVX-512) computes it. Its final
    _mm512_scalef_ps (j * 2^n, rounded once) is one float multiply where 2^n is a normal float
    (the same bits as ldexp for every float32 input: all 2^32 compared), ldexp elsewhere."""
    z = fma32(x, _LOG2E, _SHIFT)
    n = np.float32(z - _SHIFT)
    b = fma32(-n, _LN2_LO, fma32(-n, _LN2_HI, x))
    if abs(n) > 192:
        return np.float32(np.inf) if n > 0 else np.float32(0.0)
    u = np.float32(b * b)
    j = fma32(fma32(fma32(_C5, b, _C4), u, fma32(_C3, b, _C2)), u, fma32(_C1, b, np.float32(1.0)))
    if -126 <= n <= 127:
        return np.float32(j * _POW2[int(n) + 126])
    return np.float32(math.ldexp(j, int(n)))


@njit(cache=True)
def _row_exp(x, out):
    n = x.shape[0]
    vec = n - n % LANES
    for i in range(vec):
        out[i] = ggml_expf(x[i])
    for i in range(vec, n):
        out[i] = np.float32(math.exp(x[i]))


@njit(cache=True, nogil=True)  # serial: a few thousand values; waking threads would cost more
def _swiglu(gate, up, out):
    rows, n = gate.shape
    vec = n - n % LANES
    for r in range(rows):
        for i in range(n):
            g = gate[r, i]
            e = ggml_expf(-g) if i < vec else np.float32(math.exp(-g))
            out[r, i] = np.float32(g / np.float32(np.float32(1.0) + e)) * up[r, i]


@njit(cache=True, nogil=True)
def _softmax(x, sinks, vec, out):
    rows, n = x.shape
    block = np.empty(LANES, np.float64)
    for r in range(rows):
        top = x[r, 0]
        for i in range(1, n):
            top = max(top, x[r, i])
        has_sink = sinks.shape[0] > 0
        if has_sink:
            top = max(top, sinks[r])
        total = 0.0
        for base in range(0, vec, LANES):  # vector blocks: each summed in float, then into the double
            for j in range(LANES):
                block[j] = ggml_expf(np.float32(x[r, base + j] - top)) if base + j < n else 0.0
                if base + j < n:
                    out[r, base + j] = block[j]
            total += hsum16(block)
        for i in range(vec, n):
            e = np.float32(math.exp(np.float32(x[r, i] - top)))
            out[r, i] = e
            total += e
        if has_sink:
            total += np.float32(math.exp(np.float32(sinks[r] - top)))
        scale = np.float32(1.0 / total)
        for i in range(n):
            out[r, i] = out[r, i] * scale


@njit(cache=True, nogil=True)
def _rms_norm(x, weight, eps, out):
    rows, n = x.shape
    for r in range(rows):
        total = 0.0
        for i in range(n):  # in order: numpy's pairwise sum rounds differently
            total += np.float64(np.float32(x[r, i] * x[r, i]))
        mean = np.float32(total / n)
        scale = np.float32(1.0) / np.float32(math.sqrt(np.float32(mean + eps)))
        for i in range(n):
            y = np.float32(x[r, i] * scale)
            out[r, i] = y * weight[i] if weight.size else y


def rms_norm(x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
    """x / sqrt(mean(x²) + eps) (times weight) over the last axis, as ggml's rms_norm: each
    square in float, summed in double from left to right (its 1-ulp differences would otherwise
    move activations across the rounding boundaries of the next quantized matmul), the rest in
    float."""
    flat = np.ascontiguousarray(x, F32).reshape(-1, x.shape[-1])
    out = np.empty_like(flat)
    _rms_norm(flat, np.zeros(0, F32) if weight is None else weight, F32(eps), out)
    return out.reshape(x.shape)


@njit(cache=True, nogil=True)
def rope_rotate(x, cos, sin, n_rot, neox, out):
    """out = x [T, H, d] with the first n_rot dims of every head rotated by the angles whose
    cos/sin [T, n_rot/2] are given: pairs (i, i + n_rot/2) for NEOX, (2i, 2i+1) otherwise.
    x0*c - x1*s and x0*s + x1*c with the first product fused, as GCC contracts ggml's C++."""
    T, H, d = x.shape
    half = n_rot // 2
    for t in range(T):
        for h in range(H):
            for i in range(n_rot, d):
                out[t, h, i] = x[t, h, i]
            for i in range(half):
                a, b = (i, i + half) if neox else (2 * i, 2 * i + 1)
                x0, x1, c, s = x[t, h, a], x[t, h, b], cos[t, i], sin[t, i]
                out[t, h, a] = fma32(x0, c, -np.float32(x1 * s))
                out[t, h, b] = fma32(x0, s, np.float32(x1 * c))


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up over rows of [T, n], as ggml_vec_swiglu_f32."""
    gate = np.ascontiguousarray(gate, F32).reshape(-1, gate.shape[-1])
    out = np.empty_like(gate)
    _swiglu(gate, np.ascontiguousarray(up, F32).reshape(gate.shape), out)
    return out


def silu(x: np.ndarray) -> np.ndarray:
    """x / (1 + exp(-x)), as ggml_vec_silu_f32."""
    return swiglu(x, np.ones_like(x, dtype=F32)).reshape(x.shape)


def softmax(x: np.ndarray, sinks: np.ndarray | None = None, padded: bool = False) -> np.ndarray:
    """Softmax over the last axis as ggml's soft_max: exponentials as above, each block of 16
    summed in float and the block sums in double, scaled by the float reciprocal of the sum.

    sinks: one extra logit per row that joins the maximum and the sum but gets no output
    (attention sinks; its exponential is libm's, as in ggml). padded: the row stands for a
    row ggml pads to a multiple of 16 with -inf (the KV cache), so every element takes the
    vector path."""
    flat = np.ascontiguousarray(x, F32).reshape(-1, x.shape[-1])
    out = np.empty_like(flat)
    n = flat.shape[1]
    sink_row = np.zeros(0, F32) if sinks is None else np.ascontiguousarray(sinks, F32).reshape(-1)
    _softmax(flat, sink_row, n if padded else n - n % LANES, out)
    return out.reshape(x.shape)


@njit(cache=True, nogil=True, parallel=True)
def _attention_scores(q, k, scale, out):
    """out[h, t, s] = (q[t, h, :] . k[s, h // group, :]) * scale, the dot in ggml's order."""
    T, H, d = q.shape
    S, Hkv, _ = k.shape
    group = H // Hkv
    for h in prange(H):
        g = h // group
        for t in range(T):
            x = q[t, h]
            for s in range(S):
                out[h, t, s] = vec_dot_f32(x, k[s, g], d, d) * scale


@njit(cache=True)
def values_width(S):
    """Columns of transposed values attention_values reads for S positions: S rounded up to
    the dots' step (4 x 16 floats)."""
    return -(-S // (4 * LANES)) * 4 * LANES


@njit(cache=True, nogil=True, parallel=True)
def _attention_values(p, vt, n, out):
    """out[t, h, c] = Σ_s p[h, t, s] vt[h // group, c, s], summed as a dot over the n rows of
    llama.cpp's padded V cache: a tinyBLAS dot for a batch of queries, vec_dot's for a single one
    (llamafile takes only products of >= 2 columns).  vt: the V cache transposed, at least as
    wide as the dots read (values_width(S)), finite past S (zero probabilities meet it)."""
    H, T, S = p.shape
    Hkv, dv, _ = vt.shape
    width = values_width(S)
    group = H // Hkv
    for h in prange(H):
        a = np.zeros(width, np.float32)
        g = h // group
        for t in range(T):
            a[:S] = p[h, t]
            for c in range(dv):
                out[t, h, c] = sgemm_dot(a, vt[g, c], n, S) if T > 1 else vec_dot_f32(a, vt[g, c], n, S)


@njit(cache=True, nogil=True, parallel=True)
def _attention_one_query(q, k, vt, scale, sinks, n, out):
    """_attention_scores, _softmax (padded) and _attention_values of one query [1, H, d] that
    sees every key, in one call: a decoding step's attention, the same operations in the same
    order per head."""
    H, d = q.shape[1], q.shape[2]
    S, Hkv, _ = k.shape
    dv = vt.shape[1]
    group = H // Hkv
    for h in prange(H):
        g = h // group
        scores = np.empty((1, S), np.float32)
        for s in range(S):
            scores[0, s] = vec_dot_f32(q[0, h], k[s, g], d, d) * scale
        p = np.empty((1, S), np.float32)
        _softmax(scores, sinks[h : h + 1], S, p)
        a = np.zeros(values_width(S), np.float32)
        a[:S] = p[0]
        for c in range(dv):
            out[0, h, c] = vec_dot_f32(a, vt[g, c], n, S)


def attention_one_query(
    q: np.ndarray, k: np.ndarray, vt: np.ndarray, scale: float, sinks: np.ndarray | None = None
) -> np.ndarray:
    """attention_values(softmax(attention_scores(q, k, scale), sinks, padded=True), vt) for one
    query q [1, H, d] that every key may see (a decoding step), in one kernel call: the same
    bits. Returns [1, H, dv]."""
    S = len(k)
    if vt.shape[2] < values_width(S):
        raise ValueError(f"transposed values of width {vt.shape[2]} for {S} positions")
    out = np.empty((1, q.shape[1], vt.shape[1]), F32)
    sink_row = np.zeros(0, F32) if sinks is None else np.ascontiguousarray(sinks, F32)
    _attention_one_query(
        np.ascontiguousarray(q, F32), np.ascontiguousarray(k, F32), vt, F32(scale), sink_row, padded_rows(S), out
    )
    return out


def attention_scores(q: np.ndarray, k: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """q·k for every head, token and key [H, T, S], summed as llama.cpp's CPU backend does (its
    vec_dot_f32: the queries are a non-contiguous view, and a single query is too few columns
    for tinyBLAS), each then times the float `scale` (ggml's scaled softmax input)."""
    out = np.empty((q.shape[1], q.shape[0], k.shape[0]), F32)
    _attention_scores(np.ascontiguousarray(q, F32), np.ascontiguousarray(k, F32), F32(scale), out)
    return out


KV_PAD = 256  # llama.cpp's CPU KV cache holds a multiple of 256 rows; the padding is masked


def padded_rows(S: int) -> int:
    """The rows of llama.cpp's CPU KV cache that hold S positions: S rounded up to KV_PAD."""
    return -(-S // KV_PAD) * KV_PAD


def transposed_values(v: np.ndarray) -> np.ndarray:
    """Values [S, Hkv, dv] as attention_values reads them: [Hkv, dv, values_width(S)], zero
    past S (as llama.cpp's CPU KV cache keeps V without flash attention)."""
    S, Hkv, dv = v.shape
    vt = np.zeros((Hkv, dv, values_width(S)), F32)
    vt[:, :, :S] = v.transpose(1, 2, 0)
    return vt


def attention_values(p: np.ndarray, vt: np.ndarray, n: int | None = None) -> np.ndarray:
    """Σ p·v [T, H, dv] as llama.cpp sums it (the transposed V cache times the probabilities
    p [H, T, S]): dots of n values (default: S rounded up to llama.cpp's KV cache padding; the
    rest zero). vt: the transposed values [Hkv, dv, width] (transposed_values, or a cache kept
    that way): at least values_width(S) wide, finite past S (those columns meet zeros)."""
    H, T, S = p.shape
    if vt.shape[2] < values_width(S):
        raise ValueError(f"transposed values of width {vt.shape[2]} for {S} positions")
    out = np.empty((T, H, vt.shape[1]), F32)
    _attention_values(np.ascontiguousarray(p, F32), vt, padded_rows(S) if n is None else n, out)
    return out


@njit(cache=True)
def cos_sin(thetas):
    """cosf and sinf of every float32 angle, from the C library as ggml calls them (numpy's
    float32 cos/sin are SIMD approximations that differ from libm by an ulp now and then)."""
    cos = np.empty_like(thetas)
    sin = np.empty_like(thetas)
    flat, c, s = thetas.reshape(-1), cos.reshape(-1), sin.reshape(-1)
    for i in range(flat.size):
        c[i] = math.cos(flat[i])
        s[i] = math.sin(flat[i])
    return cos, sin
