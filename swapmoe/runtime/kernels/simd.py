"""Whole-vector building blocks for the hottest dot products, as numba intrinsics.

LLVM's auto-vectorizer turns the kernels' scalar byte loops into SIMD code only in simple
contexts; inside a row kernel it often gives up (a Q4_K dot written as plain loops ran at 2 GB/s
where these run at 20).  The intrinsics here hand LLVM vector IR directly: load 32 bytes as
<32 x i8>, split nibbles, multiply-add, reduce.  Every result is an exact int32 sum, the same
integer the scalar loops compute, so rounding downstream is untouched.

Code generators per target, picked when numba compiles (the CPU it compiles for):
* x86 with AVX-512BW: pmaddubsw (u8 x s8 -> pairs summed in int16) and pmaddwd (int16 pairs x
  scale -> int32) on 64-byte vectors, llama.cpp's instruction pair for these blocks;
* x86 with AVX2: the same on 32-byte vectors;
* elsewhere: portable vector IR (zext/sext, mul, vector.reduce.add) that LLVM lowers for any
  target;
* x86 with AVX-512 VBMI, BITALG and GFNI (Ice Lake, Zen 4 and later), for the IQ grid types
  only: the grid decoded in registers by byte and word permutes, or gathered (see "AVX-512 VBMI"
  below).
The legacy row dots (Q4_0 .. Q8_0) have a generic and an AVX2 generator.
pmaddubsw saturates its int16 pair sums; no use here reaches that: the unsigned operand is at
most 127 with the activation in -127..127 (signs moved onto it, see _signed_grid_isum), or at
most 63 with any int8 activation (2 * 63 * 128 = 16128 < 32767).
"""

from __future__ import annotations

import functools
import platform

import numba
import numpy as np
from gguf import quants as gq
from llvmlite import binding as llvm_binding, ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from ._constants import (
    IQ2_XXS_BYTES,
    IQ4_NL_BYTES,
    MXFP4_BYTES,
    ORDER_GEMM,
    ORDER_GEMV,
    ORDER_TILED,
    Q4_0_BYTES,
    Q4_1_BYTES,
    Q5_0_BYTES,
    Q5_1_BYTES,
    Q8_0_BYTES,
)

I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)


def _target_features() -> set[str]:
    """Features of the CPU numba compiles for (NUMBA_CPU_FEATURES when set, else the host's)."""
    if numba.config.CPU_FEATURES:
        return {f[1:] for f in numba.config.CPU_FEATURES.split(",") if f.startswith("+")}
    if numba.config.CPU_NAME and numba.config.CPU_NAME != "host":
        return set()  # a named generic target: assume nothing
    return {name for name, on in llvm_binding.get_host_cpu_features().items() if on}


_FEATURES = _target_features()
GENERIC, AVX2, AVX512, VBMI = "generic", "avx2", "avx512", "avx512vbmi"
TARGETS = (GENERIC, AVX2, AVX512, VBMI)  # a CPU that runs one runs those before it
# the IQ grid types' VBMI generators with the grid entries gathered from memory instead of permuted
# out of registers (same instructions otherwise): a variant of VBMI, not a further target
VBMI_GATHER = "avx512vbmi-gather"
TARGET = (
    VBMI
    if {"avx512f", "avx512bw", "avx512vbmi", "avx512bitalg", "gfni"} <= _FEATURES  # Ice Lake, Zen 4 on
    else AVX512
    if {"avx512f", "avx512bw"} <= _FEATURES
    else AVX2
    if "avx2" in _FEATURES
    else GENERIC
)
# half -> float in one instruction: F16C on x86, base ARMv8 (elsewhere LLVM would call a runtime helper)
HW_HALF = "f16c" in _FEATURES or platform.machine().lower() in ("aarch64", "arm64")


def _gathers_beat_permutes() -> bool:
    """Whether IQ2_XS's and IQ2_S's grid entries should be gathered (vpgatherqq) rather than
    permuted out of registers (IQ2_XXS and the IQ3 types: always in registers, their own way): on
    Intel, which runs 512-bit permutes on one port (a Sapphire Rapids class VM: 1.2-1.7x faster
    per block gathered; docs/kernels.md), unless the microcode mitigation of Gather Data
    Sampling (Skylake .. Ice Lake, Tiger Lake) has slowed gathers several-fold.
    AMD keeps the permutes, measured on Zen 5 (against the scalar-load generator; vector gathers
    of these grids are untimed there)."""
    try:
        with open("/proc/cpuinfo") as f:
            intel = any(line.startswith("vendor_id") and "GenuineIntel" in line for line in f)
    except OSError:  # not Linux: keep the permutes
        return False
    try:
        with open("/sys/devices/system/cpu/vulnerabilities/gather_data_sampling") as f:
            gathers_slowed = f.read().startswith("Mitigation")
    except OSError:
        gathers_slowed = False
    return intel and not gathers_slowed


GATHER_GRIDS = TARGET == VBMI and _gathers_beat_permutes()


def _for_this_cpu(generators: dict):
    """Of one intrinsic's generators (keyed by target), the most capable one this CPU runs (for
    the IQ grid types on CPUs with fast gathers: their gathering variant)."""
    if GATHER_GRIDS and VBMI_GATHER in generators:
        return generators[VBMI_GATHER]
    return next(generators[t] for t in reversed(TARGETS[: TARGETS.index(TARGET) + 1]) if t in generators)


def _vec(t, n):
    return ir.VectorType(t, n)


def _splat(t, n, value):
    return ir.Constant(_vec(t, n), [value] * n)


def _load_bytes(context, builder, aryty, ary, offset, n):
    """<n x i8> from ary[offset:offset+n] (a uint8/int8 array; no bounds check: callers index
    inside their row)."""
    data = context.make_array(aryty)(context, builder, value=ary).data
    ptr = builder.bitcast(builder.gep(data, [offset]), _vec(I8, n).as_pointer())
    return builder.load(ptr, align=1)


def _call(builder, name, ret, *args):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, list(args))


def _reduce_add(builder, v):
    return _call(builder, f"llvm.vector.reduce.add.v{v.type.count}i32", I32, v)


def _add_offset(builder, offset, k):
    return builder.add(offset, ir.Constant(offset.type, k))


def _field(builder, v, shift, mask):
    """(v >> shift) & mask for an integer value v."""
    return builder.and_(builder.lshr(v, ir.Constant(v.type, shift)), ir.Constant(v.type, mask))


def _shuffle(builder, a, b, lanes):
    """Lanes of a (then b, from a.type.count on) listed in `lanes`, as a new vector."""
    return builder.shuffle_vector(a, b, ir.Constant(_vec(I32, len(lanes)), list(lanes)))


def _pick(builder, v, lanes):
    """The lanes of v listed in `lanes`, as a new vector (a constant shuffle)."""
    return _shuffle(builder, v, v, lanes)


# ---- software prefetch ---------------------------------------------------------------------------

# How far ahead of the block being summed the straight row dots ask for weight bytes.  A row dot
# spends more time per byte than a plain read, and on some CPUs the hardware prefetcher then does
# not run far enough ahead: Q4_K from DRAM read 5.3 GB/s on one core of an Intel Xeon VM against
# 14.7 in cache and 15.5 for a plain read; on two threads 10.2 GB/s, with every block prefetched
# 2048 bytes ahead 25.7 (512-4096 measured; docs/kernels.md).
PREFETCH_AHEAD = 2048


def _prefetch(builder, ptr, offset):
    """Prefetch the line holding ptr[offset] into every cache level, for reading (a hint: never
    faults, past the end of the array included)."""
    _call(
        builder,
        "llvm.prefetch.p0",
        ir.VoidType(),
        builder.gep(ptr, [offset]),
        ir.Constant(I32, 0),
        ir.Constant(I32, 3),
        ir.Constant(I32, 1),
    )


@intrinsic
def prefetch_bytes(typingctx, w, start, n):
    """Ask the caches for w[start:start+n], one prefetch per 64 bytes (w: a uint8 array)."""
    if w.dtype != types.uint8 or not isinstance(start, types.Integer) or not isinstance(n, types.Integer):
        return None
    sig = types.none(w, start, n)

    def codegen(context, builder, signature, args):
        (w_ptr,) = _data(context, builder, signature, args, 0)
        start = builder.sext(args[1], ir.IntType(64)) if args[1].type.width < 64 else args[1]
        n = builder.sext(args[2], ir.IntType(64)) if args[2].type.width < 64 else args[2]
        lines = builder.udiv(builder.add(n, ir.Constant(n.type, 63)), ir.Constant(n.type, 64))
        with cgutils.for_range(builder, lines) as loop:
            _prefetch(builder, w_ptr, builder.add(start, builder.mul(loop.index, ir.Constant(n.type, 64))))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def store_bytes(typingctx, out, o, word):
    """out[o:o+n] = the n little-endian bytes of the unsigned integer word (n = its size; out: an
    int8/uint8 array, no bounds check)."""
    if out.dtype not in (types.int8, types.uint8) or not isinstance(word, types.Integer):
        return None
    sig = types.none(out, o, word)

    def codegen(context, builder, signature, args):
        (out_ptr,) = _data(context, builder, signature, args, 0)
        at = builder.bitcast(builder.gep(out_ptr, [args[1]]), args[2].type.as_pointer())
        builder.store(args[2], at, align=1)
        return context.get_dummy_value()

    return sig, codegen


def _block_sums(context, builder, aryty, ary, offset):
    """The 16 Q8_K block sums ary[offset:offset+16] (int32) as <16 x i32>."""
    data = context.make_array(aryty)(context, builder, value=ary).data
    return builder.load(builder.bitcast(builder.gep(data, [offset]), _vec(I32, 16).as_pointer()), align=4)


def _weighted_block_sums(builder, sums, weights, target):
    """sum_j weights[j] * sums[j] for <16 x i16> weights: x86 in one pmaddwd (Q8_K block sums fit
    int16: |sum| <= 16 * 127)."""
    if target == GENERIC:
        return _reduce_add(builder, builder.mul(sums, builder.sext(weights, _vec(I32, 16))))
    return _reduce_add(builder, _weighted_pairs(builder, sums, weights))


def _weighted_pairs(builder, sums, weights):
    """<8 x i32>: weights[2k] * sums[2k] + weights[2k+1] * sums[2k+1] (one pmaddwd, x86)."""
    return _call(builder, "llvm.x86.avx2.pmadd.wd", _vec(I32, 8), weights, builder.trunc(sums, _vec(I16, 16)))


def _concat(builder, a, b):
    """a then b (two vectors of the same type) as one vector twice as long."""
    n = a.type.count
    return builder.shuffle_vector(a, b, ir.Constant(_vec(I32, 2 * n), list(range(2 * n))))


def _broadcast(builder, scalar, n):
    """<n x type> with every lane = scalar."""
    v = builder.insert_element(ir.Constant(_vec(scalar.type, n), None), scalar, ir.Constant(I32, 0))
    return _pick(builder, v, [0] * n)


def _madd(builder, u, x, scale16):
    """int32 lanes of sum(u[i] * x[i] * scale[i]) over pairs, for u <n x u8> (unsigned), x <n x s8>,
    scale16 <n/2 x i16> (pmaddubsw then pmaddwd; n = 32 or 64; see the module note on saturation)."""
    n = u.type.count
    name = "avx512.pmaddubs.w.512" if n == 64 else "avx2.pmadd.ub.sw"
    pairs = _call(builder, f"llvm.x86.{name}", _vec(I16, n // 2), u, x)
    name = "avx512.pmaddw.d.512" if n == 64 else "avx2.pmadd.wd"
    return _call(builder, f"llvm.x86.{name}", _vec(I32, n // 4), pairs, scale16)


def _nibble_blocks_isum(context, builder, signature, args, target):
    """sum over k < 4 of scale[2k] * (low nibbles of w[wo+32k:+32] . x[xo+64k:+32])
                       + scale[2k+1] * (high nibbles . x[xo+64k+32:+32]),
    for Q5_K (a sixth argument: the offset of its qh[32]) each value with a fifth bit: bit 2k
    (low nibbles) or 2k+1 (high) of qh[l]."""
    w, wo, x, xo, scales = args[:5]
    wt, xt = signature.args[0], signature.args[2]
    qh = _load_bytes(context, builder, wt, w, args[5], 32) if len(args) > 5 else None
    scale_bytes = builder.bitcast(scales, _vec(I8, 8))
    scale_words = builder.zext(scale_bytes, _vec(I16, 8))

    def values(q, n, h, groups):  # nibble h of q's bytes, plus the fifth bits of `groups` (64 values each)
        v = builder.and_(builder.lshr(q, _splat(I8, n, 4)) if h else q, _splat(I8, n, 15))
        if qh is None:
            return v
        bits = [builder.and_(builder.lshr(qh, _splat(I8, 32, 2 * g + h)), _splat(I8, 32, 1)) for g in groups]
        fifth = bits[0] if n == 32 else _concat(builder, bits[0], bits[1])
        return builder.or_(v, builder.shl(fifth, _splat(I8, n, 4)))

    total = None
    if target == AVX512:  # 64 quant bytes at a time: sub-blocks 4k+h and 4k+2+h side by side
        for k in range(2):
            q = _load_bytes(context, builder, wt, w, _add_offset(builder, wo, 64 * k), 64)
            for h in range(2):
                xa = _load_bytes(context, builder, xt, x, _add_offset(builder, xo, 128 * k + 32 * h), 32)
                xb = _load_bytes(context, builder, xt, x, _add_offset(builder, xo, 128 * k + 64 + 32 * h), 32)
                xv = _concat(builder, xa, xb)
                lanes = [4 * k + h] * 16 + [4 * k + 2 + h] * 16
                s16 = _pick(builder, scale_words, lanes)
                part = _madd(builder, values(q, 64, h, (2 * k, 2 * k + 1)), xv, s16)
                total = part if total is None else builder.add(total, part)
        return _reduce_add(builder, total)
    for k in range(4):
        q = _load_bytes(context, builder, wt, w, _add_offset(builder, wo, 32 * k), 32)
        for h in range(2):
            xv = _load_bytes(context, builder, xt, x, _add_offset(builder, xo, 64 * k + 32 * h), 32)
            if target == AVX2:  # int32 lanes, one reduction at the end
                s16 = _pick(builder, scale_words, [2 * k + h] * 16)
                part = _madd(builder, values(q, 32, h, (k,)), xv, s16)
            else:
                u = values(q, 32, h, (k,))
                products = builder.mul(builder.zext(u, _vec(I32, 32)), builder.sext(xv, _vec(I32, 32)))
                scale = builder.extract_element(scale_bytes, ir.Constant(I32, 2 * k + h))
                part = builder.mul(_reduce_add(builder, products), builder.zext(scale, I32))
            total = part if total is None else builder.add(total, part)
    return total if target == GENERIC else _reduce_add(builder, total)


def _q4_k_isum(target: str):
    @intrinsic
    def q4_k_isum(typingctx, w, wo, x, xo, scales):
        """Exact int32 sum of a Q4_K super-block's 256 quants times their sub-block scale times
        the int8 activation: quants are the nibbles of w[wo:wo+128] (32 bytes per 64 values, low
        nibbles first), activations x[xo:xo+256], scales the 8 bytes of the uint64 `scales`."""
        if w.dtype != types.uint8 or x.dtype != types.int8:
            return None
        sig = types.int32(w, wo, x, xo, scales)

        def codegen(context, builder, signature, args):
            return _nibble_blocks_isum(context, builder, signature, args, target)

        return sig, codegen

    return q4_k_isum


def _q5_k_isum(target: str):
    @intrinsic
    def q5_k_isum(typingctx, w, wo, x, xo, scales, qho):
        """As q4_k_isum for Q5_K: the fifth bits of the values in qh = w[qho:qho+32]."""
        if w.dtype != types.uint8 or x.dtype != types.int8:
            return None
        sig = types.int32(w, wo, x, xo, scales, qho)

        def codegen(context, builder, signature, args):
            return _nibble_blocks_isum(context, builder, signature, args, target)

        return sig, codegen

    return q5_k_isum


# every generator stays importable, so tests check each one this CPU can run against numpy
Q4_K_ISUM = {target: _q4_k_isum(target) for target in (GENERIC, AVX2, AVX512)}
q4_k_isum = _for_this_cpu(Q4_K_ISUM)
Q5_K_ISUM = {target: _q5_k_isum(target) for target in (GENERIC, AVX2, AVX512)}
q5_k_isum = _for_this_cpu(Q5_K_ISUM)


def _groups16_isum(context, builder, target, xt, x, xo, quants, scales):
    """sum over the 16 groups j of 16 values of scales[j] * (u . x)_j, for a 256-value block
    whose unsigned values u (< 64) for 128h + 32c .. +32 are quants[h][c] (<32 x i8>) and whose
    scales are <16 x i16> (signed); x the int8 activation x[xo:xo+256].  Q2_K, Q3_K, Q6_K."""
    total = None
    if target == AVX512:  # values 32c .. +32 beside 128 + 32c .. +32 (Q2_K cuts them so from 64 bytes)
        for c in range(4):
            u = _concat(builder, quants[0][c], quants[1][c])
            xv = _concat(
                builder,
                _load_bytes(context, builder, xt, x, _add_offset(builder, xo, 32 * c), 32),
                _load_bytes(context, builder, xt, x, _add_offset(builder, xo, 128 + 32 * c), 32),
            )
            groups = [8 * (lane // 16) + 2 * c + lane % 16 // 8 for lane in range(32)]
            part = _madd(builder, u, xv, _pick(builder, scales, groups))
            total = part if total is None else builder.add(total, part)
        return _reduce_add(builder, total)
    for h in range(2):
        for c in range(4):
            xv = _load_bytes(context, builder, xt, x, _add_offset(builder, xo, 128 * h + 32 * c), 32)
            if target == AVX2:
                groups = [8 * h + 2 * c + lane // 8 for lane in range(16)]
                part = _madd(builder, quants[h][c], xv, _pick(builder, scales, groups))
            else:
                products = builder.mul(builder.zext(quants[h][c], _vec(I32, 32)), builder.sext(xv, _vec(I32, 32)))
                part = None
                for half in range(2):  # one scale per 16 values
                    dot = _reduce_add(builder, _pick(builder, products, range(16 * half, 16 * half + 16)))
                    scale = builder.sext(builder.extract_element(scales, ir.Constant(I32, 8 * h + 2 * c + half)), I32)
                    part = builder.add(part, builder.mul(dot, scale)) if part is not None else builder.mul(dot, scale)
            total = part if total is None else builder.add(total, part)
    return total if target == GENERIC else _reduce_add(builder, total)


def _minus_offset(context, builder, total, bt, bsums, bo, scales, offset, target):
    """total - offset * sum_j scales[j] * bsums[bo+j]: the unsigned values' offset taken off
    through the Q8_K block sums (llama.cpp does the same); scales <16 x i16>."""
    weighted = _weighted_block_sums(builder, _block_sums(context, builder, bt, bsums, bo), scales, target)
    return builder.sub(total, builder.mul(weighted, ir.Constant(I32, offset)))


def _q6_k_quants(context, builder, wt, w, wo, h, k):
    """The 32 unsigned 6-bit quants (q + 32) of a Q6_K block's values 128h + 32k .. +32 as
    <32 x i8>: low 4 bits from ql (ql[64h + 32(k % 2) + l], low nibble for k < 2), high 2
    bits from qh[32h + l] (bits 2k, 2k+1)."""
    ql = _load_bytes(context, builder, wt, w, _add_offset(builder, wo, 64 * h + 32 * (k % 2)), 32)
    qh = _load_bytes(context, builder, wt, w, _add_offset(builder, wo, 128 + 32 * h), 32)
    low = builder.and_(ql, _splat(I8, 32, 15)) if k < 2 else builder.lshr(ql, _splat(I8, 32, 4))
    high = builder.and_(builder.lshr(qh, _splat(I8, 32, 2 * k)), _splat(I8, 32, 3))
    return builder.or_(low, builder.shl(high, _splat(I8, 32, 4)))


def _q6_k_block_isum(context, builder, signature, args, target):
    """sum_j scale_j * sum over group j of (u - 32) * x, with u = q + 32 >= 0 (pmaddubsw
    needs unsigned values)."""
    w, wo, x, xo, bsums, bo = args
    wt, xt, bt = signature.args[0], signature.args[2], signature.args[4]
    scales = builder.sext(_load_bytes(context, builder, wt, w, _add_offset(builder, wo, 192), 16), _vec(I16, 16))
    quants = [[_q6_k_quants(context, builder, wt, w, wo, h, c) for c in range(4)] for h in range(2)]
    total = _groups16_isum(context, builder, target, xt, x, xo, quants, scales)
    return _minus_offset(context, builder, total, bt, bsums, bo, scales, 32, target)


def _block_sums_intrinsic(block_isum, target: str, doc: str):
    """An intrinsic (w, wo, x, xo, bsums, bo) -> int32 for a K-quant block that takes the Q8_K
    block sums bsums[bo:bo+16] (int32), its code from block_isum for `target`."""

    @intrinsic
    def block_sums_isum(typingctx, w, wo, x, xo, bsums, bo):
        if w.dtype != types.uint8 or x.dtype != types.int8 or bsums.dtype != types.int32:
            return None
        sig = types.int32(w, wo, x, xo, bsums, bo)

        def codegen(context, builder, signature, args):
            return block_isum(context, builder, signature, args, target)

        return sig, codegen

    block_sums_isum.__doc__ = doc
    return block_sums_isum


Q6_K_ISUM = {
    target: _block_sums_intrinsic(
        _q6_k_block_isum,
        target,
        """Exact int32 sum of a Q6_K
    super-block's 256 quants (q - 32) times their int8 scale (16 values each) times the int8
    activation: the block's ql, qh and scales at w[wo:wo+208], activations x[xo:xo+256] with their
    Q8_K block sums bsums[bo:bo+16].""",
    )
    for target in (GENERIC, AVX2, AVX512)
}
q6_k_isum = _for_this_cpu(Q6_K_ISUM)


def _q2_k_block_isum(context, builder, signature, args, target):
    """(sum_j (scales[j] & 15) * sum over group j of q * x, sum_j (scales[j] >> 4) * bsums[bo+j])
    for a Q2_K block: scales[16] at w[wo], 2-bit quants at w[wo+16:wo+80] (value 128h + 32c + l
    is bits 2c of byte 32h + l)."""
    w, wo, x, xo, bsums, bo = args
    wt, xt = signature.args[0], signature.args[2]
    packed = _load_bytes(context, builder, wt, w, wo, 16)
    scales = builder.zext(builder.and_(packed, _splat(I8, 16, 15)), _vec(I16, 16))
    # all 64 quant bytes shifted at once: bytes 0..31 then hold values 32c.., bytes 32..63 128 + 32c..
    q = _load_bytes(context, builder, wt, w, _add_offset(builder, wo, 16), 64)
    fields = [builder.and_(builder.lshr(q, _splat(I8, 64, 2 * c)), _splat(I8, 64, 3)) for c in range(4)]
    quants = [[_pick(builder, fields[c], range(32 * h, 32 * h + 32)) for c in range(4)] for h in range(2)]
    isum = _groups16_isum(context, builder, target, xt, x, xo, quants, scales)
    mins = builder.zext(builder.lshr(packed, _splat(I8, 16, 4)), _vec(I16, 16))
    summ = _weighted_block_sums(builder, _block_sums(context, builder, signature.args[4], bsums, bo), mins, target)
    return context.make_tuple(builder, signature.return_type, [isum, summ])


def _q2_k_isum(target: str):
    @intrinsic
    def q2_k_isum(typingctx, w, wo, x, xo, bsums, bo):
        """(exact int32 sum of a Q2_K super-block's 256 quants times their 4-bit scale times the
        int8 activation x[xo:xo+256], its 4-bit mins times the Q8_K block sums bsums[bo:bo+16]);
        the block (scales and mins, then quants) starts at w[wo]."""
        if w.dtype != types.uint8 or x.dtype != types.int8 or bsums.dtype != types.int32:
            return None
        sig = types.UniTuple(types.int32, 2)(w, wo, x, xo, bsums, bo)

        def codegen(context, builder, signature, args):
            return _q2_k_block_isum(context, builder, signature, args, target)

        return sig, codegen

    return q2_k_isum


Q2_K_ISUM = {target: _q2_k_isum(target) for target in (GENERIC, AVX2, AVX512)}
q2_k_isum = _for_this_cpu(Q2_K_ISUM)


def _q3_k_block_isum(context, builder, signature, args, target):
    """sum_j sc[j] * sum over group j of (u - 4) * x for a Q3_K block (hmask[32] at w[wo], 2-bit
    quants at w[wo+32:wo+96]; value 128h + 32c + l: u = bits 2c of byte 32h + l, plus 4 if bit
    4h + c of hmask[l] is set).  The 16 6-bit scales (minus 32) at w[wo+96:wo+108]: low 4 bits
    from the nibbles of bytes 96..103 (low nibbles for j < 8), high 2 bits from byte
    104 + j % 4, bits 2 * (j // 4)."""
    w, wo, x, xo, bsums, bo = args
    wt, xt, bt = signature.args[0], signature.args[2], signature.args[4]
    nibbles = _load_bytes(context, builder, wt, w, _add_offset(builder, wo, 96), 8)
    low = _concat(builder, builder.and_(nibbles, _splat(I8, 8, 15)), builder.lshr(nibbles, _splat(I8, 8, 4)))
    tops = _load_bytes(context, builder, wt, w, _add_offset(builder, wo, 104), 4)
    tops = _pick(builder, tops, [j % 4 for j in range(16)])
    shifts = ir.Constant(_vec(I8, 16), [2 * (j // 4) for j in range(16)])
    high = builder.and_(builder.lshr(tops, shifts), _splat(I8, 16, 3))
    scales = builder.sext(
        builder.sub(builder.or_(low, builder.shl(high, _splat(I8, 16, 4))), _splat(I8, 16, 32)), _vec(I16, 16)
    )
    hmask = _load_bytes(context, builder, wt, w, wo, 32)
    quants = []
    for h in range(2):
        q = _load_bytes(context, builder, wt, w, _add_offset(builder, wo, 32 + 32 * h), 32)
        row = []
        for c in range(4):
            low2 = builder.and_(builder.lshr(q, _splat(I8, 32, 2 * c)), _splat(I8, 32, 3))
            bit = builder.and_(builder.lshr(hmask, _splat(I8, 32, 4 * h + c)), _splat(I8, 32, 1))
            row.append(builder.or_(low2, builder.shl(bit, _splat(I8, 32, 2))))
        quants.append(row)
    total = _groups16_isum(context, builder, target, xt, x, xo, quants, scales)
    return _minus_offset(context, builder, total, bt, bsums, bo, scales, 4, target)


Q3_K_ISUM = {
    target: _block_sums_intrinsic(
        _q3_k_block_isum,
        target,
        """Exact int32 sum of a Q3_K
    super-block's 256 values (u - 4) times their 6-bit scale (16 values each) times the int8
    activation x[xo:xo+256] with its Q8_K block sums bsums[bo:bo+16]; the block starts at
    w[wo].""",
    )
    for target in (GENERIC, AVX2, AVX512)
}
q3_k_isum = _for_this_cpu(Q3_K_ISUM)


def _gather(builder, table_ptr, indices):
    """Table entries (i64 or i32 each) at the given i64 indices, as one vector of bytes."""
    entries = ir.Constant(_vec(table_ptr.type.pointee, len(indices)), None)
    for lane, index in enumerate(indices):
        entries = builder.insert_element(entries, builder.load(builder.gep(table_ptr, [index])), ir.Constant(I32, lane))
    return builder.bitcast(entries, _vec(I8, 32))


def _signed_grid_isum(context, builder, target, xt, x, xo, sub_blocks):
    """sum over 32-value sub-blocks of scale * (magnitudes . signed x): sub_blocks yields, per
    sub-block ib, its grid magnitudes (<32 x u8>), sign masks (<32 x i8>, -1 = negative; None:
    all positive) and its scales as two i16 (values 0..15, 16..31).  The signs go onto x,
    (x ^ m) - m, which needs x > -128: Q8_K activations are (|q| <= 127, tested).  Then
    pmaddubsw pairs and pmaddwd by scale."""
    total = None
    for ib, (magnitudes, m, scale_a, scale_b) in enumerate(sub_blocks):
        xv = _load_bytes(context, builder, xt, x, _add_offset(builder, xo, 32 * ib), 32)
        signed_x = xv if m is None else builder.sub(builder.xor(xv, m), m)
        if target == GENERIC:
            products = builder.mul(builder.zext(magnitudes, _vec(I32, 32)), builder.sext(signed_x, _vec(I32, 32)))
            if scale_a is scale_b:
                # one scale for all 32 (IQ2_XXS, IQ3_XXS): also the form LLVM 22 gets right here; the
                # two-half form below with one shared scale came out wrong inside a loop over blocks
                part = builder.mul(_reduce_add(builder, products), builder.zext(scale_a, I32))
            else:
                part = None
                for half, scale in enumerate((scale_a, scale_b)):
                    dot = _reduce_add(builder, _pick(builder, products, range(16 * half, 16 * half + 16)))
                    scaled = builder.mul(dot, builder.zext(scale, I32))
                    part = scaled if part is None else builder.add(part, scaled)
        else:
            scales = _concat(builder, _broadcast(builder, scale_a, 8), _broadcast(builder, scale_b, 8))
            part = _madd(builder, magnitudes, signed_x, scales)
        total = part if total is None else builder.add(total, part)
    return total if target == GENERIC else _reduce_add(builder, total)


def _odd_scale(builder, field):
    """2 * field + 1 as i16 (field: i32 of a 4-bit scale)."""
    return builder.trunc(builder.or_(builder.shl(field, ir.Constant(I32, 1)), ir.Constant(I32, 1)), I16)


def _data(context, builder, signature, args, *positions):
    """The data pointers of the array arguments at `positions`."""
    return [context.make_array(signature.args[i])(context, builder, value=args[i]).data for i in positions]


def _byte_at(builder, ptr, offset, k, ty):
    return builder.zext(builder.load(builder.gep(ptr, [_add_offset(builder, offset, k)])), ty)


def _sign_indices(builder, aux):
    """The four 7-bit sign indices of a u32 (bits 0..27) as i64."""
    i64 = ir.IntType(64)
    return [
        builder.zext(builder.and_(builder.lshr(aux, ir.Constant(I32, 7 * l)), ir.Constant(I32, 127)), i64)
        for l in range(4)
    ]


def _u32_at(builder, ptr, offset, k):
    return builder.load(builder.bitcast(builder.gep(ptr, [_add_offset(builder, offset, k)]), I32.as_pointer()), align=1)


def _iq2_xxs_block_isum(context, builder, signature, args, target):
    """IQ2_XXS: 8 sub-blocks of 4 grid bytes (8-value entries) and a u32 of 4 x 7-bit sign
    indices plus a 4-bit scale s (weight 2s + 1)."""
    wo, x, xo = args[1:4]
    w_ptr, g_ptr, s_ptr = _data(context, builder, signature, args, 0, 4, 5)
    i64 = ir.IntType(64)

    def sub_blocks():
        for ib in range(8):
            aux = _u32_at(builder, w_ptr, wo, 2 + 8 * ib + 4)
            grid = [_byte_at(builder, w_ptr, wo, 2 + 8 * ib + l, i64) for l in range(4)]
            scale = _odd_scale(builder, builder.lshr(aux, ir.Constant(I32, 28)))
            yield _gather(builder, g_ptr, grid), _gather(builder, s_ptr, _sign_indices(builder, aux)), scale, scale

    return _signed_grid_isum(context, builder, target, signature.args[2], x, xo, sub_blocks())


def _iq3_xxs_block_isum(context, builder, signature, args, target):
    """IQ3_XXS: 64 grid bytes (4-value entries, 8 per sub-block) at wo+2, then per sub-block a u32
    at wo+66+4ib of 4 x 7-bit sign indices (8 values each) and a 4-bit scale s (weight 2s + 1)."""
    wo, x, xo = args[1:4]
    w_ptr, g_ptr, s_ptr = _data(context, builder, signature, args, 0, 4, 5)
    i64 = ir.IntType(64)

    def sub_blocks():
        for ib in range(8):
            aux = _u32_at(builder, w_ptr, wo, 66 + 4 * ib)
            grid = [_byte_at(builder, w_ptr, wo, 2 + 8 * ib + l, i64) for l in range(8)]
            scale = _odd_scale(builder, builder.lshr(aux, ir.Constant(I32, 28)))
            yield _gather(builder, g_ptr, grid), _gather(builder, s_ptr, _sign_indices(builder, aux)), scale, scale

    return _signed_grid_isum(context, builder, target, signature.args[2], x, xo, sub_blocks())


def _iq2_xs_block_isum(context, builder, signature, args, target):
    """IQ2_XS: 32 u16 at wo+2 (9-bit grid index of an 8-value entry, 7-bit sign index), 4-bit
    scales s at wo+66, two per byte, one per 16 values (weight 2s + 1)."""
    wo, x, xo = args[1:4]
    w_ptr, g_ptr, s_ptr = _data(context, builder, signature, args, 0, 4, 5)
    i64 = ir.IntType(64)

    def sub_blocks():
        for ib in range(8):
            codes = [
                builder.zext(
                    builder.or_(
                        _byte_at(builder, w_ptr, wo, 2 + 8 * ib + 2 * l, I32),
                        builder.shl(_byte_at(builder, w_ptr, wo, 3 + 8 * ib + 2 * l, I32), ir.Constant(I32, 8)),
                    ),
                    i64,
                )
                for l in range(4)
            ]
            grid = [builder.and_(c, ir.Constant(i64, 511)) for c in codes]
            signs = [builder.lshr(c, ir.Constant(i64, 9)) for c in codes]
            byte = _byte_at(builder, w_ptr, wo, 66 + ib, I32)
            scale_a = _odd_scale(builder, builder.and_(byte, ir.Constant(I32, 15)))
            scale_b = _odd_scale(builder, builder.lshr(byte, ir.Constant(I32, 4)))
            yield _gather(builder, g_ptr, grid), _gather(builder, s_ptr, signs), scale_a, scale_b

    return _signed_grid_isum(context, builder, target, signature.args[2], x, xo, sub_blocks())


def _iq3_s_block_isum(context, builder, signature, args, target):
    """IQ3_S: per sub-block ib, eight 9-bit grid indices of 4-value entries (qs bytes at
    wo+2+8ib, ninth bits from qh = w[wo+66+ib], bit j for index j), sign bytes at wo+74+4ib (bit
    j of byte l: value 8l + j negative) and a 4-bit scale s (weight 2s + 1) at wo+106, two per
    byte."""
    wo, x, xo = args[1:4]
    w_ptr, g_ptr, s_ptr = _data(context, builder, signature, args, 0, 4, 5)
    i64 = ir.IntType(64)

    def sub_blocks():
        for ib in range(8):
            qh = _byte_at(builder, w_ptr, wo, 66 + ib, i64)
            grid = [
                builder.or_(
                    _byte_at(builder, w_ptr, wo, 2 + 8 * ib + j, i64),
                    builder.shl(
                        builder.and_(builder.lshr(qh, ir.Constant(i64, j)), ir.Constant(i64, 1)), ir.Constant(i64, 8)
                    ),
                )
                for j in range(8)
            ]
            signs = [_byte_at(builder, w_ptr, wo, 74 + 4 * ib + l, i64) for l in range(4)]
            byte = _byte_at(builder, w_ptr, wo, 106 + ib // 2, I32)
            scale = _odd_scale(builder, _field(builder, byte, 4 * (ib % 2), 15))
            yield _gather(builder, g_ptr, grid), _gather(builder, s_ptr, signs), scale, scale

    return _signed_grid_isum(context, builder, target, signature.args[2], x, xo, sub_blocks())


def _iq2_s_block_isum(context, builder, signature, args, target):
    """IQ2_S: per sub-block ib, four 10-bit grid indices of 8-value entries (qs bytes at wo+2+4ib,
    two high bits each from qh = w[wo+66+ib], bits 2l, 2l+1), sign bytes at wo+34+4ib, and 4-bit
    scales s (weight 2s + 1) at wo+74+ib, low nibble for values 0..15, high for 16..31."""
    wo, x, xo = args[1:4]
    w_ptr, g_ptr, s_ptr = _data(context, builder, signature, args, 0, 4, 5)
    i64 = ir.IntType(64)

    def sub_blocks():
        for ib in range(8):
            qh = _byte_at(builder, w_ptr, wo, 66 + ib, i64)
            grid = [
                builder.or_(
                    _byte_at(builder, w_ptr, wo, 2 + 4 * ib + l, i64),
                    builder.shl(_field(builder, qh, 2 * l, 3), ir.Constant(i64, 8)),
                )
                for l in range(4)
            ]
            signs = [_byte_at(builder, w_ptr, wo, 34 + 4 * ib + l, i64) for l in range(4)]
            byte = _byte_at(builder, w_ptr, wo, 74 + ib, I32)
            scale_a = _odd_scale(builder, builder.and_(byte, ir.Constant(I32, 15)))
            scale_b = _odd_scale(builder, builder.lshr(byte, ir.Constant(I32, 4)))
            yield _gather(builder, g_ptr, grid), _gather(builder, s_ptr, signs), scale_a, scale_b

    return _signed_grid_isum(context, builder, target, signature.args[2], x, xo, sub_blocks())


def _iq1_s_block_isum(context, builder, signature, args, target):
    """IQ1_S: per sub-block ib, four 11-bit grid indices of 8-value entries (qs bytes at
    wo+2+4ib, three high bits each from the u16 qh at wo+34+2ib, bits 3l..3l+2), a 3-bit scale s
    (bits 12..14, weight 2s + 1) and the sign of ggml's delta (bit 15), which becomes bit 11 of
    each index into the delta table (IQ1_ISUM_DOC)."""
    wo, x, xo, grid, bsums, bo = args[1:7]
    w_ptr, g_ptr = _data(context, builder, signature, args, 0, 4)
    i64 = ir.IntType(64)
    weights = ir.Constant(_vec(I32, 8), None)
    sub_blocks = []
    for ib in range(8):
        qh = builder.or_(
            _byte_at(builder, w_ptr, wo, 34 + 2 * ib, i64),
            builder.shl(_byte_at(builder, w_ptr, wo, 35 + 2 * ib, i64), ir.Constant(i64, 8)),
        )
        delta = builder.lshr(builder.and_(qh, ir.Constant(i64, 0x8000)), ir.Constant(i64, 4))
        indices = [
            builder.or_(
                builder.or_(_byte_at(builder, w_ptr, wo, 2 + 4 * ib + l, i64), delta),
                builder.shl(
                    builder.and_(builder.lshr(qh, ir.Constant(i64, 3 * l)), ir.Constant(i64, 7)), ir.Constant(i64, 8)
                ),
            )
            for l in range(4)
        ]
        scale = _odd_scale(builder, builder.trunc(_field(builder, qh, 12, 7), I32))
        weights = builder.insert_element(weights, builder.zext(scale, I32), ir.Constant(I32, ib))
        sub_blocks.append((_gather(builder, g_ptr, indices), None, scale, scale))
    total = _signed_grid_isum(context, builder, target, signature.args[2], x, xo, sub_blocks)
    sums = _block_sums(context, builder, signature.args[5], bsums, bo)
    pairs = builder.add(_pick(builder, sums, range(0, 16, 2)), _pick(builder, sums, range(1, 16, 2)))
    return builder.sub(total, _reduce_add(builder, builder.mul(pairs, builder.mul(weights, _splat(I32, 8, 9)))))


def _iq1_m_block_isum(context, builder, signature, args, target):
    """IQ1_M: per 8-value group g, an 11-bit grid index (qs byte g at wo, three high bits from
    nibble g % 2 of qh[g // 2] at wo+32, whose bit 3, the sign of ggml's delta, becomes bit 11 of
    the index into the delta table); 3-bit scales s per 16 values (weight 2s + 1), four per u16
    at wo+48."""
    wo, x, xo, grid, bsums, bo = args[1:7]
    w_ptr, g_ptr = _data(context, builder, signature, args, 0, 4)
    i64 = ir.IntType(64)
    words = [
        builder.or_(
            _byte_at(builder, w_ptr, wo, 48 + 2 * k, I32),
            builder.shl(_byte_at(builder, w_ptr, wo, 49 + 2 * k, I32), ir.Constant(I32, 8)),
        )
        for k in range(4)
    ]
    scales = [
        _odd_scale(
            builder, builder.and_(builder.lshr(words[j // 4], ir.Constant(I32, 3 * (j % 4))), ir.Constant(I32, 7))
        )
        for j in range(16)
    ]
    sub_blocks = []
    for ib in range(8):
        indices = []
        for g in range(4 * ib, 4 * ib + 4):
            nibble = builder.lshr(_byte_at(builder, w_ptr, wo, 32 + g // 2, i64), ir.Constant(i64, 4 * (g % 2)))
            high = builder.shl(builder.and_(nibble, ir.Constant(i64, 15)), ir.Constant(i64, 8))
            indices.append(builder.or_(_byte_at(builder, w_ptr, wo, g, i64), high))
        sub_blocks.append((_gather(builder, g_ptr, indices), None, scales[2 * ib], scales[2 * ib + 1]))
    total = _signed_grid_isum(context, builder, target, signature.args[2], x, xo, sub_blocks)
    sums = _block_sums(context, builder, signature.args[5], bsums, bo)
    weights = ir.Constant(_vec(I32, 16), None)
    for j, scale in enumerate(scales):
        weights = builder.insert_element(weights, builder.zext(scale, I32), ir.Constant(I32, j))
    return builder.sub(total, _reduce_add(builder, builder.mul(sums, builder.mul(weights, _splat(I32, 16, 9)))))


IQ1_ISUM_DOC = """Exact int32 8 * sumi + sumi1 for an {name} super-block starting at w[wo] against the
    int8 activation x[xo:xo+256] with its Q8_K block sums bsums[bo:bo+16], where ggml's block
    value is sumi + 0.125 * sumi1 (sumi: grid values -1/0/1 times their odd scale 2s + 1 times
    x; sumi1: ggml's delta ±1 per {delta} times the scale times x).  Through the delta table
    `grid` (uint64 [4096], simd.iq1_delta_table): entry i holds 8 (v + 1) + delta + 1 per value
    v of grid entry i & 2047, delta -1 where bit 11 of i is set, else 1 (unsigned bytes 0..18),
    so one dot gives 8 * sumi + sumi1 + 9 * (scale times x), and the last term comes off
    through the block sums.  |8 * sumi + sumi1| < 2^23, so float32(it) * 0.125 is ggml's float
    sumi + 0.125 * sumi1 exactly."""


def iq1_delta_table(grid: np.ndarray) -> np.ndarray:
    """The IQ1 delta table (IQ1_ISUM_DOC) from the IQ1_S grid (int8 [2048, 8], values -1/0/1)."""
    values = 8 * (grid.astype(np.int64) + 1)
    table = np.concatenate([values + 2, values]).astype(np.uint8)  # delta +1, then delta -1
    return np.ascontiguousarray(table).view(np.uint64).reshape(-1)


def _iq1_isum(name: str, delta: str, block_isum, target: str):
    @intrinsic
    def iq1_isum(typingctx, w, wo, x, xo, grid, bsums, bo):
        if w.dtype != types.uint8 or x.dtype != types.int8 or bsums.dtype != types.int32:
            return None
        sig = types.int32(w, wo, x, xo, grid, bsums, bo)

        def codegen(context, builder, signature, args):
            return block_isum(context, builder, signature, args, target)

        return sig, codegen

    iq1_isum.__doc__ = IQ1_ISUM_DOC.format(name=name, delta=delta)
    return iq1_isum


def _grid_isum(name: str, block_isum, target: str):
    @intrinsic
    def grid_isum(typingctx, w, wo, x, xo, grid, signs):
        if w.dtype != types.uint8 or x.dtype != types.int8 or signs.dtype != types.uint64:
            return None
        sig = types.int32(w, wo, x, xo, grid, signs)

        def codegen(context, builder, signature, args):
            return block_isum(context, builder, signature, args, target)

        return sig, codegen

    grid_isum.__doc__ = f"""Exact int32 sum of an {name} super-block's 256 values times their odd sub-block
    scale (2s + 1) times the int8 activation x[xo:xo+256] (each > -128, as Q8_K's are); the block
    starts at w[wo]; `grid`: the type's grid as one unsigned integer entry per index; `signs`:
    uint64 masks, eight bytes (0xFF where the value is negative) per 7-bit sign index (IQ2_XXS,
    IQ2_XS, IQ3_XXS: ggml's even-parity signs) or per sign byte (IQ2_S, IQ3_S)."""
    return grid_isum


# ---- AVX-512 VBMI: grid blocks decoded in registers, the activation reordered -------------------
# These generators read each 256-value activation block reordered once per call (REORDERED, by
# _jit.grid_activations), most of them group-major: 64-byte chunk j holds 8-value group j of each
# 32-value sub-block k, in qword k.  Then everything a block stores per sub-block (scales, sign
# indices, grid indices) already sits where the chunk's values are: qword k of a vector holds
# sub-block k's fields and no per-chunk shuffle is needed to line them up.  Per chunk: the 64
# unsigned grid values (gathered, or looked up in registers), the signs as a mask from
# vpshufbitqmb negating the activation under it, one vpdpbusd into int32 lanes that each stay
# inside one sub-block; per block: the lanes folded to one sum per sub-block, times its weight
# (vpmuldq), one reduction.
# IQ2_XS and IQ2_S take their grid values from memory (VBMI_GATHER: vpgatherqq of whole entries)
# or from registers: an IQ2 entry is eight 2-bit codes, 16 bits; vpermi2w looks 32 such words up
# in a 64-entry slice of the table held in two registers, selects on the index's higher bits
# pick among the slices, vpmultishiftqb cuts a chunk's codes out and vpermb maps them to values.
# Intel cores run 512-bit permutes on one port only; there the entries are gathered
# (GATHER_GRIDS).  The 2048-entry IQ1 grid is always gathered.  IQ2_XXS, IQ3_XXS and IQ3_S have
# a byte-table lookup of their own, in registers everywhere, with activation orders of their own
# (_iq2_xxs_vbmi, _iq3_xxs_vbmi).

REORDERED = TARGET == VBMI
# position i of a reordered block holds value ORDER[i] of the block
GROUP_MAJOR_ORDER = np.array([32 * k + 8 * j + i for j in range(4) for k in range(8) for i in range(8)])
# IQ2_XXS: byte b of qword k of chunk c holds value 4 (b // 4) + c of group b % 4 of sub-block k
IQ2_XXS_ORDER = np.array(
    [32 * k + 8 * (b % 4) + 4 * (b // 4) + c for c in range(4) for k in range(8) for b in range(8)]
)
# IQ3_XXS: byte j of qword k of chunk c holds value c of entry j (four values) of sub-block k
IQ3_ORDER = np.array([32 * k + 4 * j + c for c in range(4) for k in range(8) for j in range(8)])
# two IQ2_XXS blocks (512 values) at once: byte b of qword k of chunk 4h + c holds value 4h + c of
# group b % 4 of sub-block k of the first block (b < 4) or of the second
IQ2_XXS_PAIR_ORDER = np.array(
    [
        256 * (b // 4) + 32 * k + 8 * (b % 4) + 4 * h + c
        for h in range(2)
        for c in range(4)
        for k in range(8)
        for b in range(8)
    ]
)


def _reorder(order):
    @intrinsic
    def reorder(typingctx, src, so, dst, do):
        """dst[do + i] = src[so + order[i]] for i < len(order) (int8 arrays; one constant shuffle)."""
        if src.dtype != types.int8 or dst.dtype != types.int8:
            return None
        sig = types.none(src, so, dst, do)

        def codegen(context, builder, signature, args):
            v = _load_bytes(context, builder, signature.args[0], args[0], args[1], len(order))
            (dst_ptr,) = _data(context, builder, signature, args, 2)
            at = builder.bitcast(builder.gep(dst_ptr, [args[3]]), v.type.as_pointer())
            builder.store(_shuffle(builder, v, v, [int(i) for i in order]), at, align=1)
            return context.get_dummy_value()

        return sig, codegen

    return reorder


reorder_group_major, reorder_iq2_xxs = _reorder(GROUP_MAJOR_ORDER), _reorder(IQ2_XXS_ORDER)
reorder_iq2_xxs_pair, reorder_iq3 = _reorder(IQ2_XXS_PAIR_ORDER), _reorder(IQ3_ORDER)


def _bytes(values):
    return ir.Constant(_vec(I8, len(values)), [int(v) & 0xFF for v in values])


def _multishift(builder, data, offsets):
    """Byte i of <64 x i8> data's qword i // 8: the 8 bits from bit offsets[i] up, cyclically
    (vpmultishiftqb; 8 offsets: the same for every qword)."""
    offsets = list(offsets) * 8 if len(offsets) == 8 else offsets
    return _call(builder, "llvm.x86.avx512.pmultishift.qb.512", _vec(I8, 64), _bytes(offsets), data)


def _words_from_bytes(builder, v, positions):
    """<32 x i16> whose word w is the byte v[positions[w]] zero-extended."""
    zero = ir.Constant(v.type, None)
    return builder.bitcast(_shuffle(builder, v, zero, [k for p in positions for k in (p, v.type.count)]), _vec(I16, 32))


def _high_index_bits(builder, v, positions, shifts, mask):
    """<32 x i16>: ((v[positions[w]] << 8) >> shifts[w]) & mask per word w: high bits of 32 grid
    indices gathered from the bytes of v."""
    words = builder.shl(_words_from_bytes(builder, v, positions), _splat(I16, 32, 8))
    return builder.and_(builder.lshr(words, ir.Constant(_vec(I16, 32), list(shifts))), _splat(I16, 32, mask))


def _qwords(builder, a, b, lanes):
    """<8 x i64> from bytes of a then b (vectors of one type): byte i of qword k = lanes[k][i]."""
    return builder.bitcast(_shuffle(builder, a, b, [i for k in range(8) for i in lanes[k]]), _vec(I64, 8))


def _byte_qwords(builder, v, positions):
    """<8 x i64>: qword k = the byte v[positions[k]] zero-extended."""
    return builder.zext(_shuffle(builder, v, v, positions), _vec(I64, 8))


def _odd_scales(builder, v, shifts):
    """2 * ((v >> shift) & 15) + 1 per qword of <8 x i64> v (shifts: one or one per qword)."""
    shifts = ir.Constant(v.type, list(shifts) if isinstance(shifts, (list, tuple)) else [shifts] * 8)
    nibbles = builder.and_(builder.lshr(v, shifts), _splat(I64, 8, 15))
    return builder.or_(builder.shl(nibbles, _splat(I64, 8, 1)), _splat(I64, 8, 1))


def _vnni_dots(builder, acc, u, x):
    """acc + per int32 lane the sum of four products u8 * s8 of <64 x i8> u (unsigned), x (vpdpbusd)."""
    return _call(
        builder,
        "llvm.x86.avx512.vpdpbusd.512",
        _vec(I32, 16),
        acc,
        builder.bitcast(u, _vec(I32, 16)),
        builder.bitcast(x, _vec(I32, 16)),
    )


def _gathered(builder, grid_ptr, indices):
    """grid[indices] as <64 x i8>: <8 x i64> indices into a table of 8-byte entries (vpgatherqq)."""
    entries = _call(
        builder,
        "llvm.x86.avx512.mask.gather.qpq.512",
        _vec(I64, 8),
        ir.Constant(_vec(I64, 8), None),
        builder.bitcast(grid_ptr, I8.as_pointer()),
        indices,
        ir.Constant(_vec(ir.IntType(1), 8), [1] * 8),
        ir.Constant(I32, 8),
    )
    return builder.bitcast(entries, _vec(I8, 64))


def _group_major_isum(context, builder, xt, x, xo, magnitudes, signs, groups, sign_bit=lambda j, i: 8 * j + i):
    """A block's exact sum, the activation reordered in four 64-byte chunks at xo + 64j, qword k
    of each holding values of sub-block k (group-major: value i of group j in byte i of chunk j).
    magnitudes(j): chunk j's unsigned values (<64 x i8>); signs: <64 x i8> whose qword k holds the
    sign bits of sub-block k, bit sign_bit(j, i) for byte i of qword k of chunk j (group-major:
    8j + i), or None; groups: (chunks, start, scales) per set of chunks that share their weights:
    their vpdpbusd sums start from `start` (<16 x i32> or None), each qword's total (one
    sub-block's) is multiplied by qword k of `scales` (<8 x i64>, vpmuldq) and added."""
    zero = _splat(I8, 64, 0)
    low_dword = _splat(I64, 8, 32)
    total = None
    for chunks, start, scales in groups:
        acc = ir.Constant(_vec(I32, 16), None) if start is None else builder.bitcast(start, _vec(I32, 16))
        for j in chunks:
            xv = _load_bytes(context, builder, xt, x, _add_offset(builder, xo, 64 * j), 64)
            if signs is not None:
                negative = _call(
                    builder,
                    "llvm.x86.avx512.vpshufbitqmb.512",
                    _vec(ir.IntType(1), 64),
                    signs,
                    _bytes([sign_bit(j, i % 8) for i in range(64)]),
                )
                xv = builder.select(negative, builder.sub(zero, xv), xv)
            acc = _vnni_dots(builder, acc, magnitudes(j), xv)
        high = builder.bitcast(builder.lshr(builder.bitcast(acc, _vec(I64, 8)), low_dword), _vec(I32, 16))
        sums = builder.bitcast(builder.add(acc, high), _vec(I64, 8))  # low dword of qword k: its total
        part = builder.mul(*(builder.ashr(builder.shl(v, low_dword), low_dword) for v in (sums, scales)))
        total = part if total is None else builder.add(total, part)
    return builder.trunc(_call(builder, "llvm.vector.reduce.add.v8i64", I64, total), I32)


def _level_codes(cls):
    """A gguf grid's distinct magnitudes (sorted) and each value's index among them, [entries,
    values per entry]."""
    cls.init_grid()
    grid = cls.grid.reshape(cls.grid_shape).astype(np.int64)
    levels = sorted(set(grid.reshape(-1).tolist()))
    return levels, np.searchsorted(levels, grid)


class _Grid:
    """An IQ2 grid (entries of eight values, three levels) as 16-bit codes, two bits per value,
    `levels` the magnitudes the codes stand for (gguf's table)."""

    def __init__(self, cls):
        self.levels, value_codes = _level_codes(cls)
        self.codes = np.zeros(len(value_codes), np.int64)
        for i in range(8):
            self.codes |= value_codes[:, i] << (2 * i)
        self.values = [self.levels[b & 3] if (b & 3) < len(self.levels) else 0 for b in range(64)]

    def lookup(self, builder, index_words):
        """codes[index] for 32 i16 indices, as <64 x i8>: vpermi2w over 64-entry slices of the
        table, selects on the higher index bits."""
        slices = []
        for s in range(0, self.codes.size, 64):
            lo, hi = (ir.Constant(_vec(I16, 32), [int(c) for c in self.codes[s + h : s + h + 32]]) for h in (0, 32))
            slices.append(_call(builder, "llvm.x86.avx512.vpermi2var.hi.512", _vec(I16, 32), lo, index_words, hi))
        bit = 64
        while len(slices) > 1:
            high = builder.icmp_unsigned("!=", builder.and_(index_words, _splat(I16, 32, bit)), _splat(I16, 32, 0))
            slices = [builder.select(high, b, a) for a, b in zip(slices[::2], slices[1::2])]
            bit *= 2
        return builder.bitcast(slices[0], _vec(I8, 64))

    def magnitudes(self, builder, grid_ptr, target, chunk_indices, index_words):
        """j -> the unsigned values of group-major chunk j (<64 x i8>).  VBMI_GATHER: the entries
        at chunk_indices(j) (<8 x i64>) gathered from the grid in memory (grid_ptr: one uint64 per
        entry holding its values as bytes); VBMI: looked up in registers, index_words(order) giving
        the grid indices of the block's 32 entries (`order`: their numbers in storage order, qword
        k holding sub-block k's) as <32 x i16>, then per chunk one vpmultishiftqb cuts the codes
        out and one vpermb maps them to values."""
        if target == VBMI_GATHER:
            return lambda j: _gathered(builder, grid_ptr, chunk_indices(j))
        codes = self.lookup(builder, index_words(list(range(32))))
        return lambda j: _call(
            builder,
            "llvm.x86.avx512.permvar.qi.512",
            _vec(I8, 64),
            _bytes(self.values),
            _multishift(builder, codes, [16 * j + 2 * i for i in range(8)]),
        )


_IQ2_XXS_GRID, _IQ2_XS_GRID, _IQ2_S_GRID = _Grid(gq.IQ2_XXS), _Grid(gq.IQ2_XS), _Grid(gq.IQ2_S)


def _gf2_affine(builder, v, rows, constant=0):
    """Per byte of <64 x i8> v, an affine map over GF(2): bit i of the result is the parity of
    (the byte & rows[i]), xor bit i of `constant` (vgf2p8affineqb, one uop off port 5 on Intel)."""
    matrix = [rows[7 - m] for m in range(8)] * 8  # its byte 7 - i is row i
    return _call(builder, "llvm.x86.vgf2p8affineqb.512", _vec(I8, 64), v, _bytes(matrix), ir.Constant(I8, constant))


_PARITY_ROWS = [1 << i for i in range(7)] + [0x7F]  # bits 0..6 kept, bit 7 = their parity


def _parity_signs(builder, v, offsets):
    """Sign bytes as ggml's even-parity table (ksigns_iq2xs) has them: qword k of the result holds
    group j's in byte j (and again in byte 4 + j), its 7-bit sign index taken from bit offsets[j]
    of v's qword k (j = 0..3)."""
    return _gf2_affine(builder, _multishift(builder, v, list(offsets) * 2), _PARITY_ROWS)


def _sign_bytes(builder, v, positions):
    """Signs of IQ2_S / IQ3_S (one byte per 8-value group g, v[positions[g]]) for
    _group_major_isum: group j of sub-block k's in byte j of qword k."""
    return _shuffle(builder, v, v, [positions[4 * k + j % 4] for k in range(8) for j in range(8)])


def _vbmi_args(context, builder, signature, args):
    """(w's type, x's type, w, wo, x, xo, the grid's data pointer, the 64 bytes at wo + 2)."""
    wt, xt = signature.args[0], signature.args[2]
    w, wo, x, xo = args[:4]
    (g_ptr,) = _data(context, builder, signature, args, 4)
    q = _load_bytes(context, builder, wt, w, _add_offset(builder, wo, 2), 64)
    return wt, xt, w, wo, x, xo, g_ptr, q


# IQ2_XXS in registers, no gathers: its 256-entry grid has three levels (8, 25, 43), so an entry
# is eight 2-bit codes, two bytes (values 0..3, values 4..7).  vpermi2b looks a byte up in a
# 128-entry half of a table held in two registers: two lookups and a select per table (the low
# and the high code bytes) serve 64 indices, two blocks' entries, so the row dot takes its blocks
# in pairs (IQ2_XXS_PAIR_ISUM; an odd last one alone, IQ2_XXS_ISUM).  Three levels are an affine
# image of two bits over GF(2) (8 ^ 17a ^ 35b): one vgf2p8affineqb per chunk turns code c of
# every byte into its level, so a chunk holds value c (or 4 + c) of each entry, the activation
# reordered to match (IQ2_XXS_PAIR_ORDER, IQ2_XXS_ORDER).  On the Xeon VM 23 cycles per block in
# cache against 30 with gathers: port 5 (every 512-bit shuffle) has less to do (docs/kernels.md).
_IQ2_XXS_LOW_CODES = (_IQ2_XXS_GRID.codes & 255).astype(np.uint8)
_IQ2_XXS_HIGH_CODES = (_IQ2_XXS_GRID.codes >> 8).astype(np.uint8)
_IQ2_XXS_SIGN_GROUPS = [32, 39, 46, 53]  # bit offsets of groups 0..3's sign indices in a sub-block's qword


def _iq2_xxs_magnitudes(builder, codes, c):
    """<64 x i8>: the level of code c (bits 2c, 2c + 1: 0, 1, 2 as 00, 01, 10) of each byte of
    codes, one affine map over GF(2) with constant levels[0]."""
    levels = _IQ2_XXS_GRID.levels
    step_a, step_b = levels[1] ^ levels[0], levels[2] ^ levels[0]
    rows = [(((step_a >> i) & 1) << 2 * c) | (((step_b >> i) & 1) << (2 * c + 1)) for i in range(8)]
    return _gf2_affine(builder, builder.bitcast(codes, _vec(I8, 64)), rows, levels[0])


def _code_bytes(builder, indices, table, ninth=None):
    """<8 x i64>: byte i = table[indices byte i] (table: 256 bytes; two vpermi2b and a select), or
    table[indices byte i + 256 * ninth[i]] (table: 512 bytes, ninth: <64 x i1>; four and three)."""
    halves = [
        builder.select(
            builder.icmp_signed("<", indices, _splat(I8, 64, 0)),
            *reversed(
                [
                    _call(
                        builder,
                        "llvm.x86.avx512.vpermi2var.qi.512",
                        _vec(I8, 64),
                        _bytes(table[h : h + 64]),
                        indices,
                        _bytes(table[h + 64 : h + 128]),
                    )
                    for h in (base, base + 128)
                ]
            ),
        )
        for base in range(0, len(table), 256)
    ]
    return builder.bitcast(halves[0] if ninth is None else builder.select(ninth, halves[1], halves[0]), _vec(I64, 8))


def _iq2_xxs_vbmi(context, builder, signature, args, target):
    """IQ2_XXS (layout in _iq2_xxs_block_isum: qword k of the 64 bytes at wo+2 is sub-block k,
    group j's grid index in byte j, its sign index at bit 32 + 7j, the scale in bits 60..63), the
    activation in IQ2_XXS_ORDER: qword k of the codes holds those of values 0..3 of entry j in
    byte j and of values 4..7 in byte 4 + j."""
    wt, xt, w, wo, x, xo = signature.args[0], signature.args[2], *args[:4]
    q = _load_bytes(context, builder, wt, w, _add_offset(builder, wo, 2), 64)
    low_half, shift = _splat(I64, 8, 0xFFFFFFFF), _splat(I64, 8, 32)
    low, high = (_code_bytes(builder, q, table) for table in (_IQ2_XXS_LOW_CODES, _IQ2_XXS_HIGH_CODES))
    codes = builder.or_(builder.and_(low, low_half), builder.shl(high, shift))
    signs = _parity_signs(builder, q, _IQ2_XXS_SIGN_GROUPS)
    scales = _odd_scales(builder, builder.bitcast(q, _vec(I64, 8)), 60)
    return _group_major_isum(
        context,
        builder,
        xt,
        x,
        xo,
        lambda c: _iq2_xxs_magnitudes(builder, codes, c),
        signs,
        [(range(4), None, scales)],
        sign_bit=lambda c, b: 8 * (b % 4) + 4 * (b // 4) + c,
    )


@intrinsic
def _iq2_xxs_pair_isum(typingctx, w, wo, x, xo):
    if w.dtype != types.uint8 or x.dtype != types.int8:
        return None
    sig = types.UniTuple(types.float32, 2)(w, wo, x, xo)

    def codegen(context, builder, signature, args):
        wt, xt, w, wo, x, xo = signature.args[0], signature.args[2], *args
        blocks = [
            _load_bytes(context, builder, wt, w, _add_offset(builder, wo, 2 + IQ2_XXS_BYTES * i), 64) for i in range(2)
        ]
        first, second = (builder.bitcast(q, _vec(I64, 8)) for q in blocks)
        low_half, shift = _splat(I64, 8, 0xFFFFFFFF), _splat(I64, 8, 32)
        # qword k, bytes 0..3: the grid indices of the first block's sub-block k, bytes 4..7: the second's
        indices = builder.bitcast(builder.or_(builder.and_(first, low_half), builder.shl(second, shift)), _vec(I8, 64))
        second_half = ir.Constant(_vec(ir.IntType(1), 64), [i % 8 >= 4 for i in range(64)])
        # qword k, byte j: group j's sign byte in the first block's sub-block k, byte 4 + j: the second's
        sign_indices = [_multishift(builder, q, _IQ2_XXS_SIGN_GROUPS * 2) for q in blocks]
        signs = _gf2_affine(builder, builder.select(second_half, *reversed(sign_indices)), _PARITY_ROWS)
        nibbles = builder.or_(
            builder.lshr(first, _splat(I64, 8, 60)),  # dword 2k: the first block's scale s
            builder.and_(builder.lshr(second, _splat(I64, 8, 28)), _splat(I64, 8, 0xF << 32)),
        )
        scales = builder.or_(builder.shl(nibbles, _splat(I64, 8, 1)), _splat(I64, 8, 0x100000001))  # 2s + 1
        zero = _splat(I8, 64, 0)
        sums = []
        for half, table in enumerate((_IQ2_XXS_LOW_CODES, _IQ2_XXS_HIGH_CODES)):
            codes = _code_bytes(builder, indices, table)
            acc = ir.Constant(_vec(I32, 16), None)
            for c in range(4):  # chunk 4 half + c: value 4 half + c of each entry
                xv = _load_bytes(context, builder, xt, x, _add_offset(builder, xo, 64 * (4 * half + c)), 64)
                negative = _call(
                    builder,
                    "llvm.x86.avx512.vpshufbitqmb.512",
                    _vec(ir.IntType(1), 64),
                    signs,
                    _bytes([8 * (i % 8) + 4 * half + c for i in range(64)]),
                )
                xv = builder.select(negative, builder.sub(zero, xv), xv)
                acc = _vnni_dots(builder, acc, _iq2_xxs_magnitudes(builder, codes, c), xv)
            sums.append(acc)
        # dword 2k: the first block's sub-block k, 2k + 1: the second's (each |sum * scale| < 2^23)
        v = builder.mul(builder.add(*sums), builder.bitcast(scales, _vec(I32, 16)))
        for width in (8, 4, 2):
            v = builder.add(_shuffle(builder, v, v, range(width)), _shuffle(builder, v, v, range(width, 2 * width)))
        totals = builder.sitofp(v, _vec(ir.FloatType(), 2))
        return context.make_tuple(
            builder, signature.return_type, [builder.extract_element(totals, ir.Constant(I32, i)) for i in range(2)]
        )

    return sig, codegen


_iq2_xxs_pair_isum.__doc__ = """The exact sums of the two IQ2_XXS super-blocks at w[wo] and w[wo + IQ2_XXS_BYTES] (as
    IQ2_XXS_ISUM) against the int8 activation x[xo:xo+512] in IQ2_XXS_PAIR_ORDER, each rounded to
    float32 (VBMI only)."""
IQ2_XXS_PAIR_ISUM = {VBMI: _iq2_xxs_pair_isum}
iq2_xxs_pair_isum = IQ2_XXS_PAIR_ISUM[VBMI] if TARGET == VBMI else None


def _nibble_codes(cls):
    """An IQ3 grid's levels and its two code-byte tables: per entry the codes of values 0, 1 (and
    of 2, 3) as the low and high nibble of a byte."""
    levels, codes = _level_codes(cls)
    return levels, [(codes[:, 2 * h] | (codes[:, 2 * h + 1] << 4)).astype(np.uint8) for h in (0, 1)]


# IQ3_XXS in registers as well: 256 entries of four values, eight levels.  An entry's 3-bit codes
# are two bytes of two nibbles (values 0, 1 and values 2, 3), looked up by vpermi2b as IQ2_XXS's
# (_code_bytes: one block's 64 entries fill the 64 lanes); per chunk one vpshufb maps a nibble to
# its level (a code is at most 7, so bit 7 of every byte stays clear; the high nibbles shifted
# down first).  Chunk c holds value c of each entry (IQ3_ORDER).  On the Xeon VM 29 cycles per
# block in cache against 43 gathered (docs/kernels.md).
_IQ3_XXS_LEVELS, _IQ3_XXS_NIBBLES = _nibble_codes(gq.IQ3_XXS)  # levels 4, 12, .., 52, 62


def _iq3_xxs_vbmi(context, builder, signature, args, target):
    """IQ3_XXS (layout in _iq3_xxs_block_isum): byte j of qword k of the 64 bytes at wo+2 is
    sub-block k's entry j (values 4j .. 4j + 3 of its 32); its sign/scale word is spread to qword
    k.  The activation in IQ3_ORDER."""
    wt, xt, w, wo, x, xo = signature.args[0], signature.args[2], *args[:4]
    q = _load_bytes(context, builder, wt, w, _add_offset(builder, wo, 2), 64)
    words = _load_bytes(context, builder, wt, w, _add_offset(builder, wo, 66), 32)
    spaced = _qwords(
        builder, words, ir.Constant(words.type, None), [[4 * k + b for b in range(4)] + [32] * 4 for k in range(8)]
    )
    nibbles = [builder.bitcast(_code_bytes(builder, q, table), _vec(I16, 32)) for table in _IQ3_XXS_NIBBLES]
    signs = _parity_signs(builder, builder.bitcast(spaced, _vec(I8, 64)), [0, 7, 14, 21])
    scales = _odd_scales(builder, spaced, 28)
    return _group_major_isum(
        context,
        builder,
        xt,
        x,
        xo,
        _nibble_levels(builder, nibbles, _IQ3_XXS_LEVELS),
        signs,
        [(range(4), None, scales)],
        sign_bit=lambda c, j: 8 * (j // 2) + 4 * (j % 2) + c,
    )


def _nibble_levels(builder, nibbles, levels):
    """magnitudes(c) for _group_major_isum from an IQ3 block's two nibble code vectors (<32 x
    i16>, codes of values 0, 1 and of 2, 3 of each entry): value c of every entry, nibble c % 2
    of code byte c // 2, mapped to its level by one vpshufb."""
    table = _bytes((levels + [0] * (16 - len(levels))) * 4)

    def magnitudes(c):
        codes = nibbles[c // 2] if c % 2 == 0 else builder.lshr(nibbles[c // 2], _splat(I16, 32, 4))
        return _call(builder, "llvm.x86.avx512.pshuf.b.512", _vec(I8, 64), table, builder.bitcast(codes, _vec(I8, 64)))

    return magnitudes


def _iq2_xs_vbmi(context, builder, signature, args, target):
    """IQ2_XS (layout in _iq2_xs_block_isum): u16 j of qword k at wo+2 is group j of sub-block k
    (9-bit grid index, 7-bit sign index); 4-bit scales per 16 values, a byte per sub-block at
    wo+66 (low nibble: groups 0, 1)."""
    wt, xt, w, wo, x, xo, g_ptr, q = _vbmi_args(context, builder, signature, args)
    q64 = builder.bitcast(q, _vec(I64, 8))
    entries = builder.bitcast(q, _vec(I16, 32))
    magnitudes = _IQ2_XS_GRID.magnitudes(
        builder,
        g_ptr,
        target,
        lambda j: builder.and_(builder.lshr(q64, _splat(I64, 8, 16 * j)), _splat(I64, 8, 511)),
        lambda order: builder.and_(_shuffle(builder, entries, entries, order), _splat(I16, 32, 511)),
    )
    signs = _parity_signs(builder, q, [9, 25, 41, 57])
    packed = builder.zext(_load_bytes(context, builder, wt, w, _add_offset(builder, wo, 66), 8), _vec(I64, 8))
    return _group_major_isum(
        context,
        builder,
        xt,
        x,
        xo,
        magnitudes,
        signs,
        [(range(2), None, _odd_scales(builder, packed, 0)), (range(2, 4), None, _odd_scales(builder, packed, 4))],
    )


def _iq2_s_vbmi(context, builder, signature, args, target):
    """IQ2_S (layout in _iq2_s_block_isum): grid index low bytes (4 per sub-block) and sign bytes
    (one per group) in the 64 bytes at wo+2; the 2-bit high index parts (a byte per sub-block)
    and 4-bit scales per 16 values (a byte per sub-block) in the 16 at wo+66."""
    wt, xt, w, wo, x, xo, g_ptr, q = _vbmi_args(context, builder, signature, args)
    tail = _load_bytes(context, builder, wt, w, _add_offset(builder, wo, 66), 16)
    tail64 = _concat(builder, _concat(builder, tail, tail), _concat(builder, tail, tail))
    # qword k: the four low index bytes of sub-block k, then its byte of high index bits
    v = _qwords(builder, q, tail64, [[4 * k + b for b in range(4)] + [64 + k] * 4 for k in range(8)])
    v8 = builder.bitcast(v, _vec(I8, 64))

    def chunk_indices(j):  # the low byte of group j's index and qh bits 2j, 2j + 1
        fields = _multishift(builder, v8, [8 * j, 32 + 2 * j] + [0] * 6)
        return builder.and_(builder.bitcast(fields, v.type), _splat(I64, 8, 0x3FF))

    def index_words(order):
        high = _high_index_bits(builder, tail, [e // 4 for e in order], [2 * (e % 4) for e in order], 0x300)
        return builder.or_(_words_from_bytes(builder, q, order), high)

    magnitudes = _IQ2_S_GRID.magnitudes(builder, g_ptr, target, chunk_indices, index_words)
    signs = _sign_bytes(builder, q, [32 + g for g in range(32)])
    scales = _byte_qwords(builder, tail, range(8, 16))
    return _group_major_isum(
        context,
        builder,
        xt,
        x,
        xo,
        magnitudes,
        signs,
        [(range(2), None, _odd_scales(builder, scales, 0)), (range(2, 4), None, _odd_scales(builder, scales, 4))],
    )


_IQ3_S_LEVELS, _IQ3_S_NIBBLES = _nibble_codes(gq.IQ3_S)  # levels 1, 3, .., 15


def _iq3_s_vbmi(context, builder, signature, args, target):
    """IQ3_S (layout in _iq3_s_block_isum) as IQ3_XXS (_iq3_xxs_vbmi, the same activation order):
    byte j of qword k of the 64 bytes at wo+2 is the low byte of sub-block k's entry j's index, its
    ninth bit is bit 8k + j of the u64 qh at wo+66 (a mask as it is); the sign bytes and the scales
    (a nibble per sub-block) from the block's last 64 bytes (wo+46: qh at 20, signs at 28, scales
    at 60; one load, all of it defined: an insert into a vector with undefined lanes let LLVM pick
    the row's float accumulator as their register, and each block waited for the one before)."""
    wt, xt, w, wo, x, xo = signature.args[0], signature.args[2], *args[:4]
    q = _load_bytes(context, builder, wt, w, _add_offset(builder, wo, 2), 64)
    rest = _load_bytes(context, builder, wt, w, _add_offset(builder, wo, 46), 64)
    ninth = builder.bitcast(
        _load_bytes(context, builder, wt, w, _add_offset(builder, wo, 66), 8), _vec(ir.IntType(1), 64)
    )
    nibbles = [builder.bitcast(_code_bytes(builder, q, table, ninth), _vec(I16, 32)) for table in _IQ3_S_NIBBLES]
    signs = _sign_bytes(builder, rest, [28 + g for g in range(32)])
    scale_nibbles = _byte_qwords(builder, rest, [60 + k // 2 for k in range(8)])  # sub-block k's: nibble k % 2
    scales = _odd_scales(builder, scale_nibbles, [4 * (k % 2) for k in range(8)])
    return _group_major_isum(
        context,
        builder,
        xt,
        x,
        xo,
        _nibble_levels(builder, nibbles, _IQ3_S_LEVELS),
        signs,
        [(range(4), None, scales)],
        sign_bit=lambda c, j: 8 * (j // 2) + 4 * (j % 2) + c,
    )


def _grid_generators(name, block_isum, vbmi_block_isum, gathering=False):
    """An IQ grid type's generators by target (`gathering`: also the VBMI_GATHER variant)."""
    generators = {t: _grid_isum(name, block_isum, t) for t in (GENERIC, AVX2, AVX512)}
    generators[VBMI] = _grid_isum(name, vbmi_block_isum, VBMI)
    if gathering:
        generators[VBMI_GATHER] = _grid_isum(name, vbmi_block_isum, VBMI_GATHER)
    return generators


IQ2_XXS_ISUM = _grid_generators("IQ2_XXS", _iq2_xxs_block_isum, _iq2_xxs_vbmi)
IQ3_XXS_ISUM = _grid_generators("IQ3_XXS", _iq3_xxs_block_isum, _iq3_xxs_vbmi)
IQ2_XS_ISUM = _grid_generators("IQ2_XS", _iq2_xs_block_isum, _iq2_xs_vbmi, gathering=True)
IQ2_S_ISUM = _grid_generators("IQ2_S", _iq2_s_block_isum, _iq2_s_vbmi, gathering=True)
IQ3_S_ISUM = _grid_generators("IQ3_S", _iq3_s_block_isum, _iq3_s_vbmi)
iq2_xxs_isum, iq3_xxs_isum = _for_this_cpu(IQ2_XXS_ISUM), _for_this_cpu(IQ3_XXS_ISUM)
iq2_xs_isum, iq2_s_isum, iq3_s_isum = _for_this_cpu(IQ2_XS_ISUM), _for_this_cpu(IQ2_S_ISUM), _for_this_cpu(IQ3_S_ISUM)


def _iq1_vbmi_isum(context, builder, signature, args, v, index_bits, delta, groups):
    """An IQ1 block from <8 x i64> v (qword k: sub-block k's four qs bytes at bits 0..31, the
    high index bits of its group j at bit 32 + index_bits * j): group-major chunk j's delta-table
    entries gathered at the qs byte plus those bits from bit 8 on (IQ1_M: the delta bit among
    them), plus `delta` (IQ1_S: the delta bit at bit 11 of each qword, or None); groups(-9 * the
    Q8_K block sums): the _group_major_isum groups (the start takes 9 * scale * x off,
    IQ1_ISUM_DOC)."""
    (g_ptr,) = _data(context, builder, signature, args, 4)
    v8 = builder.bitcast(v, _vec(I8, 64))
    mask = _splat(I64, 8, (1 << (8 + index_bits)) - 1)

    def indices(j):
        fields = _multishift(builder, v8, [8 * j, 32 + index_bits * j] + [0] * 6)
        index = builder.and_(builder.bitcast(fields, v.type), mask)
        return index if delta is None else builder.or_(index, delta)

    sums = _block_sums(context, builder, signature.args[5], args[5], args[6])
    return _group_major_isum(
        context,
        builder,
        signature.args[2],
        args[2],
        args[3],
        lambda j: _gathered(builder, g_ptr, indices(j)),
        None,
        groups(builder.mul(sums, _splat(I32, 16, -9))),
    )


def _iq1_s_vbmi(context, builder, signature, args, target):
    """IQ1_S (layout in _iq1_s_block_isum): qword k = sub-block k's four qs bytes and its u16 qh:
    the delta bit (qh bit 15, qword bit 47) goes to index bit 11, the scale (qh bits 12..14,
    qword bits 44..46) weighs all four chunks."""
    wt, w, wo = signature.args[0], args[0], args[1]
    qs = _load_bytes(context, builder, wt, w, _add_offset(builder, wo, 2), 32)
    qh = _load_bytes(context, builder, wt, w, _add_offset(builder, wo, 34), 16)
    v = _qwords(
        builder,
        qs,
        _concat(builder, qh, qh),
        [[4 * k + b for b in range(4)] + [32 + 2 * k, 33 + 2 * k] * 2 for k in range(8)],
    )
    delta = builder.and_(builder.lshr(v, _splat(I64, 8, 47 - 11)), _splat(I64, 8, 0x800))
    scale = builder.or_(builder.and_(builder.lshr(v, _splat(I64, 8, 43)), _splat(I64, 8, 0xE)), _splat(I64, 8, 1))
    return _iq1_vbmi_isum(context, builder, signature, args, v, 3, delta, lambda start: [(range(4), start, scale)])


def _iq1_m_vbmi(context, builder, signature, args, target):
    """IQ1_M (layout in _iq1_m_block_isum): qword k = sub-block k's four qs bytes, its two qh bytes
    (group j's nibble, delta bit included, at bit 32 + 4j) and the u16 holding its two scales
    (16-value halves h = j // 2, 3 bits each at bit 48 + 6 (k % 2) + 3h)."""
    wt, w, wo = signature.args[0], args[0], args[1]
    head = _load_bytes(context, builder, wt, w, wo, 32)  # qs
    tail = _load_bytes(context, builder, wt, w, _add_offset(builder, wo, 24), 32)  # block bytes 24..55
    v = _qwords(
        builder,
        head,
        tail,
        [
            [4 * k + b for b in range(4)] + [40 + 2 * k, 41 + 2 * k, 56 + 2 * (k // 2), 57 + 2 * (k // 2)]
            for k in range(8)
        ],
    )
    fields = _multishift(
        builder,
        builder.bitcast(v, _vec(I8, 64)),
        [o + 6 * (k % 2) for k in range(8) for o in (48, 0, 0, 0, 51, 0, 0, 0)],
    )
    odd = builder.or_(
        builder.shl(builder.and_(builder.bitcast(fields, _vec(I32, 16)), _splat(I32, 16, 7)), _splat(I32, 16, 1)),
        _splat(I32, 16, 1),
    )
    scales = builder.bitcast(odd, v.type)  # qword k: half 0's scale, half 1's in the high dword

    def groups(start):  # start's qword k: halves 0 and 1 of sub-block k
        start = builder.bitcast(start, v.type)
        return [
            (range(2), builder.and_(start, _splat(I64, 8, 0xFFFFFFFF)), scales),
            (range(2, 4), builder.lshr(start, _splat(I64, 8, 32)), builder.lshr(scales, _splat(I64, 8, 32))),
        ]

    return _iq1_vbmi_isum(context, builder, signature, args, v, 4, None, groups)


IQ1_S_ISUM = {
    **{t: _iq1_isum("IQ1_S", "sub-block (qh bit 15)", _iq1_s_block_isum, t) for t in (GENERIC, AVX2, AVX512)},
    VBMI: _iq1_isum("IQ1_S", "sub-block (qh bit 15)", _iq1_s_vbmi, VBMI),
}
IQ1_M_ISUM = {
    **{
        t: _iq1_isum("IQ1_M", "8-value group (bit 3 of its qh nibble)", _iq1_m_block_isum, t)
        for t in (GENERIC, AVX2, AVX512)
    },
    VBMI: _iq1_isum("IQ1_M", "8-value group (bit 3 of its qh nibble)", _iq1_m_vbmi, VBMI),
}
iq1_s_isum, iq1_m_isum = _for_this_cpu(IQ1_S_ISUM), _for_this_cpu(IQ1_M_ISUM)


@intrinsic
def iq1_m_scale_bits(typingctx, w, wo):
    """The bits of an IQ1_M block's fp16 d: the top nibbles of its four scale words at w[wo + 48],
    the low word's first.  Taken in vector registers from the bytes at wo + 24 (the load
    iq1_m_isum makes too): read as an integer, LLVM extracted the four bytes one vpextrb each."""
    if w.dtype != types.uint8:
        return None
    sig = types.uint16(w, wo)

    def codegen(context, builder, signature, args):
        v = _load_bytes(context, builder, signature.args[0], args[0], _add_offset(builder, args[1], 24), 32)
        low = builder.lshr(_shuffle(builder, v, v, [25, 29]), _splat(I8, 2, 4))  # words 0, 2: bits 12..15
        high = builder.and_(_shuffle(builder, v, v, [27, 31]), _splat(I8, 2, 0xF0))  # words 1, 3
        return builder.bitcast(builder.or_(low, high), I16)

    return sig, codegen


def _nibble_table_block_dot(context, builder, signature, args, target):
    """32 values table[nibble] (the 16 low nibbles of w[wo:wo+16] are values 0..15, the high ones
    16..31) dotted with x[xo:xo+32].  x86: pshufb looks the values up in registers, as two
    tables: magnitudes (unsigned) and sign masks, the signs applied to x ((x ^ m) - m, which
    needs x > -128: Q8_0 activations are), then pmaddubsw and pmaddwd."""
    w, wo, x, xo, table = args
    wt, xt, tt = signature.args[0], signature.args[2], signature.args[4]
    q = _load_bytes(context, builder, wt, w, wo, 16)
    nibbles = _concat(builder, builder.and_(q, _splat(I8, 16, 15)), builder.lshr(q, _splat(I8, 16, 4)))
    values16 = _load_bytes(context, builder, tt, table, ir.Constant(I32, 0), 16)
    xv = _load_bytes(context, builder, xt, x, xo, 32)
    if target == GENERIC:
        values = ir.Constant(_vec(I8, 32), None)
        for j in range(32):
            v = builder.extract_element(values16, builder.extract_element(nibbles, ir.Constant(I32, j)))
            values = builder.insert_element(values, v, ir.Constant(I32, j))
        return _reduce_add(builder, builder.mul(builder.sext(values, _vec(I32, 32)), builder.sext(xv, _vec(I32, 32))))
    table32 = _concat(builder, values16, values16)  # pshufb looks up within 16-byte lanes
    negative = builder.icmp_signed("<", table32, _splat(I8, 32, 0))
    magnitudes = builder.select(negative, builder.neg(table32), table32)
    masks = builder.sext(negative, _vec(I8, 32))
    mag = _call(builder, "llvm.x86.avx2.pshuf.b", _vec(I8, 32), magnitudes, nibbles)
    m = _call(builder, "llvm.x86.avx2.pshuf.b", _vec(I8, 32), masks, nibbles)
    signed_x = builder.sub(builder.xor(xv, m), m)
    return _reduce_add(builder, _madd(builder, mag, signed_x, _splat(I16, 16, 1)))


def _table_intrinsic(block_dot, target: str, doc: str):
    """An intrinsic (w, wo, x, xo, table) -> int32 whose values are table[nibble] (table: int8
    [16]), its code from block_dot for `target`."""

    @intrinsic
    def table_dot(typingctx, w, wo, x, xo, table):
        if w.dtype != types.uint8 or x.dtype != types.int8 or table.dtype != types.int8:
            return None
        sig = types.int32(w, wo, x, xo, table)

        def codegen(context, builder, signature, args):
            return block_dot(context, builder, signature, args, target)

        return sig, codegen

    table_dot.__doc__ = doc
    return table_dot


NIBBLE_TABLE_DOT = {
    target: _table_intrinsic(
        _nibble_table_block_dot,
        target,
        """Exact int32 dot of a 32-value
    block whose values are table[nibble] (IQ4_NL, IQ4_XS, MXFP4: table int8 [16], |value| <= 127)
    with the int8 activation x[xo:xo+32] (each > -128, as Q8_0's are); the 16 nibble bytes at
    w[wo].""",
    )
    for target in (GENERIC, AVX2, AVX512)
}
nibble_table_dot = _for_this_cpu(NIBBLE_TABLE_DOT)


def _iq4_xs_scales(context, builder, wt, w, wo):
    """IQ4_XS's eight signed sub-block scales as <8 x i16>: 6 bits each, the low four from the
    nibbles of w[wo+4:wo+8] (sub-block 2k: low nibble of byte k), the high two from the u16 at
    w[wo+2] (bits 2ib, 2ib + 1), minus 32."""
    low = builder.zext(_load_bytes(context, builder, wt, w, _add_offset(builder, wo, 4), 4), _vec(I16, 4))
    low = builder.lshr(
        _shuffle(builder, low, low, [ib // 2 for ib in range(8)]),
        ir.Constant(_vec(I16, 8), [4 * (ib % 2) for ib in range(8)]),
    )
    high = builder.bitcast(_load_bytes(context, builder, wt, w, _add_offset(builder, wo, 2), 2), _vec(I16, 1))
    high = builder.lshr(_shuffle(builder, high, high, [0] * 8), ir.Constant(_vec(I16, 8), [2 * ib for ib in range(8)]))
    six = builder.or_(
        builder.and_(low, _splat(I16, 8, 15)), builder.shl(builder.and_(high, _splat(I16, 8, 3)), _splat(I16, 8, 4))
    )
    return builder.sub(six, _splat(I16, 8, 32))


def _iq4_xs_block_isum(context, builder, signature, args, target):
    """sum over the eight sub-blocks ib of scale_ib * (32 values table[nibble] . x): the
    sub-block's 16 nibble bytes at w[wo+8+16ib] (low nibbles values 0..15, high 16..31).
    AVX-512: four sub-blocks per 64-byte vector, their low and high nibbles looked up by pshufb
    (magnitudes, sign masks), the activation's 128 bytes rearranged to match (16-byte lanes),
    pmaddubsw, then one pmaddwd by the sub-blocks' scale words; one reduction per block."""
    w, wo, x, xo, table = args
    wt, xt, tt = signature.args[0], signature.args[2], signature.args[4]
    scales = _iq4_xs_scales(context, builder, wt, w, wo)
    if target != AVX512:  # one 32-value dot per sub-block (_nibble_table_block_dot)
        total = ir.Constant(I32, 0)
        for ib in range(8):
            dot = _nibble_table_block_dot(
                context,
                builder,
                signature,
                [w, _add_offset(builder, wo, 8 + 16 * ib), x, _add_offset(builder, xo, 32 * ib), table],
                target,
            )
            scale = builder.sext(builder.extract_element(scales, ir.Constant(I32, ib)), I32)
            total = builder.add(total, builder.mul(scale, dot))
        return total
    values16 = _load_bytes(context, builder, tt, table, ir.Constant(I32, 0), 16)
    table64 = _shuffle(builder, values16, values16, [i % 16 for i in range(64)])  # pshufb looks up per 16-byte lane
    negative = builder.icmp_signed("<", table64, _splat(I8, 64, 0))
    magnitudes = builder.select(negative, builder.neg(table64), table64)
    masks = builder.sext(negative, _vec(I8, 64))
    total = None
    for h in range(2):  # sub-blocks 4h .. 4h + 3
        q = _load_bytes(context, builder, wt, w, _add_offset(builder, wo, 8 + 64 * h), 64)
        x0 = _load_bytes(context, builder, xt, x, _add_offset(builder, xo, 128 * h), 64)
        x1 = _load_bytes(context, builder, xt, x, _add_offset(builder, xo, 128 * h + 64), 64)
        words = _shuffle(builder, scales, scales, [4 * h + k // 8 for k in range(32)])  # word k: sub-block 4h + k // 8
        for shift, half in ((0, 0), (4, 16)):  # low nibbles: values 0..15 of each sub-block; high: 16..31
            nibbles = builder.and_(builder.lshr(q, _splat(I8, 64, shift)) if shift else q, _splat(I8, 64, 15))
            lanes = [32 * (k % 2) + 64 * (k // 2) + half + i for k in range(4) for i in range(16)]
            xv = _shuffle(builder, x0, x1, lanes)  # sub-block k's values half .. half + 15
            mag = _call(builder, "llvm.x86.avx512.pshuf.b.512", _vec(I8, 64), magnitudes, nibbles)
            m = _call(builder, "llvm.x86.avx512.pshuf.b.512", _vec(I8, 64), masks, nibbles)
            part = _madd(builder, mag, builder.sub(builder.xor(xv, m), m), words)
            total = part if total is None else builder.add(total, part)
    return _reduce_add(builder, total)


IQ4_XS_ISUM = {
    target: _table_intrinsic(
        _iq4_xs_block_isum,
        target,
        """Exact int32 sum of an IQ4_XS
    super-block's 256 values table[nibble] times their signed 6-bit sub-block scale times the int8
    activation x[xo:xo+256] (each > -128, as Q8_K's are); the block (fp16 d, scales, 128 nibble
    bytes) starts at w[wo].""",
    )
    for target in (GENERIC, AVX2, AVX512)
}
iq4_xs_isum = _for_this_cpu(IQ4_XS_ISUM)


# ---- decoded rows: int16 weights . int8 activation ----------------------------------------------


def _words_dot(context, builder, signature, args, target, span):
    """Exact int32 sum of ws[wo:wo+span] (int16) times x[xo:xo+span] (int8): x86 in pmaddwd steps
    of 32 (AVX-512) or 16 (AVX2) values into one int32 vector, one reduction at the end (LLVM's
    own vectorization of the scalar loop used 16-byte vectors: 1.5x slower per 256 values alone,
    1.35-2.4x in the decoded-route matmuls).  Each product is at most 2^22 in size, 256 of them sum below 2^31:
    exact for every input."""
    xt = signature.args[2]
    _, wo, x, xo = args
    (w_ptr,) = _data(context, builder, signature, args, 0)
    n = {GENERIC: span, AVX2: 16, AVX512: 32}[target]
    total = None
    for k in range(0, span, n):
        w = builder.load(
            builder.bitcast(builder.gep(w_ptr, [_add_offset(builder, wo, k)]), _vec(I16, n).as_pointer()), align=2
        )
        xv = builder.sext(_load_bytes(context, builder, xt, x, _add_offset(builder, xo, k), n), _vec(I16, n))
        if target == GENERIC:
            part = builder.mul(builder.sext(w, _vec(I32, n)), builder.sext(xv, _vec(I32, n)))
        else:
            name = "avx512.pmaddw.d.512" if n == 32 else "avx2.pmadd.wd"
            part = _call(builder, f"llvm.x86.{name}", _vec(I32, n // 2), w, xv)
        total = part if total is None else builder.add(total, part)
    return _reduce_add(builder, total)


def _words_dot_intrinsic(span: int, target: str):
    @intrinsic
    def words_dot(typingctx, ws, wo, x, xo):
        if ws.dtype != types.int16 or x.dtype != types.int8 or ws.layout != "C" or x.layout != "C":
            return None
        sig = types.int32(ws, wo, x, xo)

        def codegen(context, builder, signature, args):
            return _words_dot(context, builder, signature, args, target, span)

        return sig, codegen

    words_dot.__doc__ = (
        f"Exact int32 dot of int16 weights ws[wo:wo+{span}] (a decoded row: quant x integer "
        f"sub-block scale) with the int8 activation x[xo:xo+{span}] (both contiguous)."
    )
    return words_dot


# per span of values (256: a super-block; 64 and 128: the steps of ggml's repacked Q4_K/Q2_K gemm)
WORDS_DOT = {
    span: {target: _words_dot_intrinsic(span, target) for target in (GENERIC, AVX2, AVX512)} for span in (64, 128, 256)
}
dot64, dot128, dot256 = (_for_this_cpu(WORDS_DOT[span]) for span in (64, 128, 256))


# ---- tiles: sixteen rows interleaved, each token a broadcast -----------------------------------
# A batch of tokens against 16 rows without a horizontal sum per row and token: the rows' values
# are laid out once per block so that one 64-byte vector holds four consecutive values of each of
# the 16 rows (q4_k_tile16, q5_k_tile16, q6_k_tile16 from the quant bytes, a gather per vector;
# int8_tile16 from values a row decoder wrote), then per token every vpdpbusd takes one such
# vector and four activation bytes broadcast to all rows; its 16 int32 lanes are the 16 rows'
# sums, and the float steps run on 16 rows at once in each llama.cpp route's own rounding
# (q4_k_tile16_dot for Q4_K/Q5_K, q6_k_tile16_dot, int8_tile16_dot).  On a Xeon VM: a Q4_K 2048 x
# 4096 matmul of 64 tokens 23.4 -> 2.7 ms (docs/kernels.md).

TILE_ROWS = 16
# the tile route needs vpdpbusd (AVX-512 VNNI: with VBMI on every CPU that has both, Ice Lake and
# Zen 4 on); elsewhere matmul keeps the decoded rows
TILES = TARGET == VBMI


def _tile_io(context, builder, signature, args, target):
    """For a tile generator with args (w, wo, stride, n_rows, out, oo): gather(k) -> <16 x i32> of
    the dwords at w[wo + k + i * stride] for rows i = 0..15 (vpgatherdd; rows from n_rows on read
    row n_rows - 1 again: a group's last tile may be partial), store(v, dwords) -> writes tile
    vector v (64 bytes at out[oo + 64 v])."""
    _, wo, stride, n_rows, _, oo = args
    w_ptr, out_ptr = _data(context, builder, signature, args, 0, 4)
    stride32, last = (builder.trunc(v, I32) if v.type.width > 32 else v for v in (stride, n_rows))
    lanes = ir.Constant(_vec(I32, 16), list(range(16)))
    last_row = _broadcast(builder, builder.sub(last, ir.Constant(I32, 1)), 16)
    row_of_lane = builder.select(builder.icmp_unsigned("<", lanes, last_row), lanes, last_row)
    rows = builder.mul(_broadcast(builder, stride32, 16), row_of_lane)

    def gather(k):
        base = builder.gep(w_ptr, [_add_offset(builder, wo, k)])
        if target == GENERIC:
            words = ir.Constant(_vec(I32, 16), None)
            for i in range(16):
                at = builder.gep(base, [builder.extract_element(rows, ir.Constant(I32, i))])
                words = builder.insert_element(
                    words, builder.load(builder.bitcast(at, I32.as_pointer()), align=1), ir.Constant(I32, i)
                )
            return words
        return _call(
            builder,
            "llvm.x86.avx512.mask.gather.dpi.512",
            _vec(I32, 16),
            ir.Constant(_vec(I32, 16), None),
            base,
            rows,
            ir.Constant(_vec(ir.IntType(1), 16), [1] * 16),
            ir.Constant(I32, 1),
        )

    def store(v, dwords):
        at = builder.gep(out_ptr, [_add_offset(builder, oo, 64 * v)])
        builder.store(dwords, builder.bitcast(at, _vec(I32, 16).as_pointer()), align=1)

    return gather, store


def _vector_at(builder, ptr, offset, ty):
    return builder.load(builder.bitcast(builder.gep(ptr, [offset]), ty.as_pointer()), align=1)


def _tile_sums(context, builder, target, t_ptr, xt, x, xo, first, count):
    """<16 x i32>: per row of the tile, the exact sum over tile vectors first .. first + count - 1
    (four unsigned values each) times the activation bytes x[xo + 4 (v - first) ..], four at a
    time broadcast to every row (vpdpbusd)."""
    sums = ir.Constant(_vec(I32, 16), None)
    for k in range(count):
        q = _vector_at(builder, t_ptr, ir.Constant(I32, 64 * (first + k)), _vec(I8, 64))
        x4 = builder.bitcast(_load_bytes(context, builder, xt, x, _add_offset(builder, xo, 4 * k), 4), I32)
        xb = builder.bitcast(_broadcast(builder, x4, 16), _vec(I8, 64))
        if target == GENERIC:
            products = builder.mul(builder.zext(q, _vec(I32, 64)), builder.sext(xb, _vec(I32, 64)))
            for j in range(4):
                sums = builder.add(sums, _pick(builder, products, range(j, 64, 4)))
        else:
            sums = _vnni_dots(builder, sums, q, xb)
    return sums


def _q4_k_tile16(context, builder, signature, args, target):
    """Vector 8 * (2h + s) + k of the tile (64 bytes at out[oo:], row i at bytes 4i..4i+3): the
    values 4k..4k+3 of sub-block 2h + s of each row's block at wo (the low nibbles of quant bytes
    32h + 4k .. +3, at wo + 16 on, for s = 0, the high ones for s = 1)."""
    gather, store = _tile_io(context, builder, signature, args, target)
    low = _splat(I32, 16, 0x0F0F0F0F)
    for h in range(4):
        for k in range(8):
            words = gather(16 + 32 * h + 4 * k)
            store(8 * (2 * h) + k, builder.and_(words, low))
            store(8 * (2 * h + 1) + k, builder.and_(builder.lshr(words, _splat(I32, 16, 4)), low))
    return context.get_dummy_value()


def _q5_k_tile16(context, builder, signature, args, target):
    """As _q4_k_tile16 for Q5_K, the block at wo (qh at wo + 16, qs at wo + 48): each value's
    fifth bit from qh, bit 2h + s of byte l for value l of sub-block 2h + s."""
    gather, store = _tile_io(context, builder, signature, args, target)
    low, one, four = _splat(I32, 16, 0x0F0F0F0F), _splat(I32, 16, 0x01010101), _splat(I32, 16, 4)
    for h in range(4):
        for k in range(8):
            words, high = gather(48 + 32 * h + 4 * k), gather(16 + 4 * k)
            for s, nibbles in enumerate((words, builder.lshr(words, four))):
                bits = builder.and_(builder.lshr(high, _splat(I32, 16, 2 * h + s)), one)
                store(8 * (2 * h + s) + k, builder.or_(builder.and_(nibbles, low), builder.shl(bits, four)))
    return context.get_dummy_value()


def _q6_k_tile16(context, builder, signature, args, target):
    """Tile vector 32n + 8c + k (64 bytes, row i at bytes 4i..4i+3): the unsigned 6-bit values
    128n + 32c + 4k .. +3 of each row (ql at wo, qh at wo + 128: ggml's layout)."""
    gather, store = _tile_io(context, builder, signature, args, target)
    low, two, four = _splat(I32, 16, 0x0F0F0F0F), _splat(I32, 16, 0x03030303), _splat(I32, 16, 4)
    for n in range(2):
        for k in range(8):
            a, b, high = gather(64 * n + 4 * k), gather(64 * n + 32 + 4 * k), gather(128 + 32 * n + 4 * k)
            for c, nibbles in enumerate((a, b, builder.lshr(a, four), builder.lshr(b, four))):
                bits = builder.and_(builder.lshr(high, _splat(I32, 16, 2 * c)), two)
                store(32 * n + 8 * c + k, builder.or_(builder.and_(nibbles, low), builder.shl(bits, four)))
    return context.get_dummy_value()


def _q4_k_tile16_dot(context, builder, signature, args, target):
    tile, x, xo, scales, mins, bsums, bo, dw, dmin, dx, acc, ao, order = args
    t_ptr, s_ptr, m_ptr, b_ptr, dw_ptr, dmin_ptr, acc_ptr = _data(
        context, builder, signature, args, 0, 3, 4, 5, 7, 8, 10
    )
    xt = signature.args[1]
    isums, summs = [], []
    for h in range(4):  # 64-value steps: sub-blocks 2h, 2h + 1
        isum = None
        for s in range(2):
            sums = _tile_sums(
                context, builder, target, t_ptr, xt, x, _add_offset(builder, xo, 64 * h + 32 * s), 8 * (2 * h + s), 8
            )
            part = builder.mul(sums, _vector_at(builder, s_ptr, ir.Constant(I32, 16 * (2 * h + s)), _vec(I32, 16)))
            isum = part if isum is None else builder.add(isum, part)
        isums.append(isum)
        # the mins: words (m[2h], m[2h+1]) per row times the token's two block-sum pairs
        pair = [
            builder.add(
                *(builder.load(builder.gep(b_ptr, [_add_offset(builder, bo, 4 * h + 2 * e + i)])) for i in range(2))
            )
            for e in range(2)
        ]
        packed = builder.or_(
            builder.and_(pair[0], ir.Constant(I32, 0xFFFF)), builder.shl(pair[1], ir.Constant(I32, 16))
        )
        words = builder.bitcast(_broadcast(builder, packed, 16), _vec(I16, 32))
        m = _vector_at(builder, m_ptr, ir.Constant(I32, 32 * h), _vec(I16, 32))
        if target == GENERIC:
            products = builder.mul(builder.sext(m, _vec(I32, 32)), builder.sext(words, _vec(I32, 32)))
            summs.append(builder.add(*(_pick(builder, products, range(e, 32, 2)) for e in range(2))))
        else:
            summs.append(_call(builder, "llvm.x86.avx512.pmaddw.d.512", _vec(I32, 16), m, words))

    f16x = ir.VectorType(ir.FloatType(), 16)
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f16x, [f16x] * 3), "llvm.fma.v16f32")
    zero = ir.Constant(I32, 0)
    dxs = _broadcast(builder, dx, 16)
    scale = builder.fmul(_vector_at(builder, dw_ptr, zero, f16x), dxs)
    scale_min = builder.fmul(_vector_at(builder, dmin_ptr, zero, f16x), dxs)
    at, at_min = (
        builder.bitcast(builder.gep(acc_ptr, [_add_offset(builder, ao, k)]), f16x.as_pointer()) for k in (0, 16)
    )

    isum, summ = (functools.reduce(builder.add, parts) for parts in (isums, summs))
    fisum, fsumm = builder.sitofp(isum, f16x), builder.sitofp(summ, f16x)
    dws, dmins = (_vector_at(builder, ptr, zero, f16x) for ptr in (dw_ptr, dmin_ptr))

    def chain(ptr, parts, step_scale):
        total = builder.load(ptr, align=4)
        for part in parts:
            total = builder.call(fma, [builder.sitofp(part, f16x), step_scale, total])
        builder.store(total, ptr, align=4)

    def gemm():  # ggml's repacked gemm: an FMA every 64 values, scales and mins apart
        chain(at, isums, scale)
        chain(at_min, summs, scale_min)

    def gemv():  # its repacked gemv: one per block
        chain(at, [isum], scale)
        chain(at_min, [summ], scale_min)

    def tiled():  # its tiled matmul: fma(fma(-dmin, summ, isum * dw), dx, acc)
        inner = builder.call(fma, [builder.fneg(dmins), fsumm, builder.fmul(fisum, dws)])
        builder.store(builder.call(fma, [inner, dxs, builder.load(at, align=4)]), at, align=4)

    def vec_dot():  # acc + ((dw * dx) * isum - (dmin * dx) * summ)
        step = builder.fsub(builder.fmul(scale, fisum), builder.fmul(scale_min, fsumm))
        builder.store(builder.fadd(builder.load(at, align=4), step), at, align=4)

    done, other = builder.append_basic_block("tile.done"), builder.append_basic_block("tile.vec_dot")
    switch = builder.switch(order, other)
    for route, emit in ((ORDER_GEMM, gemm), (ORDER_GEMV, gemv), (ORDER_TILED, tiled), (None, vec_dot)):
        if route is None:
            block = other
        else:
            block = builder.append_basic_block(f"tile.{emit.__name__}")
            switch.add_case(ir.Constant(order.type, route), block)
        builder.position_at_end(block)
        emit()
        builder.branch(done)
    builder.position_at_end(done)
    return context.get_dummy_value()


def _scaled_tile16_dot(context, builder, signature, args, target, shift):
    tile, x, xo, scales, bsums, bo, dw, dx, acc, ao, tiled = args
    t_ptr, s_ptr, b_ptr, dw_ptr, acc_ptr = _data(context, builder, signature, args, 0, 3, 4, 6, 8)
    isum = None
    for j in range(16):  # 16-value sub-blocks: (u - 2^shift) . x = u . x - 2^shift * (its Q8_K block sum)
        sums = _tile_sums(
            context, builder, target, t_ptr, signature.args[1], x, _add_offset(builder, xo, 16 * j), 4 * j, 4
        )
        offset = builder.shl(builder.load(builder.gep(b_ptr, [_add_offset(builder, bo, j)])), ir.Constant(I32, shift))
        centred = builder.sub(sums, _broadcast(builder, offset, 16))
        part = builder.mul(centred, _vector_at(builder, s_ptr, ir.Constant(I32, 16 * j), _vec(I32, 16)))
        isum = part if isum is None else builder.add(isum, part)
    f16x = ir.VectorType(ir.FloatType(), 16)
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f16x, [f16x] * 3), "llvm.fma.v16f32")
    at = builder.bitcast(builder.gep(acc_ptr, [ao]), f16x.as_pointer())
    total = builder.load(at, align=4)
    dws = _vector_at(builder, dw_ptr, ir.Constant(I32, 0), f16x)
    dxs = _broadcast(builder, dx, 16)
    block = builder.sitofp(isum, f16x)
    stepped = builder.select(
        _broadcast(builder, tiled, 16),
        builder.call(fma, [builder.fmul(block, dws), dxs, total]),  # ggml's tiled matmul
        builder.fadd(total, builder.fmul(builder.fmul(dws, dxs), block)),
    )  # vec_dot
    builder.store(stepped, at, align=4)
    return context.get_dummy_value()


def _tile16_intrinsic(layout, target: str, doc: str):
    @intrinsic
    def tile16(typingctx, w, wo, stride, n_rows, out, oo):
        if w.dtype != types.uint8 or out.dtype != types.uint8:
            return None
        sig = types.none(w, wo, stride, n_rows, out, oo)

        def codegen(context, builder, signature, args):
            return layout(context, builder, signature, args, target)

        return sig, codegen

    tile16.__doc__ = doc
    return tile16


def _q4_k_tile16_dot_intrinsic(target: str):
    @intrinsic
    def q4_k_tile16_dot(typingctx, tile, x, xo, scales, mins, bsums, bo, dw, dmin, dx, acc, ao, order):
        """One Q4_K/Q5_K block of a 16-row tile against one token, rounded as the llama.cpp route
        `order` (an ORDER_* of _constants) rounds it, for row i: isum, row i's exact sum of value *
        sub-block scale * activation, and summ, its sub-blocks' mins times the token's Q8_K block
        sums; ORDER_GEMM (repacked): acc[ao + i] = fma(isum, dw[i] * dx, ...) and acc[ao + 16 +
        i] = fma(summ, dmin[i] * dx, ...) over each 64 values, ORDER_GEMV the same per block;
        ORDER_TILED and ORDER_DOT as _jit.block_sum, into acc[ao + i] alone.  tile: q4_k_tile16's
        layout; x[xo:xo+256]: the token's int8 values, bsums[bo:bo+16] their block sums; scales:
        int32 [8 sub-blocks][16 rows]; mins: int16 [4 steps][16 rows][2 sub-blocks]; dw, dmin:
        float32 [16]; dx: float32."""
        if (
            tile.dtype != types.uint8
            or x.dtype != types.int8
            or scales.dtype != types.int32
            or mins.dtype != types.int16
            or bsums.dtype != types.int32
            or acc.dtype != types.float32
            or not isinstance(order, types.Integer)
        ):
            return None
        sig = types.none(tile, x, xo, scales, mins, bsums, bo, dw, dmin, dx, acc, ao, order)

        def codegen(context, builder, signature, args):
            return _q4_k_tile16_dot(context, builder, signature, args, target)

        return sig, codegen

    return q4_k_tile16_dot


def _scaled_tile16_dot_intrinsic(target: str, name: str, shift: int):
    @intrinsic
    def scaled_tile16_dot(typingctx, tile, x, xo, scales, bsums, bo, dw, dx, acc, ao, tiled):
        if (
            tile.dtype != types.uint8
            or x.dtype != types.int8
            or scales.dtype != types.int32
            or bsums.dtype != types.int32
            or acc.dtype != types.float32
            or not isinstance(tiled, types.Boolean)
        ):
            return None
        sig = types.none(tile, x, xo, scales, bsums, bo, dw, dx, acc, ao, tiled)

        def codegen(context, builder, signature, args):
            return _scaled_tile16_dot(context, builder, signature, args, target, shift)

        return sig, codegen

    scaled_tile16_dot.__doc__ = f"""One block of a 16-row {name} tile against one token: acc[ao + i] takes
    row i's exact block sum isum (of (u - {1 << shift}) * integer scale of its 16 values *
    activation) as ggml's tiled matmul rounds it, fma(isum * dw[i], dx, acc) (tiled true), or as
    its vec_dot, acc + (dw[i] * dx) * isum.  tile: 256 unsigned values u per row, four per row
    per 64-byte vector; x[xo:xo+256]: the token's int8 values, bsums[bo:bo+16] their Q8_K block
    sums; scales: int32 [16 sub-blocks][16 rows]; dw: float32 [16]; dx: float32."""
    return scaled_tile16_dot


def _int8_tile16(context, builder, signature, args, target):
    """Tile vector v (64 bytes, row i at bytes 4i..4i+3): the int8 values 4v..4v+3 of each row
    (at w[wo + i * stride]) plus 128, as unsigned bytes."""
    gather, store = _tile_io(context, builder, signature, args, target)
    for v in range(64):
        store(v, builder.xor(gather(4 * v), _splat(I32, 16, 0x80808080)))
    return context.get_dummy_value()


TILE_TARGETS = (GENERIC, VBMI)
Q4_K_TILE16 = {
    target: _tile16_intrinsic(
        _q4_k_tile16,
        target,
        """Lay out the quants of one Q4_K block of 16
    rows (the blocks at w[wo + i * stride] for row i < n_rows; the rest repeat the last) as a tile at
    out[oo:oo+4096] for q4_k_tile16_dot.""",
    )
    for target in TILE_TARGETS
}
Q5_K_TILE16 = {
    target: _tile16_intrinsic(
        _q5_k_tile16,
        target,
        """Lay out the quants of one Q5_K block of 16
    rows (the blocks at w[wo + i * stride] for row i) as a tile at out[oo:oo+4096] for
    q4_k_tile16_dot.""",
    )
    for target in TILE_TARGETS
}
Q6_K_TILE16 = {
    target: _tile16_intrinsic(
        _q6_k_tile16,
        target,
        """Lay out the quants of one Q6_K block of 16
    rows (ql, qh: the 192 bytes at w[wo + i * stride] for row i) as a tile at out[oo:oo+4096] for
    q6_k_tile16_dot.""",
    )
    for target in TILE_TARGETS
}
INT8_TILE16 = {
    target: _tile16_intrinsic(
        _int8_tile16,
        target,
        """Lay out 256 int8 values of each of 16 rows
    (decoded weights at w[wo + i * stride] for row i) as a tile at out[oo:oo+4096] for
    int8_tile16_dot.""",
    )
    for target in TILE_TARGETS
}
Q4_K_TILE16_DOT = {target: _q4_k_tile16_dot_intrinsic(target) for target in TILE_TARGETS}
Q6_K_TILE16_DOT = {target: _scaled_tile16_dot_intrinsic(target, "Q6_K", 5) for target in TILE_TARGETS}
INT8_TILE16_DOT = {target: _scaled_tile16_dot_intrinsic(target, "int8", 7) for target in TILE_TARGETS}
q4_k_tile16, q4_k_tile16_dot = _for_this_cpu(Q4_K_TILE16), _for_this_cpu(Q4_K_TILE16_DOT)
q5_k_tile16 = _for_this_cpu(Q5_K_TILE16)
q6_k_tile16, q6_k_tile16_dot = _for_this_cpu(Q6_K_TILE16), _for_this_cpu(Q6_K_TILE16_DOT)
int8_tile16, int8_tile16_dot = _for_this_cpu(INT8_TILE16), _for_this_cpu(INT8_TILE16_DOT)


# ---- legacy 32-value blocks: a whole row . token in llama.cpp's eight FMA lanes -------------

# block layout per type: bytes per block, offset of the f16 min (None: no min), offset of the
# u32 of 5th bits (None: 4-bit), offset of the quants, value offset subtracted (signed types)
LEGACY_BLOCKS = {
    "q8_0": (Q8_0_BYTES, None, None, 2, 0),
    "q4_0": (Q4_0_BYTES, None, None, 2, 8),
    "q5_0": (Q5_0_BYTES, None, 2, 6, 16),
    "q4_1": (Q4_1_BYTES, 2, None, 4, 0),
    "q5_1": (Q5_1_BYTES, 2, 4, 8, 0),
}


def _legacy_values(context, builder, row_ptr, o, kind, with_offset=True):
    """The 32 values of the legacy block at byte o of the row, as <32 x i8> (ggml order: the
    low nibbles are values 0..15, the high ones 16..31; 5th bits from a u32, bit j for value j);
    with_offset=False: Q4_0/Q5_0's unsigned quants, before their offset (8, 16) comes off."""
    size, min_at, high_at, quants_at, offset = LEGACY_BLOCKS[kind]
    at = lambda k: builder.gep(row_ptr, [builder.add(o, ir.Constant(o.type, k))])  # noqa: E731
    if kind == "q8_0":
        return builder.load(builder.bitcast(at(quants_at), _vec(I8, 32).as_pointer()), align=1)
    q = builder.load(builder.bitcast(at(quants_at), _vec(I8, 16).as_pointer()), align=1)
    values = _concat(builder, builder.and_(q, _splat(I8, 16, 15)), builder.lshr(q, _splat(I8, 16, 4)))
    if high_at is not None:
        # byte j of the 4 takes values 8j..8j+7: spread each byte over its 8 values, test its bit
        bits = builder.load(builder.bitcast(at(high_at), _vec(I8, 4).as_pointer()), align=1)
        spread = _pick(builder, bits, [j // 8 for j in range(32)])
        masks = ir.Constant(_vec(I8, 32), [1 << (j % 8) for j in range(32)])
        set_ = builder.icmp_unsigned("!=", builder.and_(spread, masks), _splat(I8, 32, 0))
        values = builder.or_(values, builder.select(set_, _splat(I8, 32, 16), _splat(I8, 32, 0)))
    return builder.sub(values, _splat(I8, 32, offset)) if offset and with_offset else values


def _legacy_quads(builder, w, xv, kind, target):
    """<8 x i32>: lane l = sum of w[i] * x[i] over values 4l .. 4l+3 of a 32-value block."""
    signed = kind in ("q8_0", "q4_0", "q5_0")
    if target == GENERIC:
        products = builder.mul(
            (builder.sext if signed else builder.zext)(w, _vec(I32, 32)), builder.sext(xv, _vec(I32, 32))
        )
        quads = None
        for j in range(4):
            part = _pick(builder, products, [4 * lane + j for lane in range(8)])
            quads = part if quads is None else builder.add(quads, part)
        return quads
    if signed:  # pmaddubsw wants the weight unsigned: |w| times x with w's sign (psignb)
        xv = _call(builder, "llvm.x86.avx2.psign.b", _vec(I8, 32), xv, w)
        w = _call(builder, "llvm.abs.v32i8", _vec(I8, 32), w, ir.Constant(ir.IntType(1), 0))
    return _madd(builder, w, xv, _splat(I16, 16, 1))


def _tree_sum8(builder, v):
    """ggml's horizontal sum of 8 floats: ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7))."""
    e = [builder.extract_element(v, ir.Constant(I32, i)) for i in range(8)]
    return builder.fadd(
        builder.fadd(builder.fadd(e[0], e[4]), builder.fadd(e[2], e[6])),
        builder.fadd(builder.fadd(e[1], e[5]), builder.fadd(e[3], e[7])),
    )


def _legacy_dot(context, builder, signature, args, kind, target):
    row, x, dx, sx, nb = args
    rowt, xt, dxt, sxt = signature.args[:4]
    size, min_at = LEGACY_BLOCKS[kind][:2]
    row_ptr = context.make_array(rowt)(context, builder, value=row).data
    x_ptr = context.make_array(xt)(context, builder, value=x).data
    dx_ptr = context.make_array(dxt)(context, builder, value=dx).data
    sx_ptr = context.make_array(sxt)(context, builder, value=sx).data
    f32, v8f = ir.FloatType(), _vec(ir.FloatType(), 8)
    lanes = cgutils.alloca_once_value(builder, ir.Constant(v8f, [0.0] * 8))
    mins = cgutils.alloca_once_value(builder, ir.Constant(f32, 0.0))
    fma8 = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8f, [v8f] * 3), "llvm.fma.v8f32")
    fma1 = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32] * 3), "llvm.fma.f32")
    half = lambda o: context.compile_internal(  # noqa: E731
        builder,
        _half_at_scalar,
        types.float32(types.uint8, types.uint8),
        [builder.load(builder.gep(row_ptr, [o])), builder.load(builder.gep(row_ptr, [_add_offset(builder, o, 1)]))],
    )
    with cgutils.for_range(builder, nb) as loop:
        b = loop.index
        o = builder.mul(b, ir.Constant(b.type, size))
        _prefetch(builder, row_ptr, _add_offset(builder, o, PREFETCH_AHEAD))
        w = _legacy_values(context, builder, row_ptr, o, kind)
        x_at = builder.gep(x_ptr, [builder.mul(b, ir.Constant(b.type, 32))])
        xv = builder.load(builder.bitcast(x_at, _vec(I8, 32).as_pointer()), align=1)
        quads = _legacy_quads(builder, w, xv, kind, target)
        scale = builder.fmul(half(o), builder.load(builder.gep(dx_ptr, [b])))
        fma = builder.call(fma8, [_broadcast(builder, scale, 8), builder.sitofp(quads, v8f), builder.load(lanes)])
        builder.store(fma, lanes)
        if min_at is not None:  # m * s summed apart, one FMA per block (GCC contracts m*s + summs)
            m = half(builder.add(o, ir.Constant(o.type, min_at)))
            builder.store(builder.call(fma1, [m, builder.load(builder.gep(sx_ptr, [b])), builder.load(mins)]), mins)
    total = _tree_sum8(builder, builder.load(lanes))
    return builder.fadd(total, builder.load(mins)) if min_at is not None else total


def _sums8(builder, vectors):
    """<8 x i32> of the lane sums of eight <8 x i32> vectors (a transposing tree: 14 shuffles
    and 7 adds for eight reductions)."""
    level = vectors
    for width in (4, 2, 1):  # each step halves every vector and pairs them up
        paired = []
        for a, b in zip(level[::2], level[1::2]):
            lanes = [i for i in range(8) if i % (2 * width) < width]
            lo = _shuffle(builder, a, b, [i for i in lanes] + [8 + i for i in lanes])
            hi = _shuffle(builder, a, b, [i + width for i in lanes] + [8 + i + width for i in lanes])
            paired.append(builder.add(lo, hi))
        level = paired
    return level[0]


# the 32-value block types whose repacked route (one FMA per block) goes eight rows per call:
# bytes per block, offset of the quants, nibble -> value table (Q4_0: nibble - 8), e8m0 scale
ROWS8_BLOCKS = {
    "q4_0": (Q4_0_BYTES, 2, None, False),
    "iq4_nl": (IQ4_NL_BYTES, 2, np.array(gq.IQ4_NL.kvalues, np.int8), False),
    "mxfp4": (MXFP4_BYTES, 1, np.array(gq.MXFP4.kvalues, np.int8), True),
}


def _table_values_quads(builder, q, xv, table, target):
    """<8 x i32> quads (lane l: values 4l .. 4l+3) of a block whose 32 values are table[nibble] of
    the 16 bytes q (low nibbles first) against the int8 activation xv (> -128)."""
    nibbles = _concat(builder, builder.and_(q, _splat(I8, 16, 15)), builder.lshr(q, _splat(I8, 16, 4)))
    values16 = ir.Constant(_vec(I8, 16), [int(v) & 0xFF for v in table])
    if target == GENERIC:
        values = ir.Constant(_vec(I8, 32), None)
        for k in range(32):
            v = builder.extract_element(values16, builder.extract_element(nibbles, ir.Constant(I32, k)))
            values = builder.insert_element(values, v, ir.Constant(I32, k))
        return _legacy_quads(builder, values, xv, "q8_0", target)
    magnitudes = ir.Constant(_vec(I8, 32), [abs(int(v)) for v in table] * 2)  # pshufb looks up per 16-byte lane
    masks = ir.Constant(_vec(I8, 32), [0xFF if v < 0 else 0 for v in table] * 2)
    mag = _call(builder, "llvm.x86.avx2.pshuf.b", _vec(I8, 32), magnitudes, nibbles)
    m = _call(builder, "llvm.x86.avx2.pshuf.b", _vec(I8, 32), masks, nibbles)
    return _madd(builder, mag, builder.sub(builder.xor(xv, m), m), _splat(I16, 16, 1))


def _rows_dot(context, builder, signature, args, kind, target):
    """Eight consecutive rows of a 32-value block type . one token in the repacked route's
    rounding (one FMA of the block's int32 sum per block and row): row r at w[wo + r*rb]; results
    to out[oo+r].  Eight FMA chains in flight instead of one, the token's block loaded once for all
    eight rows (Q4_0: its sums taken once for the quants' offset of 8, (q - 8) . x = q . x - 8 *
    sums of x), the eight int32 block sums reduced together and the eight scales converted at
    once.  Each row is prefetched 256 bytes ahead: the hardware prefetcher kept eight interleaved
    rows fed at only ~8 GB/s per core from DRAM (Q4_0: 12.5 with the prefetch; 19 in cache)."""
    size, quants_at, table, e8m0 = ROWS8_BLOCKS[kind]
    w, wo, rb, x, dx, nb, out, oo = args
    w_ptr, x_ptr, dx_ptr, out_ptr = _data(context, builder, signature, args, 0, 3, 4, 6)
    v8f, v8i = _vec(ir.FloatType(), 8), _vec(I32, 8)
    acc = cgutils.alloca_once_value(builder, ir.Constant(v8f, [0.0] * 8))
    fma8 = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8f, [v8f] * 3), "llvm.fma.v8f32")
    prefetch_type = ir.FunctionType(ir.VoidType(), [I8.as_pointer(), I32, I32, I32])
    prefetch = cgutils.get_or_insert_function(builder.module, prefetch_type, "llvm.prefetch.p0")
    starts = [builder.add(wo, builder.mul(rb, ir.Constant(rb.type, r))) for r in range(8)]
    with cgutils.for_range(builder, nb) as loop:
        b = loop.index
        block_at = builder.mul(b, ir.Constant(b.type, size))
        offsets = [builder.add(start, block_at) for start in starts]
        for o in offsets:  # read, keep in all cache levels, data (never faults, past the end included)
            builder.call(
                prefetch,
                [
                    builder.gep(w_ptr, [_add_offset(builder, o, 256)]),
                    ir.Constant(I32, 0),
                    ir.Constant(I32, 3),
                    ir.Constant(I32, 1),
                ],
            )
        x_at = builder.gep(x_ptr, [builder.mul(b, ir.Constant(b.type, 32))])
        xv = builder.load(builder.bitcast(x_at, _vec(I8, 32).as_pointer()), align=1)
        if table is not None:
            quads = [
                _table_values_quads(
                    builder,
                    builder.load(
                        builder.bitcast(
                            builder.gep(w_ptr, [_add_offset(builder, o, quants_at)]), _vec(I8, 16).as_pointer()
                        ),
                        align=1,
                    ),
                    xv,
                    table,
                    target,
                )
                for o in offsets
            ]
        elif target == GENERIC:
            quads = [
                _legacy_quads(builder, _legacy_values(context, builder, w_ptr, o, kind), xv, kind, target)
                for o in offsets
            ]
        else:
            x_quads = builder.mul(_madd(builder, _splat(I8, 32, 1), xv, _splat(I16, 16, 1)), _splat(I32, 8, 8))
            quads = [
                builder.sub(
                    _madd(builder, _legacy_values(context, builder, w_ptr, o, kind, False), xv, _splat(I16, 16, 1)),
                    x_quads,
                )
                for o in offsets
            ]
        if e8m0:  # 0.5 * 2^(e - 127) = 2^(e - 128): exponent field e - 1, subnormal below e = 2
            e = ir.Constant(v8i, None)
            for r, o in enumerate(offsets):
                byte = builder.zext(builder.load(builder.gep(w_ptr, [o])), I32)
                e = builder.insert_element(e, byte, ir.Constant(I32, r))
            normal = builder.shl(builder.sub(e, _splat(I32, 8, 1)), _splat(I32, 8, 23))
            tiny = builder.select(
                builder.icmp_unsigned("==", e, _splat(I32, 8, 1)),
                _splat(I32, 8, 0x00400000),
                _splat(I32, 8, 0x00200000),
            )
            dw = builder.bitcast(builder.select(builder.icmp_unsigned(">=", e, _splat(I32, 8, 2)), normal, tiny), v8f)
        else:
            halves = ir.Constant(_vec(I16, 8), None)
            for r, o in enumerate(offsets):
                bits = builder.load(builder.bitcast(builder.gep(w_ptr, [o]), I16.as_pointer()), align=1)
                halves = builder.insert_element(halves, bits, ir.Constant(I32, r))
            dw = builder.fpext(builder.bitcast(halves, _vec(ir.HalfType(), 8)), v8f)
        scales = builder.fmul(dw, _broadcast(builder, builder.load(builder.gep(dx_ptr, [b])), 8))
        isums = builder.sitofp(_sums8(builder, quads), v8f)
        builder.store(builder.call(fma8, [isums, scales, builder.load(acc)]), acc)
    builder.store(builder.load(acc), builder.bitcast(builder.gep(out_ptr, [oo]), v8f.as_pointer()), align=4)
    return context.get_dummy_value()


def _rows_dot8(kind: str, target: str):
    @intrinsic
    def rows_dot8(typingctx, w, wo, rb, x, dx, nb, out, oo):
        """Eight rows (row r's blocks at w[wo + r*rb:]) . one token, into out[oo:oo+8]; each row
        rounded as llama.cpp's repacked gemv rounds it: one FMA of the block's int32 sum times
        (weight scale * activation scale) per block (out: a contiguous float32 array)."""
        if out.dtype != types.float32 or out.layout != "C":
            return None
        sig = types.none(w, wo, rb, x, dx, nb, out, oo)

        def codegen(context, builder, signature, args):
            return _rows_dot(context, builder, signature, args, kind, target)

        return sig, codegen

    return rows_dot8


def _half_at_scalar(lo, hi):
    return f16_to_f32(lo, hi)


def _legacy_row_dot(kind: str, target: str):
    @intrinsic
    def legacy_row_dot(typingctx, row, x, dx, sx, nb):
        """A legacy-type row (its nb blocks' bytes) . token (int8 x, per-block float32 scales dx
        and, for Q4_1/Q5_1, block sums sx), rounded as llama.cpp's x86 vec_dot and tinyBLAS
        round it: eight float lanes, lane l taking values 4l..4l+3 of every block (exact int32
        sums) through an FMA with the block's dw*dx, then ggml's tree sum; Q4_1/Q5_1 add their
        mins (min * sx, one FMA chain) after it."""
        sig = types.float32(row, x, dx, sx, nb)

        def codegen(context, builder, signature, args):
            return _legacy_dot(context, builder, signature, args, kind, target)

        return sig, codegen

    return legacy_row_dot


LANES_DOT = {kind: {t: _legacy_row_dot(kind, t) for t in (GENERIC, AVX2)} for kind in LEGACY_BLOCKS}
ROWS_DOT8 = {kind: {t: _rows_dot8(kind, t) for t in (GENERIC, AVX2)} for kind in ROWS8_BLOCKS}
lanes_dot = {kind: _for_this_cpu(generators) for kind, generators in LANES_DOT.items()}
rows_dot8 = {kind: _for_this_cpu(generators) for kind, generators in ROWS_DOT8.items()}


# ---- f32 dot products in ggml's lanes: true FMAs on <16 x float> --------------------------------


def _f32_lanes_dot(context, builder, signature, args, chains):
    """a . b as llama.cpp sums it with `chains` accumulators of 16 lanes (1: llamafile's tinyBLAS
    gemm element; 4: ggml_vec_dot_f32 on AVX-512, its leftovers past a multiple of 64 added one
    by one, float products into a float sum), each accumulator one FMA chain over steps of
    16 * chains.  a[live:n] and b[live:n] are zeros (padding): their products leave every lane as
    it is, so the loop stops there."""
    a, b, n, live = args
    a_ptr, b_ptr = _data(context, builder, signature, args, 0, 1)
    v16 = _vec(ir.FloatType(), 16)
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v16, [v16] * 3), "llvm.fma.v16f32")
    i64 = n.type
    step = ir.Constant(i64, 16 * chains)
    whole = builder.sub(n, builder.srem(n, step)) if chains > 1 else n
    reach = builder.add(live, ir.Constant(i64, 16 * chains - 1))
    steps = builder.sdiv(builder.select(builder.icmp_signed("<", whole, reach), whole, reach), step)
    accs = [cgutils.alloca_once_value(builder, ir.Constant(v16, [0.0] * 16)) for _ in range(chains)]
    with cgutils.for_range(builder, steps) as loop:
        base = builder.mul(loop.index, step)
        for r, acc in enumerate(accs):
            at = builder.add(base, ir.Constant(i64, 16 * r))
            av = builder.load(builder.bitcast(builder.gep(a_ptr, [at]), v16.as_pointer()), align=4)
            bv = builder.load(builder.bitcast(builder.gep(b_ptr, [at]), v16.as_pointer()), align=4)
            builder.store(builder.call(fma, [av, bv, builder.load(acc)]), acc)
    v = [builder.load(acc) for acc in accs]
    if chains == 4:  # ggml's fold: 0 += 2, 1 += 3, 0 += 1
        v = [builder.fadd(builder.fadd(v[0], v[2]), builder.fadd(v[1], v[3]))]
    half = builder.fadd(_pick(builder, v[0], range(8)), _pick(builder, v[0], range(8, 16)))  # _mm512_reduce_add_ps
    quarter = builder.fadd(_pick(builder, half, range(4)), _pick(builder, half, range(4, 8)))
    e = [builder.extract_element(quarter, ir.Constant(I32, i)) for i in range(4)]
    total = builder.fadd(builder.fadd(e[0], e[2]), builder.fadd(e[1], e[3]))
    if chains == 1:
        return total
    result = cgutils.alloca_once_value(builder, total)
    end = builder.select(builder.icmp_signed("<", n, live), n, live)
    with cgutils.for_range(
        builder, builder.select(builder.icmp_signed(">", end, whole), builder.sub(end, whole), ir.Constant(i64, 0))
    ) as loop:
        i = builder.add(whole, loop.index)
        product = builder.fmul(builder.load(builder.gep(a_ptr, [i])), builder.load(builder.gep(b_ptr, [i])))
        builder.store(builder.fadd(builder.load(result), product), result)
    return builder.load(result)


def _f32_dot_intrinsic(chains: int, doc: str):
    @intrinsic
    def f32_dot(typingctx, a, b, n, live):
        if a.dtype != types.float32 or b.dtype != types.float32 or a.layout != "C" or b.layout != "C":
            return None
        sig = types.float32(a, b, types.int64, types.int64)

        def codegen(context, builder, signature, args):
            return _f32_lanes_dot(context, builder, signature, args, chains)

        return sig, codegen

    f32_dot.__doc__ = doc
    return f32_dot


@intrinsic
def bf16_pairs_dot(typingctx, w, x, start, stop, stride):
    """vdpbf16ps's 16 lanes over w (bf16 bits, uint16) and x (float32, each 32-value step as its
    16 odd values, then its 16 even ones): one 32-value step every `stride` values from start
    to stop; lane l adds the product of pair l's odd values, then of its even ones (exact
    products, so FMAs), then _mm512_reduce_add_ps."""
    if w.dtype != types.uint16 or x.dtype != types.float32 or w.layout != "C" or x.layout != "C":
        return None
    sig = types.float32(w, x, types.int64, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        _, _, start, stop, stride = args
        w_ptr, x_ptr = _data(context, builder, signature, args, 0, 1)
        v16, i16x32 = _vec(ir.FloatType(), 16), _vec(ir.IntType(16), 32)
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v16, [v16] * 3), "llvm.fma.v16f32")
        acc = cgutils.alloca_once_value(builder, ir.Constant(v16, [0.0] * 16))
        i64 = start.type
        count = builder.sdiv(builder.add(builder.sub(stop, start), builder.sub(stride, ir.Constant(i64, 1))), stride)
        with cgutils.for_range(builder, count) as loop:
            base = builder.add(start, builder.mul(loop.index, stride))
            pairs = builder.load(builder.bitcast(builder.gep(w_ptr, [base]), i16x32.as_pointer()), align=2)
            for half, first in ((0, 1), (16, 0)):  # odd values, then even ones
                bits = builder.zext(_pick(builder, pairs, range(first, 32, 2)), _vec(I32, 16))
                wv = builder.bitcast(builder.shl(bits, _splat(I32, 16, 16)), v16)
                at = builder.add(base, ir.Constant(i64, half))
                xv = builder.load(builder.bitcast(builder.gep(x_ptr, [at]), v16.as_pointer()), align=4)
                builder.store(builder.call(fma, [wv, xv, builder.load(acc)]), acc)
        v = builder.load(acc)
        halves = builder.fadd(_pick(builder, v, range(8)), _pick(builder, v, range(8, 16)))
        quarter = builder.fadd(_pick(builder, halves, range(4)), _pick(builder, halves, range(4, 8)))
        e = [builder.extract_element(quarter, ir.Constant(I32, i)) for i in range(4)]
        return builder.fadd(builder.fadd(e[0], e[2]), builder.fadd(e[1], e[3]))

    return sig, codegen


sgemm_dot = _f32_dot_intrinsic(
    1,
    "One element of llamafile's tinyBLAS f32 GEMM: a[:n] . b[:n] in 16 FMA "
    "lanes, then _mm512_reduce_add_ps (a, b: contiguous float32; see _f32_lanes_dot).",
)
vec_dot_f32 = _f32_dot_intrinsic(
    4,
    "ggml_vec_dot_f32 (AVX-512): a[:n] . b[:n] in 4 x 16 FMA lanes over steps "
    "of 64, folded, reduced, the leftovers added in float (see _f32_lanes_dot).",
)


@intrinsic
def half_to_float(typingctx, bits):
    """IEEE half (its 16 bits in an integer) to float32 with the CPU's conversion instruction
    (only where HW_HALF: elsewhere LLVM would call a runtime helper numba may not link)."""
    sig = types.float32(bits)

    def codegen(context, builder, signature, args):
        half = builder.bitcast(builder.trunc(args[0], I16) if args[0].type.width > 16 else args[0], ir.HalfType())
        return builder.fpext(half, ir.FloatType())

    return sig, codegen


@intrinsic
def bf16_to_float(typingctx, bits):
    """bfloat16 (its 16 bits in an integer) to float32: the bits moved up by 16."""
    sig = types.float32(bits)

    def codegen(context, builder, signature, args):
        bits16 = builder.trunc(args[0], I16) if args[0].type.width > 16 else args[0]
        return builder.bitcast(builder.shl(builder.zext(bits16, I32), ir.Constant(I32, 16)), ir.FloatType())

    return sig, codegen


@intrinsic
def pair_sums_dot_bytes(typingctx, v, vo, weights):
    """sum_j weights_j * (v[vo+2j] + v[vo+2j+1]) for j < 8: a Q4_K/Q5_K super-block's mins
    (bytes of the uint64 `weights`) times its 16 Q8_K block sums (int32 v[vo:vo+16])."""
    if v.dtype != types.int32:
        return None
    sig = types.int32(v, vo, weights)

    def codegen(context, builder, signature, args):
        v_, vo_, w_ = args
        sums = _block_sums(context, builder, signature.args[0], v_, vo_)
        even, odd = _pick(builder, sums, range(0, 16, 2)), _pick(builder, sums, range(1, 16, 2))
        mins = builder.zext(builder.bitcast(w_, _vec(I8, 8)), _vec(I32, 8))
        return _reduce_add(builder, builder.mul(builder.add(even, odd), mins))

    return sig, codegen


# 2^(e - 25) for a half's exponent field e (1..30); entry 0 serves subnormals
_F16_POW2 = np.array([2.0 ** (max(e, 1) - 25) for e in range(32)], np.float32)


@njit(nogil=True, cache=True, inline="always")
def half_bits_to_f32(h):
    """IEEE half (its bits in an int32) to float32, exactly, in integer and float arithmetic."""
    exponent = (h >> 10) & 0x1F
    mantissa = h & 0x3FF
    if exponent == 31:
        value = np.float32(np.inf) if mantissa == 0 else np.float32(np.nan)
    else:
        # (implicit bit + mantissa) * 2^(e-25): exact, no libm call
        value = np.float32(mantissa | (1024 if exponent else 0)) * _F16_POW2[exponent]
    return -value if h & 0x8000 else value


@njit(nogil=True, cache=True, inline="always")
def f16_bits_to_f32(bits):
    """IEEE half (its bits, a uint16) to float32, exactly."""
    if HW_HALF:  # one instruction: the arithmetic cost Q4_K's gemv a third of its speed
        return half_to_float(bits)
    return half_bits_to_f32(np.int32(bits))


@njit(nogil=True, cache=True, inline="always")
def f16_to_f32(lo, hi):
    """IEEE half (two little-endian bytes) to float32, exactly."""
    return f16_bits_to_f32(np.uint16(np.int32(lo) | (np.int32(hi) << 8)))
