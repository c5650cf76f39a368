"""Named shapes for synthetic models.

`tiny-*` presets are for tests (a few MB). The others copy the published shapes of real
models (hidden size, heads, experts, widths); `--size-gb` then scales the layer count.
Shapes marked approximate are guesses where no public config was at hand.
"""
from __future__ import annotations

from dataclasses import replace

from swapmoe.synthetic.archs import SynthConfig

_DS2_TINY = {"q_lora_rank": 128, "kv_lora_rank": 64, "rope_dim": 32, "nope_dim": 32, "v_dim": 32, "groups": 4,
             "groups_used": 2}
_DS4_TINY = {"q_lora_rank": 128, "out_groups": 2, "out_rank": 64, "hash_layers": 1, "rope_dim": 32}
_Q35_TINY = {"ssm_state": 64, "ssm_groups": 2, "ssm_heads": 4}

PRESETS: dict[str, SynthConfig] = {
    # --- tiny, for tests -------------------------------------------------------------
    "tiny-qwen3moe": SynthConfig("qwen3moe", 2, 256, 4, 2, 64, 8, 2, 256),
    "tiny-qwen2moe": SynthConfig("qwen2moe", 2, 256, 4, 2, 64, 8, 2, 256, shared_ff=512),
    "tiny-olmoe": SynthConfig("olmoe", 2, 256, 4, 4, 64, 8, 2, 256, rms_eps=1e-5, rope_base=1e4),
    "tiny-llama": SynthConfig("llama", 2, 256, 4, 2, 64, 8, 2, 256, rms_eps=1e-5),
    "tiny-deepseek2": SynthConfig("deepseek2", 3, 256, 4, 4, 64, 8, 2, 256, shared_ff=256, dense_ff=512,
                                  n_dense_lead=1, rope_base=1e4, extra=_DS2_TINY),
    "tiny-deepseek4": SynthConfig("deepseek4", 3, 256, 4, 1, 128, 8, 2, 256, shared_ff=256, rope_base=1e4,
                                  extra=_DS4_TINY),
    "tiny-minimax-m2": SynthConfig("minimax-m2", 2, 256, 4, 2, 64, 8, 2, 256, rope_base=5e6, extra={"rope_dim": 32}),
    "tiny-gpt-oss": SynthConfig("gpt-oss", 2, 256, 4, 2, 64, 8, 2, 256, rms_eps=1e-5, rope_base=150000.0,
                                extra={"sliding_window": 128}),
    "tiny-qwen35moe": SynthConfig("qwen35moe", 4, 256, 4, 2, 64, 8, 2, 256, shared_ff=256, fused_gate_up=True,
                                  extra=_Q35_TINY),
    "tiny-qwen3next": SynthConfig("qwen3next", 4, 256, 4, 2, 64, 8, 2, 256, shared_ff=256, extra=_Q35_TINY),
    # --- real shapes -------------------------------------------------------------------
    "qwen3-30b-a3b": SynthConfig("qwen3moe", 48, 2048, 32, 4, 128, 128, 8, 768),
    "qwen3-235b-a22b": SynthConfig("qwen3moe", 94, 4096, 64, 4, 128, 128, 8, 1536),
    "qwen1.5-moe-a2.7b": SynthConfig("qwen2moe", 24, 2048, 16, 16, 128, 60, 4, 1408, shared_ff=5632),
    "olmoe-1b-7b": SynthConfig("olmoe", 16, 2048, 16, 16, 128, 64, 8, 1024, rms_eps=1e-5, rope_base=1e4),
    "mixtral-8x7b": SynthConfig("llama", 32, 4096, 32, 8, 128, 8, 2, 14336, rms_eps=1e-5),
    "deepseek-v3": SynthConfig("deepseek2", 61, 7168, 128, 128, 128, 256, 8, 2048, shared_ff=2048, dense_ff=18432,
                               n_dense_lead=3, rope_base=1e4,
                               extra={"q_lora_rank": 1536, "kv_lora_rank": 512, "rope_dim": 64, "nope_dim": 128,
                                      "v_dim": 128, "groups": 8, "groups_used": 4}),
    # approximate: DeepSeek-V4-Flash's exact config was not at hand
    "deepseek-v4-flash": SynthConfig("deepseek4", 43, 4096, 64, 1, 512, 256, 6, 2048, shared_ff=2048, rope_base=1e4,
                                     extra={"q_lora_rank": 1024, "out_groups": 8, "out_rank": 1024, "hash_layers": 3,
                                            "rope_dim": 64}),
    "minimax-m2": SynthConfig("minimax-m2", 62, 3072, 48, 8, 128, 256, 8, 1536, rope_base=5e6, extra={"rope_dim": 64}),
    "gpt-oss-20b": SynthConfig("gpt-oss", 24, 2880, 64, 8, 64, 32, 4, 2880, rms_eps=1e-5, rope_base=150000.0),
    "gpt-oss-120b": SynthConfig("gpt-oss", 36, 2880, 64, 8, 64, 128, 4, 2880, rms_eps=1e-5, rope_base=150000.0),
    # the hybrids: hidden, layers, heads, experts and widths of the published configs (their expert
    # parameters add up to the 32 / 116 / 77 billion the model cards' totals leave for experts)
    "qwen3.5-35b-a3b": SynthConfig("qwen35moe", 40, 2048, 16, 2, 256, 256, 8, 512, shared_ff=512,
                                   fused_gate_up=True, extra={"ssm_state": 128, "ssm_groups": 16, "ssm_heads": 32}),
    "qwen3.5-122b-a10b": SynthConfig("qwen35moe", 48, 3072, 32, 2, 256, 256, 8, 1024, shared_ff=1024,
                                     fused_gate_up=True, extra={"ssm_state": 128, "ssm_groups": 16, "ssm_heads": 64}),
    "qwen3-next-80b-a3b": SynthConfig("qwen3next", 48, 2048, 16, 2, 256, 512, 10, 512, shared_ff=512,
                                      extra={"ssm_state": 128, "ssm_groups": 16, "ssm_heads": 32}),
}


# Real-shape presets scale each weight matrix by 1/sqrt(its row length) and give token
# embeddings a spread of 1. With a fixed 0.05 at a width of 2048 every matmul amplifies, the
# attention output (an average over positions) swamps the residual stream within a layer or
# two, and every token then picks the same few experts: a streaming benchmark on such a model
# would measure a cache that never misses. These scales keep each token's routing its own, as
# in trained models. (Tiny presets keep the fixed spread: the golden fixtures come from them.)
for _name, _config in list(PRESETS.items()):
    if not _name.startswith("tiny-"):
        PRESETS[_name] = replace(_config, embed_std=1.0, fan_in_std=True)


def preset_for(arch: str, name: str | None) -> SynthConfig:
    return PRESETS[name or f"tiny-{arch}"]
