"""Named shapes for synthetic models.

`tiny-*` presets are for tests (a few MB). The others copy the published shapes of real
models (hidden size, heads, experts, widths); `--size-gb` then scales the layer count.
Shapes marked approximate are guesses where no public config was at hand.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from swapmoe.synthetic.archs import SynthConfig

_DS2_TINY = {
    "q_lora_rank": 128,
    "kv_lora_rank": 64,
    "rope_dim": 32,
    "nope_dim": 32,
    "v_dim": 32,
    "groups": 4,
    "groups_used": 2,
}
# DeepSeek-V4, tiny: one hash-routed layer, then compress ratios 0, 4, 128 (the 4-layer file has all
# three; "compress_lead" [0, 0] then the cycle [4, 128], as DeepSeek-V4-Flash's layers are). Chosen so
# that a 300-token prompt reaches every path llama.cpp has: the 64-token raw window is crossed, the
# ratio-4 layer has 75 compressed rows of which the indexer keeps 16, the ratio-128 layer 2 rows;
# 16 indexer heads (with 4, 857 of the indexer's relu scores over a 320-token prompt were exactly 0 and
# the 16th and 17th best rows tied at 16 positions, so which rows were kept was arbitrary; with 16, no
# zero and no tie); indexer key length 64, not head_dim 128 (equal, llama.cpp Hadamard-rotates the raw
# and compressed caches too); YaRN as real files have it, so compressed layers rotate with factor 16.
# The gate and up activations of this scale have a spread of about 0.85 (0.05 x sqrt(256)), so the
# SwiGLU limits 1.5 / 2.0 (experts, alternating by layer) and 1.75 (shared expert) clamp some of them
# (in llama.cpp over a 320-token prompt: 4% / 1% of the expert gates, 8% / 2% of the ups, 2% of the
# shared expert's gates and 4% of its ups); the real limit, 10, never would.
_DS4_TINY = {
    "q_lora_rank": 128,
    "out_groups": 2,
    "out_rank": 64,
    "hash_layers": 1,
    "rope_dim": 32,
    "sliding_window": 64,
    "compress_lead": [0, 0],
    "compress_cycle": [4, 128],
    "compress_rope_base": 160000.0,
    "indexer_heads": 16,
    "indexer_dim": 64,
    "indexer_top_k": 16,
    "yarn": {"factor": 16.0, "original_context_length": 256},
    "swiglu_limit": [1.5, 2.0],
    "swiglu_limit_shexp": 1.75,
}
# DeepSeek-V4-Flash's config.json (deepseek-ai/DeepSeek-V4-Flash on Hugging Face; quoted whole in
# rtp-llm's DeepSeek-V4 tests as "the published DeepSeek-V4-Flash-Base config", and the same values in
# exo's read of the 0731 checkpoint's config, NVIDIA NeMo's model page and ds4's model card):
# 43 layers, hidden 4096, 64 heads, 1 kv head, head_dim 512, qk_rope_head_dim 64, q_lora_rank 1024,
# o_groups 8, o_lora_rank 1024, sliding_window 128, compress_ratios [0, 0, 4, 128, 4, ..., 128, 4] (plus a
# trailing 0 for the MTP block, not written here), compress_rope_theta 160000, rope_theta 10000, YaRN
# factor 16 from 65536 (beta_fast 32, beta_slow 1), max_position_embeddings 1048576, index_n_heads 64,
# index_head_dim 128, index_topk 512, 256 routed experts + 1 shared, top-6, moe_intermediate_size 2048,
# num_hash_layers 3, routed_scaling_factor 1.5, norm_topk_prob, scoring sqrtsoftplus, swiglu_limit 10,
# hc_mult 4, hc_sinkhorn_iters 20, hc_eps 1e-6, rms_norm_eps 1e-6. With the real vocabulary these
# tensors add up to 284.3B parameters, 13.3B active: the model card's 284B / 13B. Not the real one:
# the vocabulary (129280 there; every synthetic file has the small built-in BPE), and no MTP block.
# `--type IQ1_M` gives the community IQ1_M mix (swapmoe.synthetic.ARCH_MIXES: routed experts IQ1_M,
# down Q2_K on layers 0-5, the rest Q8_0, output Q6_K; 64 GiB at 43 layers).
_DS4_FLASH = {
    "q_lora_rank": 1024,
    "out_groups": 8,
    "out_rank": 1024,
    "hash_layers": 3,
    "rope_dim": 64,
    "sliding_window": 128,
    "compress_lead": [0, 0],
    "compress_cycle": [4, 128],
    "compress_rope_base": 160000.0,
    "indexer_heads": 64,
    "indexer_dim": 128,
    "indexer_top_k": 512,
    "yarn": {"factor": 16.0, "original_context_length": 65536},
    "swiglu_limit": 10.0,
    "weights_scale": 1.5,
    "sinkhorn_iters": 20,
    "hc_eps": 1e-6,
}
_Q35_TINY = {"ssm_state": 64, "ssm_groups": 2, "ssm_heads": 4}
# Laguna, tiny: layer 0 dense, then three MoE layers; the sliding_window_pattern key makes layers 1 and 3
# sliding (window 32, so a ~100-token prompt crosses it) and 0 and 2 full, so the MoE layers have both kinds
# (without the key, extra swa_pattern None, llama.cpp's default makes 1-3 sliding). 4 heads on full layers
# and 6 on sliding ones over 2 kv heads (Laguna-S-2.1 has 48 and 72 over 8); full layers rotate 32 of 64
# dims with YaRN (factor 16 from 256: the 4096 context), sliding layers all 64 with base 1e4 and no YaRN;
# per-head gate (extra gate "element" for the other width); dense, expert and shared widths all different
# (512, 256, 384) so a runtime that mixes them up fails to load. output.weight has a spread of 0.25, not 0.05:
# with 0.05 the logits (over a 112-token prompt in llama.cpp) had a spread of 0.8 and a top probability of 0.02
# (uniform: 0.002) with top-2 margins down to 0.001; with 0.25, spread 4.2, top probability 0.16-0.99 (mean 0.5).
_LAGUNA_TINY = {
    "n_head_swa": 6,
    "sliding_window": 32,
    "swa_pattern": [False, True, False, True],
    "rope_dim": 32,
    "rope_dim_swa": 64,
    "rope_base_swa": 1e4,
    "yarn": {"factor": 16.0, "original_context_length": 256},
    "weights_scale": 2.5,
    "gate": "head",
    "output_std": 0.25,
}
# poolside Laguna-S-2.1 (poolside/Laguna-S-2.1 on Hugging Face; 117-118B total, ~8B active, 48 layers, 256 experts
# top-10 + 1 shared, per the model card as quoted in public write-ups). The config.json values, as quoted field by
# field in a public design record of that checkpoint (the INT4 release) and, for the GGUF keys, in the header of
# the lmstudio-community Laguna-S-2.1-Q4_K_M GGUF as read in a public evaluation log and in a test fixture that
# copies it: hidden 3072, 48 layers, head_dim 128, num_attention_heads_per_layer 48 on layers l % 4 == 0 (full
# attention) and 72 on the others (sliding, window 512; the GGUF has no pattern key, llama.cpp's default period
# 4 gives exactly those layers), 8 kv heads, layer 0 dense (intermediate_size 12288), moe_intermediate_size 1024,
# shared_expert_intermediate_size 1024, moe_routed_scaling_factor 2.5, norm_topk_prob, sigmoid routing with
# e_score_correction_bias, per-head gate on all layers, rms_norm_eps 1e-6, full layers rope_theta 5e5 with
# partial_rotary_factor 0.5 (64 dims) and YaRN beta_fast 32 / beta_slow 1 from 8192, sliding layers rope_theta
# 1e4 over all 128 dims, untied output. YaRN factor: 32 (context 262144), as the GGUF carries it and as poolside
# ships the checkpoint by default ("256K recommended"); the 1M setting of the model card is factor 128
# (attention_factor 1.4852, max_position_embeddings 1048576), which the INT4 config.json carries. With the real
# 100352-token vocabulary these tensors add up to 117.5B parameters, 8.1B active (10 of 256 experts, one
# embedding row). Not the real one: the vocabulary (every synthetic file has the small built-in BPE).
_LAGUNA_S = {
    "n_head_swa": 72,
    "sliding_window": 512,
    "rope_dim": 64,
    "rope_dim_swa": 128,
    "rope_base_swa": 1e4,
    "yarn": {"factor": 32.0, "original_context_length": 8192},
    "weights_scale": 2.5,
    "gate": "head",
}

PRESETS: dict[str, SynthConfig] = {
    # --- tiny, for tests -------------------------------------------------------------
    "tiny-qwen3moe": SynthConfig("qwen3moe", 2, 256, 4, 2, 64, 8, 2, 256),
    "tiny-qwen2moe": SynthConfig("qwen2moe", 2, 256, 4, 2, 64, 8, 2, 256, shared_ff=512),
    "tiny-olmoe": SynthConfig("olmoe", 2, 256, 4, 4, 64, 8, 2, 256, rms_eps=1e-5, rope_base=1e4),
    "tiny-llama": SynthConfig("llama", 2, 256, 4, 2, 64, 8, 2, 256, rms_eps=1e-5),
    "tiny-deepseek2": SynthConfig(
        "deepseek2",
        3,
        256,
        4,
        4,
        64,
        8,
        2,
        256,
        shared_ff=256,
        dense_ff=512,
        n_dense_lead=1,
        rope_base=1e4,
        extra=_DS2_TINY,
    ),
    "tiny-deepseek4": SynthConfig(
        "deepseek4", 4, 256, 4, 1, 128, 8, 2, 256, shared_ff=256, rope_base=1e4, extra=_DS4_TINY
    ),
    "tiny-minimax-m2": SynthConfig("minimax-m2", 2, 256, 4, 2, 64, 8, 2, 256, rope_base=5e6, extra={"rope_dim": 32}),
    "tiny-gpt-oss": SynthConfig(
        "gpt-oss", 2, 256, 4, 2, 64, 8, 2, 256, rms_eps=1e-5, rope_base=150000.0, extra={"sliding_window": 128}
    ),
    "tiny-qwen35moe": SynthConfig(
        "qwen35moe", 4, 256, 4, 2, 64, 8, 2, 256, shared_ff=256, fused_gate_up=True, extra=_Q35_TINY
    ),
    "tiny-qwen3next": SynthConfig("qwen3next", 4, 256, 4, 2, 64, 8, 2, 256, shared_ff=256, extra=_Q35_TINY),
    "tiny-laguna": SynthConfig(
        "laguna",
        4,
        256,
        4,
        2,
        64,
        8,
        2,
        256,
        shared_ff=384,
        dense_ff=512,
        n_dense_lead=1,
        rope_base=5e5,
        extra=_LAGUNA_TINY,
    ),
    # --- small, for per-token overhead: Qwen3-30B-A3B's 128 experts, top-8, at hidden 512 ----
    "small-qwen3moe": SynthConfig("qwen3moe", 12, 512, 8, 2, 64, 128, 8, 256),
    # --- real shapes -------------------------------------------------------------------
    "qwen3-30b-a3b": SynthConfig("qwen3moe", 48, 2048, 32, 4, 128, 128, 8, 768),
    "qwen3-235b-a22b": SynthConfig("qwen3moe", 94, 4096, 64, 4, 128, 128, 8, 1536),
    "qwen1.5-moe-a2.7b": SynthConfig("qwen2moe", 24, 2048, 16, 16, 128, 60, 4, 1408, shared_ff=5632),
    "olmoe-1b-7b": SynthConfig("olmoe", 16, 2048, 16, 16, 128, 64, 8, 1024, rms_eps=1e-5, rope_base=1e4),
    "mixtral-8x7b": SynthConfig("llama", 32, 4096, 32, 8, 128, 8, 2, 14336, rms_eps=1e-5),
    "deepseek-v3": SynthConfig(
        "deepseek2",
        61,
        7168,
        128,
        128,
        128,
        256,
        8,
        2048,
        shared_ff=2048,
        dense_ff=18432,
        n_dense_lead=3,
        rope_base=1e4,
        extra={
            "q_lora_rank": 1536,
            "kv_lora_rank": 512,
            "rope_dim": 64,
            "nope_dim": 128,
            "v_dim": 128,
            "groups": 8,
            "groups_used": 4,
        },
    ),
    # the published config (see _DS4_FLASH); `--type IQ1_M` is the community IQ1_M mix (ARCH_MIXES)
    "deepseek-v4-flash": SynthConfig(
        "deepseek4",
        43,
        4096,
        64,
        1,
        512,
        256,
        6,
        2048,
        shared_ff=2048,
        ctx=1048576,
        rope_base=1e4,
        rms_eps=1e-6,
        extra=_DS4_FLASH,
    ),
    "minimax-m2": SynthConfig("minimax-m2", 62, 3072, 48, 8, 128, 256, 8, 1536, rope_base=5e6, extra={"rope_dim": 64}),
    "gpt-oss-20b": SynthConfig("gpt-oss", 24, 2880, 64, 8, 64, 32, 4, 2880, rms_eps=1e-5, rope_base=150000.0),
    "gpt-oss-120b": SynthConfig("gpt-oss", 36, 2880, 64, 8, 64, 128, 4, 2880, rms_eps=1e-5, rope_base=150000.0),
    # the hybrids: hidden, layers, heads, experts and widths of the published configs (their expert
    # parameters add up to the 32 / 116 / 77 billion the model cards' totals leave for experts)
    "qwen3.5-35b-a3b": SynthConfig(
        "qwen35moe",
        40,
        2048,
        16,
        2,
        256,
        256,
        8,
        512,
        shared_ff=512,
        fused_gate_up=True,
        extra={"ssm_state": 128, "ssm_groups": 16, "ssm_heads": 32},
    ),
    "qwen3.5-122b-a10b": SynthConfig(
        "qwen35moe",
        48,
        3072,
        32,
        2,
        256,
        256,
        8,
        1024,
        shared_ff=1024,
        fused_gate_up=True,
        extra={"ssm_state": 128, "ssm_groups": 16, "ssm_heads": 64},
    ),
    "qwen3-next-80b-a3b": SynthConfig(
        "qwen3next",
        48,
        2048,
        16,
        2,
        256,
        512,
        10,
        512,
        shared_ff=512,
        extra={"ssm_state": 128, "ssm_groups": 16, "ssm_heads": 32},
    ),
    # the published config (see _LAGUNA_S)
    "laguna-s-2.1": SynthConfig(
        "laguna",
        48,
        3072,
        48,
        8,
        128,
        256,
        10,
        1024,
        shared_ff=1024,
        dense_ff=12288,
        n_dense_lead=1,
        ctx=262144,
        rope_base=5e5,
        rms_eps=1e-6,
        extra=_LAGUNA_S,
    ),
}


@dataclass(frozen=True)
class RoutingProfile:
    """How a model family's routing re-uses experts while decoding, as tools/route_stats.py
    measures it over 32 decoded tokens: the target its preset's synthetic file is shaped to
    (docs/models.md gives the sources and what was assumed)."""

    prev: float  # share of a token's experts that the previous token also used
    within8: float  # share used by at least one of the previous 8 tokens
    n_used: int  # experts per token
    source: str

    @property
    def distinct(self) -> float:
        """Experts a layer uses over 32 decoded tokens: assumed to be the first token's, plus three
        quarters of the choices later tokens make outside the last 8 tokens' experts (nothing
        published measures it for these models)."""
        return self.n_used * (1 + 31 * (1 - self.within8) * 0.75)


# Qwen3-30B-A3B's reuse is measured (kekzl/imp#1359). Qwen3.5's previous-token reuse is Qwen3.5-397B's
# (flash-moe CUDA report, 512 experts, top-4); its within-8 share is an assumption (the 397B's unique
# expert counts imply about 0.4 with 4 of 512, and 8 of 256 recur more by chance). MiniMax-M2,
# DeepSeek-V4-Flash and Laguna-S-2.1 (256 experts each) have no published measurement: they take
# Qwen3.5's profile. gpt-oss-120b: LRU at about one expert slot per chosen expert hit 8-9 %
# (BigMoeOnEdge#33), so about 9 % of a token's experts are the previous token's; within 8 assumed.
_QWEN35_LIKE = "Qwen3.5-397B's previous-token reuse; within 8 assumed"
ROUTING_PROFILES = {
    "qwen3-30b-a3b": RoutingProfile(0.45, 0.80, 8, "measured on Qwen3-30B-A3B (kekzl/imp#1359)"),
    "qwen3.5-35b-a3b": RoutingProfile(0.30, 0.60, 8, _QWEN35_LIKE),
    "qwen3.5-122b-a10b": RoutingProfile(0.30, 0.60, 8, _QWEN35_LIKE),
    "minimax-m2": RoutingProfile(0.30, 0.60, 8, "none published; Qwen3.5's assumed"),
    "deepseek-v4-flash": RoutingProfile(0.30, 0.60, 6, "none published; Qwen3.5's assumed"),
    "laguna-s-2.1": RoutingProfile(0.30, 0.60, 10, "none published; Qwen3.5's assumed"),
    "gpt-oss-120b": RoutingProfile(0.09, 0.30, 4, "LRU hit rate of gpt-oss-120b (BigMoeOnEdge#33); within 8 assumed"),
}
# The routing-shape settings (SynthConfig) that bring a profiled preset's file nearest its
# profile, found with tools/route_stats.py (docs/models.md has the measured values).
_ROUTING_SHAPES = {
    "qwen3-30b-a3b": dict(context_gain=12.0, router_spread=0.3),
    "qwen3.5-35b-a3b": dict(context_gain=64.0, attention_focus=0.3, recurrent_gain=0.25, router_spread=0.1),
    "qwen3.5-122b-a10b": dict(context_gain=64.0, attention_focus=0.3, recurrent_gain=0.25, router_spread=0.1),
    "minimax-m2": dict(context_gain=2.2),
    "deepseek-v4-flash": dict(context_gain=2.1, hot_experts=1),
    "laguna-s-2.1": dict(context_gain=2.5, hot_experts=2),
}

# Real-shape presets scale each weight matrix by 1/sqrt(its row length) and give token
# embeddings a spread of 1. With a fixed 0.05 at a width of 2048 every matmul amplifies, the
# attention output (an average over positions) swamps the residual stream within a layer or
# two, and every token then picks the same few experts: a streaming benchmark on such a model
# would measure a cache that never misses. These scales keep each token's routing its own, as
# in trained models. (Tiny presets keep the fixed spread: the golden fixtures come from them.)
for _name, _config in list(PRESETS.items()):
    if not _name.startswith("tiny-"):
        PRESETS[_name] = replace(_config, embed_std=1.0, fan_in_std=True, **_ROUTING_SHAPES.get(_name, {}))


def routing_tag(name: str) -> str:
    """A file-name suffix for a preset's routing shape ("" when unshaped), so that benchmark
    files made before a shape changed are not mistaken for current ones."""
    shape = _ROUTING_SHAPES.get(name)
    return "" if not shape else "-route" + "-".join(f"{value:g}" for value in shape.values())


def routing_note(name: str) -> str:
    """One line for benchmark output: the routing profile a preset's files are shaped to."""
    profile = ROUTING_PROFILES.get(name)
    if profile is None:
        return f"routing: {name} has no routing profile (unshaped random routing)"
    return (
        f"routing profile {name}: previous-token reuse {profile.prev:.0%}, within 8 tokens "
        f"{profile.within8:.0%} ({profile.source})"
    )


def preset_for(arch: str, name: str | None) -> SynthConfig:
    return PRESETS[name or f"tiny-{arch}"]
