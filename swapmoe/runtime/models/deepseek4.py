"""DeepSeek-V4 (deepseek4): DeepSeek-V4-Flash and its relatives.

Residual streams. Each token carries four copies of the hidden state (hyper-connections). Before
attention and before the FFN, the 24 "mixes" of the normalised streams give three things: the
weights that collapse the streams into the sublayer's input, how much of the sublayer's output
each stream receives, and a 4×4 Sinkhorn-normalised matrix that mixes the streams themselves.
The head collapses the streams once more before the final norm.

Attention. One query LoRA (qr = rms(W_qa·x)·norm, q = W_qb·qr, each head RMS-normalised without
a weight) and one shared key that is also the value (kv = rms(W_kv·x)·norm): multi-query
attention with K = V. RoPE (adjacent pairs) rotates only the last n_rot dims of each head, and
is taken back off the output. Sinks join each head's softmax. The output projection is grouped
low-rank: each of G groups of heads is projected to R values, then all G·R to the model width.
What a token sees depends on the layer's compress ratio:
  0    the raw keys of the last `sliding_window` positions;
  128  those, plus one compressed row per completed block of 128 positions (HCA);
  4    those, plus the compressed rows of blocks of 4 that the lightning indexer ranks among
       its top-k for this token (CSA).
A compressor turns a block into one row: per channel, a softmax over the block's positions of a
learned score (plus a per-position bias) weighs their projected values; the row is normalised
and RoPE'd at the block's first position. CSA's compressor (and the indexer's own, whose rows
are also Walsh–Hadamard rotated) reaches back over the previous block too, with the other half
of its double-width projections. Compressed layers use `compress_rope_freq_base` and YaRN.

Experts. sqrt(softplus(logits)) scores; the first `hash_layer_count` layers take their experts
from a token → experts table (the sidecar holds it) and only weigh them by the router; the
others add a selection bias and take the top-k. Weights are renormalised and scaled. Routed
and shared experts use a clamped SwiGLU: silu(min(gate, L)) · clamp(up, -L, L).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from gguf import Keys

from swapmoe.errors import SwapmoeError
from swapmoe.runtime import layers
from swapmoe.runtime.kernels import ggml_math, hyper
from swapmoe.runtime.linear import Weight, linear, linear_each, linear_per_group, rows_of
from swapmoe.runtime.models.base import Block, Gating, Hparams, Router, Transformer, _per_layer

F32 = np.float32
# metadata keys gguf-py does not name yet
COMPRESS_RATIOS = "{arch}.attention.compress_ratios"
COMPRESS_ROPE_BASE = "{arch}.attention.compress_rope_freq_base"
OUTPUT_GROUPS = "{arch}.attention.output_group_count"
HC_COUNT = "{arch}.hyper_connection.count"
HC_ITERATIONS = "{arch}.hyper_connection.sinkhorn_iterations"
HC_EPS = "{arch}.hyper_connection.epsilon"
HASH_LAYER_COUNT = "{arch}.hash_layer_count"

CSA, HCA = 4, 128  # the compress ratios llama.cpp accepts besides 0
KV_PAD = ggml_math.KV_PAD  # llama.cpp's KV cache rows come in multiples of this
LANE_CHUNK = 64  # ggml_vec_dot_f32's lanes span 64 values
CLAMP_EPS = 1e-6  # a clamp limit at or below this means no clamp


@dataclass(frozen=True)
class HyperMix:
    """hc_{attn,ffn}_{fn,base,scale}: the 24 mixes are fn·rms(streams)·scale + base."""

    fn: Weight
    base: np.ndarray
    scale: np.ndarray


@dataclass(frozen=True)
class Compressor:
    """Turns each block of `ratio` positions into one row `width` wide. With `overlap` (CSA and
    the indexer) the projections are 2·width wide: the first half serves the next block."""

    kv: Weight
    gate: Weight
    ape: np.ndarray  # [ratio, (1 or 2)·width]: score bias by position within the block
    norm: np.ndarray
    ratio: int
    overlap: bool
    rotated: bool = False  # rows Walsh–Hadamard rotated (the indexer's keys)


@dataclass(frozen=True)
class Indexer:
    """The lightning indexer of a CSA layer: its query (from qr), per-head weights, and keys."""

    q_b: Weight
    proj: Weight
    compressor: Compressor


@dataclass(frozen=True)
class CompressedAttention:
    q_a: Weight
    q_a_norm: np.ndarray
    q_b: Weight
    kv: Weight
    kv_norm: np.ndarray
    sinks: np.ndarray
    out_a: Weight  # G·R rows: group g's down-projection is rows g·R .. (g+1)·R
    out_b: Weight
    ratio: int
    compressor: Compressor | None = None
    indexer: Indexer | None = None


@dataclass(frozen=True)
class HyperBlock(Block):
    attn_mix: HyperMix
    ffn_mix: HyperMix


class CompressorState:
    """A compressor's ring of the last positions' projections (2·ratio with overlap, else ratio)
    and the rows it has produced, one per completed block."""

    def __init__(self, ratio: int, width: int, overlap: bool, n_ctx: int):
        ring, wide = (2 * ratio, 2 * width) if overlap else (ratio, width)
        self.kv = np.zeros((ring, wide), F32)
        self.score = np.zeros((ring, wide), F32)
        self.rows = np.zeros((n_ctx // ratio, width), F32)

    @staticmethod
    def nbytes(ratio: int, width: int, overlap: bool, n_ctx: int) -> int:
        ring, wide = (2 * ratio, 2 * width) if overlap else (ratio, width)
        return 4 * (2 * ring * wide + n_ctx // ratio * width)


class LayerCache:
    """What one layer keeps between tokens: a ring of the last `window` raw keys, and the
    compressors' states (attention; and the indexer's on CSA layers)."""

    def __init__(self, window: int, head_dim: int, ratio: int, index_dim: int, n_ctx: int):
        self.raw = np.zeros((window, head_dim), F32)
        self.length = 0
        self.attn = CompressorState(ratio, head_dim, ratio == CSA, n_ctx) if ratio else None
        self.indexer = CompressorState(CSA, index_dim, True, n_ctx) if ratio == CSA else None

    @staticmethod
    def nbytes(window: int, head_dim: int, ratio: int, index_dim: int, n_ctx: int) -> int:
        total = 4 * window * head_dim
        if ratio:
            total += CompressorState.nbytes(ratio, head_dim, ratio == CSA, n_ctx)
        if ratio == CSA:
            total += CompressorState.nbytes(CSA, index_dim, True, n_ctx)
        return total

    def trim(self, n: int) -> bool:
        """The ring has overwritten older keys and the compressors have folded them: only n ==
        length holds."""
        return n == self.length

    def checkpoint(self) -> None:
        """None: a copy would be as large as the cache, which the memory plan counts once; a
        conversation that leaves its held tokens is processed again from the start."""

    def restore(self, checkpoint: None) -> None:
        pass

    def window(self, kv: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Append this pass's keys; return the raw keys the pass may see and their positions."""
        n, start = len(self.raw), int(positions[0])
        older = np.arange(max(0, start - n + 1), start)
        keys = np.concatenate([self.raw[older % n], kv])
        kept = slice(max(0, len(kv) - n), None)
        self.raw[positions[kept] % n] = kv[kept]
        self.length += len(kv)
        return keys, np.concatenate([older, positions])


def _settings(g) -> dict:
    n_layer = g.arch_get(Keys.LLM.BLOCK_COUNT)
    ratios = list(g.arch_get(COMPRESS_RATIOS) or [])
    if len(ratios) < n_layer - g.arch_get(Keys.LLM.NEXTN_PREDICT_LAYERS, 0):
        raise SwapmoeError(f"{g.path}: {g.arch_key(COMPRESS_RATIOS)} has {len(ratios)} entries for {n_layer} layers")
    bad = sorted({r for r in ratios if r not in (0, CSA, HCA)})
    if bad:
        raise SwapmoeError(f"{g.path}: compress ratios {bad} are not supported (only 0, {CSA} and {HCA})")
    return dict(
        ratios=ratios,
        window=g.arch_get(Keys.Attention.SLIDING_WINDOW),
        index_dim=g.arch_get(Keys.Attention.Indexer.KEY_LENGTH, 0),
    )


class DeepSeek4(Transformer):
    @classmethod
    def cache_bytes(cls, gguf, hp: Hparams, n_ctx: int) -> int:
        s = _settings(gguf)
        return sum(
            LayerCache.nbytes(min(s["window"], n_ctx), hp.head_dim, s["ratios"][i], s["index_dim"], n_ctx)
            for i in range(hp.n_layer)
        )

    def setup(self):
        g, hp = self.gguf, self.hp
        s = _settings(g)
        self.ratios, self.window, self.index_dim = s["ratios"], s["window"], s["index_dim"]
        if hp.v_head_dim != hp.head_dim:
            raise SwapmoeError(f"{g.path}: deepseek4 needs key_length == value_length (K = V)")
        if g.arch_get(HC_COUNT) != hyper.HC:
            raise SwapmoeError(f"{g.path}: {g.arch_key(HC_COUNT)} must be {hyper.HC}")
        gating = g.arch_get(Keys.LLM.EXPERT_GATING_FUNC)
        if gating != Gating.SQRT_SOFTPLUS:
            raise SwapmoeError(
                f"{g.path}: deepseek4 expects expert_gating_func {int(Gating.SQRT_SOFTPLUS)} "
                f"(sqrt-softplus), not {gating}"
            )
        self.router = Router(
            Gating.SQRT_SOFTPLUS,
            normalize=bool(g.arch_get(Keys.LLM.EXPERT_WEIGHTS_NORM)),
            scale=g.arch_get(Keys.LLM.EXPERT_WEIGHTS_SCALE),
        )
        self.n_hash = g.arch_get(HASH_LAYER_COUNT, 0)
        tables = sorted(self.store.index.tables)
        if tables != list(range(min(self.n_hash, hp.n_layer))):
            raise SwapmoeError(
                f"{g.path}: {self.n_hash} hash-routed layers, but the index has tables for "
                f"layers {tables or 'none'}; rebuild the index"
            )
        self.hc_iterations, self.hc_eps = g.arch_get(HC_ITERATIONS), g.arch_get(HC_EPS)
        self.groups = g.arch_get(OUTPUT_GROUPS)
        self.n_index_heads = g.arch_get(Keys.Attention.Indexer.HEAD_COUNT, 0)
        self.index_top_k = g.arch_get(Keys.Attention.Indexer.TOP_K, 0)
        self.clamp = _per_layer(g.arch_get(Keys.LLM.SWIGLU_CLAMP_EXP), hp.n_layer)
        self.clamp_shared = _per_layer(g.arch_get(Keys.LLM.SWIGLU_CLAMP_SHEXP, self.clamp), hp.n_layer)
        # raw-window layers: plain RoPE; compressed layers, their rows and the indexer: their own
        # base, with YaRN whose magnitude boost llama.cpp cancels (attn_factor = 1 / mscale)
        self.rope = layers.Rope(hp.n_rot, hp.rope_base, neox=False)
        yarn = hp.rope_scaling == "yarn"
        f = F32(hp.rope_freq_scale)
        self.compress_rope = layers.Rope(
            hp.n_rot,
            g.arch_get(COMPRESS_ROPE_BASE),
            neox=False,
            freq_scale=hp.rope_freq_scale,
            ext_factor=1.0 if yarn else 0.0,
            n_ctx_orig=hp.n_ctx_orig,
            attn_factor=float(F32(1.0) / (F32(1.0) + F32(0.1) * F32(math.log(F32(1.0) / f)))) if yarn else 1.0,
        )
        self.hc_head = HyperMix(
            self.w.matrix("output_hc_fn.weight"),
            self.w.vector("output_hc_base.weight"),
            self.w.vector("output_hc_scale.weight"),
        )

    # --- loading -------------------------------------------------------------------------
    def _mix(self, i: int, half: str) -> HyperMix:
        p = f"blk.{i}.hc_{half}_"
        return HyperMix(
            self.w.matrix(p + "fn.weight"), self.w.vector(p + "base.weight"), self.w.vector(p + "scale.weight")
        )

    def _compressor(self, prefix: str, ratio: int, rotated: bool = False) -> Compressor:
        w = self.w
        ape = w.matrix(prefix + "ape.weight")
        return Compressor(
            w.matrix(prefix + "kv.weight"),
            w.matrix(prefix + "gate.weight"),
            rows_of(ape, np.arange(ape.rows)),
            w.vector(prefix + "norm.weight"),
            ratio,
            ratio == CSA,
            rotated,
        )

    def load_block(self, i):
        w, p, ratio = self.w, f"blk.{i}.", self.ratios[i]
        compressor = indexer = None
        if ratio:
            compressor = self._compressor(p + "attn_compressor_", ratio)
        if ratio == CSA:
            indexer = Indexer(
                w.matrix(p + "indexer.attn_q_b.weight"),
                w.matrix(p + "indexer.proj.weight"),
                self._compressor(p + "indexer_compressor_", CSA, rotated=True),
            )
        attn = CompressedAttention(
            q_a=w.matrix(p + "attn_q_a.weight"),
            q_a_norm=w.vector(p + "attn_q_a_norm.weight"),
            q_b=w.matrix(p + "attn_q_b.weight"),
            kv=w.matrix(p + "attn_kv.weight"),
            kv_norm=w.vector(p + "attn_kv_a_norm.weight"),
            sinks=w.vector(p + "attn_sinks.weight"),
            out_a=w.matrix(p + "attn_output_a.weight"),
            out_b=w.matrix(p + "attn_output_b.weight"),
            ratio=ratio,
            compressor=compressor,
            indexer=indexer,
        )
        ffn = w.moe(i, selection_bias=i >= self.n_hash, shared=True)
        return HyperBlock(
            w.vector(p + "attn_norm.weight"),
            attn,
            w.vector(p + "ffn_norm.weight"),
            ffn,
            self._mix(i, "attn"),
            self._mix(i, "ffn"),
        )

    def new_cache(self, n_ctx: int) -> list[LayerCache]:
        return [
            LayerCache(min(self.window, n_ctx), self.hp.head_dim, self.ratios[i], self.index_dim, n_ctx)
            for i in range(self.hp.n_layer)
        ]

    # --- the forward pass ----------------------------------------------------------------
    def embed(self, tokens):
        return np.repeat(rows_of(self.embedding, tokens)[:, None, :], hyper.HC, axis=1)  # [T, 4, D]

    def head(self, x):
        T_ = len(x)
        mixes = linear(self.hc_head.fn, layers.rms_norm(x.reshape(T_, -1), None, self.hp.rms_eps))
        pre = layers.sigmoid(mixes * self.hc_head.scale[0] + self.hc_head.base) + F32(self.hc_eps)
        y = np.empty((T_, x.shape[2]), F32)
        hyper.hc_collapse(x, pre, y)
        return layers.rms_norm(y, self.output_norm, self.hp.rms_eps)

    def block(self, i, x, step, cache):
        b, eps = self.blocks[i], self.hp.rms_eps
        h, post, comb = self.mix_in(x, b.attn_mix)
        x = self.mix_out(
            self.attention(b.attn, layers.rms_norm(h, b.attn_norm, eps), step.positions, cache), x, post, comb
        )
        h, post, comb = self.mix_in(x, b.ffn_mix)
        f = layers.rms_norm(h, b.ffn_norm, eps)
        return self.mix_out(self.moe(i, f, step) + self.shared_expert(i, f), x, post, comb)

    def mix_in(self, x, mix: HyperMix):
        """The streams x [T, 4, D] collapsed into one sublayer input [T, D], and the post weights
        and stream mixing matrix that mix_out applies after the sublayer."""
        T_ = len(x)
        mixes = linear(mix.fn, layers.rms_norm(x.reshape(T_, -1), None, self.hp.rms_eps))
        pre, post = np.empty((T_, hyper.HC), F32), np.empty((T_, hyper.HC), F32)
        comb = np.empty((T_, hyper.HC, hyper.HC), F32)
        hyper.hc_split(
            np.ascontiguousarray(mixes), mix.scale, mix.base, F32(self.hc_eps), self.hc_iterations, pre, post, comb
        )
        h = np.empty((T_, x.shape[2]), F32)
        hyper.hc_collapse(x, pre, h)
        return h, post, comb

    @staticmethod
    def mix_out(y, x, post, comb):
        out = np.empty_like(x)
        hyper.hc_expand(np.ascontiguousarray(y, F32), x, post, comb, out)
        return out

    def attention(self, at: CompressedAttention, a, positions, cache: LayerCache):
        hp, T_ = self.hp, len(a)
        hd, H = hp.head_dim, hp.n_head
        rope = self.compress_rope if at.ratio else self.rope
        cos, sin = rope.tables(positions)
        extra = []
        if at.compressor:
            extra += [at.compressor.kv, at.compressor.gate]
        if at.indexer:
            extra += [at.indexer.compressor.kv, at.indexer.compressor.gate, at.indexer.proj]
        qa, kv, *projected = linear_each(a, at.q_a, at.kv, *extra)
        qr = layers.rms_norm(qa, at.q_a_norm, hp.rms_eps)
        q = layers.rms_norm(linear(at.q_b, qr).reshape(T_, H, hd), None, hp.rms_eps)
        q = self.rope_tail(rope, q, cos, sin)
        kv = self.rope_tail(rope, layers.rms_norm(kv, at.kv_norm, hp.rms_eps)[:, None, :], cos, sin)[:, 0]
        keys, key_pos = cache.window(kv, positions)
        masked = (key_pos[None, :] > positions[:, None]) | (positions[:, None] - key_pos[None, :] >= self.window)
        # where llama.cpp holds each key in its row: raw keys in the cache cell of their position
        # (while the context fits its cache), then the compressed rows; each part padded to 256
        n_raw = _padded(int(positions[-1]) + 1)
        slots = key_pos
        if at.ratio:
            self.compress(at.compressor, cache.attn, *projected[:2], positions)
            n_rows = (int(positions[-1]) + 1) // at.ratio
            visible = (positions + 1) // at.ratio
            hidden = np.arange(n_rows)[None, :] >= visible[:, None]
            if at.indexer:
                ix = at.indexer
                self.compress(ix.compressor, cache.indexer, *projected[2:4], positions)
                hidden |= ~self.index(ix, qr, projected[4], cos, sin, cache.indexer.rows[:n_rows], visible)
            keys = np.concatenate([keys, cache.attn.rows[:n_rows]])
            masked = np.concatenate([masked, hidden], axis=1)
            slots = np.concatenate([key_pos, n_raw + np.arange(n_rows)])
        out = self.attend(q, keys, masked, slots, at.sinks)
        out = self.rope_tail(rope, out, cos, -sin)  # RoPE taken back off
        grouped = linear_per_group(at.out_a, out.reshape(T_, self.groups, H * hd // self.groups))
        return linear(at.out_b, grouped.reshape(T_, -1))

    def attend(self, q, keys, masked, slots, sinks):
        """softmax(q·k/√d, with the sinks)·k over the keys [S, d] (K = V), summed as llama.cpp sums
        its row of keys (a multiple of 256 long) in which key s sits at slots[s]. Only the
        64-value chunks of that row that hold a key are built: the others add exact zeros to
        every lane and block sum, so lanes and the softmax's 16-value blocks round as in the
        full row."""
        chunk = slots // LANE_CHUNK
        kept = np.unique(chunk)
        at = np.searchsorted(kept, chunk) * LANE_CHUNK + slots % LANE_CHUNK
        width = len(kept) * LANE_CHUNK
        row_keys = np.zeros((width, keys.shape[1]), F32)
        row_keys[at] = keys
        hidden = np.ones((len(q), width), bool)
        hidden[:, at] = masked
        T_, H, hd = q.shape
        scores = ggml_math.attention_scores(q, row_keys[:, None], 1.0 / math.sqrt(hd))  # [H, T, S]
        scores[:, hidden] = -np.inf
        p = ggml_math.softmax(scores, np.repeat(sinks, T_))
        values = ggml_math.transposed_values(row_keys[:, None])
        return ggml_math.attention_values(p, values, n=width)  # [T, H, hd]

    def rope_tail(self, rope: layers.Rope, x, cos, sin):
        """x [T, H, d] with RoPE on its last n_rot dims."""
        out = x.copy()
        out[..., -rope.n_rot :] = rope.apply(np.ascontiguousarray(x[..., -rope.n_rot :]), cos, sin)
        return out

    def compress(self, c: Compressor, state: CompressorState, kv, score, positions) -> None:
        """Feed this pass's projections to a compressor; write the row of every block that completes."""
        score = score + c.ape[positions % c.ratio]
        ring, start, r = len(state.kv), int(positions[0]), c.ratio
        ends = positions[(positions + 1) % r == 0]
        if ends.size:
            first = ends + 1 - r

            def gather(pos):  # projections at positions pos [B, n]: this pass's, the ring's, or none yet
                new = pos >= start
                at = np.clip(pos - start, 0, len(kv) - 1)
                values = np.where(new[..., None], kv[at], state.kv[pos % ring])
                scores = np.where(new[..., None], score[at], state.score[pos % ring])
                values[pos < 0], scores[pos < 0] = 0.0, -np.inf
                return values, scores

            block = first[:, None] + np.arange(r)
            if c.overlap:  # the previous block through the first half, this one through the second
                width = c.norm.size
                (pv, ps), (cv, cs) = gather(block - r), gather(block)
                values = np.concatenate([pv[..., :width], cv[..., width:]], axis=1)
                scores = np.concatenate([ps[..., :width], cs[..., width:]], axis=1)
            else:
                values, scores = gather(block)
            weights = ggml_math.softmax(scores.transpose(0, 2, 1))  # per channel, over the positions
            rows = (values.transpose(0, 2, 1) * weights).astype(np.float64).sum(axis=-1).astype(F32)
            rows = layers.rms_norm(rows, c.norm, self.hp.rms_eps)
            rows = self.rope_tail(self.compress_rope, rows[:, None, :], *self.compress_rope.tables(first))[:, 0]
            if c.rotated:
                rows = hadamard(rows)
            state.rows[ends // r] = rows
        kept = slice(max(0, len(kv) - ring), None)
        state.kv[positions[kept] % ring] = kv[kept]
        state.score[positions[kept] % ring] = score[kept]

    def index(self, ix: Indexer, qr, proj, cos, sin, keys, visible):
        """The lightning indexer: which compressed rows [T, R] each token attends to (its top-k)."""
        T_, d = len(qr), self.index_dim
        q = linear(ix.q_b, qr).reshape(T_, self.n_index_heads, d)
        q = hadamard(self.rope_tail(self.compress_rope, q, cos, sin))
        weights = proj * (F32(1.0) / F32(math.sqrt(F32(d * self.n_index_heads))))
        scores = np.empty((T_, len(keys)), F32)
        hyper.indexer_scores(q, np.ascontiguousarray(keys), np.ascontiguousarray(weights), visible, scores)
        chosen = np.zeros(scores.shape, bool)
        top = layers.top_k(scores, min(len(keys), self.index_top_k))
        np.put_along_axis(chosen, top, True, axis=1)
        return chosen

    def predict_experts(self, i, x, routing):
        """Layer i's experts for lookahead: exact for a hash-routed layer; else its router on the
        mean of the streams as they leave layer i - 1 (as if the layer's own attention and mixing
        changed nothing)."""
        exact = routing.hash_ids(i)
        if exact is not None:
            return exact[-1]
        b = self.blocks[i]
        f = layers.rms_norm(x[-1:].mean(axis=1, dtype=np.float64).astype(F32), b.ffn_norm, self.hp.rms_eps)
        scores = np.sqrt(layers.softplus(linear(b.ffn.router, f))) + b.ffn.selection_bias
        return layers.top_k(scores, self.hp.n_expert_used)[0]

    def shared_expert(self, i: int, x):
        sh = self.blocks[i].ffn.shared
        return linear(sh.down, _clamped_swiglu(*linear_each(x, sh.gate, sh.up), self.clamp_shared[i]))

    def expert_activation(self, layer, gate, up):
        return _clamped_swiglu(gate, up, self.clamp[layer])


def _padded(n: int) -> int:
    """llama.cpp's row count for n keys: a multiple of 256, at least 256."""
    return max(KV_PAD, ggml_math.padded_rows(n))


def hadamard(x: np.ndarray) -> np.ndarray:
    """The indexer's Walsh–Hadamard rotation of the last axis, in blocks of the largest power of
    two (at least 64) that divides it, as llama.cpp sizes its rotation matrix."""
    d, n = x.shape[-1], 64
    while d % (2 * n) == 0:
        n *= 2
    out = np.empty(x.shape, F32)
    hyper.fwht(np.ascontiguousarray(x, F32), n, out)
    return out


def _clamped_swiglu(gate, up, limit: float):
    if limit <= CLAMP_EPS:
        return layers.swiglu(gate, up)
    g = np.minimum(gate, F32(limit))
    return g / (F32(1.0) + layers.expf(-g)) * np.clip(up, F32(-limit), F32(limit))
