"""The contract every architecture file is written against.

An architecture is a subclass of `Transformer`. The base reads the hyperparameters, maps the
non-expert weights, runs the outer loop (embed → blocks → norm → output) and offers the pieces
several architectures share (grouped-query attention, the routed-expert mixture, dense FFNs).
A subclass provides:

- `setup()`: architecture-level settings, before the blocks load: sets `self.rope` (the RoPE
  of the attention layers) and whatever else the architecture reads from the file.
- `load_block(i) -> Block`: layer i's weights as typed records, built with the loaders of
  `self.w` (`attention`, `moe`, `dense_ffn`, `block`). Every tensor is looked up when the model
  loads, so a misnamed one fails there with a message naming it.
- `block(i, h, step, cache) -> h`: the forward pass of layer i, reading like the model; `step`
  (a `Step`) carries the pass's positions and the sequence's routing state (hand it to
  `self.moe(i, x, step)`), `cache` is the sequence's cache of layer i.

and may override:

- `router`: how router logits become expert weights (a `Router`; class attribute or set in setup).
- `hparams(gguf)`: the hyperparameters, where the architecture reads a generic key differently.
- `new_cache(n_ctx)` and `cache_bytes(gguf, hp, n_ctx)`: per-layer caches other than GQA's
  per-head keys and values, and their size. A layer cache has `length` (tokens it holds),
  `trim(n) -> bool` (cut back to the first n tokens where it can; False where it cannot) and
  `checkpoint()` / `restore(checkpoint)` (a copy of what trim cannot bring back, or None where
  nothing is needed: a later restore and trim return to this point).
- `expert_activation(layer, gate, up)`: the routed experts' activation (default SwiGLU).
- `embed(tokens)` and `head(h)`: what enters the first block (default: the token embeddings)
  and what the output matrix reads after the last (default: h normalised by output_norm),
  for architectures whose residual stream is not one vector per token (DeepSeek-V4's four).

Hash-routed layers (DeepSeek-V4) need nothing of their own: `Routing.select` (routing.py)
takes their experts from the sidecar's token → experts table instead of the router's top-k.
Sequences that decode together (together.py) are each this same forward pass.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import ExpertGatingFuncType, GGMLQuantizationType as T, Keys

from swapmoe.errors import SwapmoeError
from swapmoe.gguf_file import GGUFFile
from swapmoe.runtime import kernels, layers
from swapmoe.runtime.experts.store import Expert
from swapmoe.runtime.kernels import ggml_math
from swapmoe.runtime.linear import Weight, linear, linear_apart, linear_each, rows_of
from swapmoe.runtime.routing import Routing

ROPE_SCALE_LINEAR = "{arch}.rope.scale_linear"  # the older key for the linear factor; gguf-py no longer names it


def _per_layer(value, n_layer: int) -> list:
    return list(value) if isinstance(value, list) else [value] * n_layer


def sliding_window_layers(gguf: GGUFFile, n_layer: int, pattern: int, dense_first: bool) -> list[bool]:
    """Which layers use sliding-window attention, as llama.cpp reads it: the file's per-layer
    flags (`attention.sliding_window_pattern` as an array), else a period n (the key as a number,
    else the architecture's default `pattern`): with dense_first every layer il with il % n != 0,
    else those with il % n < n - 1 (n = 0: all)."""
    value = gguf.arch_get(Keys.Attention.SLIDING_WINDOW_PATTERN, pattern)
    if isinstance(value, list):
        return [bool(v) for v in value[:n_layer]]
    if dense_first:
        return [value == 0 or il % value != 0 for il in range(n_layer)]
    return [value == 0 or il % value < value - 1 for il in range(n_layer)]


@dataclass
class Hparams:
    """The generic `{arch}.*` keys, with llama.cpp's defaults."""

    n_layer: int
    d_model: int
    n_head: int
    n_head_kv: int
    head_dim: int
    v_head_dim: int
    n_expert: int
    n_expert_used: int
    rms_eps: float
    n_ctx_train: int
    n_rot: int
    rope_base: float
    rope_scaling: str
    rope_freq_scale: float
    rope_attn_factor: float
    n_ctx_orig: int
    n_nextn: int  # trailing multi-token-prediction layers, not part of the forward pass

    @classmethod
    def from_gguf(cls, g: GGUFFile) -> "Hparams":
        def need(key):
            value = g.arch_get(key)
            if value is None:
                raise SwapmoeError(f"{g.path}: missing metadata key {g.arch_key(key)}")
            return value

        n_nextn = g.arch_get(Keys.LLM.NEXTN_PREDICT_LAYERS, 0)
        d_model, n_layer = need(Keys.LLM.EMBEDDING_LENGTH), need(Keys.LLM.BLOCK_COUNT) - n_nextn
        n_head = _per_layer(need(Keys.Attention.HEAD_COUNT), n_layer)[0]
        n_head_kv = _per_layer(g.arch_get(Keys.Attention.HEAD_COUNT_KV, n_head), n_layer)[0]
        head_dim = g.arch_get(Keys.Attention.KEY_LENGTH, d_model // n_head)
        factor = g.arch_get(Keys.Rope.SCALING_FACTOR, g.arch_get(ROPE_SCALE_LINEAR, 0.0))
        scaling = g.arch_get(Keys.Rope.SCALING_TYPE, "linear")
        return cls(
            n_layer=n_layer,
            d_model=d_model,
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            v_head_dim=g.arch_get(Keys.Attention.VALUE_LENGTH, head_dim),
            n_expert=g.arch_get(Keys.LLM.EXPERT_COUNT, 0),
            n_expert_used=_per_layer(g.arch_get(Keys.LLM.EXPERT_USED_COUNT, 0), 1)[0],
            rms_eps=need(Keys.Attention.LAYERNORM_RMS_EPS),
            n_ctx_train=need(Keys.LLM.CONTEXT_LENGTH),
            n_rot=g.arch_get(Keys.Rope.DIMENSION_COUNT, head_dim),
            rope_base=g.arch_get(Keys.Rope.FREQ_BASE, 10000.0),
            rope_scaling=scaling,
            rope_freq_scale=1.0 if scaling == "none" or not factor else 1.0 / factor,
            rope_attn_factor=g.arch_get(Keys.Rope.SCALING_ATTN_FACTOR, 1.0),
            n_ctx_orig=g.arch_get(Keys.Rope.SCALING_ORIG_CTX_LEN, need(Keys.LLM.CONTEXT_LENGTH)),
            n_nextn=n_nextn,
        )

    def kv_cache_bytes(self, n_ctx: int) -> int:
        """f32 keys and values of every layer and position (layers.KVCache: the values transposed,
        their positions rounded up): GQA's cache, an upper bound for the architectures that cache
        less (MLA's latent rows, sliding windows)."""
        values = ggml_math.values_width(n_ctx) * self.v_head_dim
        return self.n_layer * self.n_head_kv * (n_ctx * self.head_dim + values) * 4

    def context_attn_factor(self, mscale: float = 1.0, mscale_all_dims: float = 0.0) -> float:
        """llama.cpp's context attn_factor: with YaRN, get_mscale(f, 1) — or get_mscale(f, mscale) /
        get_mscale(f, mscale_all_dims) when the model sets a YaRN log multiplier — divided by the
        boost the RoPE kernel applies itself; always times rope.scaling.attn_factor."""
        if self.rope_scaling != "yarn":
            return self.rope_attn_factor
        f = 1.0 / self.rope_freq_scale

        def get_mscale(m: float) -> float:
            return 1.0 if f <= 1.0 else 0.1 * m * math.log(f) + 1.0

        factor = get_mscale(mscale) / get_mscale(mscale_all_dims) if mscale_all_dims else get_mscale(1.0)
        return factor / (1.0 + 0.1 * math.log(f)) * self.rope_attn_factor

    def rope(
        self,
        neox: bool,
        freq_factors: np.ndarray | None = None,
        base: float | None = None,
        attn_factor: float | None = None,
    ) -> layers.Rope:
        """RoPE with llama.cpp's context-level YaRN settings; `base` overrides the frequency base
        (sliding-window layers), `attn_factor` the context attn factor."""
        return layers.Rope(
            self.n_rot,
            self.rope_base if base is None else base,
            neox,
            self.rope_freq_scale,
            1.0 if self.rope_scaling == "yarn" else 0.0,
            self.context_attn_factor() if attn_factor is None else attn_factor,
            self.n_ctx_orig,
            freq_factors=freq_factors,
        )


# --- per-layer weight records ------------------------------------------------------------


@dataclass(frozen=True)
class Attention:
    """Grouped-query attention: q/k/v/output projections, their optional biases, optional RMS
    norms of q and k, and optional per-head sink logits (gpt-oss)."""

    wq: Weight
    wk: Weight
    wv: Weight
    wo: Weight
    bq: np.ndarray | None = None
    bk: np.ndarray | None = None
    bv: np.ndarray | None = None
    bo: np.ndarray | None = None
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    sinks: np.ndarray | None = None


@dataclass(frozen=True)
class DenseFFN:
    """down(silu(gate(x)) * up(x)): a dense layer's FFN, or an always-on shared expert."""

    gate: Weight
    up: Weight
    down: Weight

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return linear(self.down, layers.swiglu(*linear_each(x, self.gate, self.up)))


@dataclass(frozen=True)
class MoE:
    """A mixture of experts' non-expert weights; the routed experts themselves stream from the
    expert store."""

    router: Weight  # ffn_gate_inp: one logit per expert
    router_bias: np.ndarray | None = None  # added to the logits (gpt-oss)
    selection_bias: np.ndarray | None = None  # exp_probs_b: shifts which experts are chosen, not their weights
    shared: DenseFFN | None = None  # always-on shared expert
    shared_gate: Weight | None = None  # a per-token logit that scales the shared expert (qwen2moe)


@dataclass(frozen=True)
class Block:
    """One layer: the norm before attention, the attention weights (`Attention`, or a record of
    the architecture's own such as DeepSeek-2's latent attention), the norm before the FFN, the FFN."""

    attn_norm: np.ndarray
    attn: Any
    ffn_norm: np.ndarray
    ffn: MoE | DenseFFN


class Gating(enum.IntEnum):
    """llama.cpp's expert_gating_func values: how router logits become expert probabilities."""

    SOFTMAX = ExpertGatingFuncType.SOFTMAX
    SIGMOID = ExpertGatingFuncType.SIGMOID
    SOFTMAX_WEIGHT = 3  # gpt-oss: the top-k of the raw logits, softmax over those k (gguf-py has no name for it)
    SQRT_SOFTPLUS = 4  # DeepSeek-V4: sqrt(softplus(logits))


@dataclass(frozen=True)
class Router:
    """llama.cpp's build_moe_ffn settings after the router logits: the gating function, whether
    the k weights are renormalised to sum to one, a scale (0 or 1: none), DeepSeek-V3's group
    limit (keep the experts of the best n_groups_used of n_groups groups)."""

    gating: Gating
    normalize: bool = False
    scale: float = 0.0
    n_groups: int = 0
    n_groups_used: int = 0


# --- loading --------------------------------------------------------------------------------


class Weights:
    """Non-expert tensors of a GGUF, by name, as views of the mapped file; and the loaders that
    build the per-layer records from llama.cpp's tensor names."""

    def __init__(self, g: GGUFFile):
        self.g = g

    def has(self, name: str) -> bool:
        return name in self.g.tensors

    def matrix(self, name: str) -> Weight:
        t = self.g.tensor(name)
        kernels.require_kernel(t.ggml_type, f"{self.g.path}: tensor {name}")
        return Weight(self.g.raw(name), t.ggml_type, int(np.prod(t.ne[1:])), t.ne[0])

    def vector(self, name: str) -> np.ndarray:
        """A small float tensor (norm weight, bias) as f32."""
        t = self.g.tensor(name)
        if t.ggml_type not in (T.F32, T.F16, T.BF16):
            return rows_of(self.matrix(name), np.arange(int(np.prod(t.ne[1:])))).reshape(-1)
        if t.ggml_type == T.BF16:
            return (self.g.raw(name).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        return self.g.array(name).astype(np.float32).reshape(-1)

    def optional_vector(self, name: str) -> np.ndarray | None:
        return self.vector(name) if self.has(name) else None

    def attention(self, i: int, qk_norm: bool = False, sinks: bool = False) -> Attention:
        """Layer i's GQA weights; biases wherever the file has them."""
        p = f"blk.{i}."
        return Attention(
            wq=self.matrix(p + "attn_q.weight"),
            wk=self.matrix(p + "attn_k.weight"),
            wv=self.matrix(p + "attn_v.weight"),
            wo=self.matrix(p + "attn_output.weight"),
            bq=self.optional_vector(p + "attn_q.bias"),
            bk=self.optional_vector(p + "attn_k.bias"),
            bv=self.optional_vector(p + "attn_v.bias"),
            bo=self.optional_vector(p + "attn_output.bias"),
            q_norm=self.vector(p + "attn_q_norm.weight") if qk_norm else None,
            k_norm=self.vector(p + "attn_k_norm.weight") if qk_norm else None,
            sinks=self.vector(p + "attn_sinks.weight") if sinks else None,
        )

    def dense_ffn(self, i: int, suffix: str = "") -> DenseFFN:
        """Layer i's ffn_{gate,up,down}{suffix} (suffix "_shexp": the shared expert)."""
        return DenseFFN(*(self.matrix(f"blk.{i}.ffn_{part}{suffix}.weight") for part in ("gate", "up", "down")))

    def moe(
        self,
        i: int,
        router_bias: bool = False,
        selection_bias: bool = False,
        shared: bool = False,
        shared_gate: bool = False,
    ) -> MoE:
        """Layer i's router and, where asked for, its bias, selection bias, shared expert and gate."""
        p = f"blk.{i}."
        return MoE(
            router=self.matrix(p + "ffn_gate_inp.weight"),
            router_bias=self.vector(p + "ffn_gate_inp.bias") if router_bias else None,
            selection_bias=self.vector(p + "exp_probs_b.bias") if selection_bias else None,
            shared=self.dense_ffn(i, "_shexp") if shared else None,
            shared_gate=self.matrix(p + "ffn_gate_inp_shexp.weight") if shared_gate else None,
        )

    def block(self, i: int, attn: Any, ffn: MoE | DenseFFN, ffn_norm: str = "ffn_norm") -> Block:
        """A layer from its attention and FFN records and its two norms (attn_norm, and `ffn_norm`:
        the name of the norm in front of the FFN)."""
        return Block(self.vector(f"blk.{i}.attn_norm.weight"), attn, self.vector(f"blk.{i}.{ffn_norm}.weight"), ffn)


@dataclass(frozen=True)
class Step:
    """What one forward pass of one sequence carries through the blocks: its tokens' positions,
    the sequence's routing state, and, where sequences decode together, the meeting at which
    its routed experts are mixed with theirs (together.Meeting; None alone)."""

    positions: np.ndarray
    routing: Routing
    meeting: Any = None


class Transformer:
    """The outer loop and the shared pieces; see the module docstring for what a subclass provides."""

    rope: layers.Rope
    router: Router = Router(Gating.SOFTMAX)
    blocks: list[Block]

    def __init__(self, gguf: GGUFFile, store, hp: Hparams | None = None):
        self.gguf = gguf
        self.store = store
        self.hp = hp or self.hparams(gguf)
        self.w = Weights(gguf)
        self.embedding = self.w.matrix("token_embd.weight")
        self.output_norm = self.w.vector("output_norm.weight")
        self.output = self.w.matrix("output.weight") if self.w.has("output.weight") else self.embedding
        self.n_vocab = self.embedding.rows
        self.setup()
        self.blocks = [self.load_block(i) for i in range(self.hp.n_layer)]
        self._check_contract()

    @classmethod
    def hparams(cls, gguf: GGUFFile) -> Hparams:
        return Hparams.from_gguf(gguf)

    def setup(self) -> None:
        raise NotImplementedError

    def load_block(self, i: int) -> Block:
        raise NotImplementedError

    def block(self, i: int, h: np.ndarray, step: Step, cache: layers.KVCache) -> np.ndarray:
        raise NotImplementedError

    def _check_contract(self) -> None:
        name = type(self).__name__
        if not isinstance(getattr(self, "rope", None), layers.Rope):
            raise TypeError(f"{name}.setup() must set self.rope to a layers.Rope")
        if not isinstance(self.router, Router):
            raise TypeError(f"{name}.router must be a Router")
        for i, b in enumerate(self.blocks):
            if not isinstance(b, Block):
                raise TypeError(f"{name}.load_block({i}) returned {type(b).__name__}, not a Block")

    @classmethod
    def cache_bytes(cls, gguf: GGUFFile, hp: Hparams, n_ctx: int) -> int:
        """Bytes of the caches new_cache(n_ctx) makes, known before the network loads (the memory
        plan reserves them): GQA's keys and values, an upper bound where an architecture caches
        less (MLA's latent rows, sliding windows)."""
        return hp.kv_cache_bytes(n_ctx)

    def new_cache(self, n_ctx: int) -> list[layers.KVCache]:
        hp = self.hp
        return [layers.KVCache(n_ctx, hp.n_head_kv, hp.head_dim, hp.v_head_dim) for _ in range(hp.n_layer)]

    def forward(
        self, tokens: np.ndarray, cache: list, routing: Routing, all_logits: bool = False, meeting=None
    ) -> np.ndarray:
        """Logits [T, n_vocab] (or [1, n_vocab] for the last token) after feeding `tokens` to the
        sequence whose per-layer caches are `cache` and routing state is `routing`. `meeting`:
        where it waits for the sequences it decodes together with (together.py)."""
        start = cache[0].length
        decoding = len(tokens) == 1 and start > 0
        step = Step(np.arange(start, start + len(tokens)), routing, meeting)
        routing.begin_pass(decoding, tokens)
        h = self.embed(tokens)
        for i in range(self.hp.n_layer):
            h = self.block(i, h, step, cache[i])
            if routing.policy.lookahead and decoding and i + 1 < self.hp.n_layer:
                routing.prefetch(i + 1, self.predict_experts(i + 1, h, routing))
        routing.end_pass()
        if not all_logits:
            h = h[-1:]
        return linear(self.output, self.head(h))

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        return rows_of(self.embedding, tokens)

    def head(self, h: np.ndarray) -> np.ndarray:
        return layers.rms_norm(h, self.output_norm, self.hp.rms_eps)

    # --- pieces several architectures use -------------------------------------------------
    def gqa_attention(
        self,
        a: Attention,
        x: np.ndarray,
        positions: np.ndarray,
        cache: layers.KVCache,
        qk_norm_per_head: bool = True,
        window: int | None = None,
        rope: layers.Rope | None = None,
    ) -> np.ndarray:
        """Grouped-query attention as llama.cpp builds it: q,k,v (+bias) → attend → output (+bias)."""
        q, k, v = self.project_qkv(a, x)
        out = linear(a.wo, self.attend(a, q, k, v, positions, cache, qk_norm_per_head, window, rope))
        return out if a.bo is None else out + a.bo

    def project_qkv(self, a: Attention, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """q, k, v (+ their biases), sharing one quantized activation where the types allow."""
        q, k, v = linear_each(x, a.wq, a.wk, a.wv)
        for proj, bias in ((q, a.bq), (k, a.bk), (v, a.bv)):
            if bias is not None:
                proj += bias
        return q, k, v

    def attend(
        self,
        a: Attention,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        positions: np.ndarray,
        cache: layers.KVCache,
        qk_norm_per_head: bool = True,
        window: int | None = None,
        rope: layers.Rope | None = None,
    ) -> np.ndarray:
        """The heads' attention before the output projection [T, H*dv]: optional RMS norm of q and
        k (per head, or over the whole projection) → RoPE → cache → softmax(q·k/√d) v, with the
        sinks in the denominator if any. `rope` replaces the model's RoPE for this layer
        (sliding-window layers with their own frequency base)."""
        hp, T_ = self.hp, len(q)
        rope = rope or self.rope
        if T_ == 1 and window is None and positions[0] == cache.length:  # decoding: one compiled call
            return layers.attend_one_token(
                q.reshape(1, hp.n_head, hp.head_dim),
                k.reshape(1, hp.n_head_kv, hp.head_dim),
                v.reshape(1, hp.n_head_kv, hp.v_head_dim),
                cache,
                rope,
                1.0 / math.sqrt(hp.head_dim),
                a.q_norm,
                a.k_norm,
                hp.rms_eps,
                qk_norm_per_head,
                a.sinks,
            )
        if a.q_norm is not None and not qk_norm_per_head:
            q, k = layers.rms_norm(q, a.q_norm, hp.rms_eps), layers.rms_norm(k, a.k_norm, hp.rms_eps)
        q = q.reshape(T_, hp.n_head, hp.head_dim)
        k = k.reshape(T_, hp.n_head_kv, hp.head_dim)
        if a.q_norm is not None and qk_norm_per_head:
            q, k = layers.rms_norm(q, a.q_norm, hp.rms_eps), layers.rms_norm(k, a.k_norm, hp.rms_eps)
        cos, sin = rope.tables(positions)
        q, k = rope.apply(q, cos, sin), rope.apply(k, cos, sin)
        keys, values = cache.append(k, v.reshape(T_, hp.n_head_kv, hp.v_head_dim))
        return layers.attention(q, keys, values, positions, 1.0 / math.sqrt(hp.head_dim), window, a.sinks)

    def moe(self, i: int, x: np.ndarray, step: Step) -> np.ndarray:
        """llama.cpp's build_moe_ffn for layer i's routed experts, by `self.router`: router logits
        (+ bias) → probabilities by the gating function → choice (shifted by the selection bias,
        limited to groups) → top-k → weights from the unbiased probabilities, optionally
        renormalised, then scaled → the weighted sum of the chosen experts."""
        ffn, r = self.blocks[i].ffn, self.router
        logits = linear(ffn.router, x)
        if ffn.router_bias is not None:
            logits = logits + ffn.router_bias
        probs = _GATES[r.gating](logits)
        selection = probs if ffn.selection_bias is None else probs + ffn.selection_bias
        if r.n_groups > 1:
            selection = layers.limit_to_groups(selection, r.n_groups, r.n_groups_used)
        ids = step.routing.select(i, selection, self.hp.n_expert_used)
        weights = probs[np.arange(len(ids))[:, None], ids]
        if r.gating == Gating.SOFTMAX_WEIGHT:
            weights = layers.softmax(weights)
        if r.normalize:
            weights = layers.normalize_weights(weights)
        if r.scale not in (0.0, 1.0):
            weights = weights * np.float32(r.scale)
        return self.routed_experts(i, x, ids, weights, step)

    def routed_experts(self, layer: int, x: np.ndarray, ids: np.ndarray, weights: np.ndarray, step: Step) -> np.ndarray:
        """Σ_k weights[t,k] · expert_{ids[t,k]}(x[t]), summed in rank order as llama.cpp does.

        Expert-major: each expert any token chose is fetched once and applied to all its tokens.
        All reads of the layer start at once, and the experts already resident are computed while
        the others are read (store.ready_first); for one token, the resident ones in one kernel
        call per projection (experts_ffn). Sequences decoding together (step.meeting) meet here
        first, and one call mixes the experts for all their tokens."""
        if step.meeting is not None:
            return step.meeting.experts(layer, x, ids, weights)
        return self.mix_experts(layer, x, ids, weights)

    def mix_experts(self, layer: int, x: np.ndarray, ids: np.ndarray, weights: np.ndarray) -> np.ndarray:
        T_, k = ids.shape
        used = self.store.start_reads(layer, ids)
        if T_ == 1:  # decoding: every expert reads the same x, converted once
            quantized, (order, n_resident) = {}, self.store.ready_first(layer, used)
            ys = np.empty((len(order), x.shape[1]), np.float32)
            ys[:n_resident] = self.experts_ffn(
                layer, [self.store.expert(layer, e) for e in order[:n_resident]], x, quantized
            )
            for g in range(n_resident, len(order)):
                ys[g] = self.expert_ffn(layer, self.store.expert(layer, order[g]), x, quantized)[0]
            return layers.weighted_sum(ys, np.array([order.index(e) for e in ids[0].tolist()]), weights[0])
        per_slot = np.zeros((T_, k, x.shape[1]), np.float32)
        for e in self.store.ready_first(layer, used)[0]:
            rows, slots = np.nonzero(ids == e)
            y = self.expert_ffn(layer, self.store.expert(layer, e), x[rows])
            per_slot[rows, slots] = y * weights[rows, slots, None]
        out = per_slot[:, 0]
        for s in range(1, k):
            out = out + per_slot[:, s]
        return out

    def expert_ffn(
        self, layer: int, expert: Expert, x: np.ndarray, quantized: dict[int, kernels.QuantizedActivation] | None = None
    ) -> np.ndarray:
        """down(act(gate(x), up(x))) of one routed expert, plus its per-expert biases if the file has
        them. A fused gate_up is one matmul whose rows [0, F) are the gate and [F, 2F) the up.
        `quantized`: x's conversions shared by the experts of one token (linear_each)."""
        bias = expert.extras.get
        if expert.gate_up is not None:
            both = _plus(linear_each(x, expert.gate_up, quantized=quantized)[0], bias("gate_up.bias"))
            gate, up = both[:, : expert.gate_up.rows // 2], both[:, expert.gate_up.rows // 2 :]  # (np.split: 10 us)
        else:
            gate, up = linear_each(x, expert.gate, expert.up, quantized=quantized)
            gate, up = _plus(gate, bias("gate.bias")), _plus(up, bias("up.bias"))
        return _plus(linear(expert.down, self.expert_activation(layer, gate, up)), bias("down.bias"))

    def experts_ffn(
        self, layer: int, experts: list[Expert], x: np.ndarray, quantized: dict[int, kernels.QuantizedActivation]
    ) -> np.ndarray:
        """The rows of expert_ffn(layer, e, x, quantized) for e in experts [G, H], for one token
        x [1, H]: one product per projection for all of them where they can share one
        (_experts_together)."""
        together = self._experts_together(layer, experts, x) if len(experts) > 1 else None
        if together is not None:
            return together
        return (
            np.concatenate([self.expert_ffn(layer, e, x, quantized) for e in experts])
            if experts
            else np.empty((0, x.shape[1]), np.float32)
        )

    def _experts_together(self, layer: int, experts: list[Expert], x: np.ndarray) -> np.ndarray | None:
        """The experts' outputs [G, H] for one token x, by one kernel call per projection for all
        of them (linear_apart: the same bits as one call each), or None where their matrices do
        not lie in one buffer or they have per-expert biases."""
        if any(e.extras for e in experts):
            return None
        if experts[0].gate_up is not None and all(e.gate_up is not None for e in experts):
            both = linear_apart([e.gate_up for e in experts], x)
            if both is None:
                return None
            gate, up = both[:, : both.shape[1] // 2], both[:, both.shape[1] // 2 :]
        elif all(e.gate is not None and e.up is not None for e in experts):
            both = linear_apart([e.gate for e in experts] + [e.up for e in experts], x)  # gates, then ups
            if both is not None:
                gate, up = both[: len(experts)], both[len(experts) :]
            else:  # gate and up of different types: one product each
                gate, up = linear_apart([e.gate for e in experts], x), linear_apart([e.up for e in experts], x)
                if gate is None or up is None:
                    return None
        else:
            return None
        return linear_apart([e.down for e in experts], self.expert_activation(layer, gate, up))

    def expert_activation(self, layer: int, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return layers.swiglu(gate, up)

    def predict_experts(self, i: int, h: np.ndarray, routing: Routing) -> np.ndarray | None:
        """Guess layer i's experts from the residual stream before layer i runs (for prefetch):
        its router applied to h as if attention added nothing. None for a dense layer."""
        b = self.blocks[i]
        if not isinstance(b.ffn, MoE):
            return None
        exact = routing.hash_ids(i)
        if exact is not None:
            return exact[-1]
        x = layers.rms_norm(h[-1:], b.ffn_norm, self.hp.rms_eps)
        return layers.top_k(linear(b.ffn.router, x), self.hp.n_expert_used)[0]


_GATES = {
    Gating.SOFTMAX: layers.softmax,
    Gating.SIGMOID: layers.sigmoid,
    Gating.SOFTMAX_WEIGHT: lambda z: z,
    Gating.SQRT_SOFTPLUS: lambda z: np.sqrt(layers.softplus(z)),
}


def _plus(x: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    return x if bias is None else x + bias
