"""Legacy 32-value block types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.

Matmul kernels decode a weight row once into int8 quants and float block
scales, then every token takes exact int32 block dots against its Q8_0/Q8_1
activation (the row is read from memory once for all tokens).  The float combination
follows llama.cpp's x86 vec_dot (and tinyBLAS): eight FMA lanes per row (_lanes_dot),
except for Q4_0 weights llama.cpp repacks (kernels.ggml_order): one FMA per block.

Kernel signature: matmul_X(W, rows, group_rows, cols, qs, d, extra, out, order) with W
the raw uint8 bytes (rows * row_bytes), qs/d/extra a QuantizedActivation's
arrays and out float32 [n_tokens, rows]; rows come in groups of group_rows, and
group g dots activation rows [g*n_tokens, (g+1)*n_tokens) (one group: all rows,
all tokens; see kernels.matmul_q).  dequantize_X(W, cols, row_ids, out) writes
out[i] = row row_ids[i] in float32, matching gguf.quants.dequantize exactly.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._jit import INLINE, ORDER_LANES, PARALLEL, ROWS_PER_TASK, SERIAL, dot32, f16_to_f32, fma32, tree_sum8, u64


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


@njit(**INLINE)
def _lanes_dot(wq, dw, x, dx, nb, lane_sums):
    """A row . token as llama.cpp's x86 vec_dot (and tinyBLAS, alike) rounds it for the legacy
    types: eight float lanes, lane l taking values 4l..4l+3 of every block (wq: the row's int8
    values, dw its block scales) through an FMA with the block's scale product, then ggml's tree
    sum.  Eight named lanes rather than an array: LLVM then keeps them in one vector register."""
    for k in range(nb * 8):
        lane_sums[k] = (np.int32(wq[4 * k]) * np.int32(x[4 * k]) + np.int32(wq[4 * k + 1]) * np.int32(x[4 * k + 1])
                        + np.int32(wq[4 * k + 2]) * np.int32(x[4 * k + 2])
                        + np.int32(wq[4 * k + 3]) * np.int32(x[4 * k + 3]))
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = np.float32(0.0)
    for b in range(nb):
        s, o = dw[b] * dx[b], b * 8
        a0, a1 = fma32(s, lane_sums[o], a0), fma32(s, lane_sums[o + 1], a1)
        a2, a3 = fma32(s, lane_sums[o + 2], a2), fma32(s, lane_sums[o + 3], a3)
        a4, a5 = fma32(s, lane_sums[o + 4], a4), fma32(s, lane_sums[o + 5], a5)
        a6, a7 = fma32(s, lane_sums[o + 6], a6), fma32(s, lane_sums[o + 7], a7)
    return tree_sum8((a0, a1, a2, a3, a4, a5, a6, a7))


@njit(**INLINE)
def _lanes_dot_with_mins(wq, dw, mw, x, dx, sx, nb, lane_sums):
    """Q4_1/Q5_1: _lanes_dot plus the mins (block min times the activation block sum sx), one
    FMA per block (GCC contracts m*s + summs), added after the lanes' tree sum."""
    summs = np.float32(0.0)
    for b in range(nb):
        summs = fma32(mw[b], sx[b], summs)
    return _lanes_dot(wq, dw, x, dx, nb, lane_sums) + summs


# ---- Q4_0: d f16, 16 bytes of nibbles; value = nibble - 8 ------------------

@njit(**PARALLEL)
def matmul_q4_0(W, rows, group_rows, cols, qs, d, extra, out, order):
    n_tok = qs.shape[0] * group_rows // rows  # tokens per group of rows
    nb = cols // 32
    rb = nb * 18
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        wq = np.empty(cols, np.int8)
        w64 = wq.view(np.uint64)
        dw = np.empty(nb, np.float32)
        lane_sums = np.empty(cols // 4, np.int32)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            row = W[r * rb:(r + 1) * rb]
            for b in range(nb):
                o = b * 18
                dw[b] = f16_to_f32(row[o], row[o + 1])
                _decode_q4(row, o + 2, 8, w64, b * 4)
            t0 = (r // group_rows) * n_tok
            for t in range(n_tok):
                x = qs[t0 + t]
                dx = d[t0 + t]
                if order == ORDER_LANES:
                    out[t, r] = _lanes_dot(wq, dw, x, dx, nb, lane_sums)
                    continue
                acc = np.float32(0.0)  # repacked by llama.cpp (ORDER_GEMV): one FMA per block
                for b in range(nb):
                    acc = fma32(np.float32(dot32(wq, b * 32, x, b * 32)), dw[b] * dx[b], acc)
                out[t, r] = acc


@njit(**SERIAL)
def dequantize_q4_0(W, cols, row_ids, out):
    nb = cols // 32
    rb = nb * 18
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb:(row_ids[i] + 1) * rb]
        wq = np.empty(32, np.int8)
        w64 = wq.view(np.uint64)
        for b in range(nb):
            o = b * 18
            dw = f16_to_f32(row[o], row[o + 1])
            _decode_q4(row, o + 2, 8, w64, 0)
            for j in range(32):
                out[i, b * 32 + j] = dw * np.float32(wq[j])


# ---- Q4_1: d f16, m f16, nibbles; value = d * nibble + m --------------------

@njit(**PARALLEL)
def matmul_q4_1(W, rows, group_rows, cols, qs, d, extra, out, order):
    n_tok = qs.shape[0] * group_rows // rows  # tokens per group of rows
    nb = cols // 32
    rb = nb * 20
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        wq = np.empty(cols, np.int8)
        w64 = wq.view(np.uint64)
        dw = np.empty(nb, np.float32)
        mw = np.empty(nb, np.float32)
        lane_sums = np.empty(cols // 4, np.int32)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            row = W[r * rb:(r + 1) * rb]
            for b in range(nb):
                o = b * 20
                dw[b] = f16_to_f32(row[o], row[o + 1])
                mw[b] = f16_to_f32(row[o + 2], row[o + 3])
                _decode_q4(row, o + 4, 0, w64, b * 4)
            t0 = (r // group_rows) * n_tok
            for t in range(n_tok):
                out[t, r] = _lanes_dot_with_mins(wq, dw, mw, qs[t0 + t], d[t0 + t], extra[t0 + t], nb, lane_sums)


@njit(**SERIAL)
def dequantize_q4_1(W, cols, row_ids, out):
    nb = cols // 32
    rb = nb * 20
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb:(row_ids[i] + 1) * rb]
        wq = np.empty(32, np.int8)
        w64 = wq.view(np.uint64)
        for b in range(nb):
            o = b * 20
            dw = f16_to_f32(row[o], row[o + 1])
            mw = f16_to_f32(row[o + 2], row[o + 3])
            _decode_q4(row, o + 4, 0, w64, 0)
            for j in range(32):
                out[i, b * 32 + j] = dw * np.float32(wq[j]) + mw


# ---- Q5_0: d f16, qh u32 (5th bits), nibbles; value = q5 - 16 ---------------

@njit(**PARALLEL)
def matmul_q5_0(W, rows, group_rows, cols, qs, d, extra, out, order):
    n_tok = qs.shape[0] * group_rows // rows  # tokens per group of rows
    nb = cols // 32
    rb = nb * 22
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        wq = np.empty(cols, np.int8)
        w64 = wq.view(np.uint64)
        dw = np.empty(nb, np.float32)
        lane_sums = np.empty(cols // 4, np.int32)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            row = W[r * rb:(r + 1) * rb]
            for b in range(nb):
                o = b * 22
                dw[b] = f16_to_f32(row[o], row[o + 1])
                _decode_q5(row, o + 2, 16, w64, b * 4)
            t0 = (r // group_rows) * n_tok
            for t in range(n_tok):
                out[t, r] = _lanes_dot(wq, dw, qs[t0 + t], d[t0 + t], nb, lane_sums)


@njit(**SERIAL)
def dequantize_q5_0(W, cols, row_ids, out):
    nb = cols // 32
    rb = nb * 22
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb:(row_ids[i] + 1) * rb]
        wq = np.empty(32, np.int8)
        w64 = wq.view(np.uint64)
        for b in range(nb):
            o = b * 22
            dw = f16_to_f32(row[o], row[o + 1])
            _decode_q5(row, o + 2, 16, w64, 0)
            for j in range(32):
                out[i, b * 32 + j] = dw * np.float32(wq[j])


# ---- Q5_1: d f16, m f16, qh u32, nibbles; value = d * q5 + m ----------------

@njit(**PARALLEL)
def matmul_q5_1(W, rows, group_rows, cols, qs, d, extra, out, order):
    n_tok = qs.shape[0] * group_rows // rows  # tokens per group of rows
    nb = cols // 32
    rb = nb * 24
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        wq = np.empty(cols, np.int8)
        w64 = wq.view(np.uint64)
        dw = np.empty(nb, np.float32)
        mw = np.empty(nb, np.float32)
        lane_sums = np.empty(cols // 4, np.int32)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            row = W[r * rb:(r + 1) * rb]
            for b in range(nb):
                o = b * 24
                dw[b] = f16_to_f32(row[o], row[o + 1])
                mw[b] = f16_to_f32(row[o + 2], row[o + 3])
                _decode_q5(row, o + 4, 0, w64, b * 4)
            t0 = (r // group_rows) * n_tok
            for t in range(n_tok):
                out[t, r] = _lanes_dot_with_mins(wq, dw, mw, qs[t0 + t], d[t0 + t], extra[t0 + t], nb, lane_sums)


@njit(**SERIAL)
def dequantize_q5_1(W, cols, row_ids, out):
    nb = cols // 32
    rb = nb * 24
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb:(row_ids[i] + 1) * rb]
        wq = np.empty(32, np.int8)
        w64 = wq.view(np.uint64)
        for b in range(nb):
            o = b * 24
            dw = f16_to_f32(row[o], row[o + 1])
            mw = f16_to_f32(row[o + 2], row[o + 3])
            _decode_q5(row, o + 4, 0, w64, 0)
            for j in range(32):
                out[i, b * 32 + j] = dw * np.float32(wq[j]) + mw


# ---- Q8_0: d f16, 32 int8 ---------------------------------------------------

@njit(**PARALLEL)
def matmul_q8_0(W, rows, group_rows, cols, qs, d, extra, out, order):
    n_tok = qs.shape[0] * group_rows // rows  # tokens per group of rows
    nb = cols // 32
    rb = nb * 34
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        dw = np.empty(nb, np.float32)
        wq = np.empty(cols, np.int8)  # the row's quants without the block headers
        w64 = wq.view(np.uint64)
        lane_sums = np.empty(cols // 4, np.int32)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            row = W[r * rb:(r + 1) * rb]
            for b in range(nb):
                o = b * 34
                dw[b] = f16_to_f32(row[o], row[o + 1])
                for k in range(4):  # eight bytes per move: a byte-wise copy loop stays scalar
                    w64[b * 4 + k] = u64(row, o + 2 + 8 * k)
            t0 = (r // group_rows) * n_tok
            for t in range(n_tok):
                x = qs[t0 + t]
                dx = d[t0 + t]
                out[t, r] = _lanes_dot(wq, dw, x, dx, nb, lane_sums)


@njit(**SERIAL)
def dequantize_q8_0(W, cols, row_ids, out):
    nb = cols // 32
    rb = nb * 34
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb:(row_ids[i] + 1) * rb]
        for b in range(nb):
            o = b * 34
            dw = f16_to_f32(row[o], row[o + 1])
            for j in range(32):
                out[i, b * 32 + j] = dw * np.float32(np.int8(row[o + 2 + j]))
