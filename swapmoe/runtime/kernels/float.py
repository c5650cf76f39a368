"""Float weight types: F32, F16, BF16.

llama.cpp rounds the activation to the weight's type (F16/BF16, done in
activation.py) and accumulates the products in float32 SIMD lanes.  We do the
same: each weight row is widened to float32 once, then dotted with every
token.  F32 and BF16 rows are summed in ggml's order, bit for bit: tinyBLAS's where
llama.cpp uses it (ORDER_LANES), ggml's vec_dot otherwise; F16 uses a vectorized
float32 reduction whose order differs from ggml's (see docs/kernels.md).
Products of two f16/bf16 values are exact in float32, so only the
accumulation rounds.

BF16 on AVX512-BF16: each `vdpbf16ps` adds to lane l of 16 float32 lanes the products of
value pairs (2l+1, then 2l) of a 32-value step, each rounded once (an exact product, so a
plain float add here). tinyBLAS runs one such accumulator over the row; vec_dot_bf16 two,
over alternate 32-value halves of each 64, and adds the rest in double.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._constants import ORDER_LANES
from ._jit import INLINE, PARALLEL, SERIAL, hsum16
from .simd import HW_HALF, half_to_float, sgemm_dot, vec_dot_f32

_F16_EXP_SCALE = np.float32(2.0**112)


@njit(nogil=True, cache=True, fastmath=True)
def _dot_f32(a, b):
    s = np.float32(0.0)
    for j in range(a.size):
        s += a[j] * b[j]
    return s


@njit(nogil=True, cache=True, fastmath=True)
def _dot_f16(halves, x):
    """Widened as they are summed (vcvtph2ps, 16 at a time): for a few tokens, cheaper than a
    widened copy of the row."""
    s = np.float32(0.0)
    for j in range(halves.size):
        s += half_to_float(halves[j]) * x[j]
    return s


@njit(**INLINE)
def _dpbf16_steps(w, x, start, stop, stride, acc):
    """acc[16] += the vdpbf16ps products of w and x: one 32-value step every `stride` values
    from start to stop."""
    for base in range(start, stop, stride):
        for lane in range(16):
            i = base + 2 * lane
            acc[lane] = np.float32(acc[lane] + w[i + 1] * x[i + 1])
            acc[lane] = np.float32(acc[lane] + w[i] * x[i])


@njit(**INLINE)
def _bf16_sgemm_dot(w, x, cols):
    """tinyBLAS's BF16 dot (cols % 32 == 0): one accumulator over every step, then its reduction."""
    acc = np.zeros(16, np.float32)
    _dpbf16_steps(w, x, 0, cols, 32, acc)
    return hsum16(acc)


@njit(**INLINE)
def _bf16_vec_dot(w, x, cols):
    """ggml_vec_dot_bf16: two accumulators over each 64 values' halves, reduced into a double,
    then the values past the last whole 64 one product at a time."""
    whole = cols - cols % 64
    first, second = np.zeros(16, np.float32), np.zeros(16, np.float32)
    _dpbf16_steps(w, x, 0, whole, 64, first)
    _dpbf16_steps(w, x, 32, whole, 64, second)
    total = np.float64(hsum16(first)) + np.float64(hsum16(second))
    for j in range(whole, cols):
        total += np.float64(np.float32(w[j] * x[j]))
    return np.float32(total)


@njit(**SERIAL)
def _widen_f16(halves, bits, values):
    """halves (uint16) -> values (float32 view of the uint32 scratch `bits`)."""
    if HW_HALF:  # vcvtph2ps, 16 at a time: 2x the bit arithmetic below
        for j in range(halves.size):
            values[j] = half_to_float(halves[j])
        return
    for j in range(halves.size):
        h = np.uint32(halves[j])
        special = np.uint32(0x7F800000) if (h & 0x7C00) == 0x7C00 else np.uint32(0)
        bits[j] = ((h & 0x8000) << 16) | ((h & 0x7FFF) << 13) | special
    for j in range(halves.size):
        # moves the 5-bit exponent into float32 range; exact, also for subnormals
        values[j] = values[j] * _F16_EXP_SCALE


@njit(**SERIAL)
def _widen_bf16(halves, bits):
    for j in range(halves.size):
        bits[j] = np.uint32(halves[j]) << 16


# Top-level on purpose: numba caches factory-made parallel kernels per process only (docs/kernels.md).
@njit(**PARALLEL)
def matmul_f32(W, rows, group_rows, cols, qs, d, extra, out, order, straight):
    n_tok = qs.shape[0] * group_rows // rows  # tokens per group of rows
    for r in prange(rows):
        t0 = (r // group_rows) * n_tok
        w = W[r * cols * 4:(r + 1) * cols * 4].view(np.float32)
        for t in range(n_tok):
            if order == ORDER_LANES:
                out[t, r] = sgemm_dot(w, qs[t0 + t], cols, cols)
            else:
                out[t, r] = vec_dot_f32(w, qs[t0 + t], cols, cols)


@njit(**SERIAL)
def dequantize_f32(W, cols, row_ids, out):
    w = W.view(np.float32)
    for i in range(row_ids.size):
        for j in range(cols):  # a plain loop: a whole-row slice assignment took 2 s to compile
            out[i, j] = w[row_ids[i] * cols + j]


# Top-level on purpose: numba caches factory-made parallel kernels per process only (docs/kernels.md).
@njit(**PARALLEL)
def matmul_f16(W, rows, group_rows, cols, qs, d, extra, out, order, straight):
    n_tok = qs.shape[0] * group_rows // rows  # tokens per group of rows
    for r in prange(rows):
        t0 = (r // group_rows) * n_tok
        halves = W[r * cols * 2:(r + 1) * cols * 2].view(np.uint16)
        if HW_HALF and straight:
            for t in range(n_tok):
                out[t, r] = _dot_f16(halves, qs[t0 + t])
            continue
        bits = np.empty(cols, np.uint32)
        w = bits.view(np.float32)
        _widen_f16(halves, bits, w)
        for t in range(n_tok):
            out[t, r] = _dot_f32(w, qs[t0 + t])


@njit(**SERIAL)
def dequantize_f16(W, cols, row_ids, out):
    for i in range(row_ids.size):
        bits = np.empty(cols, np.uint32)
        w = bits.view(np.float32)
        _widen_f16(W[row_ids[i] * cols * 2:(row_ids[i] + 1) * cols * 2].view(np.uint16), bits, w)
        for j in range(cols):
            out[i, j] = w[j]


# Top-level on purpose: numba caches factory-made parallel kernels per process only (docs/kernels.md).
@njit(**PARALLEL)
def matmul_bf16(W, rows, group_rows, cols, qs, d, extra, out, order, straight):
    n_tok = qs.shape[0] * group_rows // rows  # tokens per group of rows
    for r in prange(rows):
        t0 = (r // group_rows) * n_tok
        bits = np.empty(cols, np.uint32)
        _widen_bf16(W[r * cols * 2:(r + 1) * cols * 2].view(np.uint16), bits)
        w = bits.view(np.float32)
        for t in range(n_tok):
            if order == ORDER_LANES:
                out[t, r] = _bf16_sgemm_dot(w, qs[t0 + t], cols)
            else:
                out[t, r] = _bf16_vec_dot(w, qs[t0 + t], cols)


@njit(**SERIAL)
def dequantize_bf16(W, cols, row_ids, out):
    for i in range(row_ids.size):
        bits = np.empty(cols, np.uint32)
        _widen_bf16(W[row_ids[i] * cols * 2:(row_ids[i] + 1) * cols * 2].view(np.uint16), bits)
        w = bits.view(np.float32)
        for j in range(cols):
            out[i, j] = w[j]
