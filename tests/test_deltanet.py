"""The gated DeltaNet kernels against a plain float64 statement of the recurrence."""

import numpy as np

from swapmoe.runtime import layers
from swapmoe.runtime.kernels.deltanet import causal_conv, gated_delta_rule

F32 = np.float32


def test_causal_conv_slides_over_the_kept_inputs_and_keeps_the_last_ones():
    rng = np.random.default_rng(0)
    d_conv, C, T = 4, 12, 5
    state = rng.standard_normal((d_conv - 1, C)).astype(F32)
    x = rng.standard_normal((T, C)).astype(F32)
    weight = rng.standard_normal((C, d_conv)).astype(F32)
    window = np.concatenate([state, x]).astype(np.float64)
    expected = np.stack([(window[t : t + d_conv] * weight.T).sum(axis=0) for t in range(T)])
    out = np.empty((T, C), F32)
    kept = state.copy()
    causal_conv(kept, x, weight, out)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(kept, x[-(d_conv - 1) :])


def reference_delta_rule(state, q, k, v, g, beta):
    """S per V-head as [hk, hv] in float64: S *= exp(g); δ = (v - Sᵀk)β; S += k δᵀ; o = Sᵀq/√hk."""
    T, H, hv = v.shape
    n_k, hk = k.shape[1:]
    S = state.transpose(0, 2, 1).astype(np.float64)  # the kernel keeps S transposed
    out = np.empty((T, H, hv))
    for t in range(T):
        for h in range(H):
            kh = h % n_k
            S[h] *= np.exp(g[t, h])
            delta = (v[t, h] - S[h].T @ k[t, kh]) * beta[t, h]
            S[h] += np.outer(k[t, kh], delta)
            out[t, h] = S[h].T @ q[t, kh] / np.sqrt(hk)
    return out, S.transpose(0, 2, 1)


def test_gated_delta_rule_matches_the_recurrence_with_tiled_k_heads():
    rng = np.random.default_rng(1)
    T, H, n_k, hk, hv = 6, 4, 2, 32, 32  # V-head h reads K-head h % 2, not h // 2
    state = (0.1 * rng.standard_normal((H, hv, hk))).astype(F32)
    q = rng.standard_normal((T, n_k, hk)).astype(F32)
    k = rng.standard_normal((T, n_k, hk)).astype(F32)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((T, H, hv)).astype(F32)
    g = -rng.uniform(0.01, 1.0, (T, H)).astype(F32)
    beta = rng.uniform(0.0, 1.0, (T, H)).astype(F32)
    expected, expected_state = reference_delta_rule(state, q, k, v, g, beta)
    out = np.empty((T, H, hv), F32)
    kept = state.copy()
    gated_delta_rule(kept, q, k, v, g, beta, out)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(kept, expected_state, rtol=1e-4, atol=1e-5)


def test_softplus_is_linear_above_twenty():
    x = np.array([-30.0, -1.0, 0.0, 1.0, 19.5, 20.0, 25.0], F32)
    expected = np.where(x > 20, x, np.log(F32(1.0) + np.exp(x)))  # in float: 1 + exp(-30) is 1
    np.testing.assert_allclose(layers.softplus(x), expected, rtol=1e-6, atol=0)
