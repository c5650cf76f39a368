"""Shared numba helpers for the quantized kernels.

Every kernel decodes a weight row into a scratch array (int8 values, or int16
values times their integer sub-block scale) and then takes exact integer dot
products with the quantized activation.  What makes that fast in numba:

* Those short fixed-length loops only become SIMD code through LLVM's SLP
  vectorizer, which numba leaves off by default; kernels/__init__.py turns it on
  for the process before any kernel is compiled (it only changes how code is
  vectorized, never what it computes).
* No array slices or views inside block loops (each one costs atomic refcount
  calls), and helpers are inlined at numba level (inline="always") so LLVM
  sees non-negative loop-derived offsets and drops the negative-index checks.
  Kernels therefore index a per-row slice with explicit block offsets.
* Activations are indexed through a 1-D row view per token (2-D indexing
  defeats vectorization), so the kernels decode a whole weight row first
  (int8 values, or int16 values times their integer sub-block scale for the
  256-value types) and then run one tight dot loop per token over it.  The row
  is decoded once for all tokens; its bytes are read from memory once.
* Decoders move eight values per uint64 (SWAR nibble arithmetic, packed table
  entries, widen8): a loop of byte loads from one array and stores to another
  stays scalar, as LLVM cannot rule out that the two arrays overlap.
"""

from __future__ import annotations

import os

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from ._constants import ORDER_GEMV, ORDER_TILED, QK8_0, QK_K
from .simd import (
    PREFETCH_AHEAD,
    REORDERED,
    f16_to_f32,
    nibble_table_dot,
    prefetch_bytes,
    reorder_group_major,
    reorder_iq2_xxs,
    reorder_iq2_xxs_pair,
    reorder_iq3,
    store_bytes,
)

# Idle OpenMP workers spin briefly (about 10k polls) before they sleep.  Decode makes hundreds of
# short kernel calls per token: waking sleeping workers (OMP_WAIT_POLICY=passive) cost ~30 us per
# call and made decode 39% slower on an idle machine (17.3 against 28.2 tok/s, 4 GB qwen3moe,
# 2 threads).  On a core shared with other busy processes spinning backfires (4.5 against 15.0
# tok/s with one competing busy loop on 2 cores): there, set OMP_WAIT_POLICY=passive or use
# fewer threads.  Both variables are left alone when the user has set either.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")

# Options for the row-parallel kernels: release the GIL, cache the machine code.
PARALLEL = dict(parallel=True, nogil=True, cache=True)
SERIAL = dict(nogil=True, cache=True)
# small helpers called from the kernels
INLINE = dict(nogil=True, cache=True, inline="always")
# rows per parallel task: amortises the per-task scratch allocations
ROWS_PER_TASK = 8


@njit(**INLINE)
def row_start(starts, r, group_rows, rb):
    """Where row r of a matmul's weights begins in W: its group's first row at byte starts[g], the
    group's rows of rb bytes back to back (groups need not be; kernels.matmul_q)."""
    g = r // group_rows
    return starts[g] + (r - g * group_rows) * rb


@njit(**INLINE)
def chunk_count(rows, group_rows, size):
    """How many chunks of `size` rows a matmul's rows split into when no chunk spans two groups
    (each group's last chunk partial): the parallel tasks of the row kernels (ROWS_PER_TASK),
    the 16-row tiles of the tiled ones (simd.TILES)."""
    return rows // group_rows * ((group_rows + size - 1) // size)


@njit(**INLINE)
def chunk_rows(chunk, group_rows, size):
    """(first row, row count, group) of chunk number `chunk` (chunk_count's numbering). The rows
    of a chunk share their group's activations: a kernel makes each token's activation views once
    per chunk (a view made per row cost as much as a one-block row's dot)."""
    per_group = (group_rows + size - 1) // size
    g, j = chunk // per_group, chunk % per_group
    return g * group_rows + j * size, min(size, group_rows - j * size), g


# ggml_e8m0_to_fp32_half: 0.5 * 2^(e - 127) for each exponent byte
E8M0_HALF = np.array([2.0 ** (e - 128) for e in range(256)], np.float32)


@njit(**INLINE)
def u32(blk, o):
    """Four little-endian bytes blk[o:o+4] as one uint32."""
    return (
        np.uint32(blk[o]) | (np.uint32(blk[o + 1]) << 8) | (np.uint32(blk[o + 2]) << 16) | (np.uint32(blk[o + 3]) << 24)
    )


@njit(**INLINE)
def u64(blk, o):
    """Eight little-endian bytes blk[o:o+8] as one uint64 (LLVM merges this into a single load)."""
    w = np.uint64(0)
    for i in range(8):
        w |= np.uint64(blk[o + i]) << np.uint64(8 * i)
    return w


def widen8(w, scale, ws, o):
    """ws[o:o+8] = the eight int8 values packed in uint64 w, times scale, as int16.
    A decoded table entry goes straight to the int16 row this way (a shift per
    value, vectorized by LLVM) instead of a byte store and a reload.  Into an int8
    array (the unscaled values of a tile, scale 1): w as it is, one store."""
    raise TypeError("widen8 runs inside numba-compiled code only")


def widen4(w, scale, ws, o):
    """As widen8 for the four int8 values packed in uint32 w."""
    raise TypeError("widen4 runs inside numba-compiled code only")


def _widen_overload(count):
    """widen8 (count 8) / widen4's implementation for numba, chosen by the output's type."""
    word = np.uint64 if count == 8 else np.uint32

    def implementation(w, scale, ws, o):
        if ws.dtype == types.int8:  # a tile's unscaled values (scale 1): the entry as it is

            def store(w, scale, ws, o):
                store_bytes(ws, o, w)

            return store

        def widen(w, scale, ws, o):
            s = np.int16(scale)
            for j in range(count):
                ws[o + j] = np.int16(np.int8(w >> word(8 * j))) * s

        return widen

    return implementation


overload(widen8, inline="always")(_widen_overload(8))
overload(widen4, inline="always")(_widen_overload(4))


def nibble_pair_words(values: np.ndarray) -> np.ndarray:
    """For a 16-entry int8 value table (IQ4_NL, MXFP4): byte -> uint64 whose two low bytes are
    (value of its low nibble, value of its high nibble)."""
    v = values.view(np.uint8).astype(np.uint64)
    return v[np.arange(256) & 15] | (v[np.arange(256) >> 4] << np.uint64(8))


@njit(**INLINE)
def decode_pairs(pairs, blk, p):
    """The eight values of the four bytes blk[p:p+4] through a nibble_pair_words table, packed in
    one uint64 in *pair order*: byte 0's low value, its high value, byte 1's low value, ...
    Four table loads and one store per eight weights, where ggml's order (the 16 low values of a
    block, then the 16 high ones) costs a load and a store per weight."""
    return (
        pairs[blk[p]]
        | (pairs[blk[p + 1]] << np.uint64(16))
        | (pairs[blk[p + 2]] << np.uint64(32))
        | (pairs[blk[p + 3]] << np.uint64(48))
    )


@njit(**INLINE)
def pair_order(qs):
    """Quantized activations [T, n] with every 32-value block put in pair order (x0, x16, x1, x17,
    ...), to dot with weights decoded by decode_pairs: the same products, so the same exact int32
    sums."""
    xp = np.empty_like(qs)
    for t in range(qs.shape[0]):
        for b in range(qs.shape[1] // 32):
            for j in range(16):
                xp[t, b * 32 + 2 * j] = qs[t, b * 32 + j]
                xp[t, b * 32 + 2 * j + 1] = qs[t, b * 32 + 16 + j]
    return xp


@intrinsic
def _fma_f32(typingctx, a, b, c):
    """LLVM's fused multiply-add on three float32 values: one vfmadd instruction on CPUs with FMA
    (a library call elsewhere), rounded once, as ggml's FMA instructions round."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        fma = builder.module.declare_intrinsic("llvm.fma", [f32], ir.FunctionType(f32, [f32, f32, f32]))
        return builder.call(fma, args)

    return sig, codegen


@njit(**INLINE)
def fma32(a, b, c):
    """float32 a*b + c rounded once."""
    return _fma_f32(np.float32(a), np.float32(b), np.float32(c))


@njit(**INLINE)
def block_sum(order, acc, isum, summ, dw, dmin, dx):
    """acc plus one super-block's share of a dot product: integer sums isum (scaled quants x
    activation) and summ (mins x activation block sums; 0 for types without mins), weight scales
    dw/dmin, activation scale dx, rounded as the route `order` (ORDER_DOT or ORDER_TILED) rounds
    it (the tiled kernel's multiply-add into its accumulator is contracted to an FMA by GCC)."""
    if order == ORDER_TILED:
        return fma32(fma32(-dmin, summ, np.float32(isum * dw)), dx, acc)
    return acc + ((dw * dx) * isum - (dmin * dx) * summ)


@njit(**INLINE)
def block_step(order, acc, isum, dw, dx):
    """block_sum for a type without mins (summ = dmin = 0): the same float32 result, the zero
    terms left out (acc starts at +0.0, so it is never -0.0 and dropping a signed zero changes
    nothing)."""
    if order == ORDER_TILED:
        return fma32(np.float32(isum * dw), dx, acc)
    return acc + (dw * dx) * isum


@njit(**INLINE)
def block_fma(order, acc, sumi, dw, dx):
    """acc plus a 32-value block's share (int32 sum sumi, scales dw, dx) for Q4_0-like types
    (IQ4_NL, MXFP4): one FMA per block where llama.cpp repacks them (ORDER_GEMV), vec_dot's
    (dx * dw) * sumi added in float otherwise."""
    if order == ORDER_GEMV:
        return fma32(sumi, dw * dx, acc)
    return acc + (dx * dw) * sumi


def nibble_row_dot(block_bytes: int, table: np.ndarray, fp16_scale: bool):
    """A row . token for a 32-value block type whose values are table[nibble] (IQ4_NL: fp16 scale,
    MXFP4: e8m0 exponent byte, then 16 nibble bytes) against Q8_0 activations: each block's exact
    sum by simd.nibble_table_dot, the float step block_fma.  (An inline helper: a top-level kernel
    made by a factory would not stay in numba's cache across processes.)"""
    quants_at = 2 if fp16_scale else 1

    @njit(**INLINE)
    def row_dot(row, x, dx, nb, order):
        acc = np.float32(0.0)
        for b in range(nb):
            o = b * block_bytes
            prefetch_bytes(row, o + PREFETCH_AHEAD, block_bytes)
            sumi = np.float32(nibble_table_dot(row, o + quants_at, x, b * QK8_0, table))
            dw = f16_to_f32(row[o], row[o + 1]) if fp16_scale else E8M0_HALF[row[o]]
            acc = block_fma(order, acc, sumi, dw, dx[b])
        return acc

    return row_dot


def _reordered_blocks(reorder, pair_reorder=None):
    """qs in the order `reorder` gives each 256-value block (where simd.REORDERED; else as is), or
    with `pair_reorder` each pair of blocks in its order and an odd last block in reorder's."""

    @njit(**INLINE)
    def reordered(qs):
        if not REORDERED:
            return qs
        out = np.empty_like(qs)
        paired = 0
        for t in range(qs.shape[0]):
            if pair_reorder is not None:
                paired = qs.shape[1] - qs.shape[1] % (2 * QK_K)
                for o in range(0, paired, 2 * QK_K):
                    pair_reorder(qs[t], o, out[t], o)
            for o in range(paired, qs.shape[1], QK_K):
                reorder(qs[t], o, out[t], o)
        return out

    return reordered


# qs (int8 activations [T, cols]) in the order this CPU's IQ grid intrinsics read them: as is, or
# where they are the VBMI ones (simd.REORDERED) each 256-value block in simd.GROUP_MAJOR_ORDER
# (IQ3_XXS, IQ3_S: simd.IQ3_ORDER; IQ2_XXS, whose row dot takes blocks in pairs: each pair in
# simd.IQ2_XXS_PAIR_ORDER, an odd last block in simd.IQ2_XXS_ORDER)
grid_activations = _reordered_blocks(reorder_group_major)
iq3_activations = _reordered_blocks(reorder_iq3)
iq2_xxs_activations = _reordered_blocks(reorder_iq2_xxs, reorder_iq2_xxs_pair)


@njit(**INLINE)
def hsum16(acc):
    """_mm512_reduce_add_ps of acc[0:16] (float32 values): halves, quarters, then pairs (GCC's
    order); folds acc in place."""
    for j in range(8):
        acc[j] = np.float32(np.float32(acc[j]) + np.float32(acc[j + 8]))
    for j in range(4):
        acc[j] = np.float32(np.float32(acc[j]) + np.float32(acc[j + 4]))
    return np.float32(
        np.float32(np.float32(acc[0]) + np.float32(acc[2])) + np.float32(np.float32(acc[1]) + np.float32(acc[3]))
    )
