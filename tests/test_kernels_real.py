"""Kernels on blocks written by llama.cpp's own llama-quantize
(tests/data/kernels, made by tools/make_kernel_fixtures.py)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T, GGUFReader, quants

from swapmoe.runtime import kernels as K

from conftest import DATA
from test_kernels import activation_error_bound, emulate

FIXTURES = sorted((DATA / "kernels").glob("*.gguf"))


def quantized_tensors():
    for path in FIXTURES:
        for tensor in GGUFReader(path).tensors:
            yield pytest.param(tensor, id=f"{path.stem}:{tensor.name}")


def test_fixtures_cover_every_type():
    seen = {T(t.tensor_type) for p in FIXTURES for t in GGUFReader(p).tensors}
    assert seen == {T(t) for t in K.KERNELS} - {T.F32}


@pytest.mark.parametrize("tensor", list(quantized_tensors()))
def test_real_blocks(tensor):
    tp = T(tensor.tensor_type)
    cols, rows = (int(n) for n in tensor.shape[:2])
    W = np.asarray(tensor.data).view(np.uint8).reshape(-1)  # the mmap'd bytes, no copy
    ref = quants.dequantize(W.reshape(rows, -1), tp).astype(np.float32)
    np.testing.assert_array_equal(K.dequantize_rows(tp, W, rows, cols), ref)

    X = np.random.default_rng(0).standard_normal((2, cols)).astype(np.float32)
    Y = K.matmul(tp, W, rows, cols, X)
    w = ref.astype(np.float64)
    assert np.all(np.abs(Y - X.astype(np.float64) @ w.T) <= activation_error_bound(tp, w, X))
    Y_emul = emulate(tp, W, rows, cols, X)
    tol = 2 * cols * 2.0**-24 * (np.abs(w) @ np.abs(X.astype(np.float64)).T).T
    np.testing.assert_array_less(np.abs(Y - Y_emul), tol + 1e-30)
