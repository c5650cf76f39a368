"""Legacy 32-value block types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.

Matmul kernels take each row . token in one call of a simd.lanes_dot intrinsic: the blocks'
values decoded in vector registers, exact int32 sums of four products per lane against the
Q8_0/Q8_1 activation, and the float combination of llama.cpp's x86 vec_dot (and tinyBLAS):
eight FMA lanes per row.  Q4_0 weights llama.cpp repacks (kernels.ggml_order) round with one
FMA per block; one row alone would wait on that chain, so they go eight rows per call
(simd.rows_dot8).  The rows' bytes come from memory once; the other tokens find them in
cache.

Kernel signature: matmul_X(W, rows, group_rows, cols, qs, d, extra, out, order, straight)
with W the raw uint8 bytes (rows * row_bytes), qs/d/extra a QuantizedActivation's
arrays and out float32 [n_tokens, rows]; rows come in groups of group_rows, and
group g dots activation rows [g*n_tokens, (g+1)*n_tokens) (one group: all rows,
all tokens; see kernels.matmul_q).  order: llama.cpp's rounding route
(kernels.ggml_order).  straight: take every token's sums from the row bytes rather
than from a row decoded once for all tokens (kernels.KERNELS sets it by token count;
kernels with one route, such as these, ignore it).  dequantize_X(W, cols, row_ids, out) writes
out[i] = row row_ids[i] in float32, matching gguf.quants.dequantize exactly.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._constants import (
    ORDER_LANES,
    Q4_0_BYTES,
    Q4_1_BYTES,
    Q5_0_BYTES,
    Q5_1_BYTES,
    Q8_0_BYTES,
    QK4_0,
    QK4_1,
    QK5_0,
    QK5_1,
    QK8_0,
)
from ._jit import INLINE, PARALLEL, ROWS_PER_TASK, SERIAL, chunk_count, chunk_rows, f16_to_f32, row_start, u64
from .simd import lanes_dot, rows_dot8

_Q4_0_LANES, _Q4_1_LANES, _Q5_0_LANES, _Q5_1_LANES, _Q8_0_LANES = (
    lanes_dot[k] for k in ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0")
)
_Q4_0_ROWS8 = rows_dot8["q4_0"]


_LOW_NIBBLES = np.uint64(0x0F0F0F0F0F0F0F0F)
_BYTE_TOP_BITS = np.uint64(0x8080808080808080)
_ONE_PER_BYTE = np.uint64(0x0101010101010101)
# byte b -> 0x10 in byte i of a uint64 for every set bit i of b: the 5th bits of Q5 values
_FIFTH_BITS = np.array([sum(((b >> i) & 1) << (8 * i + 4) for i in range(8)) for b in range(256)], np.uint64)


@njit(**INLINE)
def _minus(w, offset):
    """Eight unsigned bytes (each < 0x80) minus offset, as int8 bytes: setting each
    byte's top bit first keeps the subtraction from borrowing across bytes."""
    return ((w | _BYTE_TOP_BITS) - np.uint64(offset) * _ONE_PER_BYTE) ^ _BYTE_TOP_BITS


# The decoders below work on eight values per uint64 (SWAR): the byte-wise
# version of these loops is not vectorized by LLVM and ran at ~1 value/cycle.
# Values 0..15 of a block are the low nibbles of its 16 bytes, 16..31 the high.


@njit(**INLINE)
def _decode_q4(blk, o, offset, w64, wo):
    """32 values of a block's nibbles (at blk[o:o+16]) minus offset into w64[wo:wo+4]."""
    lo = u64(blk, o)
    hi = u64(blk, o + 8)
    w64[wo] = _minus(lo & _LOW_NIBBLES, offset)
    w64[wo + 1] = _minus(hi & _LOW_NIBBLES, offset)
    w64[wo + 2] = _minus((lo >> np.uint64(4)) & _LOW_NIBBLES, offset)
    w64[wo + 3] = _minus((hi >> np.uint64(4)) & _LOW_NIBBLES, offset)


@njit(**INLINE)
def _decode_q5(blk, o, offset, w64, wo):
    """As _decode_q4 for a u32 of 5th bits at blk[o:o+4] followed by the nibbles."""
    lo = u64(blk, o + 4)
    hi = u64(blk, o + 12)
    w64[wo] = _minus((lo & _LOW_NIBBLES) | _FIFTH_BITS[blk[o]], offset)
    w64[wo + 1] = _minus((hi & _LOW_NIBBLES) | _FIFTH_BITS[blk[o + 1]], offset)
    w64[wo + 2] = _minus(((lo >> np.uint64(4)) & _LOW_NIBBLES) | _FIFTH_BITS[blk[o + 2]], offset)
    w64[wo + 3] = _minus(((hi >> np.uint64(4)) & _LOW_NIBBLES) | _FIFTH_BITS[blk[o + 3]], offset)


# ---- Q4_0: d f16, 16 bytes of nibbles; value = nibble - 8 ------------------


# Top-level on purpose: numba caches factory-made parallel kernels per process only (docs/kernels.md).
@njit(**PARALLEL)
def matmul_q4_0(W, starts, rows, group_rows, cols, qs, d, extra, out, order, straight):
    """Repacked by llama.cpp (order != ORDER_LANES; then group_rows % 8 == 0, kernels.ggml_order):
    eight rows per call, so that eight FMA chains are in flight (2x in
    cache; eight rows at once for the lane-rounded types measured 1.1-1.8x slower from DRAM)."""
    n_tok = qs.shape[0] * group_rows // rows  # tokens per group of rows
    nb = cols // QK4_0
    rb = nb * Q4_0_BYTES
    if order != ORDER_LANES:
        for task in prange(rows // 8):
            g = task * 8 // group_rows
            at = row_start(starts, task * 8, group_rows, rb)
            for t in range(n_tok):
                _Q4_0_ROWS8(W, at, rb, qs[g * n_tok + t], d[g * n_tok + t], nb, out[t], task * 8)
        return
    for task in prange(chunk_count(rows, group_rows, ROWS_PER_TASK)):
        r0, n_rows, g = chunk_rows(task, group_rows, ROWS_PER_TASK)
        t0 = g * n_tok
        for t in range(n_tok):  # each token's activation rows viewed once per task, not per row
            x, dx = qs[t0 + t], d[t0 + t]
            for r in range(r0, r0 + n_rows):
                at = row_start(starts, r, group_rows, rb)
                row = W[at : at + rb]
                out[t, r] = _Q4_0_LANES(row, x, dx, dx, nb)


@njit(**SERIAL)
def dequantize_q4_0(W, cols, row_ids, out):
    nb = cols // QK4_0
    rb = nb * Q4_0_BYTES
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb : (row_ids[i] + 1) * rb]
        wq = np.empty(QK4_0, np.int8)
        w64 = wq.view(np.uint64)
        for b in range(nb):
            o = b * Q4_0_BYTES
            dw = f16_to_f32(row[o], row[o + 1])
            _decode_q4(row, o + 2, 8, w64, 0)
            for j in range(QK4_0):
                out[i, b * QK4_0 + j] = dw * np.float32(wq[j])


# ---- Q4_1: d f16, m f16, nibbles; value = d * nibble + m --------------------


# Top-level on purpose: numba caches factory-made parallel kernels per process only (docs/kernels.md).
@njit(**PARALLEL)
def matmul_q4_1(W, starts, rows, group_rows, cols, qs, d, extra, out, order, straight):
    n_tok = qs.shape[0] * group_rows // rows  # tokens per group of rows
    nb = cols // QK4_1
    rb = nb * Q4_1_BYTES
    for task in prange(chunk_count(rows, group_rows, ROWS_PER_TASK)):
        r0, n_rows, g = chunk_rows(task, group_rows, ROWS_PER_TASK)
        t0 = g * n_tok
        for t in range(n_tok):  # each token's activation rows viewed once per task, not per row
            x, dx, bsums = qs[t0 + t], d[t0 + t], extra[t0 + t]
            for r in range(r0, r0 + n_rows):
                at = row_start(starts, r, group_rows, rb)
                row = W[at : at + rb]
                out[t, r] = _Q4_1_LANES(row, x, dx, bsums, nb)


@njit(**SERIAL)
def dequantize_q4_1(W, cols, row_ids, out):
    nb = cols // QK4_1
    rb = nb * Q4_1_BYTES
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb : (row_ids[i] + 1) * rb]
        wq = np.empty(QK4_1, np.int8)
        w64 = wq.view(np.uint64)
        for b in range(nb):
            o = b * Q4_1_BYTES
            dw = f16_to_f32(row[o], row[o + 1])
            mw = f16_to_f32(row[o + 2], row[o + 3])
            _decode_q4(row, o + 4, 0, w64, 0)
            for j in range(QK4_1):
                out[i, b * QK4_1 + j] = dw * np.float32(wq[j]) + mw


# ---- Q5_0: d f16, qh u32 (5th bits), nibbles; value = q5 - 16 ---------------


# Top-level on purpose: numba caches factory-made parallel kernels per process only (docs/kernels.md).
@njit(**PARALLEL)
def matmul_q5_0(W, starts, rows, group_rows, cols, qs, d, extra, out, order, straight):
    n_tok = qs.shape[0] * group_rows // rows  # tokens per group of rows
    nb = cols // QK5_0
    rb = nb * Q5_0_BYTES
    for task in prange(chunk_count(rows, group_rows, ROWS_PER_TASK)):
        r0, n_rows, g = chunk_rows(task, group_rows, ROWS_PER_TASK)
        t0 = g * n_tok
        for t in range(n_tok):  # each token's activation rows viewed once per task, not per row
            x, dx = qs[t0 + t], d[t0 + t]
            for r in range(r0, r0 + n_rows):
                at = row_start(starts, r, group_rows, rb)
                row = W[at : at + rb]
                out[t, r] = _Q5_0_LANES(row, x, dx, dx, nb)


@njit(**SERIAL)
def dequantize_q5_0(W, cols, row_ids, out):
    nb = cols // QK5_0
    rb = nb * Q5_0_BYTES
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb : (row_ids[i] + 1) * rb]
        wq = np.empty(QK5_0, np.int8)
        w64 = wq.view(np.uint64)
        for b in range(nb):
            o = b * Q5_0_BYTES
            dw = f16_to_f32(row[o], row[o + 1])
            _decode_q5(row, o + 2, 16, w64, 0)
            for j in range(QK5_0):
                out[i, b * QK5_0 + j] = dw * np.float32(wq[j])


# ---- Q5_1: d f16, m f16, qh u32, nibbles; value = d * q5 + m ----------------


# Top-level on purpose: numba caches factory-made parallel kernels per process only (docs/kernels.md).
@njit(**PARALLEL)
def matmul_q5_1(W, starts, rows, group_rows, cols, qs, d, extra, out, order, straight):
    n_tok = qs.shape[0] * group_rows // rows  # tokens per group of rows
    nb = cols // QK5_1
    rb = nb * Q5_1_BYTES
    for task in prange(chunk_count(rows, group_rows, ROWS_PER_TASK)):
        r0, n_rows, g = chunk_rows(task, group_rows, ROWS_PER_TASK)
        t0 = g * n_tok
        for t in range(n_tok):  # each token's activation rows viewed once per task, not per row
            x, dx, bsums = qs[t0 + t], d[t0 + t], extra[t0 + t]
            for r in range(r0, r0 + n_rows):
                at = row_start(starts, r, group_rows, rb)
                row = W[at : at + rb]
                out[t, r] = _Q5_1_LANES(row, x, dx, bsums, nb)


@njit(**SERIAL)
def dequantize_q5_1(W, cols, row_ids, out):
    nb = cols // QK5_1
    rb = nb * Q5_1_BYTES
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb : (row_ids[i] + 1) * rb]
        wq = np.empty(QK5_1, np.int8)
        w64 = wq.view(np.uint64)
        for b in range(nb):
            o = b * Q5_1_BYTES
            dw = f16_to_f32(row[o], row[o + 1])
            mw = f16_to_f32(row[o + 2], row[o + 3])
            _decode_q5(row, o + 4, 0, w64, 0)
            for j in range(QK5_1):
                out[i, b * QK5_1 + j] = dw * np.float32(wq[j]) + mw


# ---- Q8_0: d f16, 32 int8 ---------------------------------------------------


# Top-level on purpose: numba caches factory-made parallel kernels per process only (docs/kernels.md).
@njit(**PARALLEL)
def matmul_q8_0(W, starts, rows, group_rows, cols, qs, d, extra, out, order, straight):
    n_tok = qs.shape[0] * group_rows // rows  # tokens per group of rows
    nb = cols // QK8_0
    rb = nb * Q8_0_BYTES
    for task in prange(chunk_count(rows, group_rows, ROWS_PER_TASK)):
        r0, n_rows, g = chunk_rows(task, group_rows, ROWS_PER_TASK)
        t0 = g * n_tok
        for t in range(n_tok):  # each token's activation rows viewed once per task, not per row
            x, dx = qs[t0 + t], d[t0 + t]
            for r in range(r0, r0 + n_rows):
                at = row_start(starts, r, group_rows, rb)
                row = W[at : at + rb]
                out[t, r] = _Q8_0_LANES(row, x, dx, dx, nb)


@njit(**SERIAL)
def dequantize_q8_0(W, cols, row_ids, out):
    nb = cols // QK8_0
    rb = nb * Q8_0_BYTES
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb : (row_ids[i] + 1) * rb]
        for b in range(nb):
            o = b * Q8_0_BYTES
            dw = f16_to_f32(row[o], row[o + 1])
            for j in range(QK8_0):
                out[i, b * QK8_0 + j] = dw * np.float32(np.int8(row[o + 2 + j]))
