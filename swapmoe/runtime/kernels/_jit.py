"""Shared numba helpers for the quantized kernels.

Every kernel decodes one weight block into a small int8 scratch array and then
takes fixed-length (16 or 32) integer dot products with the quantized
activation.  Those short fixed-length loops only become SIMD code through
LLVM's SLP vectorizer, which numba leaves off by default; we turn it on for
the process before any kernel is compiled (it only changes how code is
vectorized, never what it computes).
"""
from __future__ import annotations

import math

import numba
import numpy as np
from numba import njit

numba.config.SLP_VECTORIZE = 1

# Options for the row-parallel kernels: release the GIL, cache the machine code.
PARALLEL = dict(parallel=True, nogil=True, cache=True)
SERIAL = dict(nogil=True, cache=True)


@njit(nogil=True, cache=True, inline="always")
def f16_to_f32(lo, hi):
    """IEEE half (two little-endian bytes) to float32, exactly."""
    h = np.int32(lo) | (np.int32(hi) << 8)
    exponent = (h >> 10) & 0x1F
    mantissa = h & 0x3FF
    if exponent == 0:
        value = np.float32(math.ldexp(mantissa, -24))
    elif exponent == 31:
        value = np.float32(np.inf) if mantissa == 0 else np.float32(np.nan)
    else:
        value = np.float32(math.ldexp(mantissa + 1024, exponent - 25))
    return -value if h & 0x8000 else value


@njit(nogil=True, cache=True, inline="always")
def e8m0_to_f32_half(e):
    """MXFP4 shared exponent byte to 0.5 * 2^(e-127) (ggml_e8m0_to_fp32_half)."""
    return np.float32(math.ldexp(1.0, np.int32(e) - 128))


@njit(nogil=True, cache=True)
def dot16(a, b):
    """Exact int32 dot of the first 16 entries of two int8 arrays."""
    s = np.int32(0)
    for j in range(16):
        s = np.int32(s + np.int32(a[j]) * np.int32(b[j]))
    return s


@njit(nogil=True, cache=True)
def dot32(a, b):
    """Exact int32 dot of the first 32 entries of two int8 arrays."""
    s = np.int32(0)
    for j in range(32):
        s = np.int32(s + np.int32(a[j]) * np.int32(b[j]))
    return s
