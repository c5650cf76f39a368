"""ggml-order element-wise math and attention sums against plain numpy."""

import math

import numpy as np
import pytest
from numba import njit, prange

from swapmoe.runtime.kernels import ggml_math
from swapmoe.runtime.kernels._jit import fma32

RNG = np.random.default_rng(5)


def test_expf_within_its_documented_error():  # ggml: at most 1.45 ulp + 0.5 ulp of rounding
    x = np.concatenate([np.linspace(-87, 88, 20001, dtype=np.float32), RNG.standard_normal(5000).astype(np.float32)])
    ours = np.array([ggml_math.ggml_expf(v) for v in x], np.float32)
    exact = np.exp(x.astype(np.float64))
    assert np.all(np.abs(ours - exact) <= 2.5 * np.spacing(exact.astype(np.float32)))  # measured max: 2.17
    assert ggml_math.ggml_expf(np.float32(-200)) == 0 and np.isinf(ggml_math.ggml_expf(np.float32(200)))


@njit
def _expf_scaled_by_ldexp(x):
    """ggml_expf with its last step as ldexp in double, rounded once to float: _mm512_scalef_ps."""
    g = ggml_math
    z = fma32(x, g._LOG2E, g._SHIFT)
    n = np.float32(z - g._SHIFT)
    b = fma32(-n, g._LN2_LO, fma32(-n, g._LN2_HI, x))
    if abs(n) > 192:
        return np.float32(np.inf) if n > 0 else np.float32(0.0)
    u = np.float32(b * b)
    j = fma32(fma32(fma32(g._C5, b, g._C4), u, fma32(g._C3, b, g._C2)), u, fma32(g._C1, b, np.float32(1.0)))
    return np.float32(math.ldexp(j, int(n)))


@njit(parallel=True)
def _expf_mismatches(step):
    """Float32 bit patterns 0, step, 2*step, ... where ggml_expf and the ldexp form differ."""
    per_chunk = 1 << 20
    chunks = ((1 << 32) // step + per_chunk - 1) // per_chunk
    bad = np.zeros(chunks, np.int64)
    for c in prange(chunks):
        for i in range(c * per_chunk, min((c + 1) * per_chunk, (1 << 32) // step)):
            x = np.array([np.uint32(i * step)]).view(np.float32)[0]
            a, e = ggml_math.ggml_expf(x), _expf_scaled_by_ldexp(x)
            if not (a == e or (a != a and e != e)):
                bad[c] += 1
    return bad.sum()


@pytest.mark.parametrize("step", [4099, pytest.param(1, marks=pytest.mark.slow)], ids=["sample", "every-float"])
def test_expf_scales_as_ldexp(step):
    """Its scaling by a table of powers of two gives ldexp's bits (the slow case: all 2^32 inputs)."""
    assert _expf_mismatches(step) == 0


@pytest.mark.parametrize("n", [16, 37, 256])
def test_softmax_swiglu_rms_norm(n):
    x = (RNG.standard_normal((5, n)) * 3).astype(np.float32)
    g = RNG.standard_normal((5, n)).astype(np.float32)
    e = np.exp(x.astype(np.float64) - x.max(-1, keepdims=True))
    np.testing.assert_allclose(ggml_math.softmax(x), e / e.sum(-1, keepdims=True), rtol=3e-6, atol=1e-9)
    np.testing.assert_allclose(
        ggml_math.swiglu(x, g), x / (1 + np.exp(-x.astype(np.float64))) * g, rtol=3e-6, atol=1e-7
    )
    # squares rounded to float (as ggml does), summed in double, the rest in float
    w = RNG.standard_normal(n).astype(np.float32)
    mean = ((x * x).astype(np.float64).sum(-1, keepdims=True) / n).astype(np.float32)
    want = x * (np.float32(1) / np.sqrt(mean + np.float32(1e-6)))
    np.testing.assert_array_equal(ggml_math.rms_norm(x, None, 1e-6), want)
    np.testing.assert_array_equal(ggml_math.rms_norm(x, w, 1e-6), want * w)
    sinks = RNG.standard_normal(5).astype(np.float32)
    top = np.maximum(x.max(-1), sinks)[:, None]
    with_sink = np.exp(np.concatenate([x, sinks[:, None]], 1).astype(np.float64) - top)
    np.testing.assert_allclose(
        ggml_math.softmax(x, sinks), (with_sink / with_sink.sum(-1, keepdims=True))[:, :-1], rtol=3e-6, atol=1e-9
    )


@pytest.mark.parametrize("T", [1, 7])
def test_attention_sums(T):
    H, Hkv, d, S = 4, 2, 64, 23
    q = RNG.standard_normal((T, H, d)).astype(np.float32)
    k = RNG.standard_normal((S, Hkv, d)).astype(np.float32)
    v = RNG.standard_normal((S, Hkv, d)).astype(np.float32)
    kv_head = np.arange(H) // (H // Hkv)
    exact = np.einsum("thd,shd->hts", q.astype(np.float64), k[:, kv_head].astype(np.float64))
    scores = ggml_math.attention_scores(q, k)
    np.testing.assert_allclose(scores, exact, rtol=1e-5, atol=1e-4)
    p = ggml_math.softmax(scores)
    values = ggml_math.attention_values(p, ggml_math.transposed_values(v))
    np.testing.assert_allclose(
        values, np.einsum("hts,shd->thd", p.astype(np.float64), v[:, kv_head]), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("S", [1, 23, 300])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_one_query_attention_is_the_three_kernels(S, with_sinks):
    H, Hkv, d, dv = 8, 2, 64, 48
    q = RNG.standard_normal((1, H, d)).astype(np.float32)
    k = RNG.standard_normal((S, Hkv, d)).astype(np.float32)
    vt = ggml_math.transposed_values(RNG.standard_normal((S, Hkv, dv)).astype(np.float32))
    sinks = RNG.standard_normal(H).astype(np.float32) if with_sinks else None
    p = ggml_math.softmax(ggml_math.attention_scores(q, k, 0.125), sinks, padded=True)
    np.testing.assert_array_equal(
        ggml_math.attention_one_query(q, k, vt, 0.125, sinks), ggml_math.attention_values(p, vt)
    )


@pytest.mark.parametrize("norm", ["none", "per-head", "whole"])
@pytest.mark.parametrize("with_sinks", [False, True])
@pytest.mark.parametrize("past", [0, 5, 300])
def test_one_token_attention_is_its_steps(norm, with_sinks, past):
    """layers.attend_one_token gives the bits of rms_norm, Rope.apply, KVCache.append and
    attention() one after the other, and leaves the same cache."""
    from swapmoe.runtime import layers

    H, Hkv, d, dv, eps, scale = 8, 2, 64, 48, 1e-6, 0.125
    rope = layers.Rope(n_rot=32, base=10000.0, neox=norm != "whole")  # partial rotation, both pair orders
    caches = [layers.KVCache(320, Hkv, d, dv) for _ in range(2)]
    old_k = RNG.standard_normal((past, Hkv, d)).astype(np.float32)
    old_v = RNG.standard_normal((past, Hkv, dv)).astype(np.float32)
    for cache in caches:
        cache.append(old_k, old_v)
    q = RNG.standard_normal((1, H, d)).astype(np.float32)
    k = RNG.standard_normal((1, Hkv, d)).astype(np.float32)
    v = RNG.standard_normal((1, Hkv, dv)).astype(np.float32)
    q_norm = k_norm = None
    if norm != "none":
        q_norm = RNG.uniform(0.5, 1.5, d if norm == "per-head" else H * d).astype(np.float32)
        k_norm = RNG.uniform(0.5, 1.5, d if norm == "per-head" else Hkv * d).astype(np.float32)
    sinks = RNG.standard_normal(H).astype(np.float32) if with_sinks else None
    positions = np.array([past])
    cos, sin = rope.tables(positions)

    q_step, k_step = q, k
    if norm == "per-head":
        q_step, k_step = layers.rms_norm(q, q_norm, eps), layers.rms_norm(k, k_norm, eps)
    elif norm == "whole":
        q_step = layers.rms_norm(q.reshape(1, -1), q_norm, eps).reshape(q.shape)
        k_step = layers.rms_norm(k.reshape(1, -1), k_norm, eps).reshape(k.shape)
    keys, values = caches[0].append(rope.apply(k_step, cos, sin), v)
    expected = layers.attention(rope.apply(q_step, cos, sin), keys, values, positions, scale, None, sinks)

    got = layers.attend_one_token(q, k, v, caches[1], rope, scale, q_norm, k_norm, eps, norm == "per-head", sinks)
    np.testing.assert_array_equal(got, expected)
    assert caches[1].length == caches[0].length == past + 1
    np.testing.assert_array_equal(caches[1].k[: past + 1], caches[0].k[: past + 1])
    np.testing.assert_array_equal(caches[1].vt[:, :, : past + 1], caches[0].vt[:, :, : past + 1])


def test_attention_is_masked_softmax_attention():
    """Causal, windowed, with sinks and grouped KV heads: a float64 statement of it."""
    from swapmoe.runtime import layers

    T, S, H, Hkv, d, window, scale = 5, 9, 4, 2, 64, 3, 0.125
    q = RNG.standard_normal((T, H, d)).astype(np.float32)
    k = RNG.standard_normal((S, Hkv, d)).astype(np.float32)
    v = RNG.standard_normal((S, Hkv, d)).astype(np.float32)
    sinks = RNG.standard_normal(H).astype(np.float32)
    q_pos, k_pos = np.arange(S - T, S), np.arange(S)
    kv_head = np.arange(H) // (H // Hkv)
    scores = np.einsum("thd,shd->hts", q.astype(np.float64), k[:, kv_head]) * scale
    scores[:, (k_pos[None, :] > q_pos[:, None]) | (q_pos[:, None] - k_pos[None, :] >= window)] = -np.inf
    top = np.maximum(scores.max(axis=-1, keepdims=True), sinks[:, None, None])
    e = np.exp(scores - top)
    p = e / (e.sum(axis=-1, keepdims=True) + np.exp(sinks[:, None, None] - top))
    expected = np.einsum("hts,shd->thd", p, v[:, kv_head]).reshape(T, H * d)
    got = layers.attention(q, k, ggml_math.transposed_values(v), q_pos, scale, window=window, sinks=sinks)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("neox", [False, True])
def test_rope_rotate(neox):
    """The first n_rot dims turn pairwise, x0*c - x1*s (first product fused), the rest stay."""
    T, H, d, n_rot = 3, 2, 10, 8
    x = RNG.standard_normal((T, H, d)).astype(np.float32)
    angles = RNG.uniform(-3, 3, (T, n_rot // 2)).astype(np.float32)
    cos, sin = np.cos(angles), np.sin(angles)
    out = np.empty_like(x)
    ggml_math.rope_rotate(x, cos, sin, n_rot, neox, out)
    a = np.arange(n_rot // 2) if neox else np.arange(0, n_rot, 2)
    b = a + n_rot // 2 if neox else a + 1
    x0, x1 = x[..., a].astype(np.float64), x[..., b]
    c, s = cos[:, None, :], sin[:, None, :]
    np.testing.assert_array_equal(out[..., a], (x0 * c - (x1 * s).astype(np.float32)).astype(np.float32))
    np.testing.assert_array_equal(out[..., b], (x0 * s + (x1 * c).astype(np.float32)).astype(np.float32))
    np.testing.assert_array_equal(out[..., n_rot:], x[..., n_rot:])


@pytest.mark.parametrize("k", [1, 8, 40])
def test_top_k_is_a_stable_sort_of_the_negated_scores(k):
    """Ties in index order, -inf and NaN last, k above and below the scan's limit."""
    from swapmoe.runtime import layers

    for trial in range(60):
        scores = np.round(RNG.standard_normal((3, 150)), 1 if trial % 2 else 6).astype(np.float32)
        scores[RNG.random(scores.shape) < 0.1 * (trial % 3)] = np.nan
        scores[RNG.random(scores.shape) < 0.1 * (trial % 4 == 1)] = -np.inf
        np.testing.assert_array_equal(layers.top_k(scores, k), np.argsort(-scores, axis=-1, kind="stable")[:, :k])


def test_normalize_and_sum_weighted_experts_round_as_numpy():
    from swapmoe.runtime import layers

    w = RNG.random((4, 8)).astype(np.float32)
    w[1] *= 1e-7  # under the clamp
    w[2, 3] = np.nan
    total = np.zeros((4, 1))
    for k in range(8):
        total += w[:, k : k + 1]  # in double, left to right
    want = w / np.maximum(total.astype(np.float32), np.float32(6.103515625e-5))
    np.testing.assert_array_equal(layers.normalize_weights(w), want)
    ys, rows = RNG.standard_normal((8, 300)).astype(np.float32), RNG.permutation(8)
    out = ys[rows[0]] * w[0, 0]
    for s in range(1, 8):
        out = out + ys[rows[s]] * w[0, s]  # each product rounded, then added in rank order
    np.testing.assert_array_equal(layers.weighted_sum(ys, rows, w[0])[0], out)
