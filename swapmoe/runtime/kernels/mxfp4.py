"""MXFP4 (gpt-oss experts): 32 values per block, one e8m0 exponent byte and
16 bytes of FP4 (E2M1) nibbles, dotted against Q8_0 activations:
    sumf += (d_x * e8m0_half(e)) * (sumi_lo + sumi_hi)      (ggml quants.c)
Kernel signatures as in legacy.py.
"""
from __future__ import annotations

import numpy as np
from gguf.quants import MXFP4
from numba import njit

from ._jit import E8M0_HALF, SERIAL, nibble_table_matmul

_KVALUES = np.array(MXFP4.kvalues, dtype=np.int8)


matmul_mxfp4 = nibble_table_matmul(17, _KVALUES, fp16_scale=False)


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
