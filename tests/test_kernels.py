"""Kernel tests: every ggml type against gguf's dequantizer and against a
numpy emulation of llama.cpp's quantized dot product.

The emulation is written from ggml's C semantics (ggml-cpu/quants.c generic
vec_dot and the x86 quantize_row_q8_0/q8_1, quantize_row_q8_K_ref): the
activation quantizers are re-implemented here in numpy, the integer parts of
the weights come from gguf.quants.dequantize of a copy of the block whose
float scale field is set to 1 (so it yields the integer sub-scale x quant
products exactly), and the per-block float step is spelled out per type.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T, quants
from numba import njit

from swapmoe.runtime import kernels as K
from swapmoe.runtime.kernels import simd

ROWS, COLS = 5, 512  # odd row count, two 256-value super-blocks per row
F32 = np.float32
TYPES = [T(t) for t in K.KERNELS]
# byte offsets of the fp16 scale fields of each block type
F16_FIELDS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
    T.IQ4_NL: [0],
    T.IQ4_XS: [0],
    T.IQ2_XXS: [0],
    T.IQ2_XS: [0],
    T.IQ2_S: [0],
    T.IQ3_XXS: [0],
    T.IQ3_S: [0],
    T.IQ1_S: [0],
}


def f16_bytes(values) -> np.ndarray:
    return np.asarray(values, np.float16).view(np.uint8).reshape(-1, 2)


def set_iq1_m_d(blocks: np.ndarray, d: np.ndarray) -> None:
    """IQ1_M keeps its fp16 scale in the top nibbles of four u16 scale words."""
    bits = np.asarray(d, np.float16).view(np.uint16)
    sc = blocks[:, 48:56].copy().view(np.uint16) & 0x0FFF
    for k in range(4):
        sc[:, k] |= ((bits >> (4 * k)) & 15) << 12
    blocks[:, 48:56] = sc.view(np.uint8)


def random_weights(tp: T, rows: int, cols: int, rng) -> np.ndarray:
    """Random valid bytes: finite fp16 scales, sane MXFP4 exponents, plus a
    zero block, a huge-scale and a subnormal-scale block."""
    bs, ts = GGML_QUANT_SIZES[tp]
    n = rows * cols // bs
    if tp == T.F32:
        return rng.standard_normal(n).astype(F32).view(np.uint8)
    if tp == T.F16:
        return rng.standard_normal(n).astype(np.float16).view(np.uint8)
    if tp == T.BF16:
        return (rng.standard_normal(n).astype(F32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    blocks = rng.integers(0, 256, size=(n, ts), dtype=np.uint8)
    scales = rng.uniform(-0.05, 0.05, n)
    scales[1], scales[2] = 60000.0, 2.0**-24  # extreme: near fp16 max, subnormal
    for off in F16_FIELDS.get(tp, []):
        blocks[:, off : off + 2] = f16_bytes(scales)
    if tp == T.MXFP4:
        blocks[:, 0] = rng.integers(118, 130, n)
    if tp == T.IQ1_M:
        set_iq1_m_d(blocks, scales)
    blocks[n // 2] = 0  # an all-zero block
    return blocks.reshape(-1)


def random_activations(n_tok: int, cols: int, rng) -> np.ndarray:
    X = rng.standard_normal((n_tok, cols)).astype(F32)
    X[0, 256:288] = 0.0  # zero block: amax == 0 path
    X[-1, :8] = [3.0, -3.0, 0.5, -0.5, 1.5, 2.5, -1.5, -2.5]  # ties in max|x| and halves
    return X


# ---- numpy emulation of llama.cpp's activation quantizers ------------------


def np_q8_0(x):
    blocks = x.reshape(-1, 32)
    amax = np.abs(blocks).max(axis=1)
    d = (amax / F32(127)).astype(np.float16).astype(F32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, F32(127) / amax, F32(0)).astype(F32)
    q = np.rint(blocks * inv[:, None]).astype(np.int32)
    return q, d, amax / F32(127)


def np_q8_1(x):
    q, d, d_exact = np_q8_0(x)
    s = (d_exact * q.sum(axis=1).astype(F32)).astype(np.float16).astype(F32)
    return q, d, s


def np_q8_k(x):
    blocks = x.reshape(-1, 256)
    q = np.zeros(blocks.shape, np.int32)
    d = np.zeros(len(blocks), F32)
    for i, b in enumerate(blocks):
        j = int(np.argmax(np.abs(b)))  # first index of the largest |x|
        if b[j] == 0:
            continue
        iscale = F32(-127.0) / b[j]
        q[i] = np.minimum(127, np.rint(iscale * b).astype(np.int32))
        d[i] = F32(1.0) / iscale
    return q, d


# ---- numpy emulation of the quantized dot products --------------------------


def integer_parts(tp: T, blocks: np.ndarray, **fields) -> np.ndarray:
    """gguf-dequantized blocks after overwriting scale fields (name -> value)."""
    b = blocks.copy()
    for off, value in fields.items():
        off = int(off[1:])
        b[:, off : off + 2] = f16_bytes(np.full(len(b), value))
    return quants.dequantize(b, tp).reshape(len(b), -1).astype(np.float64)


def f16_at(blocks, off):
    return blocks[:, off : off + 2].copy().view(np.float16)[:, 0].astype(F32)


def emulate_row(tp: T, blocks: np.ndarray, x: np.ndarray) -> F32:
    """llama.cpp's vec_dot for one weight row (its blocks) and activation x."""
    sumf = F32(0)
    if tp in (T.F32, T.F16, T.BF16):
        w = quants.dequantize(blocks.reshape(-1), tp).astype(np.float64)
        xr = K.quantize_activation(tp, x).qs[0].astype(np.float64)
        return F32(w @ xr)
    if tp in (T.Q4_0, T.Q5_0, T.Q8_0, T.IQ4_NL, T.MXFP4):
        q, dy, _ = np_q8_0(x)
        if tp == T.MXFP4:
            ints = quants.dequantize(np.concatenate([np.full((len(blocks), 1), 128, np.uint8), blocks[:, 1:]], 1), tp)
            scale = quants.MXFP4.e8m0_to_fp32_half(blocks[:, :1])[:, 0]
        else:
            ints = integer_parts(tp, blocks, o0=1.0)
            dw = f16_at(blocks, 0)
        sumi = (ints.reshape(len(blocks), -1) * q).sum(axis=1).astype(F32)
        for i in range(len(blocks)):
            if tp == T.Q4_0:
                sumf += sumi[i] * dw[i] * dy[i]
            elif tp == T.Q5_0:
                sumf += (dw[i] * dy[i]) * sumi[i]
            elif tp == T.Q8_0:
                sumf += sumi[i] * (dw[i] * dy[i])
            elif tp == T.IQ4_NL:
                sumf += (dy[i] * dw[i]) * sumi[i]
            else:
                sumf += (dy[i] * scale[i]) * sumi[i]
        return sumf
    if tp in (T.Q4_1, T.Q5_1):
        q, dy, sy = np_q8_1(x)
        ints = integer_parts(tp, blocks, o0=1.0, o2=0.0)
        sumi = (ints * q).sum(axis=1).astype(F32)
        dw, mw = f16_at(blocks, 0), f16_at(blocks, 2)
        for i in range(len(blocks)):
            sumf += (dw[i] * dy[i]) * sumi[i] + mw[i] * sy[i]
        return sumf
    q, dy = np_q8_k(x)
    if tp in (T.Q2_K, T.Q4_K, T.Q5_K):
        d_off, m_off = (80, 82) if tp == T.Q2_K else (0, 2)
        isum = (integer_parts(tp, blocks, **{f"o{d_off}": 1.0, f"o{m_off}": 0.0}) * q).sum(axis=1)
        summs = -(integer_parts(tp, blocks, **{f"o{d_off}": 0.0, f"o{m_off}": 1.0}) * q).sum(axis=1)
        dw, dmin = f16_at(blocks, d_off), f16_at(blocks, m_off)
        for i in range(len(blocks)):
            sumf += (dy[i] * dw[i]) * F32(isum[i]) - (dy[i] * dmin[i]) * F32(summs[i])
        return sumf
    if tp in (T.Q3_K, T.Q6_K):
        off = 108 if tp == T.Q3_K else 208
        isum = (integer_parts(tp, blocks, **{f"o{off}": 1.0}) * q).sum(axis=1)
        dw = f16_at(blocks, off)
        for i in range(len(blocks)):
            sumf += (dw[i] * dy[i]) * F32(isum[i])
        return sumf
    if tp == T.IQ4_XS:
        # every 6-bit scale forced to 33 (ls - 32 = 1: high bits 0b10, low nibble 1)
        # makes gguf return the plain table values
        forced = blocks.copy()
        forced[:, 2:4], forced[:, 4:8] = 0xAA, 0x11
        ints = integer_parts(tp, forced, o0=1.0).reshape(len(blocks), 8, 32)
        sumi = (ints * q.reshape(len(blocks), 8, 32)).sum(axis=2)
        h = blocks[:, 2].astype(np.int32) | (blocks[:, 3].astype(np.int32) << 8)
        dw = f16_at(blocks, 0)
        for i in range(len(blocks)):
            d4d8 = dw[i] * dy[i]
            for ib in range(8):
                ls = ((blocks[i, 4 + ib // 2] >> (4 * (ib % 2))) & 15) | (((h[i] >> (2 * ib)) & 3) << 4)
                sumf += (d4d8 * F32(int(ls) - 32)) * F32(sumi[i, ib])
        return sumf
    # IQ2/IQ3/IQ1: dequantizing with d = 1 gives ls * grid * sign / factor
    factor = {T.IQ2_XXS: 8, T.IQ2_XS: 8, T.IQ2_S: 8, T.IQ3_XXS: 4, T.IQ3_S: 1, T.IQ1_S: 1, T.IQ1_M: 1}[tp]
    if tp == T.IQ1_M:
        dw = np.empty(len(blocks), F32)
        sc = blocks[:, 48:56].copy().view(np.uint16)
        bits = (sc[:, 0] >> 12) | ((sc[:, 1] >> 8) & 0xF0) | ((sc[:, 2] >> 4) & 0xF00) | (sc[:, 3] & 0xF000)
        dw[:] = bits.astype(np.uint16).view(np.float16).astype(F32)
        ones = blocks.copy()
        set_iq1_m_d(ones, np.ones(len(blocks)))
        ints = quants.dequantize(ones, tp).reshape(len(blocks), -1).astype(np.float64)
    else:
        dw = f16_at(blocks, 0)
        ints = integer_parts(tp, blocks, o0=1.0)
    bsum = (ints * factor * q).sum(axis=1)  # for IQ1: sumi + 0.125 * sumi1, exactly
    for i in range(len(blocks)):
        sumf += (dw[i] * dy[i]) * F32(bsum[i])
    scale = {T.IQ2_XXS: F32(0.125), T.IQ2_XS: F32(0.125), T.IQ2_S: F32(0.125), T.IQ3_XXS: F32(0.25)}.get(tp, F32(1))
    return scale * sumf


def emulate(tp: T, W: np.ndarray, rows: int, cols: int, X: np.ndarray) -> np.ndarray:
    bs, ts = GGML_QUANT_SIZES[tp]
    blocks = W.reshape(rows, cols // bs, ts) if tp not in (T.F32, T.F16, T.BF16) else W.reshape(rows, -1)
    return np.array([[emulate_row(tp, blocks[r], x) for r in range(rows)] for x in X], F32)


def activation_error_bound(tp: T, w: np.ndarray, X: np.ndarray) -> np.ndarray:
    """|W @ x - W @ x~| bound from quantizing x to the vec_dot_type:
    per element |x - x~| <= amax_block * (0.5/127 + 2^-11) (Q8_0/Q8_1, fp16 d),
    amax_block * 0.5/127 (Q8_K, f32 d), |x| * 2^-11 (F16), |x| * 2^-8 (BF16)."""
    vdt = T(K.KERNELS[int(tp)].vec_dot_type)
    if vdt == T.F32:
        dx = np.zeros_like(X)
    elif vdt == T.F16:
        dx = np.abs(X) * 2.0**-11
    elif vdt == T.BF16:
        dx = np.abs(X) * 2.0**-8
    else:
        bs = 256 if vdt == T.Q8_K else 32
        amax = np.abs(X.reshape(len(X), -1, bs)).max(axis=2, keepdims=True)
        per = 0.5 / 127 + (0 if vdt == T.Q8_K else 2.0**-11)
        dx = np.broadcast_to(amax * per, (len(X), X.shape[1] // bs, bs)).reshape(X.shape)
    bound = np.abs(w) @ dx.T
    if vdt == T.Q8_1:  # the fp16-rounded s = d * sum(q) multiplies the block min m
        bound += 2.0**-11 * np.abs(w).max() * 127 * 32 * np.abs(X).max() / 127 * (X.shape[1] // 32)
    return bound.T + 1e-5 * (np.abs(w) @ np.abs(X).T).T  # float accumulation slack


@pytest.fixture(params=TYPES, ids=lambda t: t.name)
def case(request):
    tp = request.param
    rng = np.random.default_rng(int(tp) + 1)
    W = random_weights(tp, ROWS, COLS, rng)
    return tp, W, rng


def test_dequantize_rows_matches_gguf(case):
    tp, W, _ = case
    ref = quants.dequantize(W.reshape(ROWS, -1), tp).astype(F32)
    np.testing.assert_array_equal(K.dequantize_rows(tp, W, ROWS, COLS), ref)
    np.testing.assert_array_equal(K.dequantize_rows(tp, W, ROWS, COLS, [3, 0, 3]), ref[[3, 0, 3]])


def test_matvec_matmul_against_dequantized_and_emulation(case):
    tp, W, rng = case
    X = random_activations(3, COLS, rng)
    w = quants.dequantize(W.reshape(ROWS, -1), tp).astype(np.float64)
    Y = K.matmul(tp, W, ROWS, COLS, X)
    # reading blocks once for all tokens changes no result, unless llama.cpp itself takes
    # another route (and rounding) for a batch than for one token
    if K.ggml_order(tp, ROWS, COLS, 1, False, False) == K.ggml_order(tp, ROWS, COLS, len(X), False, False):
        for t in range(len(X)):
            np.testing.assert_array_equal(K.matvec(tp, W, ROWS, COLS, X[t]), Y[t])
    # against the float reference, within the activation-quantization bound
    assert np.all(np.abs(Y - X.astype(np.float64) @ w.T) <= activation_error_bound(tp, w, X))
    # against llama.cpp's semantics: at most ~1 float32 ulp per block
    Y_emul = emulate(tp, W, ROWS, COLS, X)
    bs = GGML_QUANT_SIZES[tp][0]
    magnitude = np.abs(w) @ np.abs(X.astype(np.float64)).T
    if tp in (T.F32, T.F16, T.BF16):  # f32 sums in a different order
        tol = 2 * COLS * 2.0**-24 * magnitude.T
    else:
        tol = 2 * (COLS // bs) * 2.0**-24 * (magnitude.T + np.abs(Y_emul))
    np.testing.assert_array_less(np.abs(Y - Y_emul), tol + 1e-30)


def test_grouped_rows_equal_separate_matrices(case):
    """group_rows: 3 matrices of 2 rows stacked, each with its own 2 tokens, in one call."""
    tp, _, rng = case
    W = random_weights(tp, 6, COLS, rng)
    X = random_activations(6, COLS, rng).reshape(3, 2, COLS)  # [group, token, cols]
    Y = K.matmul_q(tp, W, 6, COLS, K.quantize_activation(tp, X.reshape(6, COLS)), group_rows=2)
    group_bytes = W.size // 3
    for g in range(3):
        np.testing.assert_array_equal(
            Y[:, 2 * g : 2 * g + 2], K.matmul(tp, W[g * group_bytes : (g + 1) * group_bytes], 2, COLS, X[g])
        )


def test_scattered_experts_equal_separate_matrices(case):
    """starts: stacked experts that lie apart in one buffer, out of order, in one call, equal to one
    call per expert on every route: one token each (decode), 3 each (straight), 9 each (decoded or
    tiled); 16-row experts (whole tiles; rows % 8 == 0: the repacked routes)."""
    tp, _, rng = case
    n_expert, rows = 5, 16
    W = random_weights(tp, n_expert * rows, COLS, rng)
    expert_bytes = W.size // n_expert
    chosen = np.array([3, 0, 4], np.int64)
    for n_tok in (1, 3, 9):
        X = random_activations(len(chosen) * n_tok, COLS, rng)
        Y = K.matmul_q(
            tp,
            W,
            len(chosen) * rows,
            COLS,
            K.quantize_activation(tp, X),
            group_rows=rows,
            stacked=True,
            starts=chosen * expert_bytes,
        )
        for g, e in enumerate(chosen):
            alone = K.matmul_q(
                tp,
                W[e * expert_bytes : (e + 1) * expert_bytes],
                rows,
                COLS,
                K.quantize_activation(tp, X[g * n_tok : (g + 1) * n_tok]),
                stacked=True,
            )
            np.testing.assert_array_equal(Y[:, g * rows : (g + 1) * rows], alone)


def test_starts_outside_the_buffer_are_refused():
    W = np.zeros(2 * 144, np.uint8)  # two Q4_K rows of 256
    qx = K.quantize_activation(T.Q4_K, np.ones((2, 256), np.float32))
    with pytest.raises(ValueError, match="starts"):
        K.matmul_q(T.Q4_K, W, 2, 256, qx, group_rows=1, starts=np.array([0, 145], np.int64))
    with pytest.raises(ValueError, match="starts"):
        K.matmul_q(T.Q4_K, W, 2, 256, qx, group_rows=1, starts=np.array([-1, 0], np.int64))
    qf = K.quantize_activation(T.F32, np.ones((2, 256), np.float32))  # float rows are viewed as floats
    with pytest.raises(ValueError, match="multiples"):
        K.matmul_q(
            T.F32, np.zeros(4 * 512 + 2, np.uint8), 2, 256, qf, group_rows=1, starts=np.array([0, 1026], np.int64)
        )


@pytest.mark.parametrize(
    "tp", [tp for tp in TYPES if K.KERNELS[int(tp)].straight_tokens and tp not in (T.F16, T.BF16)], ids=lambda t: t.name
)
def test_straight_and_decoded_routes_agree(tp):
    """KERNELS' straight_tokens picks a route by speed alone: both take the same exact block sums
    and the same float steps, so the same bits, on every rounding route (rows % 8 == 0 repacks
    Q4_K/Q2_K; stacked experts; >= 8 tokens tiled), and where the decoded route takes 16-row
    tiles (simd.TILES) 32- and 24-row experts (whole and partial tiles) and groups of 16 and 20
    rows with their own tokens; rows of three super-blocks (IQ2_XXS's straight route takes them in
    pairs and an odd last one alone)."""
    rng = np.random.default_rng(int(tp) + 40)
    for rows, stacked, group_rows, cols in (
        (ROWS, False, ROWS, COLS),
        (8, False, 8, COLS),
        (8, True, 8, COLS),
        (32, True, 32, COLS),
        (32, False, 16, COLS),
        (24, True, 24, COLS),
        (40, False, 20, COLS),
        (8, False, 8, 768),
    ):
        W = random_weights(tp, rows, cols, rng)
        for n_tok in (1, 3, 9):
            qx = K.quantize_activation(tp, random_activations(n_tok * rows // group_rows, cols, rng))
            np.testing.assert_array_equal(
                K.matmul_q(tp, W, rows, cols, qx, group_rows, stacked=stacked, straight=True),
                K.matmul_q(tp, W, rows, cols, qx, group_rows, stacked=stacked, straight=False),
            )


@pytest.mark.slow
@pytest.mark.skipif(not simd.TILES, reason="without the tiles the default suite runs the row decode")
def test_row_decode_where_no_tiles_run(tmp_path):
    """Where the tiles run numba never compiles the decoded rows (pruned on simd.TILES); a CPU
    without them takes that route.  Compiled for a named generic CPU (no tiles, the portable
    intrinsics), in a fresh process and numba cache: the rounding-route tests and both routes
    against each other."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, NUMBA_CPU_NAME="x86-64-v3", NUMBA_CACHE_DIR=str(tmp_path))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            __file__,
            "-k",
            "routes_agree or repacked_route or tiled_route or grouped_rows",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and "skipped" not in run.stdout.splitlines()[-1]


def test_f16_rows_straight_and_widened():
    """F16 rows: up to straight_tokens tokens convert each value as they sum it, more tokens
    share one widened copy of the row; both within float32 summation error of the exact dot."""
    tp = T.F16
    rng = np.random.default_rng(16)
    W = random_weights(tp, 8, COLS, rng)
    X = random_activations(K.KERNELS[int(tp)].straight_tokens + 2, COLS, rng)
    Xr = K.quantize_activation(tp, X).qs.astype(np.float64)  # the activations rounded to the type
    exact = Xr @ quants.dequantize(W.reshape(8, -1), tp).astype(np.float64).T
    magnitude = np.abs(Xr) @ np.abs(quants.dequantize(W.reshape(8, -1), tp).astype(np.float64)).T
    widened = K.matmul(tp, W, 8, COLS, X)
    straight = np.stack([K.matvec(tp, W, 8, COLS, x) for x in X])
    for Y in (widened, straight):
        np.testing.assert_array_less(np.abs(Y - exact), COLS * 2.0**-24 * magnitude + 1e-30)


def _bf16_lanes(w, x, bases, acc):
    """vdpbf16ps at each base: lane l adds product 2l+1, then 2l, of the 32 values there."""
    for base in bases:
        for lane in range(16):
            for i in (base + 2 * lane + 1, base + 2 * lane):
                acc[lane] = np.float32(acc[lane] + np.float32(w[i] * x[i]))
    for width in (8, 4):  # _mm512_reduce_add_ps as GCC orders it
        acc[:width] = (acc[:width] + acc[width : 2 * width]).astype(np.float32)
    return np.float32(np.float32(acc[0] + acc[2]) + np.float32(acc[1] + acc[3]))


@pytest.mark.parametrize("cols", [256, 288, 100])
def test_bf16_rounds_as_llama_cpp(cols):
    """BF16: tinyBLAS (>= 2 tokens, rows % 4 == 0, cols % 32 == 0) runs one vdpbf16ps accumulator
    over the row; ggml_vec_dot_bf16 two over the halves of each 64 values, summed in double with
    the products past the last whole 64."""
    rng = np.random.default_rng(cols)
    rows = 8
    W = random_weights(T.BF16, rows, cols, rng)
    X = random_activations(3, cols, rng)
    w = quants.dequantize(W.reshape(rows, -1), T.BF16).astype(np.float32)
    x = K.quantize_activation(T.BF16, X).qs
    for n_tok in (1, 3):
        Y = K.matmul(T.BF16, W, rows, cols, X[:n_tok])
        for t in range(n_tok):
            for r in range(rows):
                if K.ggml_order(T.BF16, rows, cols, n_tok, False, False) == K.ORDER_LANES:
                    want = _bf16_lanes(w[r], x[t], range(0, cols, 32), np.zeros(16, np.float32))
                else:
                    whole = cols - cols % 64
                    want = np.float64(_bf16_lanes(w[r], x[t], range(0, whole, 64), np.zeros(16, np.float32)))
                    want += np.float64(_bf16_lanes(w[r], x[t], range(32, whole, 64), np.zeros(16, np.float32)))
                    for j in range(whole, cols):
                        want += np.float64(np.float32(w[r, j] * x[t, j]))
                assert Y[t, r] == np.float32(want), (n_tok, t, r)
    assert (K.ggml_order(T.BF16, rows, cols, 3, False, False) == K.ORDER_LANES) == (cols % 32 == 0)


def test_quantize_once_reuse():
    rng = np.random.default_rng(7)
    x = rng.standard_normal(COLS).astype(F32)
    W4 = random_weights(T.Q4_K, ROWS, COLS, rng)
    W6 = random_weights(T.Q6_K, ROWS, COLS, rng)
    qx = K.quantize_activation(T.Q4_K, x)  # both use Q8_K activations
    np.testing.assert_array_equal(K.matvec_q(T.Q6_K, W6, ROWS, COLS, qx), K.matvec(T.Q6_K, W6, ROWS, COLS, x))
    np.testing.assert_array_equal(K.matvec_q(T.Q4_K, W4, ROWS, COLS, qx), K.matvec(T.Q4_K, W4, ROWS, COLS, x))
    with pytest.raises(ValueError):
        K.matvec_q(T.Q8_0, random_weights(T.Q8_0, ROWS, COLS, rng), ROWS, COLS, qx)


def test_activation_quantizers_match_numpy_emulation():
    rng = np.random.default_rng(3)
    X = random_activations(2, COLS, rng)
    X[1, 300] = 1e-30  # tiny values, still in range
    for t in range(len(X)):
        q, d, _ = np_q8_0(X[t])
        qa = K.quantize_activation(T.Q8_0, X[t])
        np.testing.assert_array_equal(qa.qs[0], q.reshape(-1))
        np.testing.assert_array_equal(qa.d[0], d)
        q, d, s = np_q8_1(X[t])
        qa = K.quantize_activation(T.Q4_1, X[t])
        np.testing.assert_array_equal(qa.qs[0], q.reshape(-1))
        np.testing.assert_array_equal(qa.extra[0], s)
        q, d = np_q8_k(X[t])
        qa = K.quantize_activation(T.Q4_K, X[t])
        np.testing.assert_array_equal(qa.qs[0], q.reshape(-1))
        np.testing.assert_array_equal(qa.d[0], d)
        np.testing.assert_array_equal(qa.extra[0], q.reshape(-1, 16).sum(axis=1))


def test_rejects_bad_shapes():
    W = np.zeros(ROWS * COLS // 32 * 34, np.uint8)
    with pytest.raises(ValueError):
        K.matvec(T.Q8_0, W, ROWS + 1, COLS, np.zeros(COLS, F32))
    with pytest.raises(ValueError):
        K.matvec(T.Q4_K, W, 1, 100, np.zeros(100, F32))
    with pytest.raises(TypeError):
        K.matvec(T.Q8_0, W.view(np.int8), ROWS, COLS, np.zeros(COLS, F32))


def test_concurrent_calls_from_threads():
    """Kernels release the GIL; calls from several Python threads must not interfere."""
    import threading

    rng = np.random.default_rng(11)
    W = random_weights(T.Q4_K, 64, COLS, rng)
    x = rng.standard_normal(COLS).astype(F32)
    expected = K.matvec(T.Q4_K, W, 64, COLS, x)
    results = []

    def work():
        for _ in range(5):
            results.append(np.array_equal(K.matvec(T.Q4_K, W, 64, COLS, x), expected))

    threads = [threading.Thread(target=work) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 15 and all(results)


# ---- the rounding of llama.cpp's batch routes, bit for bit (kernels.ggml_order) -------------


def block_sums(tp: T, W: np.ndarray, rows: int, x: np.ndarray, step: int = 256):
    """Per-row integer sums of scaled quants x Q8_K activation over each `step` values, the mins
    x activation sums over the same spans, and the scales: isum, summ [rows, cols // step]."""
    bs_bytes = GGML_QUANT_SIZES[tp][1]
    blocks = W.reshape(-1, bs_bytes)
    q, dy = np_q8_k(x)
    d_off, m_off = {T.Q2_K: (80, 82), T.Q4_K: (0, 2), T.Q6_K: (208, None)}[tp]
    fields = {f"o{d_off}": 1.0} if m_off is None else {f"o{d_off}": 1.0, f"o{m_off}": 0.0}
    scaled = integer_parts(tp, blocks, **fields).reshape(rows, -1)
    isum = (scaled * q.reshape(-1)).reshape(rows, -1, step).sum(axis=2)
    summ = np.zeros_like(isum)
    dw = f16_at(blocks, d_off).reshape(rows, -1)
    dmin = np.zeros_like(dw)
    if m_off is not None:
        mins = -integer_parts(tp, blocks, **{f"o{d_off}": 0.0, f"o{m_off}": 1.0}).reshape(rows, -1)
        summ = (mins * q.reshape(-1)).reshape(rows, -1, step).sum(axis=2)
        dmin = f16_at(blocks, m_off).reshape(rows, -1)
    per_block = 256 // step
    return (
        isum.astype(F32),
        summ.astype(F32),
        np.repeat(dw, per_block, 1),
        np.repeat(dmin, per_block, 1),
        np.repeat(dy, per_block),
    )


def fma(a, b, c):
    return (np.float64(a) * np.float64(b) + np.float64(c)).astype(F32)


def test_tiled_route_rounding():
    """>= 8 tokens: ggml's tiled kernel, acc = fma((isum*dw) - dmin*summ (fused), dx, acc) per block."""
    rng = np.random.default_rng(11)
    for tp, rows in ((T.Q6_K, 6), (T.Q4_K, 5)):  # Q4_K with rows % 8 != 0 is not repacked
        W = random_weights(tp, rows, COLS, rng)
        X = random_activations(8, COLS, rng)
        assert K.ggml_order(tp, rows, COLS, 8, False, False) == K.ORDER_TILED
        Y = K.matmul(tp, W, rows, COLS, X)
        for t in range(8):
            isum, summ, dw, dmin, dy = block_sums(tp, W, rows, X[t])
            want = np.zeros(rows, F32)
            for b in range(isum.shape[1]):
                want = fma(fma(-dmin[:, b], summ[:, b], (isum[:, b] * dw[:, b]).astype(F32)), dy[b], want)
            np.testing.assert_array_equal(Y[t], want)


@pytest.mark.parametrize("tp, gemm_step", [(T.Q4_K, 64), (T.Q2_K, 128)], ids=["Q4_K", "Q2_K"])
def test_repacked_route_rounding(tp, gemm_step):
    """Q4_K (and Q2_K, AVX-512) with rows % 8 == 0: gemm for tokens in fours (FMA chains per 64 or
    128 values), gemv for the rest and for stacked experts (per block); scales and mins summed
    apart, subtracted at the end.  24 rows: Q4_K's batches take a 16-row tile and a partial one
    (with vpdpbusd)."""
    rng = np.random.default_rng(12)
    rows = 24
    W = random_weights(tp, rows, COLS, rng)
    blocks = W.reshape(-1, GGML_QUANT_SIZES[tp][1])
    dmin_at = F16_FIELDS[tp][1]  # dmin apart from d (random_weights gives both the same value)
    blocks[:, dmin_at : dmin_at + 2] = f16_bytes(rng.uniform(-0.05, 0.05, len(blocks)))
    X = random_activations(5, COLS, rng)
    batch = K.matmul(tp, W, rows, COLS, X)
    # stacked experts: gemv rounding for 5 and for 10 tokens (whichever route KERNELS picks)
    few = K.matmul_q(tp, W, rows, COLS, K.quantize_activation(tp, X), stacked=True)
    many = K.matmul_q(tp, W, rows, COLS, K.quantize_activation(tp, np.tile(X, (2, 1))), stacked=True)
    for t in range(5):
        for Y, step in ((batch, gemm_step if t < 4 else 256), (few, 256), (many[5:], 256)):
            isum, summ, dw, dmin, dy = block_sums(tp, W, rows, X[t], step)
            acc, acc_min = np.zeros(rows, F32), np.zeros(rows, F32)
            for b in range(isum.shape[1]):
                acc = fma(isum[:, b], (dw[:, b] * dy[b]).astype(F32), acc)
                acc_min = fma(summ[:, b], (dmin[:, b] * dy[b]).astype(F32), acc_min)
            np.testing.assert_array_equal(Y[t], (acc - acc_min).astype(F32))


def tree_sum(v):
    """ggml's horizontal sum of a float vector of 8 or 16 lanes."""
    while len(v) > 4:
        v = (v[: len(v) // 2] + v[len(v) // 2 :]).astype(F32)
    return F32(F32(v[0] + v[2]) + F32(v[1] + v[3]))


def test_lanes_route_rounding():
    """F32 batches (llamafile's tinyBLAS, which takes rows % 4 == 0) and the legacy types (tinyBLAS
    or vec_dot): FMA lanes, then a tree sum."""
    rng = np.random.default_rng(13)
    X = random_activations(2, COLS, rng)
    W = rng.standard_normal((8, COLS)).astype(F32)
    Y = K.matmul(T.F32, W.view(np.uint8).reshape(-1), 8, COLS, X)
    for t in range(2):
        for r in range(8):
            lanes = np.zeros(16, F32)
            for base in range(0, COLS, 16):
                lanes = fma(W[r, base : base + 16], X[t, base : base + 16], lanes)
            assert Y[t, r] == tree_sum(lanes)
    # the legacy types (Q4_0 only where llama.cpp does not repack it: rows % 8 != 0)
    for tp in (T.Q8_0, T.Q4_0, T.Q5_0, T.Q4_1, T.Q5_1):
        Wq = random_weights(tp, ROWS, COLS, rng)
        Y = K.matmul(tp, Wq, ROWS, COLS, X)
        np.testing.assert_array_equal(K.matvec(tp, Wq, ROWS, COLS, X[1]), Y[1])
        blocks = Wq.reshape(ROWS * COLS // 32, -1)
        with_min = tp in (T.Q4_1, T.Q5_1)
        ints = integer_parts(tp, blocks, **({"o0": 1.0, "o2": 0.0} if with_min else {"o0": 1.0}))
        ints = ints.reshape(ROWS, -1, 32)
        dw = f16_at(blocks, 0).reshape(ROWS, -1)
        for t in range(2):
            q, dy, sy = np_q8_1(X[t]) if with_min else np_q8_0(X[t])
            q = q.reshape(-1, 32)
            for r in range(ROWS):
                lanes = np.zeros(8, F32)
                for b in range(ints.shape[1]):
                    lane_ints = (ints[r, b] * q[b]).reshape(8, 4).sum(1)
                    lanes = fma((dw[r, b] * dy[b]).astype(F32), lane_ints.astype(F32), lanes)
                want = tree_sum(lanes)
                if with_min:
                    summs = F32(0)
                    for b, m in enumerate(f16_at(blocks, 2).reshape(ROWS, -1)[r]):
                        summs = fma(m, sy[b], summs)
                    want = F32(want + summs)
                assert Y[t, r] == want, tp.name


@pytest.mark.parametrize("tp", [T.Q4_0, T.IQ4_NL], ids=lambda t: t.name)
def test_repacked_block_types_rounding(tp):
    """Q4_0 and IQ4_NL with rows % 8 == 0 are repacked: one FMA per 32-value block, for a batch
    as for one token (MXFP4 likewise: test_simd_rows_dot8 and the golden gpt-oss files)."""
    rng = np.random.default_rng(14)
    W = random_weights(tp, 8, COLS, rng)
    X = random_activations(5, COLS, rng)
    Y = K.matmul(tp, W, 8, COLS, X)
    blocks = W.reshape(8 * COLS // 32, -1)
    ints = integer_parts(tp, blocks, o0=1.0).reshape(8, -1, 32)
    dw = f16_at(blocks, 0).reshape(8, -1)
    for t in range(5):
        q, dy, _ = np_q8_0(X[t])
        isum = (ints * q.reshape(1, -1, 32)).sum(axis=2).astype(F32)
        want = np.zeros(8, F32)
        for b in range(isum.shape[1]):
            want = fma(isum[:, b], (dw[:, b] * dy[b]).astype(F32), want)
        np.testing.assert_array_equal(Y[t], want)


# ---- the explicit SIMD helpers (kernels/simd.py), each code generator against numpy ----------

SIMD_TARGETS = [simd.GENERIC, simd.AVX2, simd.AVX512]  # the generators every intrinsic has
IQ1_TARGETS = SIMD_TARGETS + [simd.VBMI]  # IQ1_S/IQ1_M's VBMI generators gather their grid entries
# the other IQ grid types decode in registers with VBMI, their entries permuted or gathered, but for
# these, whose VBMI code looks its grid up in registers only, each in an activation order of its own
GRID_TARGETS = IQ1_TARGETS + [simd.VBMI_GATHER]
OWN_ORDER = {T.IQ2_XXS: simd.IQ2_XXS_ORDER, T.IQ3_XXS: simd.IQ3_ORDER, T.IQ3_S: simd.IQ3_ORDER}


def x_order(x, target, tp=None):
    """int8 activations in the order the IQ grid intrinsics of `target` for type tp read them: the
    VBMI ones each 256-value block in simd.IQ2_XXS_ORDER (IQ2_XXS), simd.IQ3_ORDER (IQ3_XXS, IQ3_S) or
    group-major (8-value group j of 32-value sub-block k at 64j + 8k)."""
    if target not in (simd.VBMI, simd.VBMI_GATHER):
        return x
    if tp in OWN_ORDER:
        return np.ascontiguousarray(x.reshape(-1, 256)[:, OWN_ORDER[tp]]).reshape(-1)
    return np.ascontiguousarray(x.reshape(-1, 8, 4, 8).transpose(0, 2, 1, 3)).reshape(-1)


def iq2_xxs_pair_order(x):
    """An IQ2_XXS row's activation as its VBMI row dot reads it: each pair of blocks in
    simd.IQ2_XXS_PAIR_ORDER, an odd last block in simd.IQ2_XXS_ORDER."""
    paired = x.size - x.size % 512
    return np.concatenate(
        [x[:paired].reshape(-1, 512)[:, simd.IQ2_XXS_PAIR_ORDER].reshape(-1), x_order(x[paired:], simd.VBMI, T.IQ2_XXS)]
    )


@pytest.mark.parametrize(
    "order, size",
    [(simd.IQ2_XXS_ORDER, 256), (simd.IQ2_XXS_PAIR_ORDER, 512), (simd.IQ3_ORDER, 256), (simd.GROUP_MAJOR_ORDER, 256)],
    ids=["IQ2_XXS", "IQ2_XXS-pair", "IQ3_XXS", "group-major"],
)
def test_activation_orders_are_chunks_of_sub_blocks(order, size):
    """Every value once, and qword k of each 64-byte chunk from one sub-block (what the per-sub-block
    int32 lanes need): in a single block sub-block k; in a pair sub-block k of the first block in
    bytes 0..3, of the second in bytes 4..7."""
    np.testing.assert_array_equal(np.sort(order), np.arange(size))
    k, b = np.arange(8)[:, None], np.arange(8)[None, :]
    want = k + 8 * (b // 4) if size == 512 else np.broadcast_to(k, (8, 8))
    for chunk in order.reshape(-1, 8, 8):
        np.testing.assert_array_equal(chunk // 32, want)


def test_grid_activations_in_the_order_the_grid_intrinsics_read():
    from swapmoe.runtime.kernels._jit import grid_activations, iq2_xxs_activations, iq3_activations

    x = np.random.default_rng(31).integers(-127, 128, (3, 768), dtype=np.int8)
    reordered = simd.REORDERED
    np.testing.assert_array_equal(
        grid_activations(x), np.stack([x_order(row, simd.VBMI) for row in x]) if reordered else x
    )
    np.testing.assert_array_equal(
        iq3_activations(x), np.stack([x_order(row, simd.VBMI, T.IQ3_XXS) for row in x]) if reordered else x
    )
    np.testing.assert_array_equal(
        iq2_xxs_activations(x), np.stack([iq2_xxs_pair_order(row) for row in x]) if reordered else x
    )


def skip_unless_this_cpu_runs(target):
    needs = simd.VBMI if target == simd.VBMI_GATHER else target
    if simd.TARGETS.index(needs) > simd.TARGETS.index(simd.TARGET):
        pytest.skip(f"this CPU cannot run the {target} code")  # the generic one runs everywhere


@pytest.mark.parametrize("target", SIMD_TARGETS)
def test_simd_q4_k_isum(target):
    skip_unless_this_cpu_runs(target)
    isum = simd.Q4_K_ISUM[target]

    @njit
    def run(w, x, scales, out):
        for i in range(out.size):
            out[i] = isum(w, 5 + i * 128, x, i * 256, scales[i])

    rng = np.random.default_rng(21)
    n = 40
    w = rng.integers(0, 256, 5 + n * 128, dtype=np.uint8)
    x = rng.integers(-128, 128, n * 256, dtype=np.int8)
    x[:256] = -128  # the extremes: largest nibbles, scales and activations
    w[5 : 5 + 128] = 255
    scales = rng.integers(0, 64, (n, 8), dtype=np.uint8)
    scales[0] = 63
    out = np.empty(n, np.int32)
    run(w, x, scales.view(np.uint64).reshape(-1), out)
    q = w[5:].reshape(n, 4, 32).astype(np.int64)
    values = np.stack([q & 15, q >> 4], axis=2).reshape(n, 8, 32)  # 32 low nibbles, then 32 high
    want = (values * scales[:, :, None] * x.reshape(n, 8, 32)).sum(axis=(1, 2))
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("target", [simd.GENERIC, simd.VBMI])
@pytest.mark.parametrize("tp", [T.Q4_K, T.Q5_K], ids=lambda t: t.name)
def test_simd_k4_tile16(tp, target):
    """A 16-row Q4_K / Q5_K tile (blocks `stride` bytes apart) against one token in each rounding
    route, as numpy computes them: the repacked gemm's two FMA chains over 64-value steps, its
    gemv's per block, the tiled matmul's and vec_dot's steps; other slots of acc untouched."""
    skip_unless_this_cpu_runs(target)
    tile16 = (simd.Q4_K_TILE16 if tp == T.Q4_K else simd.Q5_K_TILE16)[target]
    tile_dot = simd.Q4_K_TILE16_DOT[target]
    orders = np.array([K.ORDER_GEMM, K.ORDER_GEMV, K.ORDER_TILED, K.ORDER_DOT])

    @njit
    def run(w, stride, x, scales, mins, bsums, dw, dmin, dx, acc, orders):
        tile = np.empty(4096, np.uint8)
        tile16(w, 7, stride, 16, tile, 0)
        for k in range(orders.size):
            tile_dot(tile, x, 256, scales, mins, bsums, 16, dw, dmin, dx, acc, 32 * (k + 1), orders[k])

    rng = np.random.default_rng(23)
    stride, size = 300, GGML_QUANT_SIZES[tp][1]
    w = rng.integers(0, 256, 7 + 16 * stride, dtype=np.uint8)
    w[7 : 7 + size] = 255  # row 0: the largest values, scales and activations
    x = rng.integers(-127, 128, 512, dtype=np.int8)
    x[256:320] = -127
    scales = rng.integers(0, 64, (8, 16)).astype(np.int32)
    scales[:, 0] = 63
    mins = rng.integers(0, 64, (4, 16, 2)).astype(np.int16)
    bsums = rng.integers(-4064, 4065, 32).astype(np.int32)
    dw, dmin = rng.uniform(-1, 1, (2, 16)).astype(F32)
    dx = F32(0.37)
    acc = rng.standard_normal(160).astype(F32)
    start = acc.copy()
    run(w, stride, x, scales, mins.reshape(-1), bsums, dw, dmin, dx, acc, orders)
    # each row's unsigned values: its block with d = 1, dmin = 0, every scale 1 and min 0
    scale_bytes = np.array([1] * 4 + [0] * 4 + [1] * 4, np.uint8)  # 6-bit scales 1, mins 0
    unit = np.concatenate([f16_bytes(np.array([1.0, 0.0])).reshape(-1), scale_bytes])
    values = (
        np.stack(
            [
                quants.dequantize(np.concatenate([unit, w[7 + i * stride + 16 : 7 + i * stride + size]]), tp)
                for i in range(16)
            ]
        )
        .astype(np.int64)
        .reshape(16, 8, 32)
    )  # [row, sub-block, value]
    sub = (values * x[256:].reshape(8, 32)).sum(axis=2) * scales.T  # [row, sub-block]
    pairs = bsums[16:].reshape(8, 2).sum(axis=1)  # per sub-block
    isum = sub[:, 0::2] + sub[:, 1::2]  # [row, 64-value step]
    summ = mins[:, :, 0].T * pairs[0::2] + mins[:, :, 1].T * pairs[1::2]
    scale, scale_min = (dw * dx).astype(F32), (dmin * dx).astype(F32)
    block_isum, block_summ = isum.sum(axis=1).astype(F32), summ.sum(axis=1).astype(F32)
    total, total_min = start[32:48], start[48:64]
    for h in range(4):  # gemm: an FMA per step
        total = fma(isum[:, h], scale, total)
        total_min = fma(summ[:, h], scale_min, total_min)
    np.testing.assert_array_equal(acc[32:48], total)
    np.testing.assert_array_equal(acc[48:64], total_min)
    np.testing.assert_array_equal(acc[64:80], fma(block_isum, scale, start[64:80]))  # gemv: per block
    np.testing.assert_array_equal(acc[80:96], fma(block_summ, scale_min, start[80:96]))
    np.testing.assert_array_equal(acc[96:112], fma(fma(-dmin, block_summ, block_isum * dw), dx, start[96:112]))
    np.testing.assert_array_equal(acc[128:144], start[128:144] + (scale * block_isum - scale_min * block_summ))
    for untouched in (slice(0, 32), slice(112, 128), slice(144, 160)):
        np.testing.assert_array_equal(acc[untouched], start[untouched])


@pytest.mark.parametrize("target", [simd.GENERIC, simd.VBMI])
def test_simd_q6_k_tile16(target):
    """A 16-row Q6_K tile against one token: each row's exact block sum, stepped as ggml's tiled
    matmul (fma(isum * dw, dx, acc)) and as its vec_dot (acc + (dw * dx) * isum); a partial tile
    (5 rows) repeats its last row in the lanes past it."""
    skip_unless_this_cpu_runs(target)
    tile16, tile_dot = simd.Q6_K_TILE16[target], simd.Q6_K_TILE16_DOT[target]

    @njit
    def run(w, wo, stride, x, scales, bsums, dw, dx, acc):
        tile = np.empty(4096, np.uint8)
        tile16(w, wo, stride, 16, tile, 0)
        tile_dot(tile, x, 256, scales, bsums, 16, dw, dx, acc, 16, True)
        tile_dot(tile, x, 256, scales, bsums, 16, dw, dx, acc, 32, False)
        tile16(w, wo, stride, 5, tile, 0)  # a partial tile: rows 5.. repeat row 4
        tile_dot(tile, x, 256, scales, bsums, 16, dw, dx, acc, 64, True)

    rng = np.random.default_rng(24)
    stride = 250
    w = rng.integers(0, 256, 3 + 16 * stride, dtype=np.uint8)
    w[3 : 3 + 192] = 255  # row 0: the largest values
    x = rng.integers(-127, 128, 512, dtype=np.int8)
    scales = rng.integers(-128, 128, (16, 16)).astype(np.int32)
    scales[:, 0] = -128
    dw = rng.uniform(-1, 1, 16).astype(F32)
    dx = F32(0.37)
    bsums = x.reshape(32, 16).sum(axis=1).astype(np.int32)
    acc = rng.standard_normal(80).astype(F32)
    start = acc.copy()
    run(w, 3, stride, x, scales, bsums, dw, dx, acc)
    unit = np.concatenate([np.ones(16, np.uint8), f16_bytes(np.array([1.0])).reshape(-1)])  # scales 1, d 1
    values = (
        np.stack(
            [
                quants.dequantize(np.concatenate([w[3 + i * stride : 3 + i * stride + 192], unit]), T.Q6_K)
                for i in range(16)
            ]
        ).astype(np.int64)
        + 32
    )  # u: the 6-bit values
    isum = ((values - 32) * np.repeat(scales.T, 16, axis=1) * x[256:]).sum(axis=1)
    np.testing.assert_array_equal(acc[16:32], fma(isum.astype(F32) * dw, dx, start[16:32]))
    np.testing.assert_array_equal(acc[32:48], (start[32:48] + (dw * dx).astype(F32) * isum.astype(F32)).astype(F32))
    repeated = values[np.minimum(np.arange(16), 4)]  # each lane's quants: its row's, up to row 4
    isum = ((repeated - 32) * np.repeat(scales.T, 16, axis=1) * x[256:]).sum(axis=1)  # (scales: each lane's)
    np.testing.assert_array_equal(acc[64:80], fma(isum.astype(F32) * dw, dx, start[64:80]))
    np.testing.assert_array_equal(acc[:16], start[:16])
    np.testing.assert_array_equal(acc[48:64], start[48:64])


@pytest.mark.parametrize("target", [simd.GENERIC, simd.VBMI])
def test_simd_int8_tile16(target):
    """16 rows of decoded int8 values (the full range) as a tile, against one token: each row's
    exact sum of value * integer scale (per 16 values) * activation, stepped as ggml's tiled
    matmul and as its vec_dot."""
    skip_unless_this_cpu_runs(target)
    tile16, tile_dot = simd.INT8_TILE16[target], simd.INT8_TILE16_DOT[target]

    @njit
    def run(w, stride, x, scales, bsums, dw, dx, acc):
        tile = np.empty(4096, np.uint8)
        tile16(w, 5, stride, 16, tile, 0)
        tile_dot(tile, x, 256, scales, bsums, 16, dw, dx, acc, 0, True)
        tile_dot(tile, x, 256, scales, bsums, 16, dw, dx, acc, 16, False)

    rng = np.random.default_rng(25)
    stride = 300
    values = rng.integers(-128, 128, (16, 256)).astype(np.int8)
    values[0] = -128
    w = np.zeros(5 + 16 * stride, np.uint8)
    for i in range(16):
        w[5 + i * stride : 5 + i * stride + 256] = values[i].view(np.uint8)
    x = rng.integers(-127, 128, 512, dtype=np.int8)
    x[256:272] = -127
    scales = rng.integers(-64, 64, (16, 16)).astype(np.int32)
    dw = rng.uniform(-1, 1, 16).astype(F32)
    dx = F32(0.37)
    bsums = x.reshape(32, 16).sum(axis=1).astype(np.int32)
    acc = rng.standard_normal(48).astype(F32)
    start = acc.copy()
    run(w, stride, x, scales, bsums, dw, dx, acc)
    isum = (values.astype(np.int64) * np.repeat(scales.T, 16, axis=1) * x[256:]).sum(axis=1)
    np.testing.assert_array_equal(acc[:16], fma(isum.astype(F32) * dw, dx, start[:16]))
    np.testing.assert_array_equal(acc[16:32], (start[16:32] + (dw * dx).astype(F32) * isum.astype(F32)).astype(F32))
    np.testing.assert_array_equal(acc[32:], start[32:])


def test_simd_pair_sums_dot_bytes():
    @njit
    def run(v, weights, out):
        for i in range(out.size):
            out[i] = simd.pair_sums_dot_bytes(v, 3 + 16 * i, weights[i])

    rng = np.random.default_rng(22)
    n = 20
    v = rng.integers(-32768, 32768, 3 + 16 * n).astype(np.int32)
    weights = rng.integers(0, 64, (n, 8), dtype=np.uint8)
    out = np.empty(n, np.int32)
    run(v, weights.view(np.uint64).reshape(-1), out)
    pairs = v[3:].reshape(n, 8, 2).sum(axis=2).astype(np.int64)
    np.testing.assert_array_equal(out, (pairs * weights).sum(axis=1))


def test_half_to_float_every_bit_pattern():
    """Both half -> float conversions (the CPU instruction where there is one, the arithmetic
    elsewhere) against numpy for all 65536 halves."""
    from swapmoe.runtime.kernels.simd import half_bits_to_f32

    def every_half(convert):
        @njit
        def run(out):
            for h in range(65536):
                out[h] = convert(h)

        out = np.empty(65536, F32)
        run(out)
        return out

    want = np.arange(65536, dtype=np.uint16).view(np.float16).astype(F32)
    converters = [half_bits_to_f32] + ([simd.half_to_float] if simd.HW_HALF else [])
    for convert in converters:
        out = every_half(convert)
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(out), nan)
        np.testing.assert_array_equal(out[~nan].view(np.uint32), want[~nan].view(np.uint32))


@pytest.mark.parametrize("target", SIMD_TARGETS)
def test_simd_q6_k_isum(target):
    skip_unless_this_cpu_runs(target)
    isum = simd.Q6_K_ISUM[target]

    @njit
    def run(w, x, bsums, out):
        for i in range(out.size):
            out[i] = isum(w, i * 210, x, i * 256, bsums, i * 16)

    rng = np.random.default_rng(23)
    n = 30
    blocks = rng.integers(0, 256, (n, 210), dtype=np.uint8)
    blocks[0, :192] = 255  # the extremes: quants 31, scales -128, activations -128
    blocks[0, 192:208] = 128
    blocks[1, :192] = 0  # quants -32
    x = rng.integers(-128, 128, n * 256, dtype=np.int8)
    x[:512] = -128
    bsums = x.reshape(-1, 16).sum(axis=1).astype(np.int32)
    out = np.empty(n, np.int32)
    run(blocks.reshape(-1), x, bsums, out)
    scaled = integer_parts(T.Q6_K, blocks, o208=1.0)  # scale * (q - 32) per value
    np.testing.assert_array_equal(out, (scaled * x.reshape(n, 256)).sum(axis=1).astype(np.int64))


@pytest.mark.parametrize("target", SIMD_TARGETS)
def test_simd_q2_k_isum(target):
    skip_unless_this_cpu_runs(target)
    isum = simd.Q2_K_ISUM[target]

    @njit
    def run(w, x, bsums, out, mins):
        for i in range(out.size):
            out[i], mins[i] = isum(w, i * 84, x, i * 256, bsums, i * 16)

    rng = np.random.default_rng(24)
    n = 30
    blocks = rng.integers(0, 256, (n, 84), dtype=np.uint8)
    blocks[0, :80] = 255  # the extremes: quants 3, scales and mins 15, activations -128
    x = rng.integers(-128, 128, n * 256, dtype=np.int8)
    x[:256] = -128
    bsums = x.reshape(-1, 16).sum(axis=1).astype(np.int32)
    out, mins = np.empty(n, np.int32), np.empty(n, np.int32)
    run(blocks.reshape(-1), x, bsums, out, mins)
    scaled = integer_parts(T.Q2_K, blocks, o80=1.0, o82=0.0)  # (scale & 15) * q per value
    np.testing.assert_array_equal(out, (scaled * x.reshape(n, 256)).sum(axis=1).astype(np.int64))
    want_mins = ((blocks[:, :16] >> 4).astype(np.int64) * bsums.reshape(n, 16)).sum(axis=1)
    np.testing.assert_array_equal(mins, want_mins)


@pytest.mark.parametrize(
    "tp, target",
    [
        (tp, target)
        for tp in (T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S)
        for target in (IQ1_TARGETS if tp in OWN_ORDER else GRID_TARGETS)
    ],
    ids=lambda v: v.name if isinstance(v, T) else v,
)
def test_simd_grid_isum(tp, target):
    skip_unless_this_cpu_runs(target)
    from swapmoe.runtime.kernels import iquants

    isum, grid, signs, d_scale = {
        T.IQ2_XXS: (simd.IQ2_XXS_ISUM, iquants._GRID8_IQ2_XXS, iquants._SIGN_MASKS, 8.0),
        T.IQ2_XS: (simd.IQ2_XS_ISUM, iquants._GRID8_IQ2_XS, iquants._SIGN_MASKS, 8.0),
        T.IQ2_S: (simd.IQ2_S_ISUM, iquants._GRID8_IQ2_S, iquants._BYTE_MASKS, 8.0),
        T.IQ3_XXS: (simd.IQ3_XXS_ISUM, iquants._GRID4_IQ3_XXS, iquants._SIGN_MASKS, 4.0),
        T.IQ3_S: (simd.IQ3_S_ISUM, iquants._GRID4_IQ3_S, iquants._BYTE_MASKS, 1.0),
    }[tp]
    isum = isum[target]
    size = GGML_QUANT_SIZES[tp][1]

    @njit
    def run(w, x, grid, signs, out):
        for i in range(out.size):
            out[i] = isum(w, i * size, x, i * 256, grid, signs)

    rng = np.random.default_rng(25)
    n = 30
    blocks = rng.integers(0, 256, (n, size), dtype=np.uint8)
    blocks[0, 2:] = 255  # the extremes: largest scales, activations -127 (Q8_K's least)
    x = rng.integers(-127, 128, n * 256, dtype=np.int8)
    x[:256] = -127
    out = np.empty(n, np.int32)
    run(blocks.reshape(-1), x_order(x, target, tp), grid, signs, out)
    # gguf: d * (0.5 + s) * 0.25 (IQ2) or 0.5 (IQ3_XXS) or d * (2s + 1) (IQ3_S) times the value
    scaled = integer_parts(tp, blocks, o0=d_scale)
    np.testing.assert_array_equal(out, (scaled * x.reshape(n, 256)).sum(axis=1).astype(np.int64))


def test_simd_iq2_xxs_pair_isum():
    """Two IQ2_XXS blocks per call (the VBMI code), each as gguf computes it, rounded to float32."""
    skip_unless_this_cpu_runs(simd.VBMI)
    pair_isum = simd.IQ2_XXS_PAIR_ISUM[simd.VBMI]

    @njit
    def run(w, x, out):
        for i in range(0, out.size, 2):
            out[i], out[i + 1] = pair_isum(w, i * 66, x, i * 256)

    rng = np.random.default_rng(26)
    n = 30
    blocks = rng.integers(0, 256, (n, 66), dtype=np.uint8)
    blocks[1, 2:] = 255  # the extremes, in the second block of a pair
    x = rng.integers(-127, 128, n * 256, dtype=np.int8)
    x[256:512] = -127
    out = np.empty(n, np.float32)
    run(blocks.reshape(-1), iq2_xxs_pair_order(x), out)
    scaled = integer_parts(T.IQ2_XXS, blocks, o0=8.0)
    np.testing.assert_array_equal(out, (scaled * x.reshape(n, 256)).sum(axis=1).astype(np.float32))


def legacy_case(tp: T, seed: int):
    """Eight random rows of 40 blocks (a Q8_0 weight of -128 among them), an int8 activation
    with its extreme -127, per-block activation scales and block sums."""
    rng = np.random.default_rng(seed)
    nb = 40
    rows = random_weights(tp, 8, 32 * nb, rng).reshape(8, nb, -1)
    if tp == T.Q8_0:
        rows[0, 0, 2:] = 0x80  # -128, the one weight whose magnitude is not an int8
    x = rng.integers(-127, 128, 32 * nb, dtype=np.int8)
    x[:32] = -127
    return rows, x, rng.uniform(0.5, 2.0, nb).astype(F32), rng.uniform(-50, 50, nb).astype(F32)


@pytest.mark.parametrize("target", [simd.GENERIC, simd.AVX2])
@pytest.mark.parametrize("kind", list(simd.LEGACY_BLOCKS))
def test_simd_legacy_row_dot(kind, target):
    """Each generator of the legacy row dots against llama.cpp's float steps in numpy: eight FMA
    lanes of exact 4-value sums and a tree sum (Q4_1/Q5_1: plus their mins' FMA chain)."""
    skip_unless_this_cpu_runs(target)
    tp = T[kind.upper()]
    dot = simd.LANES_DOT[kind][target]
    rows, x, dx, sx = legacy_case(tp, 31)
    nb = rows.shape[1]

    @njit
    def run(row, x, dx, sx, nb):
        return dot(row, x, dx, sx, nb)

    with_min = tp in (T.Q4_1, T.Q5_1)
    for blocks in rows:
        ints = integer_parts(tp, blocks, **({"o0": 1.0, "o2": 0.0} if with_min else {"o0": 1.0})).astype(np.int64)
        products = ints * x.reshape(nb, 32)
        scales = (f16_at(blocks, 0) * dx).astype(F32)
        lanes = np.zeros(8, F32)
        for b in range(nb):
            lanes = fma(scales[b], products[b].reshape(8, 4).sum(1).astype(F32), lanes)
        want = tree_sum(lanes)
        if with_min:
            summs = F32(0)
            for b, m in enumerate(f16_at(blocks, 2)):
                summs = fma(m, sx[b], summs)
            want = F32(want + summs)
        assert run(blocks.reshape(-1), x, dx, sx, nb) == want


@pytest.mark.parametrize("target", [simd.GENERIC, simd.AVX2])
@pytest.mark.parametrize("tp", [T.Q4_0, T.IQ4_NL, T.MXFP4], ids=lambda t: t.name)
def test_simd_rows_dot8(tp, target):
    """Eight rows at once of the types llama.cpp repacks, each as its repacked gemv rounds it: one
    FMA of the block's int32 sum times (weight scale * activation scale) per block."""
    skip_unless_this_cpu_runs(target)
    dot8 = simd.ROWS_DOT8[tp.name.lower()][target]
    rows, x, dx, _ = legacy_case(tp, 32)
    nb, size = rows.shape[1], rows.shape[2]
    if tp == T.MXFP4:
        rows[0, :, 0] = [0, 1, 2, 3] * (nb // 4)  # e8m0 exponents: subnormal scales and the least normal ones
        rows[1, :, 0] = 150  # 2^22

    @njit
    def run(W, x, dx, nb, out):
        dot8(W, 0, W.size // 8, x, dx, nb, out, 0)

    got = np.zeros(8, F32)
    run(rows.reshape(-1), x, dx, nb, got)
    table = {
        T.Q4_0: np.arange(16) - 8,
        T.IQ4_NL: np.array(quants.IQ4_NL.kvalues),
        T.MXFP4: np.array(quants.MXFP4.kvalues),
    }[tp]
    quants_at = size - 16
    for r, blocks in enumerate(rows):
        q = blocks[:, quants_at:].astype(np.int64)
        values = table[np.concatenate([q & 15, q >> 4], axis=1)]  # low nibbles are values 0..15
        products = values * x.reshape(nb, 32)
        if tp == T.MXFP4:
            dw = (2.0 ** (blocks[:, 0].astype(np.float64) - 128)).astype(F32)
        else:
            dw = f16_at(blocks, 0)
        scales = (dw * dx).astype(F32)
        acc = F32(0)
        for b in range(nb):
            acc = fma(F32(products[b].sum()), scales[b], acc)
        assert got[r] == acc, r


@pytest.mark.parametrize("target", SIMD_TARGETS)
def test_simd_nibble_table_dot(target):
    skip_unless_this_cpu_runs(target)
    dot = simd.NIBBLE_TABLE_DOT[target]

    @njit
    def run(w, x, table, out):
        for i in range(out.size):
            out[i] = dot(w, 3 + i * 16, x, i * 32, table)

    rng = np.random.default_rng(26)
    n = 40
    w = rng.integers(0, 256, 3 + n * 16, dtype=np.uint8)
    x = rng.integers(-127, 128, n * 32, dtype=np.int8)
    x[:32] = -127
    for table in (np.array(quants.IQ4_NL.kvalues, np.int8), np.array(quants.MXFP4.kvalues, np.int8)):
        out = np.empty(n, np.int32)
        run(w, x, table, out)
        q = w[3:].reshape(n, 16).astype(np.int64)
        values = table[np.concatenate([q & 15, q >> 4], axis=1)].astype(np.int64)
        np.testing.assert_array_equal(out, (values * x.reshape(n, 32)).sum(axis=1))


@pytest.mark.parametrize("span", [64, 128, 256])
@pytest.mark.parametrize("target", SIMD_TARGETS)
def test_simd_words_dot(target, span):
    """Decoded-row dots against numpy's int64 sums, the extremes included (int16 -32768 and 32767
    against int8 -128 and 127: the largest sums an int32 must hold), at unaligned offsets."""
    skip_unless_this_cpu_runs(target)
    dot = simd.WORDS_DOT[span][target]

    @njit
    def run(ws, x, out):
        for i in range(out.size):
            out[i] = dot(ws, 5 + i * span, x, 3 + i * span)

    rng = np.random.default_rng(28)
    n = 12
    ws = rng.integers(-32768, 32768, 5 + n * span).astype(np.int16)
    x = rng.integers(-128, 128, 3 + n * span).astype(np.int8)
    ws[5 : 5 + span], x[3 : 3 + span] = -32768, -128
    ws[5 + span : 5 + 2 * span], x[3 + span : 3 + 2 * span] = -32768, 127
    ws[5 + 2 * span : 5 + 3 * span], x[3 + 2 * span : 3 + 3 * span] = 32767, -128
    out = np.empty(n, np.int32)
    run(ws, x, out)
    expected = (ws[5:].reshape(n, span).astype(np.int64) * x[3:].reshape(n, span)).sum(axis=1)
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("target", SIMD_TARGETS)
def test_simd_iq4_xs_isum(target):
    """Whole IQ4_XS blocks (signed 6-bit sub-block scales, table values) against gguf's integer
    parts, the extremes included: scales -32 and 31, values -127, activations -127."""
    skip_unless_this_cpu_runs(target)
    isum = simd.IQ4_XS_ISUM[target]
    table = np.array(quants.IQ4_NL.kvalues, np.int8)

    @njit
    def run(w, x, table, out):
        for i in range(out.size):
            out[i] = isum(w, 5 + i * 136, x, i * 256, table)

    rng = np.random.default_rng(27)
    n = 30
    blocks = rng.integers(0, 256, (n, 136), dtype=np.uint8)
    blocks[0, 2:8] = 0  # every scale -32, every value -127
    blocks[0, 8:] = 0
    blocks[1, 2:8] = 0xFF  # every scale 31
    x = rng.integers(-127, 128, n * 256, dtype=np.int8)
    x[:512] = -127
    w = np.concatenate([np.zeros(5, np.uint8), blocks.reshape(-1)])
    out = np.empty(n, np.int32)
    run(w, x, table, out)
    scaled = integer_parts(T.IQ4_XS, blocks, o0=1.0)
    np.testing.assert_array_equal(out, (scaled * x.reshape(n, 256)).sum(axis=1).astype(np.int64))


@pytest.mark.parametrize("target", SIMD_TARGETS)
@pytest.mark.parametrize("tp", [T.Q4_K, T.Q5_K], ids=["Q4_K", "Q5_K"])
def test_simd_k4_isum_real_layout(tp, target):
    """q4_k_isum / q5_k_isum on whole blocks against gguf's integer parts (scale x quant)."""
    skip_unless_this_cpu_runs(target)
    from swapmoe.runtime.kernels.kquants import _scales_mins_k4

    size = GGML_QUANT_SIZES[tp][1]
    isum = simd.Q4_K_ISUM[target] if tp == T.Q4_K else simd.Q5_K_ISUM[target]

    @njit
    def run(w, x, out):
        for i in range(out.size):
            o = i * size
            scales, _ = _scales_mins_k4(w, o + 4)
            if size == 144:
                out[i] = isum(w, o + 16, x, i * 256, scales)
            else:
                out[i] = isum(w, o + 48, x, i * 256, scales, o + 16)

    rng = np.random.default_rng(27)
    n = 30
    blocks = rng.integers(0, 256, (n, size), dtype=np.uint8)
    blocks[0, 4:] = 255  # largest scales and quants
    x = rng.integers(-128, 128, n * 256, dtype=np.int8)
    x[:256] = -128
    out = np.empty(n, np.int32)
    run(blocks.reshape(-1), x, out)
    scaled = integer_parts(tp, blocks, o0=1.0, o2=0.0)
    np.testing.assert_array_equal(out, (scaled * x.reshape(n, 256)).sum(axis=1).astype(np.int64))


@pytest.mark.parametrize("target", SIMD_TARGETS)
def test_simd_q3_k_isum(target):
    skip_unless_this_cpu_runs(target)
    isum = simd.Q3_K_ISUM[target]

    @njit
    def run(w, x, bsums, out):
        for i in range(out.size):
            out[i] = isum(w, i * 110, x, i * 256, bsums, i * 16)

    rng = np.random.default_rng(28)
    n = 30
    blocks = rng.integers(0, 256, (n, 110), dtype=np.uint8)
    blocks[0, :108] = 0  # the extremes: values -4 with scales -32, activations -128
    blocks[1, :108] = 255
    x = rng.integers(-128, 128, n * 256, dtype=np.int8)
    x[:512] = -128
    bsums = x.reshape(-1, 16).sum(axis=1).astype(np.int32)
    out = np.empty(n, np.int32)
    run(blocks.reshape(-1), x, bsums, out)
    scaled = integer_parts(T.Q3_K, blocks, o108=1.0)
    np.testing.assert_array_equal(out, (scaled * x.reshape(n, 256)).sum(axis=1).astype(np.int64))


def test_numba_configuration_survives_a_reload():
    """The kernels need LLVM's SLP vectorizer (numba's default is off) and a cache directory keyed
    by their sources; numba re-reads NUMBA_* variables on every compile after one changed, so
    both must live in the environment, not only on numba.config."""
    import os

    import numba

    os.environ["NUMBA_SWAPMOE_TEST_PROBE"] = "1"  # any change makes numba re-read its variables
    try:
        numba.config.reload_config()
        assert numba.config.SLP_VECTORIZE == 1
        if "NUMBA_CACHE_DIR" in os.environ:  # unset only where no cache directory could be made
            assert numba.config.CACHE_DIR == os.environ["NUMBA_CACHE_DIR"] != ""
    finally:
        del os.environ["NUMBA_SWAPMOE_TEST_PROBE"]
        numba.config.reload_config()


@pytest.mark.parametrize("target", IQ1_TARGETS)
def test_simd_iq1_s_isum(target):
    skip_unless_this_cpu_runs(target)
    from swapmoe.runtime.kernels import iquants

    isum = simd.IQ1_S_ISUM[target]

    @njit
    def run(w, x, grid, bsums, out):
        for i in range(out.size):
            out[i] = isum(w, i * 50, x, i * 256, grid, bsums, i * 16)

    rng = np.random.default_rng(29)
    n = 30
    blocks = rng.integers(0, 256, (n, 50), dtype=np.uint8)
    blocks[0, 2:] = 255  # largest scales and grid indices, activations -128
    x = rng.integers(-128, 128, n * 256, dtype=np.int8)
    x[:256] = -128
    bsums = x.reshape(-1, 16).sum(axis=1).astype(np.int32)
    out = np.empty(n, np.int32)
    run(blocks.reshape(-1), x_order(x, target), iquants._IQ1_DELTA_TABLE, bsums, out)
    qh = blocks[:, 34:50].copy().view(np.uint16).astype(np.int64)  # [n, 8]
    index = blocks[:, 2:34].astype(np.int64).reshape(n, 8, 4) | (((qh[:, :, None] >> (3 * np.arange(4))) & 7) << 8)
    values = iquants._GRID_IQ1_S[index].reshape(n, 8, 32).astype(np.int64)
    scales = 2 * ((qh >> 12) & 7) + 1
    sumi = (values * x.reshape(n, 8, 32) * scales[:, :, None]).sum(axis=(1, 2))
    pairs = bsums.reshape(n, 8, 2).sum(axis=2).astype(np.int64)
    sumi1 = (np.where(qh & 0x8000, -scales, scales) * pairs).sum(axis=1)
    np.testing.assert_array_equal(out, 8 * sumi + sumi1)


@pytest.mark.parametrize("target", IQ1_TARGETS)
def test_simd_iq1_m_isum(target):
    skip_unless_this_cpu_runs(target)
    from swapmoe.runtime.kernels import iquants

    isum = simd.IQ1_M_ISUM[target]

    @njit
    def run(w, x, grid, bsums, out):
        for i in range(out.size):
            out[i] = isum(w, i * 56, x, i * 256, grid, bsums, i * 16)

    rng = np.random.default_rng(30)
    n = 30
    blocks = rng.integers(0, 256, (n, 56), dtype=np.uint8)
    blocks[0] = 255  # largest scales and grid indices, activations -128
    x = rng.integers(-128, 128, n * 256, dtype=np.int8)
    x[:256] = -128
    bsums = x.reshape(-1, 16).sum(axis=1).astype(np.int32)
    out = np.empty(n, np.int32)
    run(blocks.reshape(-1), x_order(x, target), iquants._IQ1_DELTA_TABLE, bsums, out)
    qh = blocks[:, 32:48].astype(np.int64)
    nibbles = np.stack([qh & 15, qh >> 4], axis=2).reshape(n, 32)  # one per 8-value group
    index = blocks[:, :32].astype(np.int64) | ((nibbles & 7) << 8)
    values = iquants._GRID_IQ1_S[index].astype(np.int64)  # [n, 32 groups, 8]
    words = blocks[:, 48:56].copy().view(np.uint16).astype(np.int64)  # [n, 4]
    scales = 2 * ((words[:, :, None] >> (3 * np.arange(4))) & 7).reshape(n, 16) + 1
    per_group = np.repeat(scales, 2, axis=1)  # [n, 32]
    xg = x.reshape(n, 32, 8).astype(np.int64)
    sumi1 = ((values * xg).sum(axis=2) * per_group).sum(axis=1)
    delta = np.where(nibbles & 8, -1, 1)
    sumi2 = (xg.sum(axis=2) * per_group * delta).sum(axis=1)
    np.testing.assert_array_equal(out, 8 * sumi1 + sumi2)


def test_activations_never_reach_minus_128():
    """simd.py moves weight signs onto the activation ((x ^ m) - m), which is exact only for
    x > -128: Q8_0 and Q8_K quantize to -127..127, also at their extremes."""
    rng = np.random.default_rng(31)
    X = rng.standard_normal((64, 512)).astype(F32)
    X[0] = -1.0  # every value the block's extreme
    X[1, ::2] = -6.0e4  # near fp16 max, where Q8_0 stores its scale
    X[2] = np.where(np.arange(512) % 7 == 0, -1e-30, 1e-30)
    for tp in (T.Q8_0, T.Q8_K):
        qs = K.quantize_activation(T.Q4_0 if tp == T.Q8_0 else T.Q4_K, X).qs
        assert qs.min() >= -127 and qs.max() <= 127
