"""K-quants: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (256-value super-blocks).

Per token and super-block the kernels take exact integer sums against the Q8_K activation,
isum = sum(scale * q * x) and the mins against the Q8_K block sums, then one float step in the
rounding of the llama.cpp route `order` (kernels.ggml_order; _jit.block_sum and the repacked
Q4_K/Q2_K helpers here).  For few tokens per row (`straight`, set by kernels.KERNELS) the sums
come straight from the row bytes (simd.py intrinsics); larger batches decode the weights once for
all tokens: Q4_K, Q5_K and Q6_K, where vpdpbusd runs, into 16-row tiles that take each token's
values four at a time for 16 rows at once (simd.TILES); else each row into int16 values times
their integer sub-block scale, dotted with every token.  ggml's vec_dot spreads the float step over 8
lanes, not reproduced (docs/kernels.md).  Kernel signatures as in legacy.py.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._constants import (
    ORDER_GEMM,
    ORDER_GEMV,
    ORDER_TILED,
    Q2_K_BYTES,
    Q3_K_BYTES,
    Q4_K_BYTES,
    Q5_K_BYTES,
    Q6_K_BYTES,
    QK_K,
)
from ._jit import (
    INLINE,
    PARALLEL,
    ROWS_PER_TASK,
    SERIAL,
    block_step,
    block_sum,
    chunk_count,
    chunk_rows,
    f16_to_f32,
    fma32,
    row_start,
    u32,
)
from .simd import (
    PREFETCH_AHEAD,
    TILE_ROWS,
    TILES,
    dot64,
    dot128,
    dot256,
    pair_sums_dot_bytes,
    prefetch_bytes,
    q2_k_isum,
    q3_k_isum,
    q4_k_isum,
    q4_k_tile16,
    q4_k_tile16_dot,
    q5_k_isum,
    q5_k_tile16,
    q6_k_isum,
    q6_k_tile16,
    q6_k_tile16_dot,
)


@njit(**INLINE)
def _scales_mins_k4(blk, o):
    """Q4_K/Q5_K's twelve bytes of 6-bit scales and mins at blk[o], unpacked with
    word operations into (scales, mins): two uint64 holding eight bytes each
    (byte j = sub-block j; read with _byte).  Byte-at-a-time unpacking cost as
    much as decoding the 256 quants."""
    a = u32(blk, o)
    b = u32(blk, o + 4)
    c = u32(blk, o + 8)
    low6 = np.uint32(0x3F3F3F3F)
    low4 = np.uint32(0x0F0F0F0F)
    low2 = np.uint32(0x03030303)
    scales_lo = a & low6
    mins_lo = b & low6
    scales_hi = (c & low4) | (((a >> 6) & low2) << 4)
    mins_hi = ((c >> 4) & low4) | (((b >> 6) & low2) << 4)
    return (np.uint64(scales_lo) | (np.uint64(scales_hi) << 32), np.uint64(mins_lo) | (np.uint64(mins_hi) << 32))


@njit(**INLINE)
def _byte(word, j):
    """Byte j of a uint64, as int32."""
    return np.int32((word >> np.uint64(8 * j)) & np.uint64(255))


@njit(**INLINE)
def _decode_nibbles_k(blk, o, wq):
    """128 bytes of nibbles -> 256 values: 32 low nibbles, then 32 high, x4."""
    for g in range(4):
        for i in range(32):
            v = blk[o + g * 32 + i]
            wq[g * 64 + i] = v & 15
            wq[g * 64 + 32 + i] = v >> 4


@njit(**INLINE)
def _decode_crumbs_k(blk, o, wq):
    """64 bytes of 2-bit fields -> 256 values (Q2_K / Q3_K low bits)."""
    for h in range(2):
        for i in range(32):
            # literal shifts: a loop-variable shift keeps this loop scalar
            v = blk[o + h * 32 + i]
            wq[h * 128 + i] = v & 3
            wq[h * 128 + 32 + i] = (v >> 2) & 3
            wq[h * 128 + 64 + i] = (v >> 4) & 3
            wq[h * 128 + 96 + i] = v >> 6


@njit(**INLINE)
def _column(blk, q_o, shift, mask, s_a, s_b, ws, wo):
    """32 values (blk[q_o+i] >> shift) & mask times scale s_a (first 16) or s_b
    (last 16) into ws[wo:wo+32].  One 32-step loop of int16 arithmetic per call
    is what LLVM vectorizes well here (byte shifts by a loop variable are not)."""
    for i in range(32):
        ws[wo + i] = ((np.int16(blk[q_o + i]) >> shift) & mask) * (s_a if i < 16 else s_b)


@njit(**INLINE)
def _column_hbit(blk, q_o, shift, mask, h_o, h_shift, h_bit, offset, s_a, s_b, ws, wo):
    """As _column with a high bit from blk[h_o+i] (bit h_shift, placed at h_bit),
    minus offset."""
    for i in range(32):
        q = (np.int16(blk[q_o + i]) >> shift) & mask
        h = ((np.int16(blk[h_o + i]) >> h_shift) & 1) << h_bit
        ws[wo + i] = ((q | h) - offset) * (s_a if i < 16 else s_b)


@njit(**INLINE)
def _scaled_nibbles(blk, o, scales, ws, wo):
    """Q4_K quants (128 bytes at blk[o]) times their sub-block scale (bytes of
    the uint64 scales) -> ws[wo:wo+256].  Decoding and scaling in one narrow,
    explicitly typed pass keeps it SIMD."""
    for g in range(4):
        s_lo = np.int16(_byte(scales, 2 * g))
        s_hi = np.int16(_byte(scales, 2 * g + 1))
        for i in range(32):
            v = blk[o + g * 32 + i]
            ws[wo + g * 64 + i] = np.int16(v & np.uint8(15)) * s_lo
            ws[wo + g * 64 + 32 + i] = np.int16(v >> np.uint8(4)) * s_hi


@njit(**INLINE)
def _scaled_q5_k(blk, o, scales, ws, wo):
    """As _scaled_nibbles plus Q5_K's fifth bits (qh at blk[o+16], quants at blk[o+48])."""
    for g in range(4):
        s_lo = np.int16(_byte(scales, 2 * g))
        s_hi = np.int16(_byte(scales, 2 * g + 1))
        for i in range(32):
            v = blk[o + 48 + g * 32 + i]
            h = np.int16(blk[o + 16 + i]) >> (2 * g)
            ws[wo + g * 64 + i] = (np.int16(v & np.uint8(15)) | ((h & 1) << 4)) * s_lo
            ws[wo + g * 64 + 32 + i] = (np.int16(v >> np.uint8(4)) | ((h & 2) << 3)) * s_hi


@njit(**INLINE)
def _scaled_q2_k(blk, o, ws, wo):
    """Q2_K quants times their 4-bit scales (low nibbles of blk[o:o+16])."""
    for h in range(2):
        q = o + 16 + h * 32
        sc = o + h * 8
        for c in range(4):
            s_a = np.int16(blk[sc + 2 * c] & np.uint8(15))
            s_b = np.int16(blk[sc + 2 * c + 1] & np.uint8(15))
            _column(blk, q, 2 * c, 3, s_a, s_b, ws, wo + h * 128 + c * 32)


@njit(**INLINE)
def _q6_column(blk, lo_o, lo_shift, hi_o, hi_shift, s_a, s_b, ws, wo):
    """32 Q6_K values (q6 - 32) of one column times their two int8 scales."""
    for i in range(32):
        lo = (np.int16(blk[lo_o + i]) >> lo_shift) & 15
        hi = (np.int16(blk[hi_o + i]) >> hi_shift) & 3
        ws[wo + i] = ((lo | (hi << 4)) - 32) * (s_a if i < 16 else s_b)


@njit(**INLINE)
def _scaled_q6_k(blk, o, ws, wo):
    """Q6_K quants (q6 - 32) times their int8 scales (blk[o+192:o+208])."""
    for h in range(2):
        sc = o + 192 + h * 8
        ql = o + h * 64
        qh = o + 128 + h * 32
        out = wo + h * 128
        _q6_column(blk, ql, 0, qh, 0, np.int16(np.int8(blk[sc])), np.int16(np.int8(blk[sc + 1])), ws, out)
        _q6_column(blk, ql + 32, 0, qh, 2, np.int16(np.int8(blk[sc + 2])), np.int16(np.int8(blk[sc + 3])), ws, out + 32)
        _q6_column(blk, ql, 4, qh, 4, np.int16(np.int8(blk[sc + 4])), np.int16(np.int8(blk[sc + 5])), ws, out + 64)
        _q6_column(blk, ql + 32, 4, qh, 6, np.int16(np.int8(blk[sc + 6])), np.int16(np.int8(blk[sc + 7])), ws, out + 96)


@njit(**INLINE)
def _scaled_q3_k(blk, o, sc, ws, wo):
    """Q3_K quants (2 low bits at blk[o+32], high bit in the hmask at blk[o];
    value = q + 4*hbit - 4) times their 6-bit scales sc[0:16]."""
    for h in range(2):
        q = o + 32 + h * 32
        for c in range(4):
            s_a = np.int16(sc[h * 8 + 2 * c])
            s_b = np.int16(sc[h * 8 + 2 * c + 1])
            _column_hbit(blk, q, 2 * c, 3, o, 4 * h + c, 2, 4, s_a, s_b, ws, wo + h * 128 + c * 32)


@njit(**INLINE)
def _sum_mins_q2_k(bsums, bo, blk, o):
    """Sum of a Q2_K super-block's 16 Q8_K bsums times their 4-bit mins (high
    nibbles of blk[o:o+16])."""
    total = np.int32(0)
    for j in range(16):
        total = np.int32(total + bsums[bo + j] * np.int32(blk[o + j] >> 4))
    return total


@njit(**INLINE)
def _sum_mins_k4(bsums, bo, mins):
    """Sum of a Q4_K/Q5_K super-block's 16 Q8_K bsums times the min (bytes of
    the uint64 mins) of their 32-value sub-block."""
    total = np.int32(0)
    for j in range(8):
        total = np.int32(total + (bsums[bo + 2 * j] + bsums[bo + 2 * j + 1]) * _byte(mins, j))
    return total


# ---- Q2_K: scales[16] (lo nibble scale, hi nibble min), qs[64], d, dmin -----


# Top-level on purpose: numba caches factory-made parallel kernels per process only (docs/kernels.md).
@njit(**PARALLEL)
def matmul_q2_k(W, starts, rows, group_rows, cols, qs, d, extra, out, order, straight):
    n_tok = qs.shape[0] * group_rows // rows  # tokens per group of rows
    nb = cols // QK_K
    rb = nb * Q2_K_BYTES
    gemm_tokens = n_tok - n_tok % 4 if order == ORDER_GEMM and n_tok > 3 else 0
    straight = straight and gemm_tokens == 0  # from the row bytes
    if straight:
        for task in prange(chunk_count(rows, group_rows, ROWS_PER_TASK)):
            r0, n_rows, g = chunk_rows(task, group_rows, ROWS_PER_TASK)
            t0 = g * n_tok
            for t in range(n_tok):  # each token's activation rows viewed once per task, not per row
                x, dx, bsums = qs[t0 + t], d[t0 + t], extra[t0 + t]
                for r in range(r0, r0 + n_rows):
                    at = row_start(starts, r, group_rows, rb)
                    row = W[at : at + rb]
                    out[t, r] = _q2_k_straight_dot(row, x, dx, bsums, nb, order)
        return
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        ws = np.empty(cols, np.int16)
        dw = np.empty(nb, np.float32)
        dmin = np.empty(nb, np.float32)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            at = row_start(starts, r, group_rows, rb)
            row = W[at : at + rb]
            for b in range(nb):
                o = b * Q2_K_BYTES
                prefetch_bytes(row, o + PREFETCH_AHEAD, Q2_K_BYTES)
                dw[b] = f16_to_f32(row[o + 80], row[o + 81])
                dmin[b] = f16_to_f32(row[o + 82], row[o + 83])
                _scaled_q2_k(row, o, ws, b * QK_K)
            t0 = (r // group_rows) * n_tok
            for t in range(n_tok):
                x = qs[t0 + t]
                dx = d[t0 + t]
                bsums = extra[t0 + t]
                if order == ORDER_GEMM or order == ORDER_GEMV:
                    out[t, r] = _repacked_q2_k_dot(ws, x, dx, bsums, dw, dmin, row, nb, t < gemm_tokens)
                    continue
                acc = np.float32(0.0)
                for b in range(nb):
                    isum = dot256(ws, b * QK_K, x, b * QK_K)
                    summ = _sum_mins_q2_k(bsums, b * 16, row, b * Q2_K_BYTES)
                    acc = block_sum(order, acc, np.float32(isum), np.float32(summ), dw[b], dmin[b], dx[b])
                out[t, r] = acc


@njit(**INLINE)
def _q2_k_straight_dot(row, x, dx, bsums, nb, order):
    """A Q2_K row . token with each block's integer sums taken straight from its bytes, rounded
    as the route `order` rounds it (the repacked gemv's two FMA chains, or block_sum)."""
    acc = np.float32(0.0)
    acc_min = np.float32(0.0)
    for b in range(nb):
        o = b * Q2_K_BYTES
        prefetch_bytes(row, o + PREFETCH_AHEAD, Q2_K_BYTES)
        isum_i, summ_i = q2_k_isum(row, o, x, b * QK_K, bsums, b * 16)
        isum, summ = np.float32(isum_i), np.float32(summ_i)
        dw, dmin = f16_to_f32(row[o + 80], row[o + 81]), f16_to_f32(row[o + 82], row[o + 83])
        if order == ORDER_GEMM or order == ORDER_GEMV:
            acc = fma32(isum, dw * dx[b], acc)
            acc_min = fma32(summ, dmin * dx[b], acc_min)
        else:
            acc = block_sum(order, acc, isum, summ, dw, dmin, dx[b])
    return acc - acc_min


@njit(**INLINE)
def _repacked_q2_k_dot(ws, x, dx, bsums, dw, dmin, row, nb, gemm):
    """A Q2_K row . token as ggml's x86 kernels for its repacked Q2_K layout (AVX-512 builds)
    round it: as _repacked_q4_k_dot, with gemm adding every 128 values."""
    acc = np.float32(0.0)
    acc_min = np.float32(0.0)
    for b in range(nb):
        scale, scale_min = dw[b] * dx[b], dmin[b] * dx[b]
        if gemm:
            for h in range(2):
                isum = dot128(ws, b * QK_K + h * 128, x, b * QK_K + h * 128)
                summ = np.int32(0)
                for j in range(8 * h, 8 * h + 8):
                    summ = np.int32(summ + bsums[b * 16 + j] * np.int32(row[b * Q2_K_BYTES + j] >> 4))
                acc = fma32(np.float32(isum), scale, acc)
                acc_min = fma32(np.float32(summ), scale_min, acc_min)
        else:
            acc = fma32(np.float32(dot256(ws, b * QK_K, x, b * QK_K)), scale, acc)
            acc_min = fma32(np.float32(_sum_mins_q2_k(bsums, b * 16, row, b * Q2_K_BYTES)), scale_min, acc_min)
    return acc - acc_min


@njit(**SERIAL)
def dequantize_q2_k(W, cols, row_ids, out):
    nb = cols // QK_K
    rb = nb * Q2_K_BYTES
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb : (row_ids[i] + 1) * rb]
        wq = np.empty(QK_K, np.int8)
        for b in range(nb):
            o = b * Q2_K_BYTES
            dw = f16_to_f32(row[o + 80], row[o + 81])
            dmin = f16_to_f32(row[o + 82], row[o + 83])
            _decode_crumbs_k(row, o + 16, wq)
            for s in range(16):
                dl = dw * np.float32(row[o + s] & 15)
                ml = dmin * np.float32(row[o + s] >> 4)
                for j in range(16):
                    out[i, b * QK_K + s * 16 + j] = dl * np.float32(wq[s * 16 + j]) - ml


# ---- Q3_K: hmask[32], qs[64], scales[12] (6-bit, -32), d -------------------


@njit(**INLINE)
def _scales_q3_k(blk, o, sc):
    for k in range(8):
        sc[k] = (blk[o + 96 + k] & 15) | (((blk[o + 104 + k % 4] >> (2 * (k // 4))) & 3) << 4)
        sc[k + 8] = (blk[o + 96 + k] >> 4) | (((blk[o + 104 + k % 4] >> (2 * (k // 4 + 2))) & 3) << 4)
    for k in range(16):
        sc[k] -= 32


@njit(**INLINE)
def _decode_q3_k(blk, o, wq):
    _decode_crumbs_k(blk, o + 32, wq)
    for i in range(32):
        # the high bit *clear* means value - 4 (literal shifts, see above)
        h = ~blk[o + i]
        wq[i] -= (h & 1) << 2
        wq[32 + i] -= ((h >> 1) & 1) << 2
        wq[64 + i] -= ((h >> 2) & 1) << 2
        wq[96 + i] -= ((h >> 3) & 1) << 2
        wq[128 + i] -= ((h >> 4) & 1) << 2
        wq[160 + i] -= ((h >> 5) & 1) << 2
        wq[192 + i] -= ((h >> 6) & 1) << 2
        wq[224 + i] -= ((h >> 7) & 1) << 2


# Top-level on purpose: numba caches factory-made parallel kernels per process only (docs/kernels.md).
@njit(**PARALLEL)
def matmul_q3_k(W, starts, rows, group_rows, cols, qs, d, extra, out, order, straight):
    n_tok = qs.shape[0] * group_rows // rows  # tokens per group of rows
    nb = cols // QK_K
    rb = nb * Q3_K_BYTES
    if straight:  # from the row bytes
        for task in prange(chunk_count(rows, group_rows, ROWS_PER_TASK)):
            r0, n_rows, g = chunk_rows(task, group_rows, ROWS_PER_TASK)
            t0 = g * n_tok
            for t in range(n_tok):  # each token's activation rows viewed once per task, not per row
                x, dx, bsums = qs[t0 + t], d[t0 + t], extra[t0 + t]
                for r in range(r0, r0 + n_rows):
                    at = row_start(starts, r, group_rows, rb)
                    row = W[at : at + rb]
                    acc = np.float32(0.0)
                    for b in range(nb):
                        o = b * Q3_K_BYTES
                        prefetch_bytes(row, o + PREFETCH_AHEAD, Q3_K_BYTES)
                        isum = q3_k_isum(row, o, x, b * QK_K, bsums, b * 16)
                        acc = block_step(order, acc, np.float32(isum), f16_to_f32(row[o + 108], row[o + 109]), dx[b])
                    out[t, r] = acc
        return
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        sc = np.empty(16, np.int32)
        ws = np.empty(cols, np.int16)
        dw = np.empty(nb, np.float32)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            at = row_start(starts, r, group_rows, rb)
            row = W[at : at + rb]
            for b in range(nb):
                o = b * Q3_K_BYTES
                prefetch_bytes(row, o + PREFETCH_AHEAD, Q3_K_BYTES)
                dw[b] = f16_to_f32(row[o + 108], row[o + 109])
                _scales_q3_k(row, o, sc)
                _scaled_q3_k(row, o, sc, ws, b * QK_K)
            t0 = (r // group_rows) * n_tok
            for t in range(n_tok):
                x = qs[t0 + t]
                dx = d[t0 + t]
                acc = np.float32(0.0)
                for b in range(nb):
                    isum = dot256(ws, b * QK_K, x, b * QK_K)
                    acc = block_step(order, acc, np.float32(isum), dw[b], dx[b])
                out[t, r] = acc


@njit(**SERIAL)
def dequantize_q3_k(W, cols, row_ids, out):
    nb = cols // QK_K
    rb = nb * Q3_K_BYTES
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb : (row_ids[i] + 1) * rb]
        wq = np.empty(QK_K, np.int8)
        sc = np.empty(16, np.int32)
        for b in range(nb):
            o = b * Q3_K_BYTES
            dw = f16_to_f32(row[o + 108], row[o + 109])
            _scales_q3_k(row, o, sc)
            _decode_q3_k(row, o, wq)
            for s in range(16):
                dl = dw * np.float32(sc[s])
                for j in range(16):
                    out[i, b * QK_K + s * 16 + j] = dl * np.float32(wq[s * 16 + j])


# ---- Q4_K: d, dmin, scales[12], qs[128] ------------------------------------


# Top-level on purpose: numba caches factory-made parallel kernels per process only (docs/kernels.md).
@njit(**PARALLEL)
def matmul_q4_k(W, starts, rows, group_rows, cols, qs, d, extra, out, order, straight):
    n_tok = qs.shape[0] * group_rows // rows  # tokens per group of rows
    nb = cols // QK_K
    rb = nb * Q4_K_BYTES
    # ggml's repacked gemm takes the tokens four at a time, gemv the rest
    gemm_tokens = n_tok - n_tok % 4 if order == ORDER_GEMM and n_tok > 3 else 0
    # gemv alone, few tokens: straight from the quant bytes (simd.q4_k_isum); more tokens share
    # one decoded int16 row
    straight = straight and (order == ORDER_GEMM or order == ORDER_GEMV) and gemm_tokens == 0
    if straight:
        for task in prange(chunk_count(rows, group_rows, ROWS_PER_TASK)):
            r0, n_rows, g = chunk_rows(task, group_rows, ROWS_PER_TASK)
            t0 = g * n_tok
            for t in range(0, n_tok - 1, 2):  # token pairs share each block's unpacking
                x1, x2, dx1, dx2, bsums1, bsums2 = (
                    qs[t0 + t],
                    qs[t0 + t + 1],
                    d[t0 + t],
                    d[t0 + t + 1],
                    extra[t0 + t],
                    extra[t0 + t + 1],
                )
                for r in range(r0, r0 + n_rows):
                    at = row_start(starts, r, group_rows, rb)
                    out[t, r], out[t + 1, r] = _q4_k_gemv_dot2(W[at : at + rb], x1, x2, dx1, dx2, bsums1, bsums2, nb)
            if n_tok % 2:  # each token's activation rows viewed once per task, not per row
                t = n_tok - 1
                x, dx, bsums = qs[t0 + t], d[t0 + t], extra[t0 + t]
                for r in range(r0, r0 + n_rows):
                    at = row_start(starts, r, group_rows, rb)
                    out[t, r] = _q4_k_gemv_dot(W[at : at + rb], x, dx, bsums, nb)
        return
    if TILES:  # 16-row tiles (where vpdpbusd runs), a group's last one partial
        for tile in prange(chunk_count(rows, group_rows, TILE_ROWS)):
            r0, n_rows, g = chunk_rows(tile, group_rows, TILE_ROWS)
            at0 = row_start(starts, r0, group_rows, rb)
            _Q4_K_TILES(W, at0, r0, n_rows, rb, nb, qs, d, extra, out, g * n_tok, n_tok, order, gemm_tokens)
        return
    # else each row decoded once for all tokens
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        ws = np.empty(cols, np.int16)
        dw = np.empty(nb, np.float32)
        dmin = np.empty(nb, np.float32)
        mins = np.empty(nb, np.uint64)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            at = row_start(starts, r, group_rows, rb)
            row = W[at : at + rb]
            for b in range(nb):
                o = b * Q4_K_BYTES
                prefetch_bytes(row, o + PREFETCH_AHEAD, Q4_K_BYTES)
                dw[b] = f16_to_f32(row[o], row[o + 1])
                dmin[b] = f16_to_f32(row[o + 2], row[o + 3])
                scales, mins[b] = _scales_mins_k4(row, o + 4)
                _scaled_nibbles(row, o + 16, scales, ws, b * QK_K)
            t0 = (r // group_rows) * n_tok
            for t in range(n_tok):
                x = qs[t0 + t]
                dx = d[t0 + t]
                bsums = extra[t0 + t]
                if order == ORDER_GEMM or order == ORDER_GEMV:
                    out[t, r] = _repacked_q4_k_dot(ws, x, dx, bsums, dw, dmin, mins, nb, t < gemm_tokens)
                    continue
                acc = np.float32(0.0)
                for b in range(nb):
                    isum = dot256(ws, b * QK_K, x, b * QK_K)
                    summ = _sum_mins_k4(bsums, b * 16, mins[b])
                    acc = block_sum(order, acc, np.float32(isum), np.float32(summ), dw[b], dmin[b], dx[b])
                out[t, r] = acc


def _k4_tile_matmul(block_bytes, layout):
    """Rows r0 .. r0 + n_rows - 1 (row r0 at byte at0 of W) of a Q4_K / Q5_K matmul (block_bytes, its
    tile layout; inside one group of rows, whose tokens are t0 .. t0 + n_tok - 1) a block at a time
    through a 16-row tile (simd.q4_k_tile16_dot): the first gemm_tokens tokens rounded as ggml's
    repacked gemm, the rest by `order` (its repacked gemv where that is the gemm's)."""

    @njit(**INLINE)
    def tile_matmul(W, at0, r0, n_rows, rb, nb, qs, d, extra, out, t0, n_tok, order, gemm_tokens):
        tile = np.empty(4096, np.uint8)
        scales = np.empty(8 * TILE_ROWS, np.int32)
        mins = np.empty(8 * TILE_ROWS, np.int16)
        dw = np.empty(TILE_ROWS, np.float32)
        dmin = np.empty(TILE_ROWS, np.float32)
        acc = np.zeros(n_tok * 2 * TILE_ROWS, np.float32)
        rest = ORDER_GEMV if order == ORDER_GEMM else order
        for b in range(nb):
            o = at0 + b * block_bytes
            for i in range(n_rows):
                at = o + i * rb
                prefetch_bytes(W, at + PREFETCH_AHEAD, block_bytes)
                dw[i] = f16_to_f32(W[at], W[at + 1])
                dmin[i] = f16_to_f32(W[at + 2], W[at + 3])
                sc, mn = _scales_mins_k4(W, at + 4)
                for j in range(8):
                    scales[j * TILE_ROWS + i] = _byte(sc, j)
                    mins[(j // 2) * 2 * TILE_ROWS + 2 * i + j % 2] = _byte(mn, j)
            layout(W, o, rb, n_rows, tile, 0)
            for t in range(n_tok):
                q4_k_tile16_dot(
                    tile,
                    qs[t0 + t],
                    b * QK_K,
                    scales,
                    mins,
                    extra[t0 + t],
                    b * 16,
                    dw,
                    dmin,
                    d[t0 + t, b],
                    acc,
                    t * 2 * TILE_ROWS,
                    ORDER_GEMM if t < gemm_tokens else rest,
                )
        for t in range(n_tok):
            for i in range(n_rows):
                out[t, r0 + i] = acc[t * 2 * TILE_ROWS + i] - acc[t * 2 * TILE_ROWS + TILE_ROWS + i]

    return tile_matmul


_Q4_K_TILES = _k4_tile_matmul(Q4_K_BYTES, q4_k_tile16)
_Q5_K_TILES = _k4_tile_matmul(Q5_K_BYTES, q5_k_tile16)


@njit(**INLINE)
def _repacked_q4_k_dot(ws, x, dx, bsums, dw, dmin, mins, nb, gemm):
    """A Q4_K row . token as ggml's x86 kernels for its repacked Q4_K layout round it: scales and
    mins in two FMA chains, subtracted at the end; gemm adds every 64 values, gemv every block."""
    acc = np.float32(0.0)
    acc_min = np.float32(0.0)
    for b in range(nb):
        scale, scale_min = dw[b] * dx[b], dmin[b] * dx[b]
        if gemm:
            for h in range(4):
                isum = dot64(ws, b * QK_K + h * 64, x, b * QK_K + h * 64)
                o = b * 16 + 4 * h
                summ = (bsums[o] + bsums[o + 1]) * _byte(mins[b], 2 * h) + (bsums[o + 2] + bsums[o + 3]) * _byte(
                    mins[b], 2 * h + 1
                )
                acc = fma32(np.float32(isum), scale, acc)
                acc_min = fma32(np.float32(summ), scale_min, acc_min)
        else:
            acc = fma32(np.float32(dot256(ws, b * QK_K, x, b * QK_K)), scale, acc)
            acc_min = fma32(np.float32(_sum_mins_k4(bsums, b * 16, mins[b])), scale_min, acc_min)
    return acc - acc_min


@njit(**INLINE)
def _q4_k_gemv_dot2(row, x1, x2, dx1, dx2, bsums1, bsums2, nb):
    """_q4_k_gemv_dot for two tokens at once, each rounded exactly as alone: the block's scales,
    mins and quant bytes are unpacked once for both (LLVM shares the two intrinsic calls' loads
    and nibble masks; 8.9 -> 6.7 ns per block and token, one core, in cache)."""
    acc1 = acc_min1 = acc2 = acc_min2 = np.float32(0.0)
    for b in range(nb):
        o = b * Q4_K_BYTES
        prefetch_bytes(row, o + PREFETCH_AHEAD, Q4_K_BYTES)
        scales, mins = _scales_mins_k4(row, o + 4)
        dw, dmin = f16_to_f32(row[o], row[o + 1]), f16_to_f32(row[o + 2], row[o + 3])
        isum1, isum2 = q4_k_isum(row, o + 16, x1, b * QK_K, scales), q4_k_isum(row, o + 16, x2, b * QK_K, scales)
        summ1, summ2 = pair_sums_dot_bytes(bsums1, b * 16, mins), pair_sums_dot_bytes(bsums2, b * 16, mins)
        acc1 = fma32(np.float32(isum1), dw * dx1[b], acc1)
        acc_min1 = fma32(np.float32(summ1), dmin * dx1[b], acc_min1)
        acc2 = fma32(np.float32(isum2), dw * dx2[b], acc2)
        acc_min2 = fma32(np.float32(summ2), dmin * dx2[b], acc_min2)
    return acc1 - acc_min1, acc2 - acc_min2


@njit(**INLINE)
def _q4_k_gemv_dot(row, x, dx, bsums, nb):
    """_repacked_q4_k_dot's gemv order, with each block's integer sums taken straight from the
    quant bytes."""
    acc = np.float32(0.0)
    acc_min = np.float32(0.0)
    for b in range(nb):
        o = b * Q4_K_BYTES
        prefetch_bytes(row, o + PREFETCH_AHEAD, Q4_K_BYTES)
        scales, mins = _scales_mins_k4(row, o + 4)
        isum = q4_k_isum(row, o + 16, x, b * QK_K, scales)
        summ = pair_sums_dot_bytes(bsums, b * 16, mins)
        acc = fma32(np.float32(isum), f16_to_f32(row[o], row[o + 1]) * dx[b], acc)
        acc_min = fma32(np.float32(summ), f16_to_f32(row[o + 2], row[o + 3]) * dx[b], acc_min)
    return acc - acc_min


@njit(**SERIAL)
def dequantize_q4_k(W, cols, row_ids, out):
    nb = cols // QK_K
    rb = nb * Q4_K_BYTES
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb : (row_ids[i] + 1) * rb]
        wq = np.empty(QK_K, np.int8)
        for b in range(nb):
            o = b * Q4_K_BYTES
            dw = f16_to_f32(row[o], row[o + 1])
            dmin = f16_to_f32(row[o + 2], row[o + 3])
            scales, mins = _scales_mins_k4(row, o + 4)
            _decode_nibbles_k(row, o + 16, wq)
            for s in range(8):
                dl = dw * np.float32(_byte(scales, s))
                ml = dmin * np.float32(_byte(mins, s))
                for j in range(32):
                    out[i, b * QK_K + s * 32 + j] = dl * np.float32(wq[s * 32 + j]) - ml


# ---- Q5_K: d, dmin, scales[12], qh[32], qs[128] ----------------------------


@njit(**INLINE)
def _decode_q5_k(blk, o, wq):
    _decode_nibbles_k(blk, o + 48, wq)
    for i in range(32):
        h = blk[o + 16 + i]  # bit k is the fifth bit of sub-block k (literal shifts)
        wq[i] |= (h & 1) << 4
        wq[32 + i] |= ((h >> 1) & 1) << 4
        wq[64 + i] |= ((h >> 2) & 1) << 4
        wq[96 + i] |= ((h >> 3) & 1) << 4
        wq[128 + i] |= ((h >> 4) & 1) << 4
        wq[160 + i] |= ((h >> 5) & 1) << 4
        wq[192 + i] |= ((h >> 6) & 1) << 4
        wq[224 + i] |= ((h >> 7) & 1) << 4


# Top-level on purpose: numba caches factory-made parallel kernels per process only (docs/kernels.md).
@njit(**PARALLEL)
def matmul_q5_k(W, starts, rows, group_rows, cols, qs, d, extra, out, order, straight):
    n_tok = qs.shape[0] * group_rows // rows  # tokens per group of rows
    nb = cols // QK_K
    rb = nb * Q5_K_BYTES
    if straight:  # from the row bytes
        for task in prange(chunk_count(rows, group_rows, ROWS_PER_TASK)):
            r0, n_rows, g = chunk_rows(task, group_rows, ROWS_PER_TASK)
            t0 = g * n_tok
            for t in range(n_tok):  # each token's activation rows viewed once per task, not per row
                x, dx, bsums = qs[t0 + t], d[t0 + t], extra[t0 + t]
                for r in range(r0, r0 + n_rows):
                    at = row_start(starts, r, group_rows, rb)
                    row = W[at : at + rb]
                    acc = np.float32(0.0)
                    for b in range(nb):
                        o = b * Q5_K_BYTES
                        prefetch_bytes(row, o + PREFETCH_AHEAD, Q5_K_BYTES)
                        scales, mins = _scales_mins_k4(row, o + 4)
                        isum = np.float32(q5_k_isum(row, o + 48, x, b * QK_K, scales, o + 16))
                        summ = np.float32(pair_sums_dot_bytes(bsums, b * 16, mins))
                        dw, dmin = f16_to_f32(row[o], row[o + 1]), f16_to_f32(row[o + 2], row[o + 3])
                        acc = block_sum(order, acc, isum, summ, dw, dmin, dx[b])
                    out[t, r] = acc
        return
    if TILES:  # 16-row tiles (where vpdpbusd runs), a group's last one partial
        for tile in prange(chunk_count(rows, group_rows, TILE_ROWS)):
            r0, n_rows, g = chunk_rows(tile, group_rows, TILE_ROWS)
            at0 = row_start(starts, r0, group_rows, rb)
            _Q5_K_TILES(W, at0, r0, n_rows, rb, nb, qs, d, extra, out, g * n_tok, n_tok, order, 0)
        return
    # else each row decoded once for all tokens
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        ws = np.empty(cols, np.int16)
        dw = np.empty(nb, np.float32)
        dmin = np.empty(nb, np.float32)
        mins = np.empty(nb, np.uint64)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            at = row_start(starts, r, group_rows, rb)
            row = W[at : at + rb]
            for b in range(nb):
                o = b * Q5_K_BYTES
                prefetch_bytes(row, o + PREFETCH_AHEAD, Q5_K_BYTES)
                dw[b] = f16_to_f32(row[o], row[o + 1])
                dmin[b] = f16_to_f32(row[o + 2], row[o + 3])
                scales, mins[b] = _scales_mins_k4(row, o + 4)
                _scaled_q5_k(row, o, scales, ws, b * QK_K)
            t0 = (r // group_rows) * n_tok
            for t in range(n_tok):
                x = qs[t0 + t]
                dx = d[t0 + t]
                bsums = extra[t0 + t]
                acc = np.float32(0.0)
                for b in range(nb):
                    isum = dot256(ws, b * QK_K, x, b * QK_K)
                    summ = _sum_mins_k4(bsums, b * 16, mins[b])
                    acc = block_sum(order, acc, np.float32(isum), np.float32(summ), dw[b], dmin[b], dx[b])
                out[t, r] = acc


@njit(**SERIAL)
def dequantize_q5_k(W, cols, row_ids, out):
    nb = cols // QK_K
    rb = nb * Q5_K_BYTES
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb : (row_ids[i] + 1) * rb]
        wq = np.empty(QK_K, np.int8)
        for b in range(nb):
            o = b * Q5_K_BYTES
            dw = f16_to_f32(row[o], row[o + 1])
            dmin = f16_to_f32(row[o + 2], row[o + 3])
            scales, mins = _scales_mins_k4(row, o + 4)
            _decode_q5_k(row, o, wq)
            for s in range(8):
                dl = dw * np.float32(_byte(scales, s))
                ml = dmin * np.float32(_byte(mins, s))
                for j in range(32):
                    out[i, b * QK_K + s * 32 + j] = dl * np.float32(wq[s * 32 + j]) - ml


# ---- Q6_K: ql[128], qh[64], scales[16] int8, d; value = q6 - 32 -------------


@njit(**INLINE)
def _decode_q6_k(blk, o, wq):
    for h in range(2):
        for i in range(32):
            lo0 = blk[o + h * 64 + i]
            lo1 = blk[o + h * 64 + 32 + i]
            hi = blk[o + 128 + h * 32 + i]
            wq[h * 128 + i] = ((lo0 & 15) | ((hi & 3) << 4)) - 32
            wq[h * 128 + 32 + i] = ((lo1 & 15) | (((hi >> 2) & 3) << 4)) - 32
            wq[h * 128 + 64 + i] = ((lo0 >> 4) | (((hi >> 4) & 3) << 4)) - 32
            wq[h * 128 + 96 + i] = ((lo1 >> 4) | ((hi >> 6) << 4)) - 32


# Top-level on purpose: numba caches factory-made parallel kernels per process only (docs/kernels.md).
@njit(**PARALLEL)
def matmul_q6_k(W, starts, rows, group_rows, cols, qs, d, extra, out, order, straight):
    n_tok = qs.shape[0] * group_rows // rows  # tokens per group of rows
    nb = cols // QK_K
    rb = nb * Q6_K_BYTES
    if straight:  # from the row bytes
        for task in prange(chunk_count(rows, group_rows, ROWS_PER_TASK)):
            r0, n_rows, g = chunk_rows(task, group_rows, ROWS_PER_TASK)
            t0 = g * n_tok
            for t in range(n_tok):  # each token's activation rows viewed once per task, not per row
                x, dx, bsums = qs[t0 + t], d[t0 + t], extra[t0 + t]
                for r in range(r0, r0 + n_rows):
                    at = row_start(starts, r, group_rows, rb)
                    row = W[at : at + rb]
                    acc = np.float32(0.0)
                    for b in range(nb):
                        o = b * Q6_K_BYTES
                        prefetch_bytes(row, o + PREFETCH_AHEAD, Q6_K_BYTES)
                        isum = q6_k_isum(row, o, x, b * QK_K, bsums, b * 16)
                        acc = block_step(order, acc, np.float32(isum), f16_to_f32(row[o + 208], row[o + 209]), dx[b])
                    out[t, r] = acc
        return
    if TILES:  # 16-row tiles (where vpdpbusd runs), a group's last one partial
        for tile in prange(chunk_count(rows, group_rows, TILE_ROWS)):
            r0, n_rows, g = chunk_rows(tile, group_rows, TILE_ROWS)
            at0 = row_start(starts, r0, group_rows, rb)
            _q6_k_tile_matmul(W, at0, r0, n_rows, rb, nb, qs, d, extra, out, g * n_tok, n_tok, order == ORDER_TILED)
        return
    # else each row decoded once for all tokens
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        ws = np.empty(cols, np.int16)
        dw = np.empty(nb, np.float32)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            at = row_start(starts, r, group_rows, rb)
            row = W[at : at + rb]
            for b in range(nb):
                o = b * Q6_K_BYTES
                prefetch_bytes(row, o + PREFETCH_AHEAD, Q6_K_BYTES)
                dw[b] = f16_to_f32(row[o + 208], row[o + 209])
                _scaled_q6_k(row, o, ws, b * QK_K)
            t0 = (r // group_rows) * n_tok
            for t in range(n_tok):
                x = qs[t0 + t]
                dx = d[t0 + t]
                acc = np.float32(0.0)
                for b in range(nb):
                    isum = dot256(ws, b * QK_K, x, b * QK_K)
                    acc = block_step(order, acc, np.float32(isum), dw[b], dx[b])
                out[t, r] = acc


@njit(**INLINE)
def _q6_k_tile_matmul(W, at0, r0, n_rows, rb, nb, qs, d, extra, out, t0, n_tok, tiled):
    """Rows r0 .. r0 + n_rows - 1 (row r0 at byte at0 of W) of a Q6_K matmul (inside one group of
    rows, whose tokens are t0 .. t0 + n_tok - 1) a block at a time through a 16-row tile, rounded as ggml's tiled matmul
    (tiled) or its vec_dot."""
    tile = np.empty(4096, np.uint8)
    scales = np.empty(16 * TILE_ROWS, np.int32)
    dw = np.empty(TILE_ROWS, np.float32)
    acc = np.zeros(n_tok * TILE_ROWS, np.float32)
    for b in range(nb):
        o = at0 + b * Q6_K_BYTES
        for i in range(n_rows):
            at = o + i * rb
            prefetch_bytes(W, at + PREFETCH_AHEAD, Q6_K_BYTES)
            dw[i] = f16_to_f32(W[at + 208], W[at + 209])
            for j in range(16):
                scales[j * TILE_ROWS + i] = np.int8(W[at + 192 + j])
        q6_k_tile16(W, o, rb, n_rows, tile, 0)
        for t in range(n_tok):
            q6_k_tile16_dot(
                tile, qs[t0 + t], b * QK_K, scales, extra[t0 + t], b * 16, dw, d[t0 + t, b], acc, t * TILE_ROWS, tiled
            )
    for t in range(n_tok):
        for i in range(n_rows):
            out[t, r0 + i] = acc[t * TILE_ROWS + i]


@njit(**SERIAL)
def dequantize_q6_k(W, cols, row_ids, out):
    nb = cols // QK_K
    rb = nb * Q6_K_BYTES
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb : (row_ids[i] + 1) * rb]
        wq = np.empty(QK_K, np.int8)
        for b in range(nb):
            o = b * Q6_K_BYTES
            dw = f16_to_f32(row[o + 208], row[o + 209])
            _decode_q6_k(row, o, wq)
            for s in range(16):
                dl = dw * np.float32(np.int8(row[o + 192 + s]))
                for j in range(16):
                    out[i, b * QK_K + s * 16 + j] = dl * np.float32(wq[s * 16 + j])
