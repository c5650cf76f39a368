"""Quantized matrix kernels computing straight from GGUF weight bytes.

One dispatch table, KERNELS, keyed by ggml type (gguf.GGMLQuantizationType
ints).  Each entry names the activation type llama.cpp's CPU backend uses for
that weight type ("vec_dot_type"), the row-parallel matmul kernel and the row
dequantizer.  Adding a type is one entry.

Simple entry points:
    matvec(ggml_type, W, rows, cols, x)   -> y[rows]        y = W @ x
    matmul(ggml_type, W, rows, cols, X)   -> Y[T, rows]     Y = X @ W.T
    dequantize_rows(ggml_type, W, rows, cols, row_ids=None) -> float32 [n, cols]
Quantize an activation once and reuse it against many matrices of types that
share a vec_dot_type:
    qx = quantize_activation(ggml_type, X)   # X: [cols] or [T, cols]
    matvec_q(ggml_type, W, rows, cols, qx) / matmul_q(...)

W is the tensor's raw bytes as a 1-D uint8 array (typically a view of a
memory map; never copied), rows are ggml rows (outputs), cols the row length.
Several matrices that lie apart in one buffer (a layer's chosen experts) are one
call: matmul_q(..., group_rows=rows of one, starts=where each begins).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, NamedTuple

import numba
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

from swapmoe.errors import SwapmoeError


def _configure_numba() -> None:
    """Before any kernel module is imported: LLVM's SLP vectorizer on (numba leaves it off; the
    kernels' short fixed-length loops only become SIMD code through it), and numba's on-disk
    cache in a directory named by a hash of these kernel sources.

    numba checks a cached function against its own source file only, not the helpers it inlines
    from other modules (simd.py, _jit.py): after an upgrade that changed only those, it would run
    stale machine code.  A NUMBA_CACHE_DIR the user set is left alone.  Where the home cache
    cannot be written (a read-only install with an unwritable home: numba's own fallback, the
    package directory, fails with "no locator"), a directory in the system's temp dir is used,
    with one warning line.  Both go through the environment: numba re-reads every NUMBA_*
    variable whenever one of them changed, resetting values set only on numba.config (which
    once turned the vectorizer off mid-session)."""
    os.environ["NUMBA_SLP_VECTORIZE"] = "1"
    if not os.environ.get("NUMBA_CACHE_DIR"):
        sources = b"".join(p.read_bytes() for p in sorted(Path(__file__).parent.glob("*.py")))
        version = hashlib.sha256(sources).hexdigest()[:16]
        home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "swapmoe" / "numba"
        temp = Path(tempfile.gettempdir()) / f"swapmoe-numba-{os.getuid() if hasattr(os, 'getuid') else 0}"
        for base in (home, temp):
            if _writable(base / version):
                if base is temp:
                    print(
                        f"swapmoe: warning: {home} is not writable; compiled kernels are cached in {temp}",
                        file=sys.stderr,
                    )
                os.environ["NUMBA_CACHE_DIR"] = str(base / version)
                break
    numba.config.reload_config()


def _writable(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path):
            return True
    except OSError:
        return False


_configure_numba()

from . import (  # noqa: E402
    float as _float,  # noqa: E402  (kernel modules: after the cache directory is set)
    iquants,
    kquants,
    legacy,
    mxfp4,
)
from ._constants import ORDER_DOT, ORDER_GEMM, ORDER_GEMV, ORDER_LANES, ORDER_TILED  # noqa: E402
from .activation import QUANTIZERS, QuantizedActivation  # noqa: E402
from .ggml_math import LANES  # noqa: E402
from .simd import TILES  # noqa: E402


class Kernel(NamedTuple):
    vec_dot_type: int
    matmul: Callable  # (W, starts, rows, group_rows, cols, qs, d, extra, out[T, rows], order, straight) -> None
    dequantize: Callable  # (W, cols, row_ids, out[n, cols]) -> None
    # up to this many tokens per row (per group) the matmul takes each token's sums straight from
    # the row bytes; more tokens share a row decoded once (kernels with one route ignore it)
    straight_tokens: int = 0


# straight_tokens: the largest token count up to which the straight route was at least 5 % faster
# than the decoded one in both of two runs of tools/bench_routes.py (expert matrices, 768 x 2048
# and 2048 x 768, from memory, on 2 threads of a Xeon VM; docs/kernels.md); where they are closer
# the decoded route is kept.


def _straight(tiled: int, rows: int) -> int:
    """straight_tokens of a type whose decoded route takes 16-row tiles where vpdpbusd runs
    (simd.TILES), `rows` where it decodes row by row."""
    return tiled if TILES else rows


KERNELS: dict[int, Kernel] = {
    int(T.F32): Kernel(int(T.F32), _float.matmul_f32, _float.dequantize_f32),
    int(T.F16): Kernel(int(T.F16), _float.matmul_f16, _float.dequantize_f16, 4),
    int(T.BF16): Kernel(int(T.BF16), _float.matmul_bf16, _float.dequantize_bf16),
    int(T.Q4_0): Kernel(int(T.Q8_0), legacy.matmul_q4_0, legacy.dequantize_q4_0),
    int(T.Q4_1): Kernel(int(T.Q8_1), legacy.matmul_q4_1, legacy.dequantize_q4_1),
    int(T.Q5_0): Kernel(int(T.Q8_0), legacy.matmul_q5_0, legacy.dequantize_q5_0),
    int(T.Q5_1): Kernel(int(T.Q8_1), legacy.matmul_q5_1, legacy.dequantize_q5_1),
    int(T.Q8_0): Kernel(int(T.Q8_0), legacy.matmul_q8_0, legacy.dequantize_q8_0),
    int(T.Q2_K): Kernel(int(T.Q8_K), kquants.matmul_q2_k, kquants.dequantize_q2_k, 24),
    int(T.Q3_K): Kernel(int(T.Q8_K), kquants.matmul_q3_k, kquants.dequantize_q3_k, 2),
    int(T.Q4_K): Kernel(int(T.Q8_K), kquants.matmul_q4_k, kquants.dequantize_q4_k, _straight(3, 48)),
    int(T.Q5_K): Kernel(int(T.Q8_K), kquants.matmul_q5_k, kquants.dequantize_q5_k, _straight(2, 2)),
    int(T.Q6_K): Kernel(int(T.Q8_K), kquants.matmul_q6_k, kquants.dequantize_q6_k, _straight(3, 2)),
    int(T.IQ4_NL): Kernel(int(T.Q8_0), iquants.matmul_iq4_nl, iquants.dequantize_iq4_nl),
    int(T.IQ4_XS): Kernel(int(T.Q8_K), iquants.matmul_iq4_xs, iquants.dequantize_iq4_xs, _straight(12, 32)),
    int(T.MXFP4): Kernel(int(T.Q8_0), mxfp4.matmul_mxfp4, mxfp4.dequantize_mxfp4),
    int(T.IQ2_XXS): Kernel(int(T.Q8_K), iquants.matmul_iq2_xxs, iquants.dequantize_iq2_xxs, _straight(10, 12)),
    int(T.IQ2_XS): Kernel(int(T.Q8_K), iquants.matmul_iq2_xs, iquants.dequantize_iq2_xs, _straight(8, 8)),
    int(T.IQ2_S): Kernel(int(T.Q8_K), iquants.matmul_iq2_s, iquants.dequantize_iq2_s, _straight(6, 8)),
    int(T.IQ3_XXS): Kernel(int(T.Q8_K), iquants.matmul_iq3_xxs, iquants.dequantize_iq3_xxs, _straight(8, 8)),
    int(T.IQ3_S): Kernel(int(T.Q8_K), iquants.matmul_iq3_s, iquants.dequantize_iq3_s, _straight(8, 4)),
    int(T.IQ1_S): Kernel(int(T.Q8_K), iquants.matmul_iq1_s, iquants.dequantize_iq1_s, 12),
    int(T.IQ1_M): Kernel(int(T.Q8_K), iquants.matmul_iq1_m, iquants.dequantize_iq1_m, 48),
}


def require_kernel(ggml_type: int, tensor: str) -> None:
    """A SwapmoeError naming `tensor` (its file and name) when no kernel here computes its type:
    loading stops there, not at the tensor's first product."""
    if int(ggml_type) not in KERNELS:  # open_gguf knows every type number: T() names it
        supported = ", ".join(T(t).name for t in KERNELS)
        raise SwapmoeError(
            f"{tensor}: ggml type {T(int(ggml_type)).name} has no kernel in swapmoe (supported: {supported})"
        )


def _kernel(ggml_type: int) -> Kernel:
    try:
        return KERNELS[int(ggml_type)]
    except KeyError:
        raise NotImplementedError(f"no kernel for ggml type {T(int(ggml_type)).name}") from None


def _readonly(W: np.ndarray) -> np.ndarray:
    """A read-only view of W (no copy): numba compiles one specialization for
    writable and one for read-only arrays (e.g. np.memmap mode "r"); always
    passing read-only halves the compile time."""
    if not W.flags.writeable:
        return W
    view = W.view()
    view.flags.writeable = False
    return view


@functools.lru_cache(maxsize=4096)
def _matrix_bytes(ggml_type: int, rows: int, cols: int) -> int:
    """Bytes of a rows x cols matrix of ggml_type (cached: the decode loop asks for the same few)."""
    block_size, type_size = GGML_QUANT_SIZES[T(int(ggml_type))]
    if cols % block_size:
        raise ValueError(f"cols={cols} is not a multiple of the {T(int(ggml_type)).name} block size {block_size}")
    return rows * (cols // block_size) * type_size


def _check_weights(ggml_type: int, W: np.ndarray, rows: int, cols: int) -> None:
    if W.dtype != np.uint8 or W.ndim != 1:
        raise TypeError("W must be a 1-D uint8 array of the tensor's bytes")
    need = _matrix_bytes(ggml_type, rows, cols)
    if W.size < need:
        raise ValueError(f"W holds {W.size} bytes, {rows} rows of {cols} need {need}")


@functools.lru_cache(maxsize=4096)
def _back_to_back(groups: int, group_bytes: int) -> np.ndarray:
    """starts of `groups` matrices of group_bytes each, one after the other from byte 0."""
    starts = np.arange(groups, dtype=np.int64) * group_bytes
    starts.flags.writeable = False
    return starts


_FLOAT_SIZES = {int(T.F32): 4, int(T.F16): 2, int(T.BF16): 2}  # the float kernels view W as their elements


@numba.njit(cache=True)
def _inside(starts, need, size, step):
    """Whether every matrix of `need` bytes at starts[g] lies inside `size` bytes, at a multiple
    of `step` (a loop: numpy's min and max took 2.7 us a call)."""
    for s in starts:
        if s < 0 or s + need > size or s % step:
            return False
    return True


def quantize_activation(ggml_type: int, X: np.ndarray) -> QuantizedActivation:
    """Convert activations [cols] or [T, cols] to ggml_type's vec_dot_type."""
    X = np.ascontiguousarray(X, dtype=np.float32)
    return QUANTIZERS[_kernel(ggml_type).vec_dot_type](X.reshape(-1, X.shape[-1]))


# ggml types llama.cpp's tiled matmul takes for batches of >= 8 tokens (ggml-cpu/tiled/tiled.cpp)
_TILED = frozenset(
    int(t)
    for t in (
        T.Q2_K,
        T.Q3_K,
        T.Q4_K,
        T.Q5_K,
        T.Q6_K,
        T.IQ4_XS,
        T.IQ2_XXS,
        T.IQ2_XS,
        T.IQ2_S,
        T.IQ3_XXS,
        T.IQ3_S,
        T.IQ1_S,
        T.IQ1_M,
    )
)


@functools.lru_cache(maxsize=4096)
def ggml_order(ggml_type: int, rows: int, cols: int, n_tok: int, grouped: bool, stacked: bool) -> int:
    """Which of llama.cpp's x86 matmul routes (reference build: AVX-512 VNNI) computes this product,
    as the kernels' `order` argument: the route fixes how block sums are rounded and added.

    - Q4_K and (AVX-512) Q2_K with rows % 8 == 0 are repacked at load (2-D tensors and stacked
      experts, not 3-D per-head groups): gemm for tokens in fours, gemv for fewer than four
      tokens (all of them) and for experts;
    - other K/IQ types: the tiled kernel when >= 8 tokens meet the matrix (per expert for MoE),
      else vec_dot;
    - Q4_0, IQ4_NL and MXFP4 with rows % 8 == 0 are repacked too: one FMA per block;
    - the other legacy types: vec_dot or tinyBLAS, which round alike (eight FMA lanes);
    - F32 and BF16: tinyBLAS for >= 2 tokens when it takes the shape (rows % 4 == 0, cols a
      multiple of its step: 16 floats, 32 bf16), else vec_dot (always for stacked experts:
      MUL_MAT_ID does not use tinyBLAS).
    """
    ggml_type = int(ggml_type)
    if ggml_type in (T.Q4_K, T.Q2_K) and rows % 8 == 0 and not grouped:
        return ORDER_GEMV if stacked or n_tok < 4 else ORDER_GEMM
    if ggml_type in (T.Q4_0, T.IQ4_NL, T.MXFP4) and rows % 8 == 0 and not grouped:
        return ORDER_GEMV  # repacked; its gemm rounds as its gemv: one FMA per 32-value block
    if ggml_type in _TILED and n_tok >= 8:
        return ORDER_TILED
    if ggml_type in (T.Q8_0, T.Q5_0, T.Q4_1, T.Q5_1, T.Q4_0):
        return ORDER_LANES
    if ggml_type == T.F32 and cols % LANES == 0 and rows % 4 == 0 and n_tok >= 2 and not stacked:
        return ORDER_LANES
    if ggml_type == T.BF16 and cols % (2 * LANES) == 0 and rows % 4 == 0 and n_tok >= 2 and not stacked:
        return ORDER_LANES
    return ORDER_DOT


_separate_tokens = False  # set by separate_tokens()


@contextlib.contextmanager
def separate_tokens():
    """Inside, each row of a product is one token of its own sequence: the route is chosen as for
    a one-token product (ggml_order's n_tok = 1), so sequences decoding together in one product
    (together.forward_together) each get the bits they get alone."""
    global _separate_tokens
    before, _separate_tokens = _separate_tokens, True
    try:
        yield
    finally:
        _separate_tokens = before


def matmul_q(
    ggml_type: int,
    W: np.ndarray,
    rows: int,
    cols: int,
    qx: QuantizedActivation,
    group_rows: int | None = None,
    stacked: bool = False,
    straight: bool | None = None,
    starts: np.ndarray | None = None,
) -> np.ndarray:
    """Y[T, rows] = X @ W.T with X already passed through quantize_activation.

    group_rows: W's rows form groups of this many, each with its own activations (e.g. MLA's
    per-head matrices stacked in one tensor): qx then holds T rows per group, group-major, and
    Y[:, g*group_rows:(g+1)*group_rows] = X_g @ W_g.T; one kernel call for all groups.
    starts: byte offset in W of each group's first row (int64 [groups]; default: the groups back
    to back from byte 0), for matrices that lie apart in one buffer.
    stacked: W (each group, if grouped) is one expert of a stacked expert tensor (llama.cpp's
    MUL_MAT_ID), which changes the rounding route llama.cpp takes (see ggml_order).
    straight: force the kernel's route (True: every token's sums from the row bytes; False: the
    row decoded once for all tokens) instead of KERNELS' choice by token count (straight_tokens).
    Both give the same bits; tests and tools/bench_routes.py compare them."""
    ggml_type = int(ggml_type)  # the cached helpers below hash a plain int faster than an enum member
    kernel = _kernel(ggml_type)
    group_rows = group_rows or rows
    groups = rows // group_rows if rows else 1
    if group_rows * groups != rows or qx.qs.shape[0] % groups:
        raise ValueError(f"{rows} rows in groups of {group_rows} do not match {qx.qs.shape[0]} activation rows")
    if starts is None:
        _check_weights(ggml_type, W, rows, cols)
        starts = _back_to_back(groups, _matrix_bytes(ggml_type, group_rows, cols))
    else:
        _check_weights(ggml_type, W, 0, cols)
        need = _matrix_bytes(ggml_type, group_rows, cols)
        if starts.dtype != np.int64 or starts.shape != (groups,) or not _inside(starts, need, W.size, 1):
            raise ValueError(f"starts must be {groups} int64 offsets of {need}-byte matrices inside W's {W.size} bytes")
        if ggml_type in _FLOAT_SIZES and not _inside(starts, need, W.size, _FLOAT_SIZES[ggml_type]):
            raise ValueError(f"starts of {T(ggml_type).name} matrices must be multiples of its element size")
    if qx.vec_dot_type != kernel.vec_dot_type or qx.qs.shape[1] != cols:
        raise ValueError("activation was quantized for another vec_dot_type or length")
    out = np.empty((qx.qs.shape[0] // groups, rows), np.float32)
    if rows:
        n_tok = 1 if _separate_tokens else len(out)
        order = ggml_order(ggml_type, group_rows, cols, n_tok, groups > 1 and not stacked, stacked)
        if straight is None:
            straight = len(out) <= kernel.straight_tokens
        kernel.matmul(
            _readonly(W), _readonly(starts), rows, group_rows, cols, qx.qs, qx.d, qx.extra, out, order, straight
        )
    return out


def matvec_q(ggml_type: int, W: np.ndarray, rows: int, cols: int, qx: QuantizedActivation) -> np.ndarray:
    """y[rows] = W @ x for a single quantized activation row."""
    return matmul_q(ggml_type, W, rows, cols, qx)[0]


def matvec(ggml_type: int, W: np.ndarray, rows: int, cols: int, x: np.ndarray) -> np.ndarray:
    return matvec_q(ggml_type, W, rows, cols, quantize_activation(ggml_type, x))


def matmul(ggml_type: int, W: np.ndarray, rows: int, cols: int, X: np.ndarray) -> np.ndarray:
    return matmul_q(ggml_type, W, rows, cols, quantize_activation(ggml_type, X))


def dequantize_rows(ggml_type: int, W: np.ndarray, rows: int, cols: int, row_ids=None) -> np.ndarray:
    """float32 [len(row_ids), cols] of the selected rows (all rows if None)."""
    kernel = _kernel(ggml_type)
    _check_weights(ggml_type, W, rows, cols)
    ids = np.arange(rows, dtype=np.int64) if row_ids is None else np.asarray(row_ids, dtype=np.int64).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= rows):
        raise IndexError("row id out of range")
    out = np.empty((ids.size, cols), np.float32)
    kernel.dequantize(_readonly(W), cols, ids, out)
    return out


__all__ = [
    "KERNELS",
    "require_kernel",
    "Kernel",
    "QuantizedActivation",
    "quantize_activation",
    "ggml_order",
    "separate_tokens",
    "ORDER_DOT",
    "ORDER_GEMM",
    "ORDER_GEMV",
    "ORDER_LANES",
    "ORDER_TILED",
    "matvec",
    "matmul",
    "matvec_q",
    "matmul_q",
    "dequantize_rows",
]
