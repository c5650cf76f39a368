"""Tensor sets and metadata of each MoE architecture, as llama.cpp's loaders expect them.

Shapes are ggml `ne` (fastest dimension first). Each tensor has a role that decides its
type and contents: `matrix` weights take the chosen quant type, the others stay F32/I32.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

from gguf import ExpertGatingFuncType, Keys, RopeScalingType

from swapmoe.errors import SwapmoeError

Tensor = tuple[str, tuple[int, ...], str]  # (name, ne, role)
# roles: matrix (quantizable), norm (F32 around 1), vector (F32 small), router (F32 matrix),
#        table (I32 token->expert ids), sinks (F32 per-head logits), decay (F32, negative),
#        gain (F32 multipliers around 1), offset (F32 logit offsets of spread 1)

# Metadata keys are gguf's key templates ("{arch}.block_count"); the writer fills in the arch.
# Keys gguf-py does not name yet (DeepSeek-V4's) are written out the same way.
LLM, ATTN, ROPE, SSM = Keys.LLM, Keys.Attention, Keys.Rope, Keys.SSM
YARN = RopeScalingType.YARN.value
SQRT_SOFTPLUS = 4  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS (DeepSeek-V4; no gguf-py name)


@dataclass(frozen=True)
class SynthConfig:
    arch: str
    n_layer: int
    d_model: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_expert: int
    n_expert_used: int
    expert_ff: int
    shared_ff: int = 0  # width of the always-on shared expert (0: none)
    dense_ff: int = 0  # width of dense FFN layers (deepseek2 leading layers)
    n_dense_lead: int = 0  # deepseek2: first layers are dense
    ctx: int = 4096
    rope_base: float = 1e6
    rms_eps: float = 1e-6
    fused_gate_up: bool = False  # ffn_gate_up_exps instead of separate gate/up
    embed_std: float = 0.05  # spread of token embeddings (see presets.py)
    fan_in_std: bool = False  # weights with spread 1/sqrt(row length) instead of a fixed 0.05
    # routing shape (presets.py, docs/models.md): the spread of the attention output projections
    # times context_gain (attention averages over the context, so a larger share of it in the
    # residual stream makes routing last from token to token), DeltaNet's output projection times
    # recurrent_gain (it reads its state with each token's own query: per-token noise to routing),
    # and each expert's router row scaled by exp(N(0, router_spread)) (popular experts)
    context_gain: float = 1.0
    recurrent_gain: float = 1.0
    router_spread: float = 0.0
    attention_focus: float = 1.0  # attn_q_norm times this: below 1, attention spreads over more of the context
    # experts per layer (random ones) whose selection bias exp_probs_b is raised past any router score,
    # so every token chooses them, as trained routers have a few hot experts per layer: they add as much
    # re-use at the previous token as within 8 tokens, where the context's slow drift (context_gain)
    # adds about twice as much within 8, so together they reach profiles the drift alone cannot
    # (only routers with exp_probs_b; 0: none)
    hot_experts: int = 0
    extra: dict[str, Any] = field(default_factory=dict)  # arch-specific sizes

    def scaled(self, **changes) -> "SynthConfig":
        return replace(self, **changes)


def _common_keys(c: SynthConfig, n_ff: int) -> dict[str, Any]:
    return {
        LLM.CONTEXT_LENGTH: c.ctx,
        LLM.EMBEDDING_LENGTH: c.d_model,
        LLM.BLOCK_COUNT: c.n_layer,
        LLM.FEED_FORWARD_LENGTH: n_ff,
        LLM.EXPERT_COUNT: c.n_expert,
        LLM.EXPERT_USED_COUNT: c.n_expert_used,
        ATTN.HEAD_COUNT: c.n_head,
        ATTN.HEAD_COUNT_KV: c.n_head_kv,
        ATTN.KEY_LENGTH: c.head_dim,
        ATTN.VALUE_LENGTH: c.head_dim,
        ATTN.LAYERNORM_RMS_EPS: c.rms_eps,
        ROPE.FREQ_BASE: c.rope_base,
    }


def _experts(c: SynthConfig, i: int, d_in: int, bias: bool = False) -> list[Tensor]:
    p = f"blk.{i}."
    E, F = c.n_expert, c.expert_ff
    if c.fused_gate_up:
        out = [(p + "ffn_gate_up_exps.weight", (d_in, 2 * F, E), "matrix")]
    else:
        out = [(p + "ffn_gate_exps.weight", (d_in, F, E), "matrix"), (p + "ffn_up_exps.weight", (d_in, F, E), "matrix")]
    out.append((p + "ffn_down_exps.weight", (F, d_in, E), "matrix"))
    if bias:
        out += [
            (p + "ffn_gate_exps.bias", (F, E), "vector"),
            (p + "ffn_up_exps.bias", (F, E), "vector"),
            (p + "ffn_down_exps.bias", (d_in, E), "vector"),
        ]
    return out


def _shared(c: SynthConfig, i: int, gated: bool) -> list[Tensor]:
    p, D, Fs = f"blk.{i}.", c.d_model, c.shared_ff
    out = [(p + "ffn_gate_inp_shexp.weight", (D,), "vector")] if gated else []
    return out + [
        (p + "ffn_gate_shexp.weight", (D, Fs), "matrix"),
        (p + "ffn_up_shexp.weight", (D, Fs), "matrix"),
        (p + "ffn_down_shexp.weight", (Fs, D), "matrix"),
    ]


def _gqa(c: SynthConfig, i: int, qkv_bias: bool = False, out_bias: bool = False) -> list[Tensor]:
    p, D, q, kv = f"blk.{i}.", c.d_model, c.n_head * c.head_dim, c.n_head_kv * c.head_dim
    out = [
        (p + "attn_q.weight", (D, q), "matrix"),
        (p + "attn_k.weight", (D, kv), "matrix"),
        (p + "attn_v.weight", (D, kv), "matrix"),
        (p + "attn_output.weight", (q, D), "matrix"),
    ]
    if qkv_bias:
        out += [
            (p + "attn_q.bias", (q,), "vector"),
            (p + "attn_k.bias", (kv,), "vector"),
            (p + "attn_v.bias", (kv,), "vector"),
        ]
    if out_bias:
        out.append((p + "attn_output.bias", (D,), "vector"))
    return out


def _globals(c: SynthConfig, n_vocab: int, output: bool = True) -> list[Tensor]:
    out = [("token_embd.weight", (c.d_model, n_vocab), "matrix"), ("output_norm.weight", (c.d_model,), "norm")]
    return out + ([("output.weight", (c.d_model, n_vocab), "matrix")] if output else [])


def _norm(i: int, name: str, n: int) -> Tensor:
    return (f"blk.{i}.{name}.weight", (n,), "norm")


def _router(c: SynthConfig, i: int, bias: bool = False, probs_bias: bool = False) -> list[Tensor]:
    p = f"blk.{i}."
    out = [(p + "ffn_gate_inp.weight", (c.d_model, c.n_expert), "router")]
    if bias:
        out.append((p + "ffn_gate_inp.bias", (c.n_expert,), "vector"))
    if probs_bias:
        out.append((p + "exp_probs_b.bias", (c.n_expert,), "vector"))
    return out


# ---------------------------------------------------------------------------------------
def qwen3moe(c: SynthConfig, n_vocab: int) -> tuple[list[Tensor], dict[str, Any]]:
    t = _globals(c, n_vocab)
    for i in range(c.n_layer):
        t += [
            _norm(i, "attn_norm", c.d_model),
            *_gqa(c, i),
            _norm(i, "attn_q_norm", c.head_dim),
            _norm(i, "attn_k_norm", c.head_dim),
            _norm(i, "ffn_norm", c.d_model),
            *_router(c, i),
            *_experts(c, i, c.d_model),
        ]
    keys = _common_keys(c, c.expert_ff * c.n_expert_used) | {LLM.EXPERT_FEED_FORWARD_LENGTH: c.expert_ff}
    return t, keys


def qwen2moe(c: SynthConfig, n_vocab: int) -> tuple[list[Tensor], dict[str, Any]]:
    if c.n_head * c.head_dim != c.d_model:
        raise SwapmoeError("qwen2moe needs n_head * head_dim == d_model")
    t = _globals(c, n_vocab)
    for i in range(c.n_layer):
        t += [
            _norm(i, "attn_norm", c.d_model),
            *_gqa(c, i, qkv_bias=True),
            _norm(i, "ffn_norm", c.d_model),
            *_router(c, i),
            *_experts(c, i, c.d_model),
            *_shared(c, i, gated=True),
        ]
    keys = _common_keys(c, c.expert_ff * c.n_expert_used) | {
        LLM.EXPERT_FEED_FORWARD_LENGTH: c.expert_ff,
        LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH: c.shared_ff,
    }
    return t, keys


def olmoe(c: SynthConfig, n_vocab: int) -> tuple[list[Tensor], dict[str, Any]]:
    if c.n_head * c.head_dim != c.d_model or c.n_head_kv != c.n_head:
        raise SwapmoeError("olmoe needs n_head * head_dim == d_model and n_head_kv == n_head")
    t = _globals(c, n_vocab)
    for i in range(c.n_layer):
        t += [
            _norm(i, "attn_norm", c.d_model),
            *_gqa(c, i),
            _norm(i, "attn_q_norm", c.d_model),
            _norm(i, "attn_k_norm", c.d_model),
            _norm(i, "ffn_norm", c.d_model),
            *_router(c, i),
            *_experts(c, i, c.d_model),
        ]
    return t, _common_keys(c, c.expert_ff)


def llama(c: SynthConfig, n_vocab: int) -> tuple[list[Tensor], dict[str, Any]]:
    t = _globals(c, n_vocab)
    for i in range(c.n_layer):
        t += [
            _norm(i, "attn_norm", c.d_model),
            *_gqa(c, i),
            _norm(i, "ffn_norm", c.d_model),
            *_router(c, i),
            *_experts(c, i, c.d_model),
        ]
    return t, _common_keys(c, c.expert_ff) | {ROPE.DIMENSION_COUNT: c.head_dim}


def minimax_m2(c: SynthConfig, n_vocab: int) -> tuple[list[Tensor], dict[str, Any]]:
    t = _globals(c, n_vocab)
    for i in range(c.n_layer):
        t += [
            _norm(i, "attn_norm", c.d_model),
            *_gqa(c, i),
            _norm(i, "attn_q_norm", c.n_head * c.head_dim),
            _norm(i, "attn_k_norm", c.n_head_kv * c.head_dim),
            _norm(i, "ffn_norm", c.d_model),
            *_router(c, i, probs_bias=True),
            *_experts(c, i, c.d_model),
        ]
    keys = _common_keys(c, c.expert_ff) | {
        LLM.EXPERT_FEED_FORWARD_LENGTH: c.expert_ff,
        LLM.EXPERT_GATING_FUNC: int(ExpertGatingFuncType.SIGMOID),
        ROPE.DIMENSION_COUNT: c.extra.get("rope_dim", c.head_dim // 2),
    }
    return t, keys


def gpt_oss(c: SynthConfig, n_vocab: int) -> tuple[list[Tensor], dict[str, Any]]:
    t = _globals(c, n_vocab)
    for i in range(c.n_layer):
        t += [
            _norm(i, "attn_norm", c.d_model),
            *_gqa(c, i, qkv_bias=True, out_bias=True),
            (f"blk.{i}.attn_sinks.weight", (c.n_head,), "sinks"),
            _norm(i, "post_attention_norm", c.d_model),
            *_router(c, i, bias=True),
            *_experts(c, i, c.d_model, bias=True),
        ]
    keys = _common_keys(c, c.expert_ff) | {
        LLM.EXPERT_FEED_FORWARD_LENGTH: c.expert_ff,
        ATTN.SLIDING_WINDOW: c.extra.get("sliding_window", 128),
        ROPE.SCALING_TYPE: YARN,
        ROPE.SCALING_FACTOR: 32.0,
        ROPE.SCALING_ORIG_CTX_LEN: 4096,
    }
    if "rope_base_swa" in c.extra:
        keys[ROPE.FREQ_BASE_SWA] = float(c.extra["rope_base_swa"])
    return t, keys


def deepseek2(c: SynthConfig, n_vocab: int) -> tuple[list[Tensor], dict[str, Any]]:
    """DeepSeek-V3 shaped by default. extra knobs for the other layouts llama.cpp loads:
    q_lora_rank 0 (lite: attn_q), mla False (legacy attn_kv_b), gating 1 (V2 softmax, no
    exp_probs_b), weights_scale / weights_norm, yarn {factor, original_context_length, log_mul}."""
    x = c.extra
    ql, kvl, rope, nope, dv = x["q_lora_rank"], x["kv_lora_rank"], x["rope_dim"], x["nope_dim"], x["v_dim"]
    mla, gating = x.get("mla", True), int(x.get("gating", ExpertGatingFuncType.SIGMOID))
    D, H = c.d_model, c.n_head
    t = _globals(c, n_vocab)
    for i in range(c.n_layer):
        p = f"blk.{i}."
        t.append(_norm(i, "attn_norm", D))
        if ql:
            t += [
                (p + "attn_q_a.weight", (D, ql), "matrix"),
                _norm(i, "attn_q_a_norm", ql),
                (p + "attn_q_b.weight", (ql, H * (nope + rope)), "matrix"),
            ]
        else:
            t.append((p + "attn_q.weight", (D, H * (nope + rope)), "matrix"))
        t += [(p + "attn_kv_a_mqa.weight", (D, kvl + rope), "matrix"), _norm(i, "attn_kv_a_norm", kvl)]
        if mla:
            t += [(p + "attn_k_b.weight", (nope, kvl, H), "matrix"), (p + "attn_v_b.weight", (kvl, dv, H), "matrix")]
        else:
            t.append((p + "attn_kv_b.weight", (kvl, H * (nope + dv)), "matrix"))
        t += [(p + "attn_output.weight", (H * dv, D), "matrix"), _norm(i, "ffn_norm", D)]
        if i < c.n_dense_lead:
            t += [
                (p + "ffn_gate.weight", (D, c.dense_ff), "matrix"),
                (p + "ffn_up.weight", (D, c.dense_ff), "matrix"),
                (p + "ffn_down.weight", (c.dense_ff, D), "matrix"),
            ]
        else:
            t += [
                *_router(c, i, probs_bias=gating == ExpertGatingFuncType.SIGMOID),
                *_experts(c, i, D),
                *_shared(c, i, gated=False),
            ]
    if mla:  # the converter's MQA view of the absorbed form
        heads = {
            ATTN.HEAD_COUNT_KV: 1,
            ATTN.KEY_LENGTH: kvl + rope,
            ATTN.VALUE_LENGTH: kvl,
            ATTN.KEY_LENGTH_MLA: nope + rope,
            ATTN.VALUE_LENGTH_MLA: dv,
        }
    else:
        heads = {ATTN.HEAD_COUNT_KV: H, ATTN.KEY_LENGTH: nope + rope, ATTN.VALUE_LENGTH: dv}
    keys = (
        _common_keys(c, c.dense_ff)
        | heads
        | {
            ATTN.Q_LORA_RANK: ql,
            ATTN.KV_LORA_RANK: kvl,
            ROPE.DIMENSION_COUNT: rope,
            LLM.LEADING_DENSE_BLOCK_COUNT: c.n_dense_lead,
            LLM.EXPERT_FEED_FORWARD_LENGTH: c.expert_ff,
            LLM.EXPERT_SHARED_COUNT: max(1, c.shared_ff // c.expert_ff),
            LLM.EXPERT_WEIGHTS_SCALE: x.get("weights_scale", 2.5),
            LLM.EXPERT_WEIGHTS_NORM: x.get("weights_norm", True),
            LLM.EXPERT_GATING_FUNC: gating,
            LLM.EXPERT_GROUP_COUNT: x.get("groups", 1),
            LLM.EXPERT_GROUP_USED_COUNT: x.get("groups_used", 1),
        }
    )
    if "yarn" in x:
        y = x["yarn"]
        keys |= {
            ROPE.SCALING_TYPE: YARN,
            ROPE.SCALING_FACTOR: float(y["factor"]),
            ROPE.SCALING_ORIG_CTX_LEN: y["original_context_length"],
            ROPE.SCALING_YARN_LOG_MUL: 0.1 * y["log_mul"],
        }
    return t, keys


def compress_ratios(c: SynthConfig) -> list[int]:
    """DeepSeek-V4's per-layer compress ratio (0: raw window only, 4: CSA with the lightning
    indexer, 128: HCA): extra "compress_lead" for the first layers, then "compress_cycle" repeated,
    as DeepSeek-V4-Flash's config lists them ([0, 0] then 4, 128, 4, 128, ...). If that leaves no
    layer of ratio 4 (one or two layers), the last layer gets it: llama.cpp always makes the
    lightning indexer's cache and Hadamard-rotates it, and with no layer to size it from it divides
    by zero (SIGFPE in llama_kv_cache::build_input_k_rot) before the first token."""
    lead, cycle = list(c.extra.get("compress_lead", [0, 0])), list(c.extra.get("compress_cycle", [4, 128]))
    ratios = [lead[i] if i < len(lead) else cycle[(i - len(lead)) % len(cycle)] for i in range(c.n_layer)]
    if any(r not in (0, 4, 128) for r in ratios):
        raise SwapmoeError(f"deepseek4 compress ratios must be 0, 4 or 128, not {sorted(set(ratios))}")
    if ratios and 4 not in ratios:
        ratios[-1] = 4
    return ratios


def _per_layer(value: float | list[float], n_layer: int) -> list[float]:
    """A float, or a list repeated over the layers."""
    values = [value] if isinstance(value, (int, float)) else list(value)
    return [float(values[i % len(values)]) for i in range(n_layer)]


def deepseek4(c: SynthConfig, n_vocab: int) -> tuple[list[Tensor], dict[str, Any]]:
    """DeepSeek-V4 as llama.cpp's loader wants it (src/models/deepseek4.cpp load_arch_tensors):
    every layer has the raw-window attention, the grouped low-rank output and the two
    hyper-connection mixers; layers of compress ratio 4 or 128 add the KV compressor (rows of
    2·head_dim for ratio 4, which overlaps blocks, else head_dim), ratio 4 also the lightning
    indexer and its own compressor; the first hash_layers layers route by the I32 token table
    and have no exp_probs_b. extra: q_lora_rank, out_groups, out_rank, hash_layers, rope_dim,
    sliding_window, compress_lead / compress_cycle (see compress_ratios), compress_rope_base,
    indexer_heads / indexer_dim / indexer_top_k, yarn {factor, original_context_length},
    swiglu_limit (and swiglu_limit_shexp; a float or a per-layer list), weights_scale,
    sinkhorn_iters, hc_eps.

    Values: the mixers' scales are gains near 1 and their bases offsets of spread 1, so each
    stream gets its own pre/post weight and the Sinkhorn matrix is far from uniform (with the
    0.02 spread of plain vectors every stream got weight 1/2 and the mix was a plain average);
    the compressors' position biases (ape) have spread 1 too, so the pooling depends on the
    position in the block."""
    x = c.extra
    D, H, hd, ql = c.d_model, c.n_head, c.head_dim, x["q_lora_rank"]
    groups, out_rank, hc, n_hash = x["out_groups"], x["out_rank"], 4, x["hash_layers"]
    n_idx, idx_hd = x.get("indexer_heads", 16), x.get("indexer_dim", 64)
    hc_dim, mix = hc * D, (2 + hc) * hc
    ratios = compress_ratios(c)
    if H % groups:
        raise SwapmoeError("deepseek4 needs n_head divisible by out_groups")
    if c.shared_ff % c.expert_ff:  # llama.cpp's shared expert is expert_ff x expert_shared_count wide
        raise SwapmoeError("deepseek4 needs shared_ff a multiple of expert_ff")
    if idx_hd == hd:  # llama.cpp then Hadamard-rotates the raw and compressed caches too: not what real files do
        raise SwapmoeError("deepseek4 needs indexer_dim != head_dim")
    if idx_hd % 64:  # the indexer cache's Hadamard rotation works in blocks of 64 or more
        raise SwapmoeError("deepseek4 needs indexer_dim divisible by 64")
    t = _globals(c, n_vocab) + [
        ("output_hc_fn.weight", (hc_dim, hc), "matrix"),
        ("output_hc_base.weight", (hc,), "offset"),
        ("output_hc_scale.weight", (1,), "gain"),
    ]
    for i in range(c.n_layer):
        p = f"blk.{i}."
        t += [
            _norm(i, "attn_norm", D),
            (p + "attn_sinks.weight", (H,), "sinks"),
            (p + "attn_q_a.weight", (D, ql), "matrix"),
            _norm(i, "attn_q_a_norm", ql),
            (p + "attn_q_b.weight", (ql, H * hd), "matrix"),
            (p + "attn_kv.weight", (D, hd), "matrix"),
            _norm(i, "attn_kv_a_norm", hd),
            (p + "attn_output_a.weight", (H * hd // groups, out_rank * groups), "matrix"),
            (p + "attn_output_b.weight", (groups * out_rank, D), "matrix"),
        ]
        for half in ("attn", "ffn"):
            t += [
                (p + f"hc_{half}_fn.weight", (hc_dim, mix), "matrix"),
                (p + f"hc_{half}_base.weight", (mix,), "offset"),
                (p + f"hc_{half}_scale.weight", (3,), "gain"),
            ]
        ratio = ratios[i]
        if ratio:
            width = (2 if ratio == 4 else 1) * hd
            t += [
                (p + "attn_compressor_kv.weight", (D, width), "matrix"),
                (p + "attn_compressor_gate.weight", (D, width), "matrix"),
                (p + "attn_compressor_ape.weight", (width, ratio), "offset"),
                _norm(i, "attn_compressor_norm", hd),
            ]
        if ratio == 4:
            t += [
                (p + "indexer.proj.weight", (D, n_idx), "matrix"),
                (p + "indexer.attn_q_b.weight", (ql, n_idx * idx_hd), "matrix"),
                (p + "indexer_compressor_kv.weight", (D, 2 * idx_hd), "matrix"),
                (p + "indexer_compressor_gate.weight", (D, 2 * idx_hd), "matrix"),
                (p + "indexer_compressor_ape.weight", (2 * idx_hd, ratio), "offset"),
                _norm(i, "indexer_compressor_norm", idx_hd),
            ]
        t += [_norm(i, "ffn_norm", D), *_router(c, i, probs_bias=i >= n_hash)]
        if i < n_hash:
            t.append((p + "ffn_gate_tid2eid.weight", (c.n_expert_used, n_vocab), "table"))
        t += [*_experts(c, i, D), *_shared(c, i, gated=False)]
    yarn = x.get("yarn", {"factor": 16.0, "original_context_length": max(1, c.ctx // 16)})
    clamp = _per_layer(x.get("swiglu_limit", 10.0), c.n_layer)
    keys = _common_keys(c, c.expert_ff) | {
        LLM.EMBEDDING_LENGTH_OUT: hc * D,
        ROPE.DIMENSION_COUNT: x.get("rope_dim", hd // 2),
        ROPE.SCALING_TYPE: YARN,
        ROPE.SCALING_FACTOR: float(yarn["factor"]),
        ROPE.SCALING_ORIG_CTX_LEN: yarn["original_context_length"],
        ROPE.SCALING_YARN_BETA_FAST: 32.0,
        ROPE.SCALING_YARN_BETA_SLOW: 1.0,
        "{arch}.attention.compress_rope_freq_base": float(x.get("compress_rope_base", 160000.0)),
        ATTN.Q_LORA_RANK: ql,
        ATTN.SLIDING_WINDOW: x.get("sliding_window", 128),
        "{arch}.attention.compress_ratios": ratios,
        ATTN.Indexer.HEAD_COUNT: n_idx,
        ATTN.Indexer.KEY_LENGTH: idx_hd,
        ATTN.Indexer.TOP_K: x.get("indexer_top_k", 16),
        "{arch}.attention.output_group_count": groups,
        "{arch}.attention.output_lora_rank": out_rank,
        "{arch}.hyper_connection.count": hc,
        "{arch}.hyper_connection.sinkhorn_iterations": x.get("sinkhorn_iters", 20),
        "{arch}.hyper_connection.epsilon": float(x.get("hc_eps", 1e-6)),
        "{arch}.hash_layer_count": n_hash,
        LLM.EXPERT_FEED_FORWARD_LENGTH: c.expert_ff,
        LLM.EXPERT_SHARED_COUNT: max(1, c.shared_ff // c.expert_ff),
        LLM.EXPERT_WEIGHTS_SCALE: float(x.get("weights_scale", 1.5)),
        LLM.EXPERT_WEIGHTS_NORM: True,
        LLM.EXPERT_GATING_FUNC: SQRT_SOFTPLUS,
        LLM.SWIGLU_CLAMP_EXP: clamp,
        LLM.SWIGLU_CLAMP_SHEXP: _per_layer(x.get("swiglu_limit_shexp", x.get("swiglu_limit", 10.0)), c.n_layer),
    }
    return t, keys


def _gated_hybrid(c: SynthConfig, n_vocab: int, next_layout: bool) -> tuple[list[Tensor], dict[str, Any]]:
    """Qwen3.5-MoE, or with next_layout Qwen3-Next: gated DeltaNet layers with gated attention
    every fourth layer. Qwen3-Next's beta and alpha are one projection, and with extra
    legacy_qkvz its q, k, v and z are one projection too (ssm_in, as older converters wrote).
    Extra mtp: one multi-token-prediction block after the others, as llama.cpp's converter adds
    by default (a full-attention block with experts and the nextn projections; block_count
    counts it, nextn_predict_layers says so)."""
    x = c.extra
    D, H, hd = c.d_model, c.n_head, c.head_dim
    hk, n_k, n_v, d_conv, interval = x["ssm_state"], x["ssm_groups"], x["ssm_heads"], 4, 4
    val_dim, conv_dim = hk * n_v, 2 * hk * n_k + hk * n_v
    t = _globals(c, n_vocab)
    n_mtp = 1 if x.get("mtp") else 0
    for i in range(c.n_layer + n_mtp):
        p = f"blk.{i}."
        t += [_norm(i, "attn_norm", D), _norm(i, "post_attention_norm", D)]
        if i >= c.n_layer:
            t += [
                (p + "nextn.eh_proj.weight", (2 * D, D), "matrix"),
                _norm(i, "nextn.enorm", D),
                _norm(i, "nextn.hnorm", D),
                _norm(i, "nextn.shared_head_norm", D),
            ]
        if (i + 1) % interval == 0 or i >= c.n_layer:
            kv = c.n_head_kv * hd
            t += [
                (p + "attn_q.weight", (D, 2 * H * hd), "matrix"),
                (p + "attn_k.weight", (D, kv), "matrix"),
                (p + "attn_v.weight", (D, kv), "matrix"),
                _norm(i, "attn_q_norm", hd),
                _norm(i, "attn_k_norm", hd),
                (p + "attn_output.weight", (H * hd, D), "matrix"),
            ]
            t += [*_router(c, i), *_experts(c, i, D), *_shared(c, i, gated=True)]
            continue
        if next_layout and x.get("legacy_qkvz"):
            t += [(p + "ssm_in.weight", (D, conv_dim + val_dim), "matrix")]
        else:
            t += [(p + "attn_qkv.weight", (D, conv_dim), "matrix"), (p + "attn_gate.weight", (D, val_dim), "matrix")]
        t += [
            (p + "ssm_conv1d.weight", (d_conv, conv_dim), "router"),
            (p + "ssm_dt.bias", (n_v,), "vector"),
            (p + "ssm_a", (n_v,), "decay"),
        ]
        if next_layout:
            t += [(p + "ssm_ba.weight", (D, 2 * n_v), "matrix")]
        else:
            t += [(p + "ssm_beta.weight", (D, n_v), "matrix"), (p + "ssm_alpha.weight", (D, n_v), "matrix")]
        t += [_norm(i, "ssm_norm", hk), (p + "ssm_out.weight", (val_dim, D), "matrix")]
        t += [*_router(c, i), *_experts(c, i, D), *_shared(c, i, gated=True)]
    keys = _common_keys(c, c.expert_ff) | {
        LLM.EXPERT_FEED_FORWARD_LENGTH: c.expert_ff,
        LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH: c.shared_ff,
        ROPE.DIMENSION_COUNT: hd // 4,
    }
    if not next_layout:
        keys[ROPE.DIMENSION_SECTIONS] = [11, 11, 10, 0]
    keys |= {
        SSM.CONV_KERNEL: d_conv,
        SSM.INNER_SIZE: val_dim,
        SSM.STATE_SIZE: hk,
        SSM.TIME_STEP_RANK: n_v,
        SSM.GROUP_COUNT: n_k,
        LLM.FULL_ATTENTION_INTERVAL: interval,
    }
    if n_mtp:
        keys |= {LLM.BLOCK_COUNT: c.n_layer + n_mtp, LLM.NEXTN_PREDICT_LAYERS: n_mtp}
    return t, keys


def qwen35moe(c: SynthConfig, n_vocab: int) -> tuple[list[Tensor], dict[str, Any]]:
    return _gated_hybrid(c, n_vocab, next_layout=False)


def qwen3next(c: SynthConfig, n_vocab: int) -> tuple[list[Tensor], dict[str, Any]]:
    return _gated_hybrid(c, n_vocab, next_layout=True)


def laguna_swa_layers(c: SynthConfig) -> list[bool]:
    """Which layers of a laguna file use the sliding window, as llama.cpp reads them: none without
    extra "sliding_window"; else the "swa_pattern" (bools, repeated over the layers, written as
    attention.sliding_window_pattern); without one llama.cpp's default, every 4th layer full
    starting with layer 0 (load_swa_pattern(4, dense_first), what real files rely on)."""
    if not c.extra.get("sliding_window"):
        return [False] * c.n_layer
    pattern = c.extra.get("swa_pattern")
    if pattern is None:
        return [i % 4 != 0 for i in range(c.n_layer)]
    return [bool(pattern[i % len(pattern)]) for i in range(c.n_layer)]


def laguna(c: SynthConfig, n_vocab: int) -> tuple[list[Tensor], dict[str, Any]]:
    """Laguna (poolside) as llama.cpp's loader wants it (src/models/laguna.cpp load_arch_tensors): GQA with
    q/k norms and a softplus output gate attn_gate, {d_model, heads} (one gate per head) or with extra
    gate "element" {d_model, heads·head_dim}; the first n_dense_lead layers a dense SwiGLU of dense_ff,
    the others sigmoid routing with exp_probs_b, the experts and an always-on shared expert of shared_ff.
    attention.head_count is per layer: n_head on full layers, extra n_head_swa on sliding ones.
    extra: sliding_window (0 or absent: every layer full, as Laguna-M.1), swa_pattern (see
    laguna_swa_layers), n_head_swa, rope_dim (full layers' rotary dims, partial), rope_dim_swa and
    rope_base_swa (sliding layers: plain RoPE), yarn {factor, original_context_length} (full layers),
    weights_scale (expert_weights_scale), gate ("head" or "element"); output_std (the writer's spread of
    output.weight, for sharper logits)."""
    x = c.extra
    D, hd, kv = c.d_model, c.head_dim, c.n_head_kv * c.head_dim
    gate = x.get("gate", "head")
    if gate not in ("head", "element"):
        raise SwapmoeError(f'laguna gate is per "head" or per "element", not {gate!r}')
    if c.n_dense_lead >= c.n_layer or (c.n_dense_lead and not c.dense_ff) or not c.shared_ff:
        raise SwapmoeError("laguna needs an MoE layer (n_dense_lead < n_layer), dense_ff if n_dense_lead, shared_ff")
    swa = laguna_swa_layers(c)
    heads = [x.get("n_head_swa", c.n_head) if s else c.n_head for s in swa]
    if any(h % c.n_head_kv for h in heads):
        raise SwapmoeError("laguna needs every layer's head count a multiple of n_head_kv")
    t = _globals(c, n_vocab)
    for i, H in enumerate(heads):
        p, q = f"blk.{i}.", H * hd
        t += [
            _norm(i, "attn_norm", D),
            (p + "attn_q.weight", (D, q), "matrix"),
            (p + "attn_k.weight", (D, kv), "matrix"),
            (p + "attn_v.weight", (D, kv), "matrix"),
            (p + "attn_output.weight", (q, D), "matrix"),
            _norm(i, "attn_q_norm", hd),
            _norm(i, "attn_k_norm", hd),
            (p + "attn_gate.weight", (D, H if gate == "head" else q), "matrix"),
            _norm(i, "ffn_norm", D),
        ]
        if i < c.n_dense_lead:
            t += [
                (p + "ffn_gate.weight", (D, c.dense_ff), "matrix"),
                (p + "ffn_up.weight", (D, c.dense_ff), "matrix"),
                (p + "ffn_down.weight", (c.dense_ff, D), "matrix"),
            ]
        else:
            t += [*_router(c, i, probs_bias=True), *_experts(c, i, D), *_shared(c, i, gated=False)]
    keys = _common_keys(c, c.dense_ff) | {
        ATTN.HEAD_COUNT: heads,
        LLM.LEADING_DENSE_BLOCK_COUNT: c.n_dense_lead,
        LLM.EXPERT_FEED_FORWARD_LENGTH: c.expert_ff,
        LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH: c.shared_ff,
        LLM.EXPERT_WEIGHTS_NORM: True,
        LLM.EXPERT_WEIGHTS_SCALE: float(x.get("weights_scale", 2.5)),
        LLM.EXPERT_GATING_FUNC: int(ExpertGatingFuncType.SIGMOID),
        ROPE.DIMENSION_COUNT: x.get("rope_dim", hd // 2),
    }
    if x.get("sliding_window"):
        keys |= {
            ATTN.SLIDING_WINDOW: x["sliding_window"],
            ROPE.DIMENSION_COUNT_SWA: x.get("rope_dim_swa", hd),
            ROPE.FREQ_BASE_SWA: float(x.get("rope_base_swa", 1e4)),
        }
        if x.get("swa_pattern") is not None:
            keys[ATTN.SLIDING_WINDOW_PATTERN] = swa
    if "yarn" in x:  # as the converter writes it from rope_parameters.full_attention
        y = x["yarn"]
        keys |= {
            ROPE.SCALING_TYPE: YARN,
            ROPE.SCALING_FACTOR: float(y["factor"]),
            ROPE.SCALING_ORIG_CTX_LEN: y["original_context_length"],
            ROPE.SCALING_YARN_ATTN_FACTOR: float(y.get("attn_factor", 1.0)),
            ROPE.SCALING_YARN_BETA_FAST: 32.0,
            ROPE.SCALING_YARN_BETA_SLOW: 1.0,
        }
    return t, keys


ARCHS: dict[str, Callable[[SynthConfig, int], tuple[list[Tensor], dict[str, Any]]]] = {
    "qwen3moe": qwen3moe,
    "qwen2moe": qwen2moe,
    "olmoe": olmoe,
    "llama": llama,
    "deepseek2": deepseek2,
    "deepseek4": deepseek4,
    "minimax-m2": minimax_m2,
    "gpt-oss": gpt_oss,
    "qwen35moe": qwen35moe,
    "qwen3next": qwen3next,
    "laguna": laguna,
}
