"""The building blocks every architecture shares, computed the way llama.cpp's CPU backend does.

Shapes: activations are float32 [T, D] for T tokens; attention heads are [T, H, d].
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numba
import numpy as np

from swapmoe.runtime.kernels import ggml_math

F32 = np.float32


def rms_norm(x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis; the sum of squares in double, as ggml does."""
    return ggml_math.rms_norm(x, weight, eps)


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, with ggml's exponential (kernels/ggml_math.py)."""
    return ggml_math.softmax(x)


def silu(x: np.ndarray) -> np.ndarray:
    return ggml_math.silu(x)


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up, with ggml's exponential."""
    return ggml_math.swiglu(gate, up).reshape(gate.shape)


@numba.vectorize(["float32(float32)"], cache=True)
def expf(x):
    """The C library's expf, which ggml's scalar ops (sigmoid, swiglu_oai) call. numpy's float32
    exp differs from it by an ulp on about 40% of inputs: enough to flip the rounding of an
    activation that a quantized matmul quantizes next."""
    return math.exp(x)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return F32(1.0) / (F32(1.0) + expf(-x))


@numba.vectorize(["float32(float32)"], cache=True)
def softplus(x):
    """ggml's softplus: x above 20, else log(1 + exp(x)) with the C library's logf and expf."""
    return x if x > F32(20.0) else math.log(F32(1.0) + math.exp(x))


def swiglu_oai(gate: np.ndarray, up: np.ndarray, alpha: float = 1.702, limit: float = 7.0) -> np.ndarray:
    """gpt-oss's clamped SwiGLU: g·σ(alpha·g)·(u + 1) with g = min(gate, limit), u = clamp(up, ±limit)."""
    g = np.minimum(gate, F32(limit))
    u = np.clip(up, F32(-limit), F32(limit))
    return g / (F32(1.0) + expf(F32(alpha) * -g)) * (u + F32(1.0))


# --- rotary position embedding ------------------------------------------------------------


@dataclass(frozen=True)
class Rope:
    """RoPE with llama.cpp's angle recurrence and YaRN ramp.

    neox: rotate pairs (i, i + n_rot/2) (NEOX) instead of adjacent pairs (2i, 2i+1) (NORM).
    """

    n_rot: int
    base: float
    neox: bool
    freq_scale: float = 1.0
    ext_factor: float = 0.0
    attn_factor: float = 1.0
    n_ctx_orig: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    freq_factors: np.ndarray | None = None
    _latest: dict = field(default_factory=dict, init=False, compare=False, repr=False)  # the last tables made

    def _corr_dims(self) -> tuple[float, float]:
        def corr_dim(n_rot_pairs: float) -> float:
            return self.n_rot * math.log(self.n_ctx_orig / (n_rot_pairs * 2 * math.pi)) / (2 * math.log(self.base))

        low = math.floor(corr_dim(self.beta_fast))
        high = math.ceil(corr_dim(self.beta_slow))
        return max(0.0, low), min(self.n_rot - 1.0, high)

    def tables(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos and sin [T, n_rot/2] for integer positions (read-only: every layer of a forward
        pass asks for the same positions, so the last answer is kept)."""
        key = positions.tobytes()
        if key not in self._latest:
            cos, sin = self._tables(positions)
            cos.flags.writeable = sin.flags.writeable = False
            self._latest.clear()
            self._latest[key] = cos, sin
        return self._latest[key]

    def _tables(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        half = self.n_rot // 2
        theta_scale = F32(self.base) ** F32(-2.0 / self.n_rot)
        theta = positions.astype(F32)
        thetas = np.empty((len(positions), half), F32)
        for i in range(half):  # an f32 recurrence, not a power per i: this is what ggml computes
            thetas[:, i] = theta
            theta = theta * theta_scale
        if self.freq_factors is not None:
            thetas = thetas / self.freq_factors[:half].astype(F32)
        theta_interp = F32(self.freq_scale) * thetas
        mscale = F32(self.attn_factor)
        if self.ext_factor != 0.0:
            low, high = self._corr_dims()
            ramp = 1 - np.clip((np.arange(half, dtype=F32) - F32(low)) / F32(max(0.001, high - low)), 0, 1)
            mix = (ramp * F32(self.ext_factor)).astype(F32)
            # theta_interp*(1 - mix) fused with the add, as ggml's C++ is compiled (FMA contraction)
            thetas = (theta_interp.astype(np.float64) * (1 - mix) + (thetas * mix).astype(F32)).astype(F32)
            mscale = mscale * F32(1.0 + 0.1 * math.log(1.0 / self.freq_scale))
        else:
            thetas = theta_interp
        cos, sin = ggml_math.cos_sin(np.ascontiguousarray(thetas, dtype=F32))
        return (cos * mscale).astype(F32), (sin * mscale).astype(F32)

    def apply(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """Rotate the first n_rot dims of every head of x [T, H, d]; the rest pass through."""
        out = np.empty(x.shape, F32)
        ggml_math.rope_rotate(x, cos, sin, self.n_rot, self.neox, out)
        return out


# --- attention ----------------------------------------------------------------------------


class KVCache:
    """Keys and values of every past position of one layer, in f32. The values are kept
    transposed ([Hkv, dv, positions], as llama.cpp's CPU cache keeps them without flash
    attention), so attention reads them without transposing the whole cache at every token."""

    def __init__(self, n_ctx: int, n_head_kv: int, k_dim: int, v_dim: int):
        self.k = np.empty((n_ctx, n_head_kv, k_dim), F32)
        self.vt = np.zeros((n_head_kv, v_dim, ggml_math.values_width(n_ctx)), F32)
        self.length = 0

    def append(self, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Add positions' keys [n, Hkv, dk] and values [n, Hkv, dv]; the keys [S, Hkv, dk] and
        transposed values [Hkv, dv, width] (attention's k and vt) of all positions so far."""
        n = len(k)
        self.k[self.length : self.length + n] = k
        self.vt[:, :, self.length : self.length + n] = v.transpose(1, 2, 0)
        self.length += n
        return self.k[: self.length], self.vt

    def trim(self, n: int) -> bool:
        """Keep the first n positions (what lies past them is overwritten as new ones come)."""
        if n > self.length:
            return False
        self.length = n
        return True

    def checkpoint(self) -> None:
        """Nothing to copy: trim returns to any earlier position."""

    def restore(self, checkpoint: None) -> None:
        pass


class RecurrentState:
    """What a recurrent (gated DeltaNet) layer keeps between tokens, the same size at any context
    length: the raw inputs of its causal convolution's last d_conv - 1 tokens, and one delta-rule
    matrix per V-head (transposed, as ggml keeps it). `length` counts the tokens seen."""

    def __init__(self, d_conv: int, conv_dim: int, n_v_heads: int, head_k: int, head_v: int):
        self.conv = np.zeros((d_conv - 1, conv_dim), F32)
        self.ssm = np.zeros((n_v_heads, head_v, head_k), F32)
        self.length = 0

    def trim(self, n: int) -> bool:
        """A state cannot forget tokens: only n == length holds."""
        return n == self.length

    def checkpoint(self) -> tuple[np.ndarray, np.ndarray, int]:
        return self.conv.copy(), self.ssm.copy(), self.length

    def restore(self, checkpoint: tuple[np.ndarray, np.ndarray, int]) -> None:
        conv, ssm, self.length = checkpoint
        self.conv[...], self.ssm[...] = conv, ssm


def attention(
    q: np.ndarray,
    k: np.ndarray,
    vt: np.ndarray,
    q_pos: np.ndarray,
    scale: float,
    window: int | None = None,
    sinks: np.ndarray | None = None,
) -> np.ndarray:
    """Causal multi-head attention with grouped KV heads.

    q [T, H, d]; k [S, Hkv, d] for positions 0..S-1; vt their values transposed [Hkv, dv, ≥ S]
    (KVCache.append's, or ggml_math.transposed_values of [S, Hkv, dv]); returns [T, H*dv].
    Query head h reads KV head h // (H / Hkv). `window`: keys with q_pos - k_pos >= window are
    masked (sliding-window layers). `sinks` [H]: per-head logits that join the softmax
    denominator but add no value.
    """
    T, H, _ = q.shape
    S, dv = len(k), vt.shape[1]
    if T == 1 and window is None and q_pos[0] >= S - 1:  # decoding: nothing is masked
        return ggml_math.attention_one_query(q, k, vt, scale, sinks).reshape(1, H * dv)
    head_sinks = None if sinks is None else np.repeat(sinks, T)
    # dot products summed in ggml's order: a 1-ulp difference here can move an activation across a
    # rounding boundary of the next 8-bit quantization (docs/benchmarks.md, parity); these kernels
    # were also as fast as numpy's BLAS or faster at every size measured (docs/kernels.md)
    scores = ggml_math.attention_scores(q, k, scale)  # [H, T, S]
    k_pos = np.arange(S)
    masked = k_pos[None, :] > q_pos[:, None]
    if window is not None:
        masked |= (q_pos[:, None] - k_pos[None, :]) >= window
    scores[:, masked] = -np.inf
    p = ggml_math.softmax(scores, head_sinks, padded=True)  # llama.cpp pads the KV rows to 256
    return ggml_math.attention_values(p, vt).reshape(T, H * dv)


def attend_one_token(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    cache: KVCache,
    rope: Rope,
    scale: float,
    q_norm: np.ndarray | None,
    k_norm: np.ndarray | None,
    eps: float,
    norm_per_head: bool,
    sinks: np.ndarray | None,
) -> np.ndarray:
    """A decoding token's attention [1, H*dv] from its projections q [1, H, d], k [1, Hkv, d] and
    v [1, Hkv, dv] (at the position after the cache's last, seeing every key): the RMS norms of
    q and k if given (per head, or over the whole projection), RoPE, the cache's new position and
    attention, in one compiled call instead of one per step, with the steps and the bits of
    rms_norm, Rope.apply, KVCache.append and attention()."""
    S = cache.length + 1
    if S > len(cache.k):
        raise ValueError(f"the KV cache holds {len(cache.k)} positions; position {cache.length} is past it")
    H, dv = q.shape[1], cache.vt.shape[1]
    cos, sin = rope.tables(np.array([cache.length]))  # the token's position is the cache's next
    out = np.empty((1, H, dv), F32)
    absent = np.zeros(0, F32)  # no norm weight, no sinks
    _attend_one_token(
        np.ascontiguousarray(q, F32),
        np.ascontiguousarray(k, F32),
        np.ascontiguousarray(v, F32),
        absent if q_norm is None else q_norm,
        absent if k_norm is None else k_norm,
        F32(eps),
        norm_per_head,
        cos,
        sin,
        rope.n_rot,
        rope.neox,
        cache.k,
        cache.vt,
        cache.length,
        F32(scale),
        absent if sinks is None else np.ascontiguousarray(sinks, F32),
        ggml_math.padded_rows(S),
        out,
    )
    cache.length = S
    return out.reshape(1, H * dv)


@numba.njit(cache=True, nogil=True)
def _attend_one_token(
    q, k, v, q_norm, k_norm, eps, norm_per_head, cos, sin, n_rot, neox, keys, vt, length, scale, sinks, n, out
):
    if q_norm.size:
        normed_q, normed_k = np.empty_like(q), np.empty_like(k)
        if norm_per_head:  # each head's d values are a row
            ggml_math._rms_norm(q[0], q_norm, eps, normed_q[0])
            ggml_math._rms_norm(k[0], k_norm, eps, normed_k[0])
        else:  # the whole projection is one row
            ggml_math._rms_norm(q.reshape(1, q.size), q_norm, eps, normed_q.reshape(1, q.size))
            ggml_math._rms_norm(k.reshape(1, k.size), k_norm, eps, normed_k.reshape(1, k.size))
        q, k = normed_q, normed_k
    rotated_q = np.empty_like(q)
    ggml_math.rope_rotate(q, cos, sin, n_rot, neox, rotated_q)
    ggml_math.rope_rotate(k, cos, sin, n_rot, neox, keys[length : length + 1])  # the key goes in the cache rotated
    for g in range(v.shape[1]):
        for c in range(v.shape[2]):
            vt[g, c, length] = v[0, g, c]
    ggml_math._attention_one_query(rotated_q, keys[: length + 1], vt, scale, sinks, n, out)


# --- mixture of experts routing -----------------------------------------------------------


def weighted_sum(ys: np.ndarray, rows: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """[1, H]: Σ_s weights[s] · ys[rows[s]], each product rounded to float and added in the order
    of s (llama.cpp's sum of the weighted experts, in rank order)."""
    out = np.empty((1, ys.shape[1]), F32)
    _weighted_sum(ys, np.asarray(rows, np.int64), np.ascontiguousarray(weights, F32), out[0])
    return out


@numba.njit(cache=True, nogil=True)
def _weighted_sum(ys, rows, weights, out):
    for j in range(out.size):
        out[j] = ys[rows[0], j] * weights[0]
    for s in range(1, rows.size):
        for j in range(out.size):
            out[j] = out[j] + ys[rows[s], j] * weights[s]  # no fused multiply-add: numba does not contract


def top_k(selection: np.ndarray, k: int) -> np.ndarray:
    """Indices [T, k] of the k largest selection scores per token, best first; ties in index
    order, NaN last (a stable sort of the negated scores)."""
    scores = np.ascontiguousarray(selection, F32)
    out = np.empty((len(scores), min(k, scores.shape[1])), np.int64)
    _top_k(scores, out)
    return out


_SCAN_TOP_K = 16  # up to this many picks a scan per pick beats sorting the row


@numba.njit(cache=True, nogil=True)
def _top_k(scores, out):
    rows, n = scores.shape
    k = out.shape[1]
    taken = np.zeros(n, np.bool_)
    for r in range(rows):
        if k > _SCAN_TOP_K:
            out[r] = np.argsort(-scores[r], kind="mergesort")[:k]
            continue
        taken[:] = False
        for j in range(k):
            best = -1
            for i in range(n):  # the first of the largest; NaN only where nothing else is left
                if not taken[i] and (
                    best < 0
                    or scores[r, i] > scores[r, best]
                    or (np.isnan(scores[r, best]) and not np.isnan(scores[r, i]))
                ):
                    best = i
            taken[best] = True
            out[r, j] = best


def limit_to_groups(selection: np.ndarray, n_groups: int, n_groups_used: int) -> np.ndarray:
    """DeepSeek-V3's group-limited routing as llama.cpp applies it: experts form n_groups equal
    groups, a group scores the sum of its two best selection values, and the experts of all but
    the n_groups_used best groups are masked to -inf."""
    T_, E = selection.shape
    groups = selection.reshape(T_, n_groups, E // n_groups)
    best_two = np.sort(groups, axis=-1)[..., -2:]
    scores = best_two[..., 1] + best_two[..., 0]
    kept = top_k(scores, n_groups_used)
    masked = np.full_like(groups, -np.inf)
    rows = np.arange(T_)[:, None]
    masked[rows, kept] = groups[rows, kept]
    return masked.reshape(T_, E)


def normalize_weights(w: np.ndarray) -> np.ndarray:
    """Scale the chosen experts' weights to sum to one (the sum clamped as llama.cpp does; summed
    in double from left to right, as ggml's sum_rows)."""
    rows = np.ascontiguousarray(w, F32).reshape(-1, w.shape[-1])
    out = np.empty_like(rows)
    _normalize_weights(rows, out)
    return out.reshape(w.shape)


@numba.njit(cache=True, nogil=True)
def _normalize_weights(w, out):
    for r in range(w.shape[0]):
        total = 0.0
        for j in range(w.shape[1]):
            total += np.float64(w[r, j])
        denominator = max(np.float32(total), np.float32(6.103515625e-5))  # NaN stays NaN, as np.maximum
        if np.isnan(total):
            denominator = np.float32(total)
        for j in range(w.shape[1]):
            out[r, j] = w[r, j] / denominator
