"""IQ quants: IQ4_NL, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M.

Lookup grids come from the gguf package's tables (gguf.quants.<TYPE>.grid,
decoded from grid_hex at import) and are expanded at import into "signed grid"
tables (every grid entry times every sign pattern, packed as uint32/uint64), so
decoding is one table load and store per 4 or 8 weights.  A weight row is
decoded once into int8 values plus integer sub-block scales; each token then
sums scale * int_dot(sub-block) exactly in int32 and applies ggml's float
step (generic vec_dot, ggml-cpu/quants.c), including the final per-row factor
(0.125 for IQ2_*, 0.25 for IQ3_XXS).  IQ4_NL uses Q8_0 activations, the rest
Q8_K.  Kernel signatures as in legacy.py.
"""
from __future__ import annotations

import numpy as np
from gguf import quants as gq
from numba import njit, prange

from ._jit import INLINE, PARALLEL, ROWS_PER_TASK, SERIAL, dot16, dot32, dot256, f16_to_f32


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
_IQ4_VALUES = np.array(gq.IQ4_NL.kvalues, dtype=np.int8)
_IQ4_PAIRS = np.stack([_IQ4_VALUES[np.arange(256) & 15], _IQ4_VALUES[np.arange(256) >> 4]], axis=1).copy()
_IQ1_DELTA = np.float32(0.125)


@njit(**INLINE)
def _u32(blk, o):
    return np.uint32(blk[o]) | (np.uint32(blk[o + 1]) << 8) | (np.uint32(blk[o + 2]) << 16) | (np.uint32(blk[o + 3]) << 24)


# ---- IQ4_NL: d f16, 16 bytes of indices into a 16-value table (Q8_0 acts) ---

@njit(**INLINE)
def _decode_iq4(blk, o, wq, wo):
    for j in range(16):
        wq[wo + j] = _IQ4_PAIRS[blk[o + j], 0]
        wq[wo + j + 16] = _IQ4_PAIRS[blk[o + j], 1]


@njit(**PARALLEL)
def matmul_iq4_nl(W, rows, cols, qs, d, extra, out):
    nb = cols // 32
    rb = nb * 18
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        wq = np.empty(cols, np.int8)
        dw = np.empty(nb, np.float32)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            row = W[r * rb:(r + 1) * rb]
            for b in range(nb):
                o = b * 18
                dw[b] = f16_to_f32(row[o], row[o + 1])
                _decode_iq4(row, o + 2, wq, b * 32)
            for t in range(qs.shape[0]):
                x = qs[t]
                dx = d[t]
                acc = np.float32(0.0)
                for b in range(nb):
                    sumi = dot32(wq, b * 32, x, b * 32)
                    acc += (dx[b] * dw[b]) * np.float32(sumi)
                out[t, r] = acc


@njit(**SERIAL)
def dequantize_iq4_nl(W, cols, row_ids, out):
    nb = cols // 32
    rb = nb * 18
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb:(row_ids[i] + 1) * rb]
        wq = np.empty(32, np.int8)
        for b in range(nb):
            o = b * 18
            dw = f16_to_f32(row[o], row[o + 1])
            _decode_iq4(row, o + 2, wq, 0)
            for j in range(32):
                out[i, b * 32 + j] = dw * np.float32(wq[j])


# ---- IQ4_XS: d, scales_h u16, scales_l[4], qs[128]; 6-bit scales - 32 --------

@njit(**INLINE)
def _scales_iq4_xs(blk, o, sc, so):
    h = np.int32(blk[o + 2]) | (np.int32(blk[o + 3]) << 8)
    for ib in range(8):
        sc[so + ib] = (((blk[o + 4 + ib // 2] >> (4 * (ib % 2))) & 15) | (((h >> (2 * ib)) & 3) << 4)) - 32


@njit(**PARALLEL)
def matmul_iq4_xs(W, rows, cols, qs, d, extra, out):
    nb = cols // 256
    rb = nb * 136
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        wq = np.empty(cols, np.int8)
        dw = np.empty(nb, np.float32)
        ls = np.empty(nb * 8, np.int32)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            row = W[r * rb:(r + 1) * rb]
            for b in range(nb):
                o = b * 136
                dw[b] = f16_to_f32(row[o], row[o + 1])
                _scales_iq4_xs(row, o, ls, b * 8)
                for ib in range(8):
                    _decode_iq4(row, o + 8 + ib * 16, wq, b * 256 + ib * 32)
            for t in range(qs.shape[0]):
                x = qs[t]
                dx = d[t]
                acc = np.float32(0.0)
                for b in range(nb):
                    d4d8 = dw[b] * dx[b]
                    for ib in range(8):
                        sumi = dot32(wq, b * 256 + ib * 32, x, b * 256 + ib * 32)
                        acc += (d4d8 * np.float32(ls[b * 8 + ib])) * np.float32(sumi)
                out[t, r] = acc


@njit(**SERIAL)
def dequantize_iq4_xs(W, cols, row_ids, out):
    nb = cols // 256
    rb = nb * 136
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb:(row_ids[i] + 1) * rb]
        wq = np.empty(256, np.int8)
        sc = np.empty(8, np.int32)
        for b in range(nb):
            o = b * 136
            dw = f16_to_f32(row[o], row[o + 1])
            _scales_iq4_xs(row, o, sc, 0)
            for ib in range(8):
                _decode_iq4(row, o + 8 + ib * 16, wq, ib * 32)
                dl = dw * np.float32(sc[ib])
                for j in range(32):
                    out[i, b * 256 + ib * 32 + j] = dl * np.float32(wq[ib * 32 + j])


# ---- IQ2_XXS: d, 8 x (4 grid bytes, u32 of 4x7 sign bits + 4-bit scale) -----

@njit(**INLINE)
def _decode_iq2_xxs(blk, o, w64, wo, ls, lo):
    for ib in range(8):
        p = 2 + ib * 8
        aux = _u32(blk, o + p + 4)
        ls[lo + ib] = 2 * np.int32(aux >> 28) + 1
        for l in range(4):
            w64[wo + ib * 4 + l] = _SIGNED_IQ2_XXS[np.int64(blk[o + p + l]) * 128 + ((aux >> (7 * l)) & 127)]


@njit(**PARALLEL)
def matmul_iq2_xxs(W, rows, cols, qs, d, extra, out):
    nb = cols // 256
    rb = nb * 66
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        wq = np.empty(cols, np.int8)
        w64 = wq.view(np.uint64)  # one table store per 8 weights
        ls = np.empty(nb * 8, np.int32)
        dw = np.empty(nb, np.float32)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            row = W[r * rb:(r + 1) * rb]
            for b in range(nb):
                o = b * 66
                dw[b] = f16_to_f32(row[o], row[o + 1])
                _decode_iq2_xxs(row, o, w64, b * 32, ls, b * 8)
            for t in range(qs.shape[0]):
                x = qs[t]
                dx = d[t]
                acc = np.float32(0.0)
                for b in range(nb):
                    bsum = 0
                    for s in range(8):
                        bsum += ls[b * 8 + s] * dot32(wq, b * 256 + s * 32, x, b * 256 + s * 32)
                    acc += (dw[b] * dx[b]) * np.float32(bsum)
                out[t, r] = np.float32(0.125) * acc


@njit(**SERIAL)
def dequantize_iq2_xxs(W, cols, row_ids, out):
    nb = cols // 256
    rb = nb * 66
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb:(row_ids[i] + 1) * rb]
        wq = np.empty(256, np.int8)
        w64 = wq.view(np.uint64)  # wide stores of decoded groups
        ls = np.empty(8, np.int32)
        for b in range(nb):
            o = b * 66
            dw = f16_to_f32(row[o], row[o + 1])
            _decode_iq2_xxs(row, o, w64, 0, ls, 0)
            for ib in range(8):
                db = dw * (np.float32(0.5) + np.float32(ls[ib] // 2)) * np.float32(0.25)
                for j in range(32):
                    out[i, b * 256 + ib * 32 + j] = db * np.float32(wq[ib * 32 + j])


# ---- IQ2_XS: d, 32 x u16 (9-bit grid index, 7-bit sign index), scales[8] ---

@njit(**INLINE)
def _decode_iq2_xs(blk, o, w64, wo, ls, lo):
    for k in range(32):
        q = np.int32(blk[o + 2 + 2 * k]) | (np.int32(blk[o + 3 + 2 * k]) << 8)
        w64[wo + k] = _SIGNED_IQ2_XS[(q & 511) * 128 + (q >> 9)]
    for ib in range(8):
        ls[lo + 2 * ib] = 2 * (blk[o + 66 + ib] & 15) + 1
        ls[lo + 2 * ib + 1] = 2 * (blk[o + 66 + ib] >> 4) + 1


@njit(**PARALLEL)
def matmul_iq2_xs(W, rows, cols, qs, d, extra, out):
    nb = cols // 256
    rb = nb * 74
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        wq = np.empty(cols, np.int8)
        w64 = wq.view(np.uint64)  # one table store per 8 weights
        ls = np.empty(nb * 16, np.int32)
        dw = np.empty(nb, np.float32)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            row = W[r * rb:(r + 1) * rb]
            for b in range(nb):
                o = b * 74
                dw[b] = f16_to_f32(row[o], row[o + 1])
                _decode_iq2_xs(row, o, w64, b * 32, ls, b * 16)
            for t in range(qs.shape[0]):
                x = qs[t]
                dx = d[t]
                acc = np.float32(0.0)
                for b in range(nb):
                    bsum = 0
                    for s in range(16):
                        bsum += ls[b * 16 + s] * dot16(wq, b * 256 + s * 16, x, b * 256 + s * 16)
                    acc += (dw[b] * dx[b]) * np.float32(bsum)
                out[t, r] = np.float32(0.125) * acc


@njit(**SERIAL)
def dequantize_iq2_xs(W, cols, row_ids, out):
    nb = cols // 256
    rb = nb * 74
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb:(row_ids[i] + 1) * rb]
        wq = np.empty(256, np.int8)
        w64 = wq.view(np.uint64)  # wide stores of decoded groups
        ls = np.empty(16, np.int32)
        for b in range(nb):
            o = b * 74
            dw = f16_to_f32(row[o], row[o + 1])
            _decode_iq2_xs(row, o, w64, 0, ls, 0)
            for s in range(16):
                db = dw * (np.float32(0.5) + np.float32(ls[s] // 2)) * np.float32(0.25)
                for j in range(16):
                    out[i, b * 256 + s * 16 + j] = db * np.float32(wq[s * 16 + j])


# ---- IQ2_S: d, qs[32] grid low bits, signs[32], qh[8], scales[8] ------------

@njit(**INLINE)
def _decode_iq2_s(blk, o, w32, wo, ls, lo):
    for ib in range(8):
        qh = np.int32(blk[o + 66 + ib])
        for l in range(4):
            gi = np.int32(blk[o + 2 + ib * 4 + l]) | ((qh << (8 - 2 * l)) & 0x300)
            sb = blk[o + 34 + ib * 4 + l]
            w32[wo + (ib * 4 + l) * 2] = _SIGNED_IQ2_S[gi * 32 + (sb & 15)]
            w32[wo + (ib * 4 + l) * 2 + 1] = _SIGNED_IQ2_S[gi * 32 + 16 + (sb >> 4)]
        ls[lo + 2 * ib] = 2 * (blk[o + 74 + ib] & 15) + 1
        ls[lo + 2 * ib + 1] = 2 * (blk[o + 74 + ib] >> 4) + 1


@njit(**PARALLEL)
def matmul_iq2_s(W, rows, cols, qs, d, extra, out):
    nb = cols // 256
    rb = nb * 82
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        wq = np.empty(cols, np.int8)
        w32 = wq.view(np.uint32)  # one table store per 4 weights
        ls = np.empty(nb * 16, np.int32)
        dw = np.empty(nb, np.float32)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            row = W[r * rb:(r + 1) * rb]
            for b in range(nb):
                o = b * 82
                dw[b] = f16_to_f32(row[o], row[o + 1])
                _decode_iq2_s(row, o, w32, b * 64, ls, b * 16)
            for t in range(qs.shape[0]):
                x = qs[t]
                dx = d[t]
                acc = np.float32(0.0)
                for b in range(nb):
                    bsum = 0
                    for s in range(16):
                        bsum += ls[b * 16 + s] * dot16(wq, b * 256 + s * 16, x, b * 256 + s * 16)
                    acc += (dw[b] * dx[b]) * np.float32(bsum)
                out[t, r] = np.float32(0.125) * acc


@njit(**SERIAL)
def dequantize_iq2_s(W, cols, row_ids, out):
    nb = cols // 256
    rb = nb * 82
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb:(row_ids[i] + 1) * rb]
        wq = np.empty(256, np.int8)
        w32 = wq.view(np.uint32)  # wide stores of decoded groups
        ls = np.empty(16, np.int32)
        for b in range(nb):
            o = b * 82
            dw = f16_to_f32(row[o], row[o + 1])
            _decode_iq2_s(row, o, w32, 0, ls, 0)
            for s in range(16):
                db = dw * (np.float32(0.5) + np.float32(ls[s] // 2)) * np.float32(0.25)
                for j in range(16):
                    out[i, b * 256 + s * 16 + j] = db * np.float32(wq[s * 16 + j])


# ---- IQ3_XXS: d, qs[64] grid indices (4 values each), 8 x u32 signs+scale ---

@njit(**INLINE)
def _decode_iq3_xxs(blk, o, w32, wo, ls, lo):
    for ib in range(8):
        aux = _u32(blk, o + 66 + ib * 4)
        ls[lo + ib] = 2 * np.int32(aux >> 28) + 1
        for l in range(4):
            p = 2 + ib * 8 + 2 * l
            sb = _KSIGNS[(aux >> (7 * l)) & 127]
            w32[wo + (ib * 4 + l) * 2] = _SIGNED_IQ3_XXS[np.int64(blk[o + p]) * 16 + (sb & 15)]
            w32[wo + (ib * 4 + l) * 2 + 1] = _SIGNED_IQ3_XXS[np.int64(blk[o + p + 1]) * 16 + (sb >> 4)]


@njit(**PARALLEL)
def matmul_iq3_xxs(W, rows, cols, qs, d, extra, out):
    nb = cols // 256
    rb = nb * 98
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        wq = np.empty(cols, np.int8)
        w32 = wq.view(np.uint32)  # one table store per 4 weights
        ls = np.empty(nb * 8, np.int32)
        dw = np.empty(nb, np.float32)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            row = W[r * rb:(r + 1) * rb]
            for b in range(nb):
                o = b * 98
                dw[b] = f16_to_f32(row[o], row[o + 1])
                _decode_iq3_xxs(row, o, w32, b * 64, ls, b * 8)
            for t in range(qs.shape[0]):
                x = qs[t]
                dx = d[t]
                acc = np.float32(0.0)
                for b in range(nb):
                    bsum = 0
                    for s in range(8):
                        bsum += ls[b * 8 + s] * dot32(wq, b * 256 + s * 32, x, b * 256 + s * 32)
                    acc += (dw[b] * dx[b]) * np.float32(bsum)
                out[t, r] = np.float32(0.25) * acc


@njit(**SERIAL)
def dequantize_iq3_xxs(W, cols, row_ids, out):
    nb = cols // 256
    rb = nb * 98
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb:(row_ids[i] + 1) * rb]
        wq = np.empty(256, np.int8)
        w32 = wq.view(np.uint32)  # wide stores of decoded groups
        ls = np.empty(8, np.int32)
        for b in range(nb):
            o = b * 98
            dw = f16_to_f32(row[o], row[o + 1])
            _decode_iq3_xxs(row, o, w32, 0, ls, 0)
            for ib in range(8):
                db = dw * (np.float32(0.5) + np.float32(ls[ib] // 2)) * np.float32(0.5)
                for j in range(32):
                    out[i, b * 256 + ib * 32 + j] = db * np.float32(wq[ib * 32 + j])


# ---- IQ3_S: d, qs[64], qh[8] (9th index bits), signs[32], scales[4] ---------

@njit(**INLINE)
def _decode_iq3_s(blk, o, w32, wo, ls, lo):
    for ib in range(8):
        qh = np.int32(blk[o + 66 + ib])
        for l in range(4):
            p = 2 + ib * 8 + 2 * l
            g1 = np.int32(blk[o + p]) | ((qh << (8 - 2 * l)) & 256)
            g2 = np.int32(blk[o + p + 1]) | ((qh << (7 - 2 * l)) & 256)
            sb = blk[o + 74 + ib * 4 + l]
            w32[wo + (ib * 4 + l) * 2] = _SIGNED_IQ3_S[g1 * 16 + (sb & 15)]
            w32[wo + (ib * 4 + l) * 2 + 1] = _SIGNED_IQ3_S[g2 * 16 + (sb >> 4)]
        ls[lo + ib] = 2 * ((blk[o + 106 + ib // 2] >> (4 * (ib % 2))) & 15) + 1


@njit(**PARALLEL)
def matmul_iq3_s(W, rows, cols, qs, d, extra, out):
    nb = cols // 256
    rb = nb * 110
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        wq = np.empty(cols, np.int8)
        w32 = wq.view(np.uint32)  # one table store per 4 weights
        ls = np.empty(nb * 8, np.int32)
        dw = np.empty(nb, np.float32)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            row = W[r * rb:(r + 1) * rb]
            for b in range(nb):
                o = b * 110
                dw[b] = f16_to_f32(row[o], row[o + 1])
                _decode_iq3_s(row, o, w32, b * 64, ls, b * 8)
            for t in range(qs.shape[0]):
                x = qs[t]
                dx = d[t]
                acc = np.float32(0.0)
                for b in range(nb):
                    bsum = 0
                    for s in range(8):
                        bsum += ls[b * 8 + s] * dot32(wq, b * 256 + s * 32, x, b * 256 + s * 32)
                    acc += (dw[b] * dx[b]) * np.float32(bsum)
                out[t, r] = acc


@njit(**SERIAL)
def dequantize_iq3_s(W, cols, row_ids, out):
    nb = cols // 256
    rb = nb * 110
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb:(row_ids[i] + 1) * rb]
        wq = np.empty(256, np.int8)
        w32 = wq.view(np.uint32)  # wide stores of decoded groups
        ls = np.empty(8, np.int32)
        for b in range(nb):
            o = b * 110
            dw = f16_to_f32(row[o], row[o + 1])
            _decode_iq3_s(row, o, w32, 0, ls, 0)
            for ib in range(8):
                db = dw * np.float32(ls[ib])
                for j in range(32):
                    out[i, b * 256 + ib * 32 + j] = db * np.float32(wq[ib * 32 + j])


# ---- IQ1_S: d, qs[32] grid low bits, qh u16[8] (3x3 index bits, scale, delta sign)

@njit(**INLINE)
def _decode_iq1_s(blk, o, w64, wo, ls, lo, delta):
    for ib in range(8):
        qh = np.int32(blk[o + 34 + 2 * ib]) | (np.int32(blk[o + 35 + 2 * ib]) << 8)
        ls[lo + ib] = 2 * ((qh >> 12) & 7) + 1
        delta[ib] = -1 if qh & 0x8000 else 1
        for l in range(4):
            gi = np.int32(blk[o + 2 + ib * 4 + l]) | (((qh >> (3 * l)) & 7) << 8)
            w64[wo + ib * 4 + l] = _GRID8_IQ1_S[gi]


@njit(**PARALLEL)
def matmul_iq1_s(W, rows, cols, qs, d, extra, out):
    nb = cols // 256
    rb = nb * 50
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        wq = np.empty(cols, np.int8)
        w64 = wq.view(np.uint64)  # one table store per 8 weights
        ls = np.empty(nb * 8, np.int32)
        dw = np.empty(nb, np.float32)
        delta = np.empty(8, np.int32)
        shift = np.empty(nb * 8, np.int32)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            row = W[r * rb:(r + 1) * rb]
            for b in range(nb):
                o = b * 50
                dw[b] = f16_to_f32(row[o], row[o + 1])
                _decode_iq1_s(row, o, w64, b * 32, ls, b * 8, delta)
                for ib in range(8):
                    shift[b * 8 + ib] = ls[b * 8 + ib] * delta[ib]
            for t in range(qs.shape[0]):
                x = qs[t]
                dx = d[t]
                bsums = extra[t]
                acc = np.float32(0.0)
                for b in range(nb):
                    bsum = 0
                    for s in range(8):
                        bsum += ls[b * 8 + s] * dot32(wq, b * 256 + s * 32, x, b * 256 + s * 32)
                    sumi1 = 0
                    for ib in range(8):
                        sumi1 += shift[b * 8 + ib] * (bsums[b * 16 + 2 * ib] + bsums[b * 16 + 2 * ib + 1])
                    acc += (dw[b] * dx[b]) * (np.float32(bsum) + _IQ1_DELTA * np.float32(sumi1))
                out[t, r] = acc


@njit(**SERIAL)
def dequantize_iq1_s(W, cols, row_ids, out):
    nb = cols // 256
    rb = nb * 50
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb:(row_ids[i] + 1) * rb]
        wq = np.empty(256, np.int8)
        w64 = wq.view(np.uint64)  # wide stores of decoded groups
        ls = np.empty(8, np.int32)
        delta = np.empty(8, np.int32)
        for b in range(nb):
            o = b * 50
            dw = f16_to_f32(row[o], row[o + 1])
            _decode_iq1_s(row, o, w64, 0, ls, 0, delta)
            for ib in range(8):
                dl = dw * np.float32(ls[ib])
                shift = _IQ1_DELTA * np.float32(delta[ib])
                for j in range(32):
                    out[i, b * 256 + ib * 32 + j] = dl * (np.float32(wq[ib * 32 + j]) + shift)


# ---- IQ1_M: qs[32], qh[16] (3 index bits + delta sign per 8), scales u16[4]
# (3-bit scales per 16 values; the f16 d lives in the scales' top nibbles) ---

@njit(**INLINE)
def _decode_iq1_m(blk, o, w64, wo, ls, lo, delta):
    for ib in range(8):
        sc = np.int32(blk[o + 48 + 2 * (ib // 2)]) | (np.int32(blk[o + 49 + 2 * (ib // 2)]) << 8)
        ls[lo + 2 * ib] = 2 * ((sc >> (6 * (ib % 2))) & 7) + 1
        ls[lo + 2 * ib + 1] = 2 * ((sc >> (6 * (ib % 2) + 3)) & 7) + 1
        for l in range(4):
            qh = np.int32(blk[o + 32 + ib * 2 + l // 2])
            gi = np.int32(blk[o + ib * 4 + l]) | ((qh << (8 - 4 * (l % 2))) & 0x700)
            delta[ib * 4 + l] = -1 if qh & (0x08 << (4 * (l % 2))) else 1
            w64[wo + ib * 4 + l] = _GRID8_IQ1_S[gi]


@njit(**INLINE)
def _d_iq1_m(blk, o):
    lo = (blk[o + 49] >> 4) | (blk[o + 51] & 0xF0)
    hi = (blk[o + 53] >> 4) | (blk[o + 55] & 0xF0)
    return f16_to_f32(lo, hi)


@njit(**PARALLEL)
def matmul_iq1_m(W, rows, cols, qs, d, extra, out):
    nb = cols // 256
    rb = nb * 56
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        wq = np.empty(cols, np.int8)
        w64 = wq.view(np.uint64)  # one table store per 8 weights
        ls = np.empty(nb * 16, np.int32)
        dw = np.empty(nb, np.float32)
        delta = np.empty(32, np.int32)
        shifts = np.empty(cols, np.int16)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            row = W[r * rb:(r + 1) * rb]
            for b in range(nb):
                o = b * 56
                dw[b] = _d_iq1_m(row, o)
                _decode_iq1_m(row, o, w64, b * 32, ls, b * 16, delta)
                # delta * scale of each 8-value group, per value, so its sum is one more dot
                for g in range(32):
                    for j in range(8):
                        shifts[b * 256 + g * 8 + j] = ls[b * 16 + g // 2] * delta[g]
            for t in range(qs.shape[0]):
                x = qs[t]
                dx = d[t]
                acc = np.float32(0.0)
                for b in range(nb):
                    bsum = 0
                    for s in range(16):
                        bsum += ls[b * 16 + s] * dot16(wq, b * 256 + s * 16, x, b * 256 + s * 16)
                    sumi2 = dot256(shifts, b * 256, x, b * 256)
                    acc += (dw[b] * dx[b]) * (np.float32(bsum) + _IQ1_DELTA * np.float32(sumi2))
                out[t, r] = acc


@njit(**SERIAL)
def dequantize_iq1_m(W, cols, row_ids, out):
    nb = cols // 256
    rb = nb * 56
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb:(row_ids[i] + 1) * rb]
        wq = np.empty(256, np.int8)
        w64 = wq.view(np.uint64)  # wide stores of decoded groups
        ls = np.empty(16, np.int32)
        delta = np.empty(32, np.int32)
        for b in range(nb):
            o = b * 56
            dw = _d_iq1_m(row, o)
            _decode_iq1_m(row, o, w64, 0, ls, 0, delta)
            for g in range(32):
                dl = dw * np.float32(ls[g // 2])
                shift = _IQ1_DELTA * np.float32(delta[g])
                for j in range(8):
                    out[i, b * 256 + g * 8 + j] = dl * (np.float32(wq[g * 8 + j]) + shift)
