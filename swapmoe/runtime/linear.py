"""A weight matrix kept as its GGUF bytes, and the matmul that reads them directly."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as T

from swapmoe.runtime import kernels


@dataclass(frozen=True)
class Weight:
    """rows x cols matrix in ggml row layout (rows = outputs); `raw` is a uint8 view, never a copy."""
    raw: np.ndarray
    ggml_type: T
    rows: int
    cols: int

    @property
    def vec_dot_type(self) -> int:
        return kernels.KERNELS[int(self.ggml_type)].vec_dot_type


def linear(w: Weight, x: np.ndarray, qx: kernels.QuantizedActivation | None = None) -> np.ndarray:
    """x[T, cols] -> [T, rows], as llama.cpp computes it (activation quantized to the weight's dot type).

    Pass `qx` (from `quantize(w, x)`) to reuse one quantized activation for several weights."""
    if qx is None:
        qx = kernels.quantize_activation(w.ggml_type, x)
    return kernels.matmul_q(w.ggml_type, w.raw, w.rows, w.cols, qx)


def quantize(w: Weight, x: np.ndarray) -> kernels.QuantizedActivation:
    return kernels.quantize_activation(w.ggml_type, x)


def rows_of(w: Weight, ids: np.ndarray) -> np.ndarray:
    """Dequantized rows `ids` (embedding lookup, llama.cpp's get_rows)."""
    return kernels.dequantize_rows(w.ggml_type, w.raw, w.rows, w.cols, ids)
