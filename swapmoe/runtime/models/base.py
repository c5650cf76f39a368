"""What every architecture file shares: hyperparameters read from the GGUF, weight lookup,
and the outer loop (embed → blocks → norm → output). Each architecture supplies its block."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as T

from swapmoe.errors import SwapmoeError
from swapmoe.gguf_file import GGUFFile
from swapmoe.runtime import layers
from swapmoe.runtime.experts.store import Expert
from swapmoe.runtime.linear import Weight, linear, quantize, rows_of


def _per_layer(value, n_layer: int) -> list:
    return list(value) if isinstance(value, list) else [value] * n_layer


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

    @classmethod
    def from_gguf(cls, g: GGUFFile) -> "Hparams":
        def need(key):
            value = g.arch_get(key)
            if value is None:
                raise SwapmoeError(f"{g.path}: missing metadata key {g.arch}.{key}")
            return value

        d_model, n_layer = need("embedding_length"), need("block_count") - g.arch_get("nextn_predict_layers", 0)
        n_head = _per_layer(need("attention.head_count"), n_layer)[0]
        n_head_kv = _per_layer(g.arch_get("attention.head_count_kv", n_head), n_layer)[0]
        head_dim = g.arch_get("attention.key_length", d_model // n_head)
        factor = g.arch_get("rope.scaling.factor", g.arch_get("rope.scale_linear", 0.0))
        scaling = g.arch_get("rope.scaling.type", "linear")
        return cls(
            n_layer=n_layer, d_model=d_model, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim,
            v_head_dim=g.arch_get("attention.value_length", head_dim),
            n_expert=g.arch_get("expert_count", 0), n_expert_used=_per_layer(g.arch_get("expert_used_count", 0), 1)[0],
            rms_eps=need("attention.layer_norm_rms_epsilon"), n_ctx_train=need("context_length"),
            n_rot=g.arch_get("rope.dimension_count", head_dim), rope_base=g.arch_get("rope.freq_base", 10000.0),
            rope_scaling=scaling, rope_freq_scale=1.0 if scaling == "none" or not factor else 1.0 / factor,
            rope_attn_factor=g.arch_get("rope.scaling.attn_factor", 1.0),
            n_ctx_orig=g.arch_get("rope.scaling.original_context_length", need("context_length")),
        )

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

    def rope(self, neox: bool, freq_factors: np.ndarray | None = None, base: float | None = None,
             attn_factor: float | None = None) -> layers.Rope:
        """RoPE with llama.cpp's context-level YaRN settings; `base` overrides the frequency base
        (sliding-window layers), `attn_factor` the context attn factor."""
        return layers.Rope(self.n_rot, self.rope_base if base is None else base, neox, self.rope_freq_scale,
                           1.0 if self.rope_scaling == "yarn" else 0.0,
                           self.context_attn_factor() if attn_factor is None else attn_factor,
                           self.n_ctx_orig, freq_factors=freq_factors)


class Weights:
    """Non-expert tensors of a GGUF, by name, as views of the mapped file."""

    def __init__(self, g: GGUFFile):
        self.g = g

    def has(self, name: str) -> bool:
        return name in self.g.tensors

    def matrix(self, name: str) -> Weight:
        t = self.g.tensor(name)
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


class Routing:
    """Expert-choice policies that sit between the router and the expert store.

    fixation N: while decoding, each layer reuses the expert ids of the first pass of every
        window of N passes (the router still weighs the pinned experts); never for prompts.
    prefetch_previous: at the start of a decoding pass, prefetch each layer's experts of the
        previous pass. lookahead: prefetch layer i+1's predicted experts after layer i.
    """

    def __init__(self, store):
        self.store = store
        self.fixation, self.prefetch_previous, self.lookahead = 0, False, False  # set by Model from its plan
        self._decoding = False
        self._passes = 0  # decoding passes since the fixation window opened
        self._pinned: dict[int, np.ndarray] = {}
        self._last: dict[int, np.ndarray] = {}

    def begin_pass(self, decoding: bool) -> None:
        self._decoding = decoding
        if not decoding:
            self._pinned.clear()
            self._passes = 0
        elif self.fixation and self._passes >= self.fixation:
            self._pinned.clear()
            self._passes = 0
        if decoding and self.prefetch_previous:
            for layer, ids in self._last.items():
                self.store.prefetch(layer, ids)
        elif decoding and self._pinned:  # fixed experts are known for the whole pass
            for layer, ids in self._pinned.items():
                self.store.prefetch(layer, ids)

    def select(self, layer: int, selection: np.ndarray, k: int) -> np.ndarray:
        """ids [T, k] of the chosen experts: top-k of `selection`, or the pinned ids under fixation."""
        if self._decoding and self.fixation and layer in self._pinned:
            ids = self._pinned[layer][None, :]
        else:
            ids = layers.top_k(selection, k)
            if self._decoding and self.fixation:
                self._pinned[layer] = ids[0]
        self._last[layer] = np.unique(ids)
        return ids

    def prefetch(self, layer: int, ids) -> None:
        if ids is not None and not (self._decoding and layer in self._pinned):
            self.store.prefetch(layer, ids)

    def end_pass(self) -> None:
        if self._decoding:
            self._passes += 1
        self.store.end_pass()


class Transformer:
    """The outer loop shared by all architectures: embed, run the blocks, normalise, project.

    Subclasses set up their per-layer weights in __init__ and implement `block`.
    """

    neox_rope = True

    def __init__(self, gguf: GGUFFile, store, hp: Hparams | None = None):
        self.gguf = gguf
        self.store = store
        self.hp = hp or Hparams.from_gguf(gguf)
        self.w = Weights(gguf)
        self.embedding = self.w.matrix("token_embd.weight")
        self.output_norm = self.w.vector("output_norm.weight")
        self.output = self.w.matrix("output.weight") if self.w.has("output.weight") else self.embedding
        self.n_vocab = self.embedding.rows
        self.routing = Routing(store)

    def new_cache(self, n_ctx: int) -> list[layers.KVCache]:
        hp = self.hp
        return [layers.KVCache(n_ctx, hp.n_head_kv, hp.head_dim, hp.v_head_dim) for _ in range(hp.n_layer)]

    def forward(self, tokens: np.ndarray, cache: list[layers.KVCache], all_logits: bool = False) -> np.ndarray:
        """Logits [T, n_vocab] (or [1, n_vocab] for the last token) after feeding `tokens`."""
        start = cache[0].length
        positions = np.arange(start, start + len(tokens))
        decoding = len(tokens) == 1 and start > 0
        self.routing.begin_pass(decoding)
        h = rows_of(self.embedding, tokens)
        for i in range(self.hp.n_layer):
            h = self.block(i, h, positions, cache[i])
            if self.routing.lookahead and decoding and i + 1 < self.hp.n_layer:
                self.routing.prefetch(i + 1, self.predict_experts(i + 1, h))
        self.routing.end_pass()
        if not all_logits:
            h = h[-1:]
        return linear(self.output, layers.rms_norm(h, self.output_norm, self.hp.rms_eps))

    def block(self, i: int, h: np.ndarray, positions: np.ndarray, cache: layers.KVCache) -> np.ndarray:
        raise NotImplementedError

    # --- pieces several architectures use -------------------------------------------------
    def routed_experts(self, layer: int, x: np.ndarray, ids: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """Σ_k weights[t,k] · expert_{ids[t,k]}(x[t]), summed in rank order as llama.cpp does.

        Expert-major: each expert any token chose is fetched once and applied to all its tokens.
        All reads of the layer start at once; each expert is computed as soon as it is in."""
        T_, k = ids.shape
        used = np.unique(ids)
        self.store.start_reads(layer, used)
        per_slot = np.zeros((T_, k, x.shape[1]), np.float32)
        for e in used:
            expert = self.store.expert(layer, e)
            rows, slots = np.nonzero(ids == e)
            per_slot[rows, slots] = self.expert_ffn(expert, x[rows]) * weights[rows, slots, None]
        out = per_slot[:, 0]
        for s in range(1, k):
            out = out + per_slot[:, s]
        return out

    expert_activation = staticmethod(layers.swiglu)  # act(gate, up) of the routed experts

    def expert_ffn(self, expert: Expert, x: np.ndarray) -> np.ndarray:
        """down(act(gate(x), up(x))) of one routed expert, plus its per-expert biases if the file has
        them. A fused gate_up is one matmul whose rows [0, F) are the gate and [F, 2F) the up."""
        bias = expert.extras.get
        if expert.gate_up is not None:
            both = _plus(linear(expert.gate_up, x), bias("gate_up.bias"))
            gate, up = both[:, :expert.gate_up.rows // 2], both[:, expert.gate_up.rows // 2:]  # (np.split: 10 us)
        else:
            gate, up = _gate_and_up(expert.gate, expert.up, x)
            gate, up = _plus(gate, bias("gate.bias")), _plus(up, bias("up.bias"))
        return _plus(linear(expert.down, self.expert_activation(gate, up)), bias("down.bias"))

    def dense_ffn(self, gate: Weight, up: Weight, down: Weight, x: np.ndarray) -> np.ndarray:
        """down(silu(gate(x)) * up(x))."""
        return linear(down, layers.swiglu(*_gate_and_up(gate, up, x)))

    def predict_experts(self, i: int, h: np.ndarray) -> np.ndarray | None:
        """Guess layer i's experts from the residual stream before layer i runs (for prefetch):
        its router applied to h as if attention added nothing. None if the layer has no router."""
        b = self.blocks[i]
        if "router" not in b:
            return None
        x = layers.rms_norm(h[-1:], b["ffn_norm"], self.hp.rms_eps)
        return layers.top_k(linear(b["router"], x), self.hp.n_expert_used)[0]

    def attention_weights(self, i: int, q_norm: bool = False, k_norm: bool = False) -> dict:
        """Per-layer GQA weights: q/k/v/o matrices, optional biases and optional q/k norms."""
        w, p = self.w, f"blk.{i}."
        b = {name: w.matrix(p + f"attn_{name[1]}.weight") for name in ("wq", "wk", "wv")}
        b["wo"] = w.matrix(p + "attn_output.weight")
        for name, tensor in (("bq", "attn_q"), ("bk", "attn_k"), ("bv", "attn_v"), ("bo", "attn_output")):
            b[name] = w.optional_vector(p + tensor + ".bias")
        b["q_norm"] = w.vector(p + "attn_q_norm.weight") if q_norm else None
        b["k_norm"] = w.vector(p + "attn_k_norm.weight") if k_norm else None
        return b

    def gqa_attention(self, b: dict, x: np.ndarray, positions: np.ndarray, cache: layers.KVCache,
                      qk_norm_per_head: bool = True, window: int | None = None,
                      sinks: np.ndarray | None = None, rope: layers.Rope | None = None) -> np.ndarray:
        """Grouped-query attention as llama.cpp builds it: q,k,v (+bias) → optional RMS norm of q
        and k (per head, or over the whole projection) → RoPE → softmax(q·k/√d) v → output (+bias).
        `rope` replaces the model's RoPE for this layer (per-layer frequency base)."""
        hp, T_ = self.hp, len(x)
        qx = quantize(b["wq"], x)
        same = lambda w: qx if w.vec_dot_type == b["wq"].vec_dot_type else None  # noqa: E731
        q, k, v = linear(b["wq"], x, qx), linear(b["wk"], x, same(b["wk"])), linear(b["wv"], x, same(b["wv"]))
        for proj, bias in ((q, b["bq"]), (k, b["bk"]), (v, b["bv"])):
            if bias is not None:
                proj += bias
        if b["q_norm"] is not None and not qk_norm_per_head:
            q, k = layers.rms_norm(q, b["q_norm"], hp.rms_eps), layers.rms_norm(k, b["k_norm"], hp.rms_eps)
        q = q.reshape(T_, hp.n_head, hp.head_dim)
        k = k.reshape(T_, hp.n_head_kv, hp.head_dim)
        if b["q_norm"] is not None and qk_norm_per_head:
            q, k = layers.rms_norm(q, b["q_norm"], hp.rms_eps), layers.rms_norm(k, b["k_norm"], hp.rms_eps)
        rope = rope or self.rope
        cos, sin = rope.tables(positions)
        q, k = rope.apply(q, cos, sin), rope.apply(k, cos, sin)
        keys, values = cache.append(k, v.reshape(T_, hp.n_head_kv, hp.v_head_dim))
        out = linear(b["wo"], layers.attention(q, keys, values, positions, 1.0 / math.sqrt(hp.head_dim),
                                               window, sinks))
        return out if b["bo"] is None else out + b["bo"]

    def softmax_moe(self, i: int, router: Weight, x: np.ndarray, renormalize: bool) -> np.ndarray:
        """Softmax over all experts, top-k, optionally renormalise the k weights, run the experts."""
        return self.moe(i, linear(router, x), x, "softmax", normalize=renormalize)

    def moe(self, i: int, logits: np.ndarray, x: np.ndarray, gating: str, selection_bias: np.ndarray | None = None,
            normalize: bool = False, scale: float = 0.0, n_groups: int = 0, n_groups_used: int = 0) -> np.ndarray:
        """llama.cpp's build_moe_ffn from the router logits on. gating: "softmax" or "sigmoid" gives
        the probabilities, "softmax_weight" (gpt-oss) keeps the logits and softmaxes the chosen k.
        `selection_bias` (DeepSeek-V3's exp_probs_b) shifts only which experts are chosen; group
        limiting, top-k, weights gathered from the unbiased probabilities, optionally renormalised,
        then scaled unless scale is 0 or 1."""
        probs = {"softmax": layers.softmax, "sigmoid": layers.sigmoid, "softmax_weight": lambda z: z}[gating](logits)
        selection = probs if selection_bias is None else probs + selection_bias
        if n_groups > 1:
            selection = layers.limit_to_groups(selection, n_groups, n_groups_used)
        ids = self.routing.select(i, selection, self.hp.n_expert_used)
        weights = np.take_along_axis(probs, ids, axis=-1)
        if gating == "softmax_weight":
            weights = layers.softmax(weights)
        if normalize:
            weights = layers.normalize_weights(weights)
        if scale not in (0.0, 1.0):
            weights = weights * np.float32(scale)
        return self.routed_experts(i, x, ids, weights)


def _gate_and_up(gate: Weight, up: Weight, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """gate(x) and up(x), sharing one quantized activation when the types allow."""
    qx = quantize(gate, x)
    return linear(gate, x, qx), linear(up, x, qx if up.vec_dot_type == gate.vec_dot_type else None)


def _plus(x: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    return x if bias is None else x + bias
