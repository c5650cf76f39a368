"""IQ quants: IQ4_NL, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M.

Lookup grids come from the gguf package's tables (gguf.quants.<TYPE>.grid, decoded from
grid_hex at import).  For few tokens per row (`straight`, set by kernels.KERNELS; IQ4_NL:
always) a simd.py intrinsic takes each super-block's exact int32 sum straight from the row
bytes: grid entries gathered into a vector or looked up in registers, signs as byte masks applied
to the activation (which the VBMI code reads reordered, _jit.grid_activations and its kin), IQ4
values looked up by pshufb.  Larger batches decode each row once through "signed grid" tables
(every grid entry times every sign pattern, packed as uint32/uint64: one table load per 4 or 8
weights): where vpdpbusd runs (simd.TILES) into int8 values laid out as 16-row tiles that take
every token 16 rows at a time (_tile_matmul; IQ1_S/IQ1_M not yet), else into int16 values
times their integer sub-block scale (_jit.widen8) dotted with every token.
Either way the float step is ggml's (generic vec_dot, ggml-cpu/quants.c), including the final
per-row factor (0.125 for IQ2_*, 0.25 for IQ3_XXS).  IQ4_NL uses Q8_0 activations, the rest
Q8_K.  Kernel signatures as in legacy.py.
"""

from __future__ import annotations

import numpy as np
from gguf import quants as gq
from numba import njit, prange

from ._constants import (
    IQ1_M_BYTES,
    IQ1_S_BYTES,
    IQ2_S_BYTES,
    IQ2_XS_BYTES,
    IQ2_XXS_BYTES,
    IQ3_S_BYTES,
    IQ3_XXS_BYTES,
    IQ4_NL_BYTES,
    IQ4_XS_BYTES,
    ORDER_GEMV,
    ORDER_TILED,
    QK4_NL,
    QK_K,
)
from ._jit import (
    INLINE,
    PARALLEL,
    ROWS_PER_TASK,
    SERIAL,
    block_step,
    chunk_count,
    chunk_rows,
    decode_pairs,
    f16_to_f32,
    grid_activations,
    iq2_xxs_activations,
    iq3_activations,
    nibble_pair_words,
    nibble_row_dot,
    pair_order,
    row_start,
    u32,
    widen4,
    widen8,
)
from .simd import (
    PREFETCH_AHEAD,
    TILE_ROWS,
    TILES,
    dot256,
    f16_bits_to_f32,
    int8_tile16,
    int8_tile16_dot,
    iq1_delta_table,
    iq1_m_isum,
    iq1_m_scale_bits,
    iq1_s_isum,
    iq2_s_isum,
    iq2_xs_isum,
    iq2_xxs_isum,
    iq2_xxs_pair_isum,
    iq3_s_isum,
    iq3_xxs_isum,
    iq4_xs_isum,
    prefetch_bytes,
    rows_dot8,
)


def _grid(cls) -> np.ndarray:
    cls.init_grid()
    return np.ascontiguousarray(cls.grid.reshape(cls.grid_shape).astype(np.int8))


_GRID_IQ2_XXS = _grid(gq.IQ2_XXS)
_GRID_IQ2_XS = _grid(gq.IQ2_XS)
_GRID_IQ2_S = _grid(gq.IQ2_S)
_GRID_IQ3_XXS = _grid(gq.IQ3_XXS)
_GRID_IQ3_S = _grid(gq.IQ3_S)
_GRID_IQ1_S = _grid(gq.IQ1_S)
# sign byte -> eight factors of +-1 (bit j set = negate value j)
_SIGNS = np.where((np.arange(256)[:, None] >> np.arange(8)) & 1, -1, 1).astype(np.int8)
# 7-bit sign index -> sign byte with even parity
_KSIGNS = np.frombuffer(gq.IQ2_XXS.ksigns, dtype=np.uint8).copy()


def _signed8(grid: np.ndarray) -> np.ndarray:
    """[grid index * 128 + 7-bit sign index] -> the 8 signed int8 values as one uint64,
    so decoding eight weights is a single table load and store."""
    signs = _SIGNS[_KSIGNS]  # [128, 8]
    return np.ascontiguousarray(grid[:, None, :] * signs[None, :, :]).view(np.uint64).reshape(-1)


def _signed4(grid: np.ndarray) -> np.ndarray:
    """[grid index * 16 + 4 sign bits] -> 4 signed int8 values as one uint32 (grid
    entries of 4 values, or half an 8-value entry)."""
    signs = _SIGNS[:16, :4]  # [16, 4]
    return np.ascontiguousarray(grid[:, None, :] * signs[None, :, :]).view(np.uint32).reshape(-1)


_SIGNED_IQ2_XXS = _signed8(_GRID_IQ2_XXS)
_SIGNED_IQ2_XS = _signed8(_GRID_IQ2_XS)
# IQ2_S has raw 8-bit signs: split each 8-value entry into halves of 4
_SIGNED_IQ2_S = _signed4(_GRID_IQ2_S.reshape(-1, 4))
_SIGNED_IQ3_XXS = _signed4(_GRID_IQ3_XXS)
_SIGNED_IQ3_S = _signed4(_GRID_IQ3_S)
_GRID8_IQ1_S = _GRID_IQ1_S.view(np.uint64).reshape(-1)
_IQ1_DELTA_TABLE = iq1_delta_table(_GRID_IQ1_S)  # for simd.iq1_s_isum / iq1_m_isum
_GRID8_IQ2_XXS = _GRID_IQ2_XXS.view(np.uint64).reshape(-1)
_GRID8_IQ2_XS = _GRID_IQ2_XS.view(np.uint64).reshape(-1)
_GRID4_IQ3_XXS = _GRID_IQ3_XXS.view(np.uint32).reshape(-1)
_GRID8_IQ2_S = _GRID_IQ2_S.view(np.uint64).reshape(-1)
_GRID4_IQ3_S = _GRID_IQ3_S.view(np.uint32).reshape(-1)
# 7-bit sign index -> eight byte masks (0xFF: negate that value), for simd's IQ2/IQ3 grid sums
_SIGN_MASKS = np.ascontiguousarray(np.where(_SIGNS[_KSIGNS] < 0, 0xFF, 0).astype(np.uint8)).view(np.uint64).reshape(-1)
# sign byte -> eight byte masks (bit j set: negate value j), for IQ2_S and IQ3_S
_BYTE_MASKS = np.ascontiguousarray(np.where(_SIGNS < 0, 0xFF, 0).astype(np.uint8)).view(np.uint64).reshape(-1)
_IQ4_VALUES = np.array(gq.IQ4_NL.kvalues, dtype=np.int8)
_IQ4_PAIRS = nibble_pair_words(_IQ4_VALUES)
_IQ1_DELTA = np.float32(0.125)
_IQ4_NL_ROW = nibble_row_dot(IQ4_NL_BYTES, _IQ4_VALUES, fp16_scale=True)
_IQ4_NL_ROWS8 = rows_dot8["iq4_nl"]


def _grid_row_dot(isum, block_bytes, grid, signs, factor, pair_isum=None):
    """A row . token for one of the IQ2/IQ3 grid types, straight from the row bytes: each
    super-block's exact sum from its simd intrinsic `isum`, ggml's float step (block_step with the
    block's fp16 d in its first two bytes), then the type's final factor.  `pair_isum`, where the
    type has one for this CPU: two blocks per call (sharing their grid lookups, their sums as
    float32), an odd last block by `isum`."""

    @njit(**INLINE)
    def row_dot(row, x, dx, nb, order):
        acc = np.float32(0.0)
        paired = 0
        if pair_isum is not None:
            paired = nb - nb % 2
            for b in range(0, paired, 2):
                o = b * block_bytes
                prefetch_bytes(row, o + PREFETCH_AHEAD, 2 * block_bytes)
                first, second = pair_isum(row, o, x, b * QK_K)
                acc = block_step(order, acc, first, f16_to_f32(row[o], row[o + 1]), dx[b])
                o2 = o + block_bytes
                acc = block_step(order, acc, second, f16_to_f32(row[o2], row[o2 + 1]), dx[b + 1])
        for b in range(paired, nb):
            o = b * block_bytes
            prefetch_bytes(row, o + PREFETCH_AHEAD, block_bytes)
            block = np.float32(isum(row, o, x, b * QK_K, grid, signs))
            acc = block_step(order, acc, block, f16_to_f32(row[o], row[o + 1]), dx[b])
        return np.float32(factor) * acc

    return row_dot


# IQ2_XXS: the activation from _jit.iq2_xxs_activations (pairs and an odd last block, each read in its order)
_IQ2_XXS_ROW = _grid_row_dot(iq2_xxs_isum, IQ2_XXS_BYTES, _GRID8_IQ2_XXS, _SIGN_MASKS, 0.125, iq2_xxs_pair_isum)
_IQ2_XS_ROW = _grid_row_dot(iq2_xs_isum, IQ2_XS_BYTES, _GRID8_IQ2_XS, _SIGN_MASKS, 0.125)
_IQ2_S_ROW = _grid_row_dot(iq2_s_isum, IQ2_S_BYTES, _GRID8_IQ2_S, _BYTE_MASKS, 0.125)
_IQ3_XXS_ROW = _grid_row_dot(iq3_xxs_isum, IQ3_XXS_BYTES, _GRID4_IQ3_XXS, _SIGN_MASKS, 0.25)
_IQ3_S_ROW = _grid_row_dot(iq3_s_isum, IQ3_S_BYTES, _GRID4_IQ3_S, _BYTE_MASKS, 1.0)


def _tile_matmul(block_bytes, decode, scale16, factor):
    """Rows r0 .. r0 + n_rows - 1 (n_rows <= 16; row r0 at byte at0 of W) of a matmul of a type without
    mins whose block is d (fp16) first (inside one group of rows, whose tokens are t0 .. t0 +
    n_tok - 1), a block at a time: each row's values decoded (decode(blk, o, values, wo, False), into
    int8) with the integer scale of each 16 (scale16(blk, o, j)), the rows laid out as a tile
    (simd.int8_tile16) that every token takes 16 rows at a time (simd.int8_tile16_dot: ggml's tiled
    or vec_dot step per block), times the type's final factor."""

    @njit(**INLINE)
    def tile_matmul(W, at0, r0, n_rows, rb, nb, qs, d, extra, out, t0, n_tok, tiled):
        values = np.empty(TILE_ROWS * QK_K, np.int8)
        tile = np.empty(4096, np.uint8)
        scales = np.empty(16 * TILE_ROWS, np.int32)
        dw = np.empty(TILE_ROWS, np.float32)
        acc = np.zeros(n_tok * TILE_ROWS, np.float32)
        for b in range(nb):
            for i in range(n_rows):
                o = at0 + i * rb + b * block_bytes
                prefetch_bytes(W, o + PREFETCH_AHEAD, block_bytes)
                dw[i] = f16_to_f32(W[o], W[o + 1])
                decode(W, o, values, i * QK_K, False)
                for j in range(16):
                    scales[j * TILE_ROWS + i] = scale16(W, o, j)
            int8_tile16(values.view(np.uint8), 0, QK_K, TILE_ROWS, tile, 0)  # (rows past n_rows: unused)
            for t in range(n_tok):
                int8_tile16_dot(
                    tile,
                    qs[t0 + t],
                    b * QK_K,
                    scales,
                    extra[t0 + t],
                    b * 16,
                    dw,
                    d[t0 + t, b],
                    acc,
                    t * TILE_ROWS,
                    tiled,
                )
        for t in range(n_tok):
            for i in range(n_rows):
                out[t, r0 + i] = np.float32(factor) * acc[t * TILE_ROWS + i]

    return tile_matmul


# ---- IQ4_NL: d f16, 16 bytes of indices into a 16-value table (Q8_0 acts) ---


# Top-level on purpose: numba caches factory-made parallel kernels per process only (docs/kernels.md).
@njit(**PARALLEL)
def matmul_iq4_nl(W, starts, rows, group_rows, cols, qs, d, extra, out, order, straight):
    """Values looked up in registers (simd.nibble_table_dot), every token straight from the row
    bytes: 2.5-4x faster than decoding the row once for a batch, even for 64 tokens.  Repacked by
    llama.cpp (ORDER_GEMV; then group_rows % 8 == 0): eight rows per call (simd.rows_dot8)."""
    n_tok = qs.shape[0] * group_rows // rows  # tokens per group of rows
    nb = cols // QK4_NL
    rb = nb * IQ4_NL_BYTES
    if order == ORDER_GEMV:
        for task in prange(rows // 8):
            g = task * 8 // group_rows
            at = row_start(starts, task * 8, group_rows, rb)
            for t in range(n_tok):
                _IQ4_NL_ROWS8(W, at, rb, qs[g * n_tok + t], d[g * n_tok + t], nb, out[t], task * 8)
        return
    for task in prange(chunk_count(rows, group_rows, ROWS_PER_TASK)):
        r0, n_rows, g = chunk_rows(task, group_rows, ROWS_PER_TASK)
        t0 = g * n_tok
        for t in range(n_tok):  # each token's activation rows viewed once per task, not per row
            x, dx = qs[t0 + t], d[t0 + t]
            for r in range(r0, r0 + n_rows):
                at = row_start(starts, r, group_rows, rb)
                row = W[at : at + rb]
                out[t, r] = _IQ4_NL_ROW(row, x, dx, nb, order)


@njit(**SERIAL)
def dequantize_iq4_nl(W, cols, row_ids, out):
    nb = cols // QK4_NL
    rb = nb * IQ4_NL_BYTES
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb : (row_ids[i] + 1) * rb]
        for b in range(nb):
            o = b * IQ4_NL_BYTES
            dw = f16_to_f32(row[o], row[o + 1])
            for j in range(16):
                out[i, b * QK4_NL + j] = dw * np.float32(_IQ4_VALUES[row[o + 2 + j] & 15])
                out[i, b * QK4_NL + 16 + j] = dw * np.float32(_IQ4_VALUES[row[o + 2 + j] >> 4])


# ---- IQ4_XS: d, scales_h u16, scales_l[4], qs[128]; 6-bit scales - 32 --------


@njit(**INLINE)
def _scale_iq4_xs(blk, o, ib):
    h = np.int32(blk[o + 2]) | (np.int32(blk[o + 3]) << 8)
    return (((blk[o + 4 + ib // 2] >> (4 * (ib % 2))) & 15) | (((h >> (2 * ib)) & 3) << 4)) - 32


@njit(**INLINE)
def _decode_iq4_xs(blk, o, ws, wo, scaled):
    """The block's 256 values in their own order (low nibbles of a sub-block's 16 bytes, then the
    high ones), times their sub-block scale if scaled, into ws[wo:wo+256]."""
    for ib in range(8):
        s = np.int16(_scale_iq4_xs(blk, o, ib)) if scaled else np.int16(1)
        for j in range(16):
            v = blk[o + 8 + ib * 16 + j]
            ws[wo + ib * 32 + j] = np.int16(_IQ4_VALUES[v & 15]) * s
            ws[wo + ib * 32 + 16 + j] = np.int16(_IQ4_VALUES[v >> 4]) * s


@njit(**INLINE)
def _scale16_iq4_xs(blk, o, j):
    """The integer scale of the block's 16 values from 16j (a tile's sub-blocks)."""
    return _scale_iq4_xs(blk, o, j // 2)


_IQ4_XS_TILES = _tile_matmul(IQ4_XS_BYTES, _decode_iq4_xs, _scale16_iq4_xs, 1.0)


# Top-level on purpose: numba caches factory-made parallel kernels per process only (docs/kernels.md).
@njit(**PARALLEL)
def matmul_iq4_xs(W, starts, rows, group_rows, cols, qs, d, extra, out, order, straight):
    """Weights in pair order times their sub-block scale, against pair-ordered activations."""
    n_tok = qs.shape[0] * group_rows // rows  # tokens per group of rows
    nb = cols // QK_K
    rb = nb * IQ4_XS_BYTES
    if straight:
        for task in prange(chunk_count(rows, group_rows, ROWS_PER_TASK)):
            r0, n_rows, g = chunk_rows(task, group_rows, ROWS_PER_TASK)
            t0 = g * n_tok
            for t in range(n_tok):  # each token's activation rows viewed once per task, not per row
                x, dx = qs[t0 + t], d[t0 + t]
                for r in range(r0, r0 + n_rows):
                    at = row_start(starts, r, group_rows, rb)
                    row = W[at : at + rb]
                    acc = np.float32(0.0)
                    for b in range(nb):
                        o = b * IQ4_XS_BYTES
                        prefetch_bytes(row, o + PREFETCH_AHEAD, IQ4_XS_BYTES)
                        sumi = iq4_xs_isum(row, o, x, b * QK_K, _IQ4_VALUES)
                        dw = f16_to_f32(row[o], row[o + 1])
                        acc = block_step(order, acc, np.float32(sumi), dw, dx[b])
                    out[t, r] = acc
        return
    if TILES:  # 16-row tiles (where vpdpbusd runs), a group's last one partial
        for tile in prange(chunk_count(rows, group_rows, TILE_ROWS)):
            r0, n_rows, g = chunk_rows(tile, group_rows, TILE_ROWS)
            at0 = row_start(starts, r0, group_rows, rb)
            _IQ4_XS_TILES(W, at0, r0, n_rows, rb, nb, qs, d, extra, out, g * n_tok, n_tok, order == ORDER_TILED)
        return
    # else each row decoded once for all tokens
    xp = pair_order(qs)
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        ws = np.empty(cols, np.int16)
        dw = np.empty(nb, np.float32)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            at = row_start(starts, r, group_rows, rb)
            row = W[at : at + rb]
            for b in range(nb):
                o = b * IQ4_XS_BYTES
                prefetch_bytes(row, o + PREFETCH_AHEAD, IQ4_XS_BYTES)
                dw[b] = f16_to_f32(row[o], row[o + 1])
                for ib in range(8):
                    s = _scale_iq4_xs(row, o, ib)
                    for k in range(4):
                        widen8(
                            decode_pairs(_IQ4_PAIRS, row, o + 8 + ib * 16 + 4 * k), s, ws, b * QK_K + ib * 32 + 8 * k
                        )
            t0 = (r // group_rows) * n_tok
            for t in range(n_tok):
                x = xp[t0 + t]
                dx = d[t0 + t]
                acc = np.float32(0.0)
                for b in range(nb):
                    sumi = dot256(ws, b * QK_K, x, b * QK_K)
                    acc = block_step(order, acc, np.float32(sumi), dw[b], dx[b])
                out[t, r] = acc


@njit(**SERIAL)
def dequantize_iq4_xs(W, cols, row_ids, out):
    nb = cols // QK_K
    rb = nb * IQ4_XS_BYTES
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb : (row_ids[i] + 1) * rb]
        for b in range(nb):
            o = b * IQ4_XS_BYTES
            dw = f16_to_f32(row[o], row[o + 1])
            for ib in range(8):
                dl = dw * np.float32(_scale_iq4_xs(row, o, ib))
                for j in range(16):
                    v = row[o + 8 + ib * 16 + j]
                    out[i, b * QK_K + ib * 32 + j] = dl * np.float32(_IQ4_VALUES[v & 15])
                    out[i, b * QK_K + ib * 32 + 16 + j] = dl * np.float32(_IQ4_VALUES[v >> 4])


# ---- IQ2_XXS: d, 8 x (4 grid bytes, u32 of 4x7 sign bits + 4-bit scale) -----


@njit(**INLINE)
def _scale_iq2_xxs(blk, o, ib):
    return 2 * np.int32(u32(blk, o + 6 + ib * 8) >> 28) + 1


@njit(**INLINE)
def _decode_iq2_xxs(blk, o, ws, wo, scaled):
    for ib in range(8):
        p = 2 + ib * 8
        aux = u32(blk, o + p + 4)
        s = np.int16(2 * np.int32(aux >> 28) + 1) if scaled else np.int16(1)
        for l in range(4):
            g = _SIGNED_IQ2_XXS[np.int64(blk[o + p + l]) * 128 + ((aux >> (7 * l)) & 127)]
            widen8(g, s, ws, wo + ib * 32 + l * 8)


@njit(**INLINE)
def _scale16_iq2_xxs(blk, o, j):
    """The integer scale of the block's 16 values from 16j (a tile's sub-blocks)."""
    return _scale_iq2_xxs(blk, o, j // 2)


_IQ2_XXS_TILES = _tile_matmul(IQ2_XXS_BYTES, _decode_iq2_xxs, _scale16_iq2_xxs, 0.125)


# Top-level on purpose: numba caches factory-made parallel kernels per process only (docs/kernels.md).
@njit(**PARALLEL)
def matmul_iq2_xxs(W, starts, rows, group_rows, cols, qs, d, extra, out, order, straight):
    n_tok = qs.shape[0] * group_rows // rows  # tokens per group of rows
    nb = cols // QK_K
    rb = nb * IQ2_XXS_BYTES
    if straight:  # from the row bytes
        xs = iq2_xxs_activations(qs)
        for task in prange(chunk_count(rows, group_rows, ROWS_PER_TASK)):
            r0, n_rows, g = chunk_rows(task, group_rows, ROWS_PER_TASK)
            t0 = g * n_tok
            for t in range(n_tok):  # each token's activation rows viewed once per task, not per row
                x, dx = xs[t0 + t], d[t0 + t]
                for r in range(r0, r0 + n_rows):
                    at = row_start(starts, r, group_rows, rb)
                    row = W[at : at + rb]
                    out[t, r] = _IQ2_XXS_ROW(row, x, dx, nb, order)
        return
    if TILES:  # 16-row tiles (where vpdpbusd runs), a group's last one partial
        for tile in prange(chunk_count(rows, group_rows, TILE_ROWS)):
            r0, n_rows, g = chunk_rows(tile, group_rows, TILE_ROWS)
            at0 = row_start(starts, r0, group_rows, rb)
            _IQ2_XXS_TILES(W, at0, r0, n_rows, rb, nb, qs, d, extra, out, g * n_tok, n_tok, order == ORDER_TILED)
        return
    # else each row decoded once for all tokens
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        ws = np.empty(cols, np.int16)
        dw = np.empty(nb, np.float32)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            at = row_start(starts, r, group_rows, rb)
            row = W[at : at + rb]
            for b in range(nb):
                o = b * IQ2_XXS_BYTES
                prefetch_bytes(row, o + PREFETCH_AHEAD, IQ2_XXS_BYTES)
                dw[b] = f16_to_f32(row[o], row[o + 1])
                _decode_iq2_xxs(row, o, ws, b * QK_K, True)
            t0 = (r // group_rows) * n_tok
            for t in range(n_tok):
                x = qs[t0 + t]
                dx = d[t0 + t]
                acc = np.float32(0.0)
                for b in range(nb):
                    bsum = dot256(ws, b * QK_K, x, b * QK_K)
                    acc = block_step(order, acc, np.float32(bsum), dw[b], dx[b])
                out[t, r] = np.float32(0.125) * acc


@njit(**SERIAL)
def dequantize_iq2_xxs(W, cols, row_ids, out):
    nb = cols // QK_K
    rb = nb * IQ2_XXS_BYTES
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb : (row_ids[i] + 1) * rb]
        ws = np.empty(QK_K, np.int16)
        for b in range(nb):
            o = b * IQ2_XXS_BYTES
            dw = f16_to_f32(row[o], row[o + 1])
            _decode_iq2_xxs(row, o, ws, 0, False)
            for ib in range(8):
                db = dw * (np.float32(0.5) + np.float32(_scale_iq2_xxs(row, o, ib) // 2)) * np.float32(0.25)
                for j in range(32):
                    out[i, b * QK_K + ib * 32 + j] = db * np.float32(ws[ib * 32 + j])


# ---- IQ2_XS: d, 32 x u16 (9-bit grid index, 7-bit sign index), scales[8] ---


@njit(**INLINE)
def _scale16(blk, so, s):
    """Scale 2 * field + 1 of sub-block s, from 4-bit fields packed two per byte at blk[so:]."""
    return 2 * np.int32((blk[so + s // 2] >> (4 * (s % 2))) & 15) + 1


@njit(**INLINE)
def _decode_iq2_xs(blk, o, ws, wo, scaled):
    for k in range(32):
        q = np.int32(blk[o + 2 + 2 * k]) | (np.int32(blk[o + 3 + 2 * k]) << 8)
        s = np.int16(_scale16(blk, o + 66, k // 2)) if scaled else np.int16(1)
        widen8(_SIGNED_IQ2_XS[(q & 511) * 128 + (q >> 9)], s, ws, wo + k * 8)


@njit(**INLINE)
def _scale16_iq2_xs(blk, o, j):
    """The integer scale of the block's 16 values from 16j (a tile's sub-blocks)."""
    return _scale16(blk, o + 66, j)


_IQ2_XS_TILES = _tile_matmul(IQ2_XS_BYTES, _decode_iq2_xs, _scale16_iq2_xs, 0.125)


# Top-level on purpose: numba caches factory-made parallel kernels per process only (docs/kernels.md).
@njit(**PARALLEL)
def matmul_iq2_xs(W, starts, rows, group_rows, cols, qs, d, extra, out, order, straight):
    n_tok = qs.shape[0] * group_rows // rows  # tokens per group of rows
    nb = cols // QK_K
    rb = nb * IQ2_XS_BYTES
    if straight:  # from the row bytes
        xs = grid_activations(qs)
        for task in prange(chunk_count(rows, group_rows, ROWS_PER_TASK)):
            r0, n_rows, g = chunk_rows(task, group_rows, ROWS_PER_TASK)
            t0 = g * n_tok
            for t in range(n_tok):  # each token's activation rows viewed once per task, not per row
                x, dx = xs[t0 + t], d[t0 + t]
                for r in range(r0, r0 + n_rows):
                    at = row_start(starts, r, group_rows, rb)
                    row = W[at : at + rb]
                    out[t, r] = _IQ2_XS_ROW(row, x, dx, nb, order)
        return
    if TILES:  # 16-row tiles (where vpdpbusd runs), a group's last one partial
        for tile in prange(chunk_count(rows, group_rows, TILE_ROWS)):
            r0, n_rows, g = chunk_rows(tile, group_rows, TILE_ROWS)
            at0 = row_start(starts, r0, group_rows, rb)
            _IQ2_XS_TILES(W, at0, r0, n_rows, rb, nb, qs, d, extra, out, g * n_tok, n_tok, order == ORDER_TILED)
        return
    # else each row decoded once for all tokens
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        ws = np.empty(cols, np.int16)
        dw = np.empty(nb, np.float32)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            at = row_start(starts, r, group_rows, rb)
            row = W[at : at + rb]
            for b in range(nb):
                o = b * IQ2_XS_BYTES
                prefetch_bytes(row, o + PREFETCH_AHEAD, IQ2_XS_BYTES)
                dw[b] = f16_to_f32(row[o], row[o + 1])
                _decode_iq2_xs(row, o, ws, b * QK_K, True)
            t0 = (r // group_rows) * n_tok
            for t in range(n_tok):
                x = qs[t0 + t]
                dx = d[t0 + t]
                acc = np.float32(0.0)
                for b in range(nb):
                    bsum = dot256(ws, b * QK_K, x, b * QK_K)
                    acc = block_step(order, acc, np.float32(bsum), dw[b], dx[b])
                out[t, r] = np.float32(0.125) * acc


@njit(**SERIAL)
def dequantize_iq2_xs(W, cols, row_ids, out):
    nb = cols // QK_K
    rb = nb * IQ2_XS_BYTES
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb : (row_ids[i] + 1) * rb]
        ws = np.empty(QK_K, np.int16)
        for b in range(nb):
            o = b * IQ2_XS_BYTES
            dw = f16_to_f32(row[o], row[o + 1])
            _decode_iq2_xs(row, o, ws, 0, False)
            for s in range(16):
                db = dw * (np.float32(0.5) + np.float32(_scale16(row, o + 66, s) // 2)) * np.float32(0.25)
                for j in range(16):
                    out[i, b * QK_K + s * 16 + j] = db * np.float32(ws[s * 16 + j])


# ---- IQ2_S: d, qs[32] grid low bits, signs[32], qh[8], scales[8] ------------


@njit(**INLINE)
def _decode_iq2_s(blk, o, ws, wo, scaled):
    for ib in range(8):
        qh = np.int32(blk[o + 66 + ib])
        for l in range(4):
            s = np.int16(_scale16(blk, o + 74, 2 * ib + l // 2)) if scaled else np.int16(1)
            gi = np.int32(blk[o + 2 + ib * 4 + l]) | ((qh << (8 - 2 * l)) & 0x300)
            sb = blk[o + 34 + ib * 4 + l]
            widen4(_SIGNED_IQ2_S[gi * 32 + (sb & 15)], s, ws, wo + ib * 32 + l * 8)
            widen4(_SIGNED_IQ2_S[gi * 32 + 16 + (sb >> 4)], s, ws, wo + ib * 32 + l * 8 + 4)


@njit(**INLINE)
def _scale16_iq2_s(blk, o, j):
    """The integer scale of the block's 16 values from 16j (a tile's sub-blocks)."""
    return _scale16(blk, o + 74, j)


_IQ2_S_TILES = _tile_matmul(IQ2_S_BYTES, _decode_iq2_s, _scale16_iq2_s, 0.125)


# Top-level on purpose: numba caches factory-made parallel kernels per process only (docs/kernels.md).
@njit(**PARALLEL)
def matmul_iq2_s(W, starts, rows, group_rows, cols, qs, d, extra, out, order, straight):
    n_tok = qs.shape[0] * group_rows // rows  # tokens per group of rows
    nb = cols // QK_K
    rb = nb * IQ2_S_BYTES
    if straight:  # from the row bytes
        xs = grid_activations(qs)
        for task in prange(chunk_count(rows, group_rows, ROWS_PER_TASK)):
            r0, n_rows, g = chunk_rows(task, group_rows, ROWS_PER_TASK)
            t0 = g * n_tok
            for t in range(n_tok):  # each token's activation rows viewed once per task, not per row
                x, dx = xs[t0 + t], d[t0 + t]
                for r in range(r0, r0 + n_rows):
                    at = row_start(starts, r, group_rows, rb)
                    row = W[at : at + rb]
                    out[t, r] = _IQ2_S_ROW(row, x, dx, nb, order)
        return
    if TILES:  # 16-row tiles (where vpdpbusd runs), a group's last one partial
        for tile in prange(chunk_count(rows, group_rows, TILE_ROWS)):
            r0, n_rows, g = chunk_rows(tile, group_rows, TILE_ROWS)
            at0 = row_start(starts, r0, group_rows, rb)
            _IQ2_S_TILES(W, at0, r0, n_rows, rb, nb, qs, d, extra, out, g * n_tok, n_tok, order == ORDER_TILED)
        return
    # else each row decoded once for all tokens
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        ws = np.empty(cols, np.int16)
        dw = np.empty(nb, np.float32)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            at = row_start(starts, r, group_rows, rb)
            row = W[at : at + rb]
            for b in range(nb):
                o = b * IQ2_S_BYTES
                prefetch_bytes(row, o + PREFETCH_AHEAD, IQ2_S_BYTES)
                dw[b] = f16_to_f32(row[o], row[o + 1])
                _decode_iq2_s(row, o, ws, b * QK_K, True)
            t0 = (r // group_rows) * n_tok
            for t in range(n_tok):
                x = qs[t0 + t]
                dx = d[t0 + t]
                acc = np.float32(0.0)
                for b in range(nb):
                    bsum = dot256(ws, b * QK_K, x, b * QK_K)
                    acc = block_step(order, acc, np.float32(bsum), dw[b], dx[b])
                out[t, r] = np.float32(0.125) * acc


@njit(**SERIAL)
def dequantize_iq2_s(W, cols, row_ids, out):
    nb = cols // QK_K
    rb = nb * IQ2_S_BYTES
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb : (row_ids[i] + 1) * rb]
        ws = np.empty(QK_K, np.int16)
        for b in range(nb):
            o = b * IQ2_S_BYTES
            dw = f16_to_f32(row[o], row[o + 1])
            _decode_iq2_s(row, o, ws, 0, False)
            for s in range(16):
                db = dw * (np.float32(0.5) + np.float32(_scale16(row, o + 74, s) // 2)) * np.float32(0.25)
                for j in range(16):
                    out[i, b * QK_K + s * 16 + j] = db * np.float32(ws[s * 16 + j])


# ---- IQ3_XXS: d, qs[64] grid indices (4 values each), 8 x u32 signs+scale ---


@njit(**INLINE)
def _scale_iq3_xxs(blk, o, ib):
    return 2 * np.int32(u32(blk, o + 66 + ib * 4) >> 28) + 1


@njit(**INLINE)
def _decode_iq3_xxs(blk, o, ws, wo, scaled):
    for ib in range(8):
        aux = u32(blk, o + 66 + ib * 4)
        s = np.int16(2 * np.int32(aux >> 28) + 1) if scaled else np.int16(1)
        for l in range(4):
            p = 2 + ib * 8 + 2 * l
            sb = _KSIGNS[(aux >> (7 * l)) & 127]
            widen4(_SIGNED_IQ3_XXS[np.int64(blk[o + p]) * 16 + (sb & 15)], s, ws, wo + ib * 32 + l * 8)
            widen4(_SIGNED_IQ3_XXS[np.int64(blk[o + p + 1]) * 16 + (sb >> 4)], s, ws, wo + ib * 32 + l * 8 + 4)


@njit(**INLINE)
def _scale16_iq3_xxs(blk, o, j):
    """The integer scale of the block's 16 values from 16j (a tile's sub-blocks)."""
    return _scale_iq3_xxs(blk, o, j // 2)


_IQ3_XXS_TILES = _tile_matmul(IQ3_XXS_BYTES, _decode_iq3_xxs, _scale16_iq3_xxs, 0.25)


# Top-level on purpose: numba caches factory-made parallel kernels per process only (docs/kernels.md).
@njit(**PARALLEL)
def matmul_iq3_xxs(W, starts, rows, group_rows, cols, qs, d, extra, out, order, straight):
    n_tok = qs.shape[0] * group_rows // rows  # tokens per group of rows
    nb = cols // QK_K
    rb = nb * IQ3_XXS_BYTES
    if straight:  # from the row bytes
        xs = iq3_activations(qs)
        for task in prange(chunk_count(rows, group_rows, ROWS_PER_TASK)):
            r0, n_rows, g = chunk_rows(task, group_rows, ROWS_PER_TASK)
            t0 = g * n_tok
            for t in range(n_tok):  # each token's activation rows viewed once per task, not per row
                x, dx = xs[t0 + t], d[t0 + t]
                for r in range(r0, r0 + n_rows):
                    at = row_start(starts, r, group_rows, rb)
                    row = W[at : at + rb]
                    out[t, r] = _IQ3_XXS_ROW(row, x, dx, nb, order)
        return
    if TILES:  # 16-row tiles (where vpdpbusd runs), a group's last one partial
        for tile in prange(chunk_count(rows, group_rows, TILE_ROWS)):
            r0, n_rows, g = chunk_rows(tile, group_rows, TILE_ROWS)
            at0 = row_start(starts, r0, group_rows, rb)
            _IQ3_XXS_TILES(W, at0, r0, n_rows, rb, nb, qs, d, extra, out, g * n_tok, n_tok, order == ORDER_TILED)
        return
    # else each row decoded once for all tokens
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        ws = np.empty(cols, np.int16)
        dw = np.empty(nb, np.float32)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            at = row_start(starts, r, group_rows, rb)
            row = W[at : at + rb]
            for b in range(nb):
                o = b * IQ3_XXS_BYTES
                prefetch_bytes(row, o + PREFETCH_AHEAD, IQ3_XXS_BYTES)
                dw[b] = f16_to_f32(row[o], row[o + 1])
                _decode_iq3_xxs(row, o, ws, b * QK_K, True)
            t0 = (r // group_rows) * n_tok
            for t in range(n_tok):
                x = qs[t0 + t]
                dx = d[t0 + t]
                acc = np.float32(0.0)
                for b in range(nb):
                    bsum = dot256(ws, b * QK_K, x, b * QK_K)
                    acc = block_step(order, acc, np.float32(bsum), dw[b], dx[b])
                out[t, r] = np.float32(0.25) * acc


@njit(**SERIAL)
def dequantize_iq3_xxs(W, cols, row_ids, out):
    nb = cols // QK_K
    rb = nb * IQ3_XXS_BYTES
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb : (row_ids[i] + 1) * rb]
        ws = np.empty(QK_K, np.int16)
        for b in range(nb):
            o = b * IQ3_XXS_BYTES
            dw = f16_to_f32(row[o], row[o + 1])
            _decode_iq3_xxs(row, o, ws, 0, False)
            for ib in range(8):
                db = dw * (np.float32(0.5) + np.float32(_scale_iq3_xxs(row, o, ib) // 2)) * np.float32(0.5)
                for j in range(32):
                    out[i, b * QK_K + ib * 32 + j] = db * np.float32(ws[ib * 32 + j])


# ---- IQ3_S: d, qs[64], qh[8] (9th index bits), signs[32], scales[4] ---------


@njit(**INLINE)
def _decode_iq3_s(blk, o, ws, wo, scaled):
    for ib in range(8):
        qh = np.int32(blk[o + 66 + ib])
        s = np.int16(_scale16(blk, o + 106, ib)) if scaled else np.int16(1)
        for l in range(4):
            p = 2 + ib * 8 + 2 * l
            g1 = np.int32(blk[o + p]) | ((qh << (8 - 2 * l)) & 256)
            g2 = np.int32(blk[o + p + 1]) | ((qh << (7 - 2 * l)) & 256)
            sb = blk[o + 74 + ib * 4 + l]
            widen4(_SIGNED_IQ3_S[g1 * 16 + (sb & 15)], s, ws, wo + ib * 32 + l * 8)
            widen4(_SIGNED_IQ3_S[g2 * 16 + (sb >> 4)], s, ws, wo + ib * 32 + l * 8 + 4)


@njit(**INLINE)
def _scale16_iq3_s(blk, o, j):
    """The integer scale of the block's 16 values from 16j (a tile's sub-blocks)."""
    return _scale16(blk, o + 106, j // 2)


_IQ3_S_TILES = _tile_matmul(IQ3_S_BYTES, _decode_iq3_s, _scale16_iq3_s, 1.0)


# Top-level on purpose: numba caches factory-made parallel kernels per process only (docs/kernels.md).
@njit(**PARALLEL)
def matmul_iq3_s(W, starts, rows, group_rows, cols, qs, d, extra, out, order, straight):
    n_tok = qs.shape[0] * group_rows // rows  # tokens per group of rows
    nb = cols // QK_K
    rb = nb * IQ3_S_BYTES
    if straight:  # from the row bytes
        xs = iq3_activations(qs)
        for task in prange(chunk_count(rows, group_rows, ROWS_PER_TASK)):
            r0, n_rows, g = chunk_rows(task, group_rows, ROWS_PER_TASK)
            t0 = g * n_tok
            for t in range(n_tok):  # each token's activation rows viewed once per task, not per row
                x, dx = xs[t0 + t], d[t0 + t]
                for r in range(r0, r0 + n_rows):
                    at = row_start(starts, r, group_rows, rb)
                    row = W[at : at + rb]
                    out[t, r] = _IQ3_S_ROW(row, x, dx, nb, order)
        return
    if TILES:  # 16-row tiles (where vpdpbusd runs), a group's last one partial
        for tile in prange(chunk_count(rows, group_rows, TILE_ROWS)):
            r0, n_rows, g = chunk_rows(tile, group_rows, TILE_ROWS)
            at0 = row_start(starts, r0, group_rows, rb)
            _IQ3_S_TILES(W, at0, r0, n_rows, rb, nb, qs, d, extra, out, g * n_tok, n_tok, order == ORDER_TILED)
        return
    # else each row decoded once for all tokens
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        ws = np.empty(cols, np.int16)
        dw = np.empty(nb, np.float32)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            at = row_start(starts, r, group_rows, rb)
            row = W[at : at + rb]
            for b in range(nb):
                o = b * IQ3_S_BYTES
                prefetch_bytes(row, o + PREFETCH_AHEAD, IQ3_S_BYTES)
                dw[b] = f16_to_f32(row[o], row[o + 1])
                _decode_iq3_s(row, o, ws, b * QK_K, True)
            t0 = (r // group_rows) * n_tok
            for t in range(n_tok):
                x = qs[t0 + t]
                dx = d[t0 + t]
                acc = np.float32(0.0)
                for b in range(nb):
                    bsum = dot256(ws, b * QK_K, x, b * QK_K)
                    acc = block_step(order, acc, np.float32(bsum), dw[b], dx[b])
                out[t, r] = acc


@njit(**SERIAL)
def dequantize_iq3_s(W, cols, row_ids, out):
    nb = cols // QK_K
    rb = nb * IQ3_S_BYTES
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb : (row_ids[i] + 1) * rb]
        ws = np.empty(QK_K, np.int16)
        for b in range(nb):
            o = b * IQ3_S_BYTES
            dw = f16_to_f32(row[o], row[o + 1])
            _decode_iq3_s(row, o, ws, 0, False)
            for ib in range(8):
                db = dw * np.float32(_scale16(row, o + 106, ib))
                for j in range(32):
                    out[i, b * QK_K + ib * 32 + j] = db * np.float32(ws[ib * 32 + j])


# ---- IQ1_S: d, qs[32] grid low bits, qh u16[8] (3x3 index bits, scale, delta sign)


@njit(**INLINE)
def _qh_iq1_s(blk, o, ib):
    """Sub-block ib's u16: 3 index bits per group, 3-bit scale, delta sign."""
    return np.int32(blk[o + 34 + 2 * ib]) | (np.int32(blk[o + 35 + 2 * ib]) << 8)


@njit(**INLINE)
def _scale_iq1_s(qh):
    return 2 * ((qh >> 12) & 7) + 1


@njit(**INLINE)
def _delta_iq1_s(qh):
    return -1 if qh & 0x8000 else 1


@njit(**INLINE)
def _decode_iq1_s(blk, o, ws, wo, scaled):
    for ib in range(8):
        qh = _qh_iq1_s(blk, o, ib)
        s = np.int16(_scale_iq1_s(qh)) if scaled else np.int16(1)
        for l in range(4):
            gi = np.int32(blk[o + 2 + ib * 4 + l]) | (((qh >> (3 * l)) & 7) << 8)
            widen8(_GRID8_IQ1_S[gi], s, ws, wo + ib * 32 + l * 8)


# Top-level on purpose: numba caches factory-made parallel kernels per process only (docs/kernels.md).
@njit(**PARALLEL)
def matmul_iq1_s(W, starts, rows, group_rows, cols, qs, d, extra, out, order, straight):
    n_tok = qs.shape[0] * group_rows // rows  # tokens per group of rows
    nb = cols // QK_K
    rb = nb * IQ1_S_BYTES
    if straight:  # from the row bytes
        xs = grid_activations(qs)
        for task in prange(chunk_count(rows, group_rows, ROWS_PER_TASK)):
            r0, n_rows, g = chunk_rows(task, group_rows, ROWS_PER_TASK)
            t0 = g * n_tok
            for t in range(n_tok):  # each token's activation rows viewed once per task, not per row
                x, dx, bsums = xs[t0 + t], d[t0 + t], extra[t0 + t]
                for r in range(r0, r0 + n_rows):
                    at = row_start(starts, r, group_rows, rb)
                    row = W[at : at + rb]
                    acc = np.float32(0.0)
                    for b in range(nb):
                        o = b * IQ1_S_BYTES
                        prefetch_bytes(row, o + PREFETCH_AHEAD, IQ1_S_BYTES)
                        sums8 = iq1_s_isum(row, o, x, b * QK_K, _IQ1_DELTA_TABLE, bsums, b * 16)
                        block = np.float32(sums8) * _IQ1_DELTA  # ggml's sumi + 0.125 * sumi1, exactly
                        acc = block_step(order, acc, block, f16_to_f32(row[o], row[o + 1]), dx[b])
                    out[t, r] = acc
        return
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        ws = np.empty(cols, np.int16)
        dw = np.empty(nb, np.float32)
        shift = np.empty(nb * 8, np.int32)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            at = row_start(starts, r, group_rows, rb)
            row = W[at : at + rb]
            for b in range(nb):
                o = b * IQ1_S_BYTES
                prefetch_bytes(row, o + PREFETCH_AHEAD, IQ1_S_BYTES)
                dw[b] = f16_to_f32(row[o], row[o + 1])
                _decode_iq1_s(row, o, ws, b * QK_K, True)
            for b in range(nb):
                for ib in range(8):
                    qh = _qh_iq1_s(row, b * IQ1_S_BYTES, ib)
                    shift[b * 8 + ib] = _scale_iq1_s(qh) * _delta_iq1_s(qh)
            t0 = (r // group_rows) * n_tok
            for t in range(n_tok):
                x = qs[t0 + t]
                dx = d[t0 + t]
                bsums = extra[t0 + t]
                acc = np.float32(0.0)
                for b in range(nb):
                    bsum = dot256(ws, b * QK_K, x, b * QK_K)
                    sumi1 = 0
                    for ib in range(8):
                        sumi1 += shift[b * 8 + ib] * (bsums[b * 16 + 2 * ib] + bsums[b * 16 + 2 * ib + 1])
                    acc = block_step(order, acc, np.float32(bsum) + _IQ1_DELTA * np.float32(sumi1), dw[b], dx[b])
                out[t, r] = acc


@njit(**SERIAL)
def dequantize_iq1_s(W, cols, row_ids, out):
    nb = cols // QK_K
    rb = nb * IQ1_S_BYTES
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb : (row_ids[i] + 1) * rb]
        ws = np.empty(QK_K, np.int16)
        for b in range(nb):
            o = b * IQ1_S_BYTES
            dw = f16_to_f32(row[o], row[o + 1])
            _decode_iq1_s(row, o, ws, 0, False)
            for ib in range(8):
                qh = _qh_iq1_s(row, o, ib)
                dl = dw * np.float32(_scale_iq1_s(qh))
                shift = _IQ1_DELTA * np.float32(_delta_iq1_s(qh))
                for j in range(32):
                    out[i, b * QK_K + ib * 32 + j] = dl * (np.float32(ws[ib * 32 + j]) + shift)


# ---- IQ1_M: qs[32], qh[16] (3 index bits + delta sign per 8), scales u16[4]
# (3-bit scales per 16 values; the f16 d lives in the scales' top nibbles) ---


@njit(**INLINE)
def _d_iq1_m(blk, o):
    """The block's fp16 d (the top nibbles of its four scale words) as float32."""
    return f16_bits_to_f32(iq1_m_scale_bits(blk, o))


@njit(**INLINE)
def _scale_iq1_m(blk, o, s):
    """Scale of 16-value sub-block s: 3-bit fields, four per u16 at o + 48."""
    sc = np.int32(blk[o + 48 + 2 * (s // 4)]) | (np.int32(blk[o + 49 + 2 * (s // 4)]) << 8)
    return 2 * ((sc >> (3 * (s % 4))) & 7) + 1


@njit(**INLINE)
def _delta_iq1_m(blk, o, g):
    """Delta sign of 8-value group g: bit 3 of its nibble in qh."""
    return -1 if blk[o + 32 + g // 2] & (0x08 << (4 * (g % 2))) else 1


@njit(**INLINE)
def _decode_iq1_m(blk, o, ws, wo, scaled):
    for g in range(32):
        qh = np.int32(blk[o + 32 + g // 2])
        gi = np.int32(blk[o + g]) | ((qh << (8 - 4 * (g % 2))) & 0x700)
        s = np.int16(_scale_iq1_m(blk, o, g // 2)) if scaled else np.int16(1)
        widen8(_GRID8_IQ1_S[gi], s, ws, wo + g * 8)


# Top-level on purpose: numba caches factory-made parallel kernels per process only (docs/kernels.md).
@njit(**PARALLEL)
def matmul_iq1_m(W, starts, rows, group_rows, cols, qs, d, extra, out, order, straight):
    n_tok = qs.shape[0] * group_rows // rows  # tokens per group of rows
    nb = cols // QK_K
    rb = nb * IQ1_M_BYTES
    if straight:  # from the row bytes
        xs = grid_activations(qs)
        for task in prange(chunk_count(rows, group_rows, ROWS_PER_TASK)):
            r0, n_rows, g = chunk_rows(task, group_rows, ROWS_PER_TASK)
            t0 = g * n_tok
            for t in range(n_tok):  # each token's activation rows viewed once per task, not per row
                x, dx, bsums = xs[t0 + t], d[t0 + t], extra[t0 + t]
                for r in range(r0, r0 + n_rows):
                    at = row_start(starts, r, group_rows, rb)
                    row = W[at : at + rb]
                    acc = np.float32(0.0)
                    for b in range(nb):
                        prefetch_bytes(row, b * IQ1_M_BYTES + PREFETCH_AHEAD, IQ1_M_BYTES)
                        sums8 = iq1_m_isum(row, b * IQ1_M_BYTES, x, b * QK_K, _IQ1_DELTA_TABLE, bsums, b * 16)
                        block = np.float32(sums8) * _IQ1_DELTA  # ggml's sumi1 + 0.125 * sumi2, exactly
                        acc = block_step(order, acc, block, _d_iq1_m(row, b * IQ1_M_BYTES), dx[b])
                    out[t, r] = acc
        return
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        ws = np.empty(cols, np.int16)
        dw = np.empty(nb, np.float32)
        shifts = np.empty(cols, np.int16)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            at = row_start(starts, r, group_rows, rb)
            row = W[at : at + rb]
            for b in range(nb):
                o = b * IQ1_M_BYTES
                prefetch_bytes(row, o + PREFETCH_AHEAD, IQ1_M_BYTES)
                dw[b] = _d_iq1_m(row, o)
                _decode_iq1_m(row, o, ws, b * QK_K, True)
            # delta * scale of each 8-value group, per value, so its sum is one more dot
            for b in range(nb):
                for g in range(32):
                    sd = np.int16(_scale_iq1_m(row, b * IQ1_M_BYTES, g // 2) * _delta_iq1_m(row, b * IQ1_M_BYTES, g))
                    for j in range(8):
                        shifts[b * QK_K + g * 8 + j] = sd
            t0 = (r // group_rows) * n_tok
            for t in range(n_tok):
                x = qs[t0 + t]
                dx = d[t0 + t]
                acc = np.float32(0.0)
                for b in range(nb):
                    bsum = dot256(ws, b * QK_K, x, b * QK_K)
                    sumi2 = dot256(shifts, b * QK_K, x, b * QK_K)
                    acc = block_step(order, acc, np.float32(bsum) + _IQ1_DELTA * np.float32(sumi2), dw[b], dx[b])
                out[t, r] = acc


@njit(**SERIAL)
def dequantize_iq1_m(W, cols, row_ids, out):
    nb = cols // QK_K
    rb = nb * IQ1_M_BYTES
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb : (row_ids[i] + 1) * rb]
        ws = np.empty(QK_K, np.int16)
        for b in range(nb):
            o = b * IQ1_M_BYTES
            dw = _d_iq1_m(row, o)
            _decode_iq1_m(row, o, ws, 0, False)
            for g in range(32):
                dl = dw * np.float32(_scale_iq1_m(row, o, g // 2))
                shift = _IQ1_DELTA * np.float32(_delta_iq1_m(row, o, g))
                for j in range(8):
                    out[i, b * QK_K + g * 8 + j] = dl * (np.float32(ws[g * 8 + j]) + shift)
