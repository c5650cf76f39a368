"""MXFP4 (gpt-oss experts): 32 values per block, one e8m0 exponent byte and
16 bytes of FP4 (E2M1) nibbles, dotted against Q8_0 activations:
    sumf += (d_x * e8m0_half(e)) * (sumi_lo + sumi_hi)      (ggml quants.c)
Kernel signatures as in legacy.py.
"""
from __future__ import annotations

import numpy as np
from gguf.quants import MXFP4
from numba import njit, prange

from ._jit import (E8M0_HALF, ORDER_GEMV, PARALLEL, ROWS_PER_TASK, SERIAL, decode_pairs, dot32, fma32,
                   nibble_pair_words, pair_order)

_KVALUES = np.array(MXFP4.kvalues, dtype=np.int8)
_PAIRS = nibble_pair_words(_KVALUES)


@njit(**PARALLEL)
def matmul_mxfp4(W, rows, group_rows, cols, qs, d, extra, out, order):
    """Weights decoded in pair order (_jit.decode_pairs), dotted with pair-ordered activations."""
    n_tok = qs.shape[0] * group_rows // rows  # tokens per group of rows
    nb = cols // 32
    rb = nb * 17
    xp = pair_order(qs)
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        wq = np.empty(cols, np.int8)
        w64 = wq.view(np.uint64)
        dw = np.empty(nb, np.float32)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            row = W[r * rb:(r + 1) * rb]
            for b in range(nb):
                o = b * 17
                dw[b] = E8M0_HALF[row[o]]
                for k in range(4):
                    w64[b * 4 + k] = decode_pairs(_PAIRS, row, o + 1 + 4 * k)
            t0 = (r // group_rows) * n_tok
            for t in range(n_tok):
                x = xp[t0 + t]
                dx = d[t0 + t]
                acc = np.float32(0.0)
                for b in range(nb):
                    sumi = dot32(wq, b * 32, x, b * 32)
                    if order == ORDER_GEMV:  # repacked by llama.cpp: one FMA per block
                        acc = fma32(np.float32(sumi), dw[b] * dx[b], acc)
                    else:
                        acc += (dx[b] * dw[b]) * np.float32(sumi)
                out[t, r] = acc


@njit(**SERIAL)
def dequantize_mxfp4(W, cols, row_ids, out):
    nb = cols // 32
    rb = nb * 17
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb:(row_ids[i] + 1) * rb]
        for b in range(nb):
            o = b * 17
            scale = E8M0_HALF[row[o]]
            for j in range(16):
                out[i, b * 32 + j] = scale * np.float32(_KVALUES[row[o + 1 + j] & 15])
                out[i, b * 32 + 16 + j] = scale * np.float32(_KVALUES[row[o + 1 + j] >> 4])
