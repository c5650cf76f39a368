"""Activation quantizers: float32 activations to llama.cpp's "vec_dot_type".

llama.cpp's CPU matmul first converts the activation row to the weight
type's vec_dot_type and then takes integer dot products.  These functions
reproduce that conversion bit for bit (x86 build, AVX2/AVX-512):

* Q8_0 (quantize_row_q8_0, x86 path): per 32 values amax = max|x|,
  d = fp16(amax / 127), id = 127 / amax (0 if amax == 0), q = rint(x * id),
  rounding half to even; all in float32.
* Q8_1 (quantize_row_q8_1, x86 path): as Q8_0, plus s = fp16(d * sum(q))
  where d is the unrounded float32 amax / 127.
* Q8_K (quantize_row_q8_K_ref): per 256 values, max = the first value with
  the largest |x|, iscale = -127 / max, q = min(127, nearest_int(iscale * x)),
  d = 1 / iscale (float32, not fp16), bsums = sums of 16-value groups.
* F16 / BF16: round to nearest even (F16C / AVX512-BF16 conversions).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import njit

from ._constants import QK8_0, QK_K
from ._jit import SERIAL


class QuantizedActivation(NamedTuple):
    """Activation rows [n_tokens, cols] converted to a vec_dot_type.

    qs: int8 [n_tokens, cols] quants, or float32 values for F32/F16/BF16.
    d: float32 [n_tokens, n_blocks] block scales (empty for float types).
    extra: Q8_1: float32 s per block; Q8_K: int32 bsums per 16 values.
    """

    vec_dot_type: int
    qs: np.ndarray
    d: np.ndarray
    extra: np.ndarray


@njit(**SERIAL)
def _quantize_q8_0_blocks(x):
    n_tok, cols = x.shape
    nb = cols // QK8_0
    qs = np.empty((n_tok, cols), np.int8)
    amax = np.empty((n_tok, nb), np.float32)
    qsum = np.empty((n_tok, nb), np.int32)
    for t in range(n_tok):
        for b in range(nb):
            m = np.float32(0.0)
            for j in range(QK8_0):
                m = max(m, abs(x[t, b * QK8_0 + j]))
            inv = np.float32(127.0) / m if m != 0 else np.float32(0.0)
            total = 0
            for j in range(QK8_0):
                q = np.int32(np.rint(x[t, b * QK8_0 + j] * inv))
                qs[t, b * QK8_0 + j] = q
                total += q
            amax[t, b] = m
            qsum[t, b] = total
    return qs, amax, qsum


@njit(**SERIAL)
def _quantize_q8_k_blocks(x):
    n_tok, cols = x.shape
    nb = cols // QK_K
    qs = np.zeros((n_tok, cols), np.int8)
    d = np.zeros((n_tok, nb), np.float32)
    bsums = np.zeros((n_tok, cols // 16), np.int32)
    for t in range(n_tok):
        for b in range(nb):
            o = b * QK_K
            amax = np.float32(0.0)
            mx = np.float32(0.0)
            for j in range(QK_K):
                ax = abs(x[t, o + j])
                if ax > amax:
                    amax = ax
                    mx = x[t, o + j]
            if amax == 0:
                continue
            iscale = np.float32(-127.0) / mx
            for j in range(QK_K):
                qs[t, o + j] = min(np.int32(127), np.int32(np.rint(iscale * x[t, o + j])))
            for g in range(16):
                total = 0
                for j in range(16):
                    total += qs[t, o + g * 16 + j]
                bsums[t, b * 16 + g] = total
            d[t, b] = np.float32(1.0) / iscale
    return qs, d, bsums


def _to_f16_f32(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16).astype(np.float32)


def _to_bf16_f32(v: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(v, dtype=np.float32).view(np.uint32)
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> 16) & 1))) & np.uint32(0xFFFF0000)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = np.where(nan, (bits | 0x00400000) & np.uint32(0xFFFF0000), rounded)
    return rounded.view(np.float32)


def quantize_q8_0(x: np.ndarray) -> QuantizedActivation:
    qs, amax, _ = _quantize_q8_0_blocks(x)
    return QuantizedActivation(int(T.Q8_0), qs, _to_f16_f32(amax / np.float32(127)), _EMPTY)


def quantize_q8_1(x: np.ndarray) -> QuantizedActivation:
    qs, amax, qsum = _quantize_q8_0_blocks(x)
    d = amax / np.float32(127)
    return QuantizedActivation(int(T.Q8_1), qs, _to_f16_f32(d), _to_f16_f32(d * qsum.astype(np.float32)))


def quantize_q8_k(x: np.ndarray) -> QuantizedActivation:
    qs, d, bsums = _quantize_q8_k_blocks(x)
    return QuantizedActivation(int(T.Q8_K), qs, d, bsums)


def convert_f32(x: np.ndarray) -> QuantizedActivation:
    return QuantizedActivation(int(T.F32), x, _EMPTY, _EMPTY)


def convert_f16(x: np.ndarray) -> QuantizedActivation:
    return QuantizedActivation(int(T.F16), _to_f16_f32(x), _EMPTY, _EMPTY)


def convert_bf16(x: np.ndarray) -> QuantizedActivation:
    return QuantizedActivation(int(T.BF16), _to_bf16_f32(x), _EMPTY, _EMPTY)


_EMPTY = np.zeros((0, 0), np.float32)

# vec_dot_type -> converter of float32 rows [n_tokens, cols]
QUANTIZERS = {
    int(T.F32): convert_f32,
    int(T.F16): convert_f16,
    int(T.BF16): convert_bf16,
    int(T.Q8_0): quantize_q8_0,
    int(T.Q8_1): quantize_q8_1,
    int(T.Q8_K): quantize_q8_k,
}
