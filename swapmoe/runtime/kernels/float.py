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
value pairs (2l+1, then 2l) of a 32-value step, each rounded once (an exact product: an FMA).
tinyBLAS runs one such accumulator over the row; vec_dot_bf16 two, over alternate 32-value
halves of each 64, and adds the rest in double.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._constants import ORDER_LANES
from ._jit import INLINE, PARALLEL, ROWS_PER_TASK, SERIAL, chunk_count, chunk_rows, row_start
from .simd import HW_HALF, bf16_pairs_dot, bf16_to_float, half_to_float, sgemm_dot, vec_dot_f32

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
def _pair_split(x, out):
    """Each whole 32-value step of x as vdpbf16ps takes it: its 16 odd values, then its 16 even
    ones (simd.bf16_pairs_dot reads the activations so); the rest as it is."""
    whole = x.size - x.size % 32
    for base in range(0, whole, 32):
        for lane in range(16):
            out[base + lane] = x[base + 2 * lane + 1]
            out[base + 16 + lane] = x[base + 2 * lane]
    for j in range(whole, x.size):
        out[j] = x[j]


@njit(**INLINE)
def _bf16_vec_dot(halves, x, cols):
    """ggml_vec_dot_bf16: two accumulators, one per half of each 64 values, each reduced and
    added into a double, then the values past the last whole 64 one product at a time."""
    whole = cols - cols % 64
    total = np.float64(bf16_pairs_dot(halves, x, 0, whole, 64))
    total += np.float64(bf16_pairs_dot(halves, x, 32, whole, 64))
    for j in range(whole, cols):
        k = j
        if j < cols - cols % 32:  # inside a whole 32-value step, which x holds pair-split
            within = j % 32
            k = j - within + (within // 2 if within % 2 else 16 + within // 2)
        total += np.float64(np.float32(bf16_to_float(halves[j]) * x[k]))
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
def matmul_f32(W, starts, rows, group_rows, cols, qs, d, extra, out, order, straight):
    n_tok = qs.shape[0] * group_rows // rows  # tokens per group of rows
    values = W[: W.size - W.size % 4].view(np.float32)  # one view: rows start at multiples of 4 bytes
    for task in prange(chunk_count(rows, group_rows, ROWS_PER_TASK)):
        r0, n_rows, g = chunk_rows(task, group_rows, ROWS_PER_TASK)
        for t in range(n_tok):  # each token's activation row viewed once per task, not per row
            x = qs[g * n_tok + t]
            for r in range(r0, r0 + n_rows):
                at = row_start(starts, r, group_rows, cols * 4) // 4
                w = values[at : at + cols]
                out[t, r] = sgemm_dot(w, x, cols, cols) if order == ORDER_LANES else vec_dot_f32(w, x, cols, cols)


@njit(**SERIAL)
def dequantize_f32(W, cols, row_ids, out):
    w = W.view(np.float32)
    for i in range(row_ids.size):
        for j in range(cols):  # a plain loop: a whole-row slice assignment took 2 s to compile
            out[i, j] = w[row_ids[i] * cols + j]


# Top-level on purpose: numba caches factory-made parallel kernels per process only (docs/kernels.md).
@njit(**PARALLEL)
def matmul_f16(W, starts, rows, group_rows, cols, qs, d, extra, out, order, straight):
    n_tok = qs.shape[0] * group_rows // rows  # tokens per group of rows
    if HW_HALF and straight:
        values = W[: W.size - W.size % 2].view(np.uint16)  # one view: rows start at even bytes
        for task in prange(chunk_count(rows, group_rows, ROWS_PER_TASK)):
            r0, n_rows, g = chunk_rows(task, group_rows, ROWS_PER_TASK)
            for t in range(n_tok):  # each token's activation row viewed once per task, not per row
                x = qs[g * n_tok + t]
                for r in range(r0, r0 + n_rows):
                    at = row_start(starts, r, group_rows, cols * 2) // 2
                    out[t, r] = _dot_f16(values[at : at + cols], x)
        return
    for r in prange(rows):
        t0 = (r // group_rows) * n_tok
        at = row_start(starts, r, group_rows, cols * 2)
        halves = W[at : at + cols * 2].view(np.uint16)
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
        _widen_f16(W[row_ids[i] * cols * 2 : (row_ids[i] + 1) * cols * 2].view(np.uint16), bits, w)
        for j in range(cols):
            out[i, j] = w[j]


# Top-level on purpose: numba caches factory-made parallel kernels per process only (docs/kernels.md).
@njit(**PARALLEL)
def matmul_bf16(W, starts, rows, group_rows, cols, qs, d, extra, out, order, straight):
    """AVX512-BF16's routes: tinyBLAS (ORDER_LANES) runs one vdpbf16ps accumulator per output,
    vec_dot two (simd.bf16_pairs_dot on the row's bytes and pair-split activations)."""
    n_tok = qs.shape[0] * group_rows // rows  # tokens per group of rows
    xs = np.empty_like(qs)
    for t in range(qs.shape[0]):
        _pair_split(qs[t], xs[t])
    values = W[: W.size - W.size % 2].view(np.uint16)  # one view: rows start at even bytes
    for task in prange(chunk_count(rows, group_rows, ROWS_PER_TASK)):
        r0, n_rows, g = chunk_rows(task, group_rows, ROWS_PER_TASK)
        for t in range(n_tok):  # each token's activation row viewed once per task, not per row
            x = xs[g * n_tok + t]
            for r in range(r0, r0 + n_rows):
                at = row_start(starts, r, group_rows, cols * 2) // 2
                halves = values[at : at + cols]
                out[t, r] = (
                    bf16_pairs_dot(halves, x, 0, cols, 32) if order == ORDER_LANES else _bf16_vec_dot(halves, x, cols)
                )


@njit(**SERIAL)
def dequantize_bf16(W, cols, row_ids, out):
    for i in range(row_ids.size):
        bits = np.empty(cols, np.uint32)
        _widen_bf16(W[row_ids[i] * cols * 2 : (row_ids[i] + 1) * cols * 2].view(np.uint16), bits)
        w = bits.view(np.float32)
        for j in range(cols):
            out[i, j] = w[j]
