"""MXFP4 (gpt-oss experts): 32 values per block, one e8m0 exponent byte and
16 bytes of FP4 (E2M1) nibbles, dotted against Q8_0 activations:
    sumf += (d_x * e8m0_half(e)) * (sumi_lo + sumi_hi)      (ggml quants.c)
Kernel signatures as in legacy.py.
"""

from __future__ import annotations

import numpy as np
from gguf.quants import MXFP4
from numba import njit, prange

from ._constants import MXFP4_BYTES, ORDER_GEMV, QK_MXFP4
from ._jit import E8M0_HALF, PARALLEL, ROWS_PER_TASK, SERIAL, chunk_count, chunk_rows, nibble_row_dot, row_start
from .simd import rows_dot8

_KVALUES = np.array(MXFP4.kvalues, dtype=np.int8)
_ROW = nibble_row_dot(MXFP4_BYTES, _KVALUES, fp16_scale=False)
_ROWS8 = rows_dot8["mxfp4"]


# Top-level on purpose: numba caches factory-made parallel kernels per process only (docs/kernels.md).
@njit(**PARALLEL)
def matmul_mxfp4(W, starts, rows, group_rows, cols, qs, d, extra, out, order, straight):
    """Values looked up in registers (simd.nibble_table_dot), every token straight from the row
    bytes: 2.5-4x faster than decoding the row once for a batch, even for 64 tokens.  Repacked by
    llama.cpp (ORDER_GEMV; then group_rows % 8 == 0): eight rows per call (simd.rows_dot8)."""
    n_tok = qs.shape[0] * group_rows // rows  # tokens per group of rows
    nb = cols // QK_MXFP4
    rb = nb * MXFP4_BYTES
    if order == ORDER_GEMV:
        for task in prange(rows // 8):
            g = task * 8 // group_rows
            at = row_start(starts, task * 8, group_rows, rb)
            for t in range(n_tok):
                _ROWS8(W, at, rb, qs[g * n_tok + t], d[g * n_tok + t], nb, out[t], task * 8)
        return
    for task in prange(chunk_count(rows, group_rows, ROWS_PER_TASK)):
        r0, n_rows, g = chunk_rows(task, group_rows, ROWS_PER_TASK)
        t0 = g * n_tok
        for t in range(n_tok):  # each token's activation rows viewed once per task, not per row
            x, dx = qs[t0 + t], d[t0 + t]
            for r in range(r0, r0 + n_rows):
                at = row_start(starts, r, group_rows, rb)
                row = W[at : at + rb]
                out[t, r] = _ROW(row, x, dx, nb, order)


@njit(**SERIAL)
def dequantize_mxfp4(W, cols, row_ids, out):
    nb = cols // QK_MXFP4
    rb = nb * MXFP4_BYTES
    for i in range(row_ids.size):
        row = W[row_ids[i] * rb : (row_ids[i] + 1) * rb]
        for b in range(nb):
            o = b * MXFP4_BYTES
            scale = E8M0_HALF[row[o]]
            for j in range(16):
                out[i, b * QK_MXFP4 + j] = scale * np.float32(_KVALUES[row[o + 1 + j] & 15])
                out[i, b * QK_MXFP4 + 16 + j] = scale * np.float32(_KVALUES[row[o + 1 + j] >> 4])
