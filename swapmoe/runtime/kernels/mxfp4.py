"""MXFP4 (gpt-oss experts): 32 values per block, one e8m0 exponent byte and
16 bytes of FP4 (E2M1) nibbles, dotted against Q8_0 activations:
    sumf += (d_x * e8m0_half(e)) * (sumi_lo + sumi_hi)      (ggml quants.c)
Kernel signatures as in legacy.py.
"""
from __future__ import annotations

import numpy as np
from gguf.quants import MXFP4
from numba import njit, prange

from ._jit import E8M0_HALF, INLINE, PARALLEL, ROWS_PER_TASK, SERIAL, dot32

_KVALUES = np.array(MXFP4.kvalues, dtype=np.int8)
# both nibbles of a byte at once: (value of low nibble, value of high nibble)
_PAIRS = np.stack([_KVALUES[np.arange(256) & 15], _KVALUES[np.arange(256) >> 4]], axis=1).copy()


@njit(**INLINE)
def _decode_fp4(blk, o, pairs, wq, wo):
    for j in range(16):
        wq[wo + j] = pairs[blk[o + j], 0]
        wq[wo + j + 16] = pairs[blk[o + j], 1]


@njit(**PARALLEL)
def matmul_mxfp4(W, rows, cols, qs, d, extra, out):
    nb = cols // 32
    rb = nb * 17
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        wq = np.empty(cols, np.int8)
        dw = np.empty(nb, np.float32)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            row = W[r * rb:(r + 1) * rb]
            for b in range(nb):
                o = b * 17
                dw[b] = E8M0_HALF[row[o]]
                _decode_fp4(row, o + 1, _PAIRS, wq, b * 32)
            for t in range(qs.shape[0]):
                x = qs[t]
                dx = d[t]
                acc = np.float32(0.0)
                for b in range(nb):
                    sumi = dot32(wq, b * 32, x, b * 32)
                    acc += (dx[b] * dw[b]) * np.float32(sumi)
                out[t, r] = acc


@njit(**SERIAL)
def dequantize_mxfp4(W, cols, row_ids, out):
    nb = cols // 32
    rb = nb * 17
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb:(row_ids[i] + 1) * rb]
        wq = np.empty(32, np.int8)
        for b in range(nb):
            o = b * 17
            scale = E8M0_HALF[row[o]]
            _decode_fp4(row, o + 1, _PAIRS, wq, 0)
            for j in range(32):
                out[i, b * 32 + j] = scale * np.float32(wq[j])
