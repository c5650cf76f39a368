"""A weight matrix kept as its GGUF bytes, and the matmul that reads them directly."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as T

from swapmoe.runtime import kernels


@dataclass(frozen=True)
class Weight:
    """rows x cols matrix in ggml row layout (rows = outputs); `raw` is a uint8 view, never a copy.
    `stacked`: one expert of a stacked expert tensor (llama.cpp rounds those products differently).
    `at`: where raw begins in raw.base (bytes), for products of several weights of one buffer in
    one call (linear_apart); -1 where not needed."""

    raw: np.ndarray
    ggml_type: T
    rows: int
    cols: int
    stacked: bool = False
    at: int = -1

    @property
    def vec_dot_type(self) -> int:
        return kernels.KERNELS[int(self.ggml_type)].vec_dot_type


def linear(w: Weight, x: np.ndarray, qx: kernels.QuantizedActivation | None = None) -> np.ndarray:
    """x[T, cols] -> [T, rows], as llama.cpp computes it (activation quantized to the weight's dot type).

    `qx`: x already quantized for w's dot type (linear_each shares one among weights)."""
    if qx is None:
        return linear_each(x, w)[0]
    return kernels.matmul_q(w.ggml_type, w.raw, w.rows, w.cols, qx, stacked=w.stacked)


# Set by shared_products: where the products of sequences decoding together are pooled
_pool: Callable[[np.ndarray, tuple[Weight, ...]], list[np.ndarray] | None] | None = None


@contextlib.contextmanager
def shared_products(pool: Callable[[np.ndarray, tuple[Weight, ...]], list[np.ndarray] | None]):
    """Inside, linear_each(x, *weights) first offers (x, weights) to `pool`, which returns the
    products (computed with other callers' rows) or None to have them computed here."""
    global _pool
    before, _pool = _pool, pool
    try:
        yield
    finally:
        _pool = before


def linear_per_group(w: Weight, x: np.ndarray) -> np.ndarray:
    """x[T, G, cols] -> [T, G, rows // G]: group g of w's rows applied to x[:, g], all groups in
    one kernel call. For a 3-D tensor of G matrices (e.g. MLA's per-head attn_k_b), whose rows
    are those matrices' rows one after the other."""
    T_, groups, cols = x.shape
    group_major = np.ascontiguousarray(x.transpose(1, 0, 2)).reshape(groups * T_, cols)
    qx = kernels.quantize_activation(w.ggml_type, group_major)
    y = kernels.matmul_q(w.ggml_type, w.raw, w.rows, w.cols, qx, group_rows=w.rows // groups)
    return y.reshape(T_, groups, w.rows // groups)


def linear_each(
    x: np.ndarray, *weights: Weight, quantized: dict[int, kernels.QuantizedActivation] | None = None
) -> list[np.ndarray]:
    """[linear(w, x) for w in weights], quantizing x once per activation type, as llama.cpp
    reuses one quantized activation for the matmuls of the same input. `quantized`: x's
    conversions by vec_dot_type, kept by a caller that multiplies the same x again."""
    if _pool is not None:
        pooled = _pool(x, weights)
        if pooled is not None:
            return pooled
    quantized = {} if quantized is None else quantized
    out = []
    for w in weights:
        if w.vec_dot_type not in quantized:
            quantized[w.vec_dot_type] = kernels.quantize_activation(w.ggml_type, x)
        out.append(linear(w, x, quantized[w.vec_dot_type]))
    return out


def linear_apart(weights: list[Weight], x: np.ndarray) -> np.ndarray | None:
    """[linear(w, x[g]) for g, w in enumerate(weights)] as one product [G, rows], or None where
    that cannot be: weights of one type and shape whose bytes lie apart in one buffer (a layer's
    chosen experts, Weight.at known); x [G, cols], one row per weight, or [1, cols] for all. Each
    row is computed as in its own product, so the bits are linear's."""
    first = weights[0]
    buffer, ggml_type, rows, cols, stacked = first.raw.base, first.ggml_type, first.rows, first.cols, first.stacked
    if buffer is None:
        return None
    for w in weights:  # one loop, no tuples: this runs for every layer of every decoded token
        if (
            w.at < 0
            or w.raw.base is not buffer
            or w.ggml_type != ggml_type
            or w.rows != rows
            or w.cols != cols
            or w.stacked != stacked
        ):
            return None
    qx = kernels.quantize_activation(first.ggml_type, x)
    if len(x) == 1 < len(weights):
        qx = kernels.QuantizedActivation(
            qx.vec_dot_type, *(np.repeat(a, len(weights), axis=0) for a in (qx.qs, qx.d, qx.extra))
        )
    starts = np.array([w.at for w in weights], np.int64)
    starts.flags.writeable = False  # as the kernels take it (else matmul_q makes a read-only view)
    y = kernels.matmul_q(
        ggml_type, buffer, len(weights) * rows, cols, qx, group_rows=rows, stacked=stacked, starts=starts
    )
    return y.reshape(len(weights), rows)


def rows_of(w: Weight, ids: np.ndarray) -> np.ndarray:
    """Dequantized rows `ids` (embedding lookup, llama.cpp's get_rows)."""
    return kernels.dequantize_rows(w.ggml_type, w.raw, w.rows, w.cols, ids)
