"""Legacy 32-value block types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.

Matmul kernels decode each block's quants on the fly inside the exact int32
dot with every token's Q8_0/Q8_1 activation block (the block stays in L1, so
it is read from memory once for all tokens); dequantizers decode to int8.  The float combination
per block follows ggml's generic vec_dot (ggml-cpu/quants.c) operation by
operation, accumulated sequentially in float32 per row.

Kernel signature: matmul_X(W, rows, cols, qs, d, extra, out) with W the raw
uint8 bytes (rows * row_bytes), qs/d/extra a QuantizedActivation's arrays and
out float32 [n_tokens, rows].  dequantize_X(W, cols, row_ids, out) writes
out[i] = row row_ids[i] in float32, matching gguf.quants.dequantize exactly.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._jit import INLINE, PARALLEL, SERIAL, dot32, dot32_bytes, f16_to_f32


@njit(**INLINE)
def _decode_q4(blk, o, offset, wq):
    for j in range(16):
        wq[j] = (blk[o + j] & 15) - offset
        wq[j + 16] = (blk[o + j] >> 4) - offset


@njit(**INLINE)
def _decode_q5(blk, o, offset, wq):
    qh = np.uint32(blk[o]) | (np.uint32(blk[o + 1]) << 8) | (np.uint32(blk[o + 2]) << 16) | (np.uint32(blk[o + 3]) << 24)
    for j in range(16):
        wq[j] = ((blk[o + 4 + j] & 15) | (((qh >> j) & 1) << 4)) - offset
        wq[j + 16] = ((blk[o + 4 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - offset


@njit(**INLINE)
def _dot_q4(row, ro, offset, qs, t, xo):
    """Dot of a block's 16 nibble bytes (low nibbles = values 0..15, high =
    16..31, minus offset) with activation row t; decoded on the fly, int8-typed
    so LLVM keeps it in narrow SIMD lanes."""
    s = np.int32(0)
    for j in range(16):
        v = row[ro + j]
        lo = np.int8(v & np.uint8(15)) - np.int8(offset)
        hi = np.int8(v >> np.uint8(4)) - np.int8(offset)
        s = np.int32(s + np.int32(np.int16(lo) * np.int16(qs[t, xo + j])) + np.int32(np.int16(hi) * np.int16(qs[t, xo + 16 + j])))
    return s


@njit(**INLINE)
def _dot_q5(row, ro, offset, qs, t, xo):
    """As _dot_q4 with the fifth bits from the u32 at row[ro:ro+4]."""
    qh = np.uint32(row[ro]) | (np.uint32(row[ro + 1]) << 8) | (np.uint32(row[ro + 2]) << 16) | (np.uint32(row[ro + 3]) << 24)
    s = np.int32(0)
    for j in range(16):
        v = row[ro + 4 + j]
        lo = np.int8((v & np.uint8(15)) | np.uint8(((qh >> j) & 1) << 4)) - np.int8(offset)
        hi = np.int8((v >> np.uint8(4)) | np.uint8(((qh >> (j + 16)) & 1) << 4)) - np.int8(offset)
        s = np.int32(s + np.int32(np.int16(lo) * np.int16(qs[t, xo + j])) + np.int32(np.int16(hi) * np.int16(qs[t, xo + 16 + j])))
    return s


# ---- Q4_0: d f16, 16 bytes of nibbles; value = nibble - 8 ------------------

@njit(**PARALLEL)
def matmul_q4_0(W, rows, cols, qs, d, extra, out):
    nb = cols // 32
    rb = nb * 18
    n_tok = qs.shape[0]
    for r in prange(rows):
        row = W[r * rb:(r + 1) * rb]
        acc = np.zeros(n_tok, np.float32)
        for b in range(nb):
            o = b * 18
            dw = f16_to_f32(row[o], row[o + 1])
            for t in range(n_tok):
                sumi = _dot_q4(row, o + 2, 8, qs, t, b * 32)
                acc[t] += np.float32(sumi) * dw * d[t, b]
        for t in range(n_tok):
            out[t, r] = acc[t]


@njit(**SERIAL)
def dequantize_q4_0(W, cols, row_ids, out):
    nb = cols // 32
    rb = nb * 18
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb:(row_ids[i] + 1) * rb]
        wq = np.empty(32, np.int8)
        for b in range(nb):
            o = b * 18
            dw = f16_to_f32(row[o], row[o + 1])
            _decode_q4(row, o + 2, 8, wq)
            for j in range(32):
                out[i, b * 32 + j] = dw * np.float32(wq[j])


# ---- Q4_1: d f16, m f16, nibbles; value = d * nibble + m --------------------

@njit(**PARALLEL)
def matmul_q4_1(W, rows, cols, qs, d, extra, out):
    nb = cols // 32
    rb = nb * 20
    n_tok = qs.shape[0]
    for r in prange(rows):
        row = W[r * rb:(r + 1) * rb]
        acc = np.zeros(n_tok, np.float32)
        for b in range(nb):
            o = b * 20
            dw = f16_to_f32(row[o], row[o + 1])
            mw = f16_to_f32(row[o + 2], row[o + 3])
            for t in range(n_tok):
                sumi = _dot_q4(row, o + 4, 0, qs, t, b * 32)
                acc[t] += (dw * d[t, b]) * np.float32(sumi) + mw * extra[t, b]
        for t in range(n_tok):
            out[t, r] = acc[t]


@njit(**SERIAL)
def dequantize_q4_1(W, cols, row_ids, out):
    nb = cols // 32
    rb = nb * 20
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb:(row_ids[i] + 1) * rb]
        wq = np.empty(32, np.int8)
        for b in range(nb):
            o = b * 20
            dw = f16_to_f32(row[o], row[o + 1])
            mw = f16_to_f32(row[o + 2], row[o + 3])
            _decode_q4(row, o + 4, 0, wq)
            for j in range(32):
                out[i, b * 32 + j] = dw * np.float32(wq[j]) + mw


# ---- Q5_0: d f16, qh u32 (5th bits), nibbles; value = q5 - 16 ---------------

@njit(**PARALLEL)
def matmul_q5_0(W, rows, cols, qs, d, extra, out):
    nb = cols // 32
    rb = nb * 22
    n_tok = qs.shape[0]
    for r in prange(rows):
        row = W[r * rb:(r + 1) * rb]
        acc = np.zeros(n_tok, np.float32)
        for b in range(nb):
            o = b * 22
            dw = f16_to_f32(row[o], row[o + 1])
            for t in range(n_tok):
                sumi = _dot_q5(row, o + 2, 16, qs, t, b * 32)
                acc[t] += (dw * d[t, b]) * np.float32(sumi)
        for t in range(n_tok):
            out[t, r] = acc[t]


@njit(**SERIAL)
def dequantize_q5_0(W, cols, row_ids, out):
    nb = cols // 32
    rb = nb * 22
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb:(row_ids[i] + 1) * rb]
        wq = np.empty(32, np.int8)
        for b in range(nb):
            o = b * 22
            dw = f16_to_f32(row[o], row[o + 1])
            _decode_q5(row, o + 2, 16, wq)
            for j in range(32):
                out[i, b * 32 + j] = dw * np.float32(wq[j])


# ---- Q5_1: d f16, m f16, qh u32, nibbles; value = d * q5 + m ----------------

@njit(**PARALLEL)
def matmul_q5_1(W, rows, cols, qs, d, extra, out):
    nb = cols // 32
    rb = nb * 24
    n_tok = qs.shape[0]
    for r in prange(rows):
        row = W[r * rb:(r + 1) * rb]
        acc = np.zeros(n_tok, np.float32)
        for b in range(nb):
            o = b * 24
            dw = f16_to_f32(row[o], row[o + 1])
            mw = f16_to_f32(row[o + 2], row[o + 3])
            for t in range(n_tok):
                sumi = _dot_q5(row, o + 4, 0, qs, t, b * 32)
                acc[t] += (dw * d[t, b]) * np.float32(sumi) + mw * extra[t, b]
        for t in range(n_tok):
            out[t, r] = acc[t]


@njit(**SERIAL)
def dequantize_q5_1(W, cols, row_ids, out):
    nb = cols // 32
    rb = nb * 24
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb:(row_ids[i] + 1) * rb]
        wq = np.empty(32, np.int8)
        for b in range(nb):
            o = b * 24
            dw = f16_to_f32(row[o], row[o + 1])
            mw = f16_to_f32(row[o + 2], row[o + 3])
            _decode_q5(row, o + 4, 0, wq)
            for j in range(32):
                out[i, b * 32 + j] = dw * np.float32(wq[j]) + mw


# ---- Q8_0: d f16, 32 int8 ---------------------------------------------------

@njit(**PARALLEL)
def matmul_q8_0(W, rows, cols, qs, d, extra, out):
    nb = cols // 32
    rb = nb * 34
    n_tok = qs.shape[0]
    for r in prange(rows):
        row = W[r * rb:(r + 1) * rb]
        acc = np.zeros(n_tok, np.float32)
        for b in range(nb):
            o = b * 34
            dw = f16_to_f32(row[o], row[o + 1])
            for t in range(n_tok):
                sumi = dot32_bytes(row, o + 2, qs, t, b * 32)
                acc[t] += np.float32(sumi) * (dw * d[t, b])
        for t in range(n_tok):
            out[t, r] = acc[t]


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
