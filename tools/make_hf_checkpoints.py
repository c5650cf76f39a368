#!/usr/bin/env python3
"""Tiny random Hugging Face checkpoints converted by llama.cpp's own converter, and swapmoe's
logits checked against llama.cpp on them.

    python tools/make_hf_checkpoints.py [--ref ~/.cache/swapmoe-ref] [--out /tmp/swapmoe-hf] [--model NAME ...]
                                        [--llama-only]

Models: deepseek-v3 (DeepseekV3ForCausalLM: q LoRA, sigmoid routing with the correction bias,
groups, YaRN with mscale_all_dim 1), deepseek-v2-lite (DeepseekV2ForCausalLM: no q LoRA,
softmax routing, YaRN with mscale_all_dim 0.707; 26 layers, since llama.cpp recognises a lite
model by its layer count), minimax-m2 (MiniMaxM2ForCausalLM), gpt-oss (GptOssForCausalLM,
sliding window 16 so the prompt crosses it), qwen3.5-moe (Qwen3_5MoeForCausalLM) and
qwen3-next (Qwen3NextForCausalLM): 8 layers, gated DeltaNet with full attention every 4th
(layers 3 and 7), 2 K-heads and 4 V-heads (so the converter's V-head order matters), partial
RoPE on 16 of 64 dims, and a multi-token-prediction block, for which transformers has no module:
random tensors named as the published checkpoints name them (`mtp.*`, in
model-mtp.safetensors), so that the files carry one as converted real checkpoints do.
deepseek-v4 (DeepseekV4ForCausalLM), which the converter reads in DeepSeek's release layout, not
transformers', so deepseek_v4_checkpoint writes config.json and model.safetensors itself: 4
layers with compress ratios [0, 4, 128, 4] (sliding window only; CSA with the lightning indexer;
HCA; CSA), layer 0 hash-routed (tid2eid, int32 [vocab, 4]), 16 routed experts (4 per token,
sqrtsoftplus scores, routing bias, routed_scaling_factor 1.5) and a shared one, SwiGLU clamped
at 3 (a few % of the gate and up values pass it), hyper-connections ×4, head_dim 128 with RoPE
on its last 32 dims, 8 heads in 4 output groups, q LoRA 256, a 16-head indexer of head dim 64
(≠ head_dim, or llama.cpp would rotate every cache) keeping 16 rows, sliding window 64, YaRN
(factor 8 over 128 positions) on the compressed layers; routed experts MXFP4 (int8 pairs of
e2m1 codes, E8M0 scale per 32), projections FP8 e4m3 with E8M0 128×128 block scales, the rest
BF16 or F32, as in the release. Its prompt (PROMPTS) is 603 tokens so that it crosses the
window, gives the indexer 150 compressed rows to choose 16 from and completes 4 HCA blocks.
laguna and laguna-gate-elem (LagunaForCausalLM, poolside): 5 layers, full attention on layers 0
and 4 and a 32-token sliding window on 1-3 (the converter writes no sliding_window_pattern, and
llama.cpp's default for Laguna, period 4 with layer 0 full, is this pattern), 4 query heads on the
full layers and 8 on the sliding ones (num_attention_heads_per_layer; 2 KV heads, head_dim 64),
q/k norms, YaRN (factor 8 over 128 positions, theta 5e4) on RoPE over half the head on the full
layers and plain RoPE (theta 1e4) over all of it on the sliding ones, the softplus attention-output
gate, sigmoid routing with the score-correction bias, normalised top-2 of 8 experts, routed
scaling factor 2.5, one shared expert. laguna gates per head (gating true: attn_gate {n_embd, H})
after one dense layer; laguna-gate-elem per element (gating "per-element": {n_embd, H·hd}) after
two. Their prompt (PROMPTS) is 204 tokens, past the window and YaRN's original 128 positions.

Per model: random weights (matrices with std 0.1 so the logits are far from uniform, 0.07 for
the 26-layer model, which turns chaotic at 0.1; norm weights, biases, sinks, routing biases and
the DeltaNet's A_log and dt_bias perturbed so that they matter, A drawn from [0.05, 1] so the
recurrent state outlasts a few tokens), a small byte-level BPE tokenizer, save_pretrained →
convert_hf_to_gguf.py --outtype f32 → llama-quantize Q8_0, Q4_K_M, Q2_K and IQ2_XXS (with an
importance matrix from llama-imatrix; gpt-oss also MXFP4_MOE; the Qwen hybrids also IQ1_M, with
the importance matrix, and MXFP4_MOE; their IQ files keep the MTP block at Q8_0, since
llama-imatrix never runs it; the Laguna models also IQ1_M) →
tools/llama_ref.py → swapmoe; prints mean/max KL, top-1 agreement
and how many of the 32 greedy tokens agree, next to how far llama.cpp itself moves when fed the
prompt one token per decode call instead of in one batch (its kernels differ by batch size).
With --llama-only, or for an architecture swapmoe does not have yet, it stops at llama.cpp's
reference (REF.npz: tokens, logits, greedy) and prints what llama.cpp produced.

deepseek-v4's "F32" file is what the converter writes with --outtype f32: it forces the routed
experts to MXFP4 (a lossless repack of the FP4 source), the FP8 projections to Q8_0 (after
multiplying the block scales back) and keeps BF16 sources BF16, so only the F32 sources (norms,
hyper-connections, sinks, ape, biases) are F32 in it. Its quantizations therefore need
--allow-requantize, and its IQ files keep attn_output_a at the converter's Q8_0 and put
output_hc_fn and the compressors' ape at Q8_0 (IQ_TENSOR_TYPES says why).

The converter names a BPE pre-tokenizer by hashing a known tokenizer's output; a tiny
tokenizer has no known hash, so the converter runs with that lookup answering "qwen2". The
tokenizer plays no part in the check: both sides are given token ids.

Needs torch, transformers, safetensors and tokenizers in this Python; the llama.cpp source tree
(REF/src, for the converter and its gguf-py), a build (REF/llama-build-noamx, else
REF/llama-build) and REF/venv with the llama.cpp Python bindings.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import safetensors.torch
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from swapmoe.gguf_file import GGUFFile
from swapmoe.repack import index
from swapmoe.runtime.compare import kl_divergence
from swapmoe.runtime.experts.io import MmapEngine
from swapmoe.runtime.experts.store import ExpertStore
from swapmoe.runtime.models import ARCHITECTURES
from swapmoe.runtime.routing import Routing, RoutingPolicy

TOOLS = Path(__file__).resolve().parent
VOCAB = 384
END = "<|endoftext|>"
GREEDY = 32
TEXT = '''The expert store brings each routed expert's weights into memory when the router asks for
it, and lets it go again when memory runs short. A mixture-of-experts layer sends every token to
a few of its experts; the rest of the layer's weights are never read for that token.
def route(logits, k):
    """Indices of the k largest logits, best first."""
    return sorted(range(len(logits)), key=lambda i: -logits[i])[:k]
'''
DS_V3_YARN = {
    "rope_type": "yarn",
    "factor": 40.0,
    "original_max_position_embeddings": 256,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "rope_theta": 10000.0,
}
QWEN_HYBRID = dict(  # layers 3 and 7 full attention, the rest gated DeltaNet
    hidden_size=256,
    num_hidden_layers=8,
    full_attention_interval=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    linear_conv_kernel_dim=4,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=256,
    shared_expert_intermediate_size=256,
)
QWEN_ROPE = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}
DS_V4 = dict(  # config.json as DeepSeek's release spells it (not transformers' DeepseekV4Config names)
    architectures=["DeepseekV4ForCausalLM"],
    model_type="deepseek_v4",
    hidden_size=256,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=1,
    head_dim=128,
    qk_rope_head_dim=32,
    q_lora_rank=256,
    o_groups=4,
    o_lora_rank=64,
    n_routed_experts=16,
    num_experts_per_tok=4,
    n_shared_experts=1,
    moe_intermediate_size=256,
    scoring_func="sqrtsoftplus",
    norm_topk_prob=True,
    routed_scaling_factor=1.5,
    swiglu_limit=3.0,
    num_hash_layers=1,
    compress_ratios=[0, 4, 128, 4],
    sliding_window=64,
    index_n_heads=16,
    index_head_dim=64,
    index_topk=16,
    hc_mult=4,
    hc_sinkhorn_iters=20,
    hc_eps=1e-6,
    rope_theta=10000.0,
    compress_rope_theta=160000.0,
    rope_scaling={
        "type": "yarn",
        "factor": 8.0,
        "original_max_position_embeddings": 128,
        "beta_fast": 32,
        "beta_slow": 1,
    },
    max_position_embeddings=1024,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    tie_word_embeddings=False,
    num_nextn_predict_layers=0,
    torch_dtype="bfloat16",
    expert_dtype="fp4",
    quantization_config={
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "scale_fmt": "ue8m0",
        "weight_block_size": [128, 128],
    },
)
LAGUNA_PATTERN = ["full_attention"] + ["sliding_attention"] * 3 + ["full_attention"]  # llama.cpp's implied one
LAGUNA = dict(  # the per-layer head counts follow the layer kinds, fewer on the full layers as in Laguna XS.2
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=5,
    layer_types=LAGUNA_PATTERN,
    num_attention_heads=4,
    num_attention_heads_per_layer=[4 if t == "full_attention" else 8 for t in LAGUNA_PATTERN],
    num_key_value_heads=2,
    head_dim=64,
    sliding_window=32,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=256,
    shared_expert_intermediate_size=256,
    moe_routed_scaling_factor=2.5,
    max_position_embeddings=1024,
    rope_parameters={  # keyed by layer kind; beta 32/1 since llama.cpp's Laguna ignores the file's yarn_beta_*
        "full_attention": {
            "rope_type": "yarn",
            "rope_theta": 50000.0,
            "factor": 8.0,
            "original_max_position_embeddings": 128,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "partial_rotary_factor": 0.5,
        },
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0},
    },
)
MODELS = {  # name: (config class, model class, config arguments)
    "deepseek-v3": (
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        dict(
            hidden_size=256,
            intermediate_size=512,
            moe_intermediate_size=128,
            num_hidden_layers=3,
            first_k_dense_replace=1,
            num_attention_heads=4,
            num_key_value_heads=4,
            n_shared_experts=1,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            q_lora_rank=64,
            kv_lora_rank=64,
            qk_rope_head_dim=32,
            qk_nope_head_dim=32,
            v_head_dim=32,
            max_position_embeddings=10240,
            rope_parameters=DS_V3_YARN,
            scoring_func="sigmoid",
            topk_method="noaux_tc",
        ),
    ),
    "deepseek-v2-lite": (
        "DeepseekV2Config",
        "DeepseekV2ForCausalLM",
        dict(
            hidden_size=128,
            intermediate_size=256,
            moe_intermediate_size=64,
            num_hidden_layers=26,
            first_k_dense_replace=1,
            num_attention_heads=4,
            num_key_value_heads=4,
            n_shared_experts=2,
            n_routed_experts=8,
            num_experts_per_tok=2,
            routed_scaling_factor=1.0,
            norm_topk_prob=False,
            q_lora_rank=None,
            kv_lora_rank=64,
            qk_rope_head_dim=32,
            qk_nope_head_dim=32,
            v_head_dim=32,
            max_position_embeddings=10240,
            topk_method="greedy",
            scoring_func="softmax",
            initializer_range=0.07,
            rope_parameters={**DS_V3_YARN, "mscale": 0.707, "mscale_all_dim": 0.707},
        ),
    ),
    "minimax-m2": (
        "MiniMaxM2Config",
        "MiniMaxM2ForCausalLM",
        dict(
            hidden_size=256,
            intermediate_size=128,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            rotary_dim=32,
            num_local_experts=8,
            num_experts_per_tok=2,
            scoring_func="sigmoid",
            use_routing_bias=True,
            rope_parameters={"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 0.5},
        ),
    ),
    "gpt-oss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        dict(
            hidden_size=256,
            intermediate_size=128,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            num_local_experts=8,
            num_experts_per_tok=2,
            sliding_window=16,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        ),
    ),
    "qwen3.5-moe": (
        "Qwen3_5MoeTextConfig",
        "Qwen3_5MoeForCausalLM",
        QWEN_HYBRID
        | dict(
            mtp_num_hidden_layers=1, rope_parameters=QWEN_ROPE | {"mrope_section": [3, 3, 2], "mrope_interleaved": True}
        ),
    ),
    "qwen3-next": (
        "Qwen3NextConfig",
        "Qwen3NextForCausalLM",
        QWEN_HYBRID
        | dict(  # its config names no MTP layers:
            intermediate_size=512, norm_topk_prob=True, rope_parameters=QWEN_ROPE
        ),
    ),  # the converter counts mtp.layers.*
    "deepseek-v4": (None, None, DS_V4),  # no transformers class writes its layout: deepseek_v4_checkpoint does
    "laguna": (
        "LagunaConfig",
        "LagunaForCausalLM",
        LAGUNA
        | dict(  # attn_gate {n_embd, H}: one gate per head
            gating=True, mlp_layer_types=["dense"] + ["sparse"] * 4
        ),
    ),
    "laguna-gate-elem": (
        "LagunaConfig",
        "LagunaForCausalLM",
        LAGUNA
        | dict(  # attn_gate {n_embd, H·hd}
            gating="per-element", mlp_layer_types=["dense"] * 2 + ["sparse"] * 3
        ),
    ),
}
QUANTS = ("Q8_0", "Q4_K_M", "Q2_K", "IQ2_XXS")  # the acceptance's types; IQ2_XXS with an importance matrix
EXTRA_QUANTS = {
    "gpt-oss": ("MXFP4_MOE",),
    "qwen3.5-moe": ("IQ1_M", "MXFP4_MOE"),
    "qwen3-next": ("IQ1_M", "MXFP4_MOE"),
    "deepseek-v4": ("IQ1_M", "MXFP4_MOE"),
    "laguna": ("IQ1_M",),
    "laguna-gate-elem": ("IQ1_M",),
}
REQUANTIZE = ("deepseek-v4",)  # its "F32" file already holds Q8_0 and MXFP4 tensors (the converter forces them)
IQ_TENSOR_TYPES = {  # llama-quantize --tensor-type for the IQ files, for tensors the importance matrix cannot serve:
    # llama-imatrix records nothing for the HC head's fn nor for the compressors' position biases (added, not
    # multiplied), and records the grouped output projection per group (o_groups × 256 values) where llama-quantize
    # wants one row's 256; attn_output_a stays the converter's Q8_0 (copied), the others become Q8_0
    "deepseek-v4": ("output_hc_fn=q8_0", "compressor_ape=q8_0", "attn_output_a=q8_0")
}
PROMPTS = {  # a longer prompt where the model needs one: DeepSeek-V4's must cross the 64-token window and give its
    # indexer more compressed rows (one per 4 tokens) than its top-k (16), and its 128-token blocks must complete
    "deepseek-v4": TEXT
    + '''Most of a long prompt lies outside the window. A compressed layer pools each block of four
positions into one row, weighting every channel by a softmax over the block's scores; the lightning indexer
scores those rows against the query and keeps only the best sixteen, and a heavily compressed layer pools
blocks of 128 and keeps them all. Nothing in the pooled rows says which tokens they came from.
def pool(rows, scores):
    """One row from a block: each channel weighted by the softmax of its scores."""
    w = [[math.exp(s - max(col)) for s in col] for col in zip(*scores)]
    return [sum(r[c] * w[c][i] for i, r in enumerate(rows)) / sum(w[c]) for c in range(len(w))]
'''
}
PROMPTS["laguna"] = PROMPTS["laguna-gate-elem"] = TEXT + (  # 204 tokens in llama.cpp: past the 32-token
    "A sliding-window layer sees only the last 32 positions; a full layer sees them all.\n"
)  # window and 128
SEEDS = {"laguna": 1}  # seed 0 left a token whose 2nd and 3rd experts tie within 6e-8, which rounding decides
MTP = ("qwen3.5-moe", "qwen3-next")  # models whose checkpoints carry a multi-token-prediction block
CONVERT = """import runpy, sys
src = sys.argv.pop(1)
sys.path[:0] = [src + "/gguf-py", src]
import conversion.base
conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
sys.argv[0] = src + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""
LLAMA_SELF = """import sys, numpy as np
sys.path.insert(0, sys.argv[1])
import llama_ref as R
L = R.L
model, tokens = R.load(sys.argv[2]), [int(t) for t in sys.argv[3].split(",")]
n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
cp = L.llama_context_default_params()
cp.n_ctx, cp.n_threads, cp.n_threads_batch, cp.type_k, cp.type_v = max(512, len(tokens) + 16), 2, 2, 0, 0
cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
ctx, batch = L.llama_init_from_model(model, cp), L.llama_batch_init(1, 0, 1)
logits = np.empty((len(tokens), n_vocab), np.float32)
for j, t in enumerate(tokens):
    batch.token[0], batch.pos[0], batch.n_seq_id[0], batch.seq_id[0][0], batch.logits[0] = t, j, 1, 0, 1
    batch.n_tokens = 1
    assert L.llama_decode(ctx, batch) == 0
    logits[j] = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, 0), shape=(n_vocab,))
np.save(sys.argv[4], logits)
"""  # llama.cpp fed one token per decode call: how much it disagrees with its own one-batch prompt


def run(cmd, env=None):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(map(str, cmd))}\n{proc.stderr[-3000:]}")
    return proc.stdout


def tokenizer(directory: Path) -> transformers.PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=[END], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator([TEXT] * 4, trainer)
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=END, eos_token=END)
    tok.save_pretrained(directory)
    return tok


def checkpoint(name: str, directory: Path) -> None:
    """A random-weight checkpoint of `name` with its tokenizer, in `directory`."""
    config_cls, model_cls, args = MODELS[name]
    end = tokenizer(directory).convert_tokens_to_ids(END)
    if config_cls is None:
        deepseek_v4_checkpoint(directory, args | {"vocab_size": VOCAB, "bos_token_id": end, "eos_token_id": end})
        return
    config = getattr(transformers, config_cls)(
        **({"vocab_size": VOCAB, "bos_token_id": end, "eos_token_id": end, "initializer_range": 0.1} | args)
    )
    torch.manual_seed(SEEDS.get(name, 0))
    model = getattr(transformers, model_cls)(config).float()
    with torch.no_grad():
        for key, p in model.named_parameters():
            if key.endswith(".A_log"):  # DeltaNet decay rates; transformers draws A up to 16, which forgets at once
                p.copy_(torch.empty_like(p).uniform_(0.05, 1.0).log())
            if p.dim() == 1:  # norms (initialised to 1 or 0), biases, sinks, routing bias, A_log, dt_bias: perturb
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(directory)
    if name in MTP:
        mtp_block(directory, config)


def mtp_block(directory: Path, config) -> None:
    """The multi-token-prediction block Qwen3-Next and Qwen3.5 checkpoints carry beside the model,
    which transformers neither builds nor saves: a full-attention decoder layer `mtp.layers.0.*`
    (its tensors named and shaped as the saved model's first full-attention layer), the projection
    `mtp.fc` of [embedding | hidden state] and its norms, random, in model-mtp.safetensors (the
    converter reads every model*.safetensors when there is no index)."""
    assert not (directory / "model.safetensors.index.json").exists(), "a sharded checkpoint needs its index extended"
    saved = safetensors.torch.load_file(directory / "model.safetensors")
    layer = f"layers.{config.layer_types.index('full_attention')}."
    tensors = {"mtp.layers.0." + key.split(layer, 1)[1]: t for key, t in saved.items() if layer in key}
    n = config.hidden_size
    tensors |= {
        "mtp.fc.weight": torch.empty(n, 2 * n),
        "mtp.pre_fc_norm_embedding.weight": torch.empty(n),
        "mtp.pre_fc_norm_hidden.weight": torch.empty(n),
        "mtp.norm.weight": torch.empty(n),
    }
    torch.manual_seed(1)
    for key, t in tensors.items():  # its 1-D tensors are all norms, zero-centred (the converter adds 1)
        tensors[key] = torch.randn(t.shape) * 0.1
    safetensors.torch.save_file(
        {k: t.contiguous() for k, t in tensors.items()}, directory / "model-mtp.safetensors", metadata={"format": "pt"}
    )


E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], np.float32)  # the FP4 (e2m1) magnitudes; code | 8 is the negative


def fp8_blocks(w: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """`w` [out, in] as DeepSeek ships a projection: float8_e4m3fn values and, per 128×128 block (partial at the
    edges), one power-of-two scale as an E8M0 byte (`<name>.scale`, [ceil(out/128), ceil(in/128)]), the smallest
    with |w| / scale ≤ 448, e4m3's largest value. The converter multiplies back and writes Q8_0."""
    rows, cols = w.shape
    grid = np.zeros((-(-rows // 128) * 128, -(-cols // 128) * 128), np.float32)
    grid[:rows, :cols] = np.abs(w)
    amax = grid.reshape(grid.shape[0] // 128, 128, grid.shape[1] // 128, 128).max(axis=(1, 3))
    exponent = np.ceil(np.log2(np.maximum(amax, 2.0**-100) / 448)).astype(np.int64)
    scale = np.exp2(exponent).repeat(128, 0).repeat(128, 1)[:rows, :cols].astype(np.float32)
    return (
        torch.from_numpy(w / scale).to(torch.float8_e4m3fn),
        torch.from_numpy((exponent + 127).astype(np.uint8)).view(torch.float8_e8m0fnu),
    )


def fp4_blocks(w: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """`w` [out, in] as DeepSeek ships a routed expert's matrix: MXFP4, int8 [out, in/2] holding two e2m1 codes
    (input 2i in the low nibble, 2i+1 in the high one) and, per 32 inputs, one E8M0 exponent [out, in/32], the
    smallest power of two with |w| / scale ≤ 6; each value rounded to the nearest e2m1 magnitude."""
    rows, cols = w.shape
    blocks = w.reshape(rows, cols // 32, 32)
    exponent = np.ceil(np.log2(np.maximum(np.abs(blocks).max(-1), 2.0**-100) / 6)).astype(np.int64)
    x = blocks / np.exp2(exponent)[..., None]
    codes = (np.abs(np.abs(x)[..., None] - E2M1).argmin(-1) | np.where(x < 0, 8, 0)).astype(np.uint8)
    codes = codes.reshape(rows, cols)
    return (
        torch.from_numpy(codes[:, 0::2] | (codes[:, 1::2] << 4)).view(torch.int8),
        torch.from_numpy((exponent + 127).astype(np.uint8)).view(torch.float8_e8m0fnu),
    )


def deepseek_v4_checkpoint(directory: Path, config: dict) -> None:
    """A random DeepSeek-V4 in DeepSeek's own release layout, the one llama.cpp's converter reads (transformers
    writes another): config.json with the release's keys, and model.safetensors with the original tensor names;
    routed experts MXFP4 (fp4_blocks); the attention projections, indexer query and shared expert FP8 with E8M0
    block scales (fp8_blocks); embedding, head, router and the compressors' and indexer-weight projections BF16
    (they carry no scale in the release); norms, hyper-connection tensors, sinks, compressor position biases (ape)
    and routing biases F32; the hash layers' token → expert tables int32 [vocab, experts per token], each row
    distinct experts. Matrices have std 0.1; norms 1 + N(0, 0.1²); the hyper-connection scales 0.3, so that the
    24 mixing logits have std ~1, and their bases N(0, 0.5²) plus 1 on the residual matrix's diagonal."""
    rng = np.random.default_rng(0)
    n, hd, q, vocab = config["hidden_size"], config["head_dim"], config["q_lora_rank"], config["vocab_size"]
    heads, groups, experts, ff = (
        config[k] for k in ("num_attention_heads", "o_groups", "n_routed_experts", "moe_intermediate_size")
    )
    hc, idx_heads, idx_hd, k = (
        config[k] for k in ("hc_mult", "index_n_heads", "index_head_dim", "num_experts_per_tok")
    )
    tensors = {}

    def mat(*shape, std=0.1):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def f32(key, value):
        tensors[key] = torch.from_numpy(np.asarray(value, np.float32))

    def bf16(key, value):
        tensors[key] = torch.from_numpy(value).to(torch.bfloat16)

    def fp8(key, value):
        tensors[key + ".weight"], tensors[key + ".scale"] = fp8_blocks(value)

    def norm(key, width):
        f32(key, 1 + mat(width))

    def hyper(key, mixes, scales):  # mixes: 4 pre weights (+ 4 post weights + 4×4 residual matrix in a layer)
        base = mat(mixes, std=0.5)
        base[2 * hc :] += np.eye(hc).ravel()[: max(mixes - 2 * hc, 0)]
        f32(key + "_fn", mat(mixes, hc * n))
        f32(key + "_base", base)
        f32(key + "_scale", 0.3 * (1 + mat(scales)))

    for i, ratio in enumerate(config["compress_ratios"][: config["num_hidden_layers"]]):
        layer, attn, ffn = f"layers.{i}.", f"layers.{i}.attn.", f"layers.{i}.ffn."
        norm(layer + "attn_norm.weight", n)
        norm(layer + "ffn_norm.weight", n)
        hyper(layer + "hc_attn", (2 + hc) * hc, 3)
        hyper(layer + "hc_ffn", (2 + hc) * hc, 3)
        f32(attn + "attn_sink", mat(heads, std=1.0))
        fp8(attn + "wq_a", mat(q, n))
        norm(attn + "q_norm.weight", q)
        fp8(attn + "wq_b", mat(heads * hd, q))
        fp8(attn + "wkv", mat(hd, n))
        norm(attn + "kv_norm.weight", hd)
        fp8(attn + "wo_a", mat(groups * config["o_lora_rank"], heads * hd // groups))
        fp8(attn + "wo_b", mat(n, groups * config["o_lora_rank"]))
        compressors = [("compressor.", hd, 2 if ratio == 4 else 1)] if ratio else []
        if ratio == 4:  # CSA: the lightning indexer, with its own compressor of the indexer keys
            fp8(attn + "indexer.wq_b", mat(idx_heads * idx_hd, q))
            bf16(attn + "indexer.weights_proj.weight", mat(idx_heads, n))
            compressors.append(("indexer.compressor.", idx_hd, 2))
        for key, width, overlap in compressors:
            bf16(attn + key + "wkv.weight", mat(overlap * width, n))
            bf16(attn + key + "wgate.weight", mat(overlap * width, n))
            f32(attn + key + "ape", mat(ratio, overlap * width, std=0.3))
            norm(attn + key + "norm.weight", width)
        bf16(ffn + "gate.weight", mat(experts, n))
        if i < config["num_hash_layers"]:
            table = np.argsort(rng.random((vocab, experts)), axis=1)[:, :k]
            tensors[ffn + "gate.tid2eid"] = torch.from_numpy(table.astype(np.int32))
        else:
            f32(ffn + "gate.bias", mat(experts))
        for e in range(experts):
            for w, shape in (("w1", (ff, n)), ("w2", (n, ff)), ("w3", (ff, n))):
                tensors[f"{ffn}experts.{e}.{w}.weight"], tensors[f"{ffn}experts.{e}.{w}.scale"] = fp4_blocks(
                    mat(*shape)
                )
        shared = ff * config["n_shared_experts"]
        for w, shape in (("w1", (shared, n)), ("w2", (n, shared)), ("w3", (shared, n))):
            fp8(f"{ffn}shared_experts.{w}", mat(*shape))
    bf16("embed.weight", mat(vocab, n))
    bf16("head.weight", mat(vocab, n))
    norm("norm.weight", n)
    hyper("hc_head", hc, 1)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    safetensors.torch.save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})


def open_model(path: Path):
    g = GGUFFile(path)
    return ARCHITECTURES[g.arch](g, ExpertStore(index.build(g), MmapEngine([s.path for s in g.shards], None)))


def agreement(ref_logits: np.ndarray, logits: np.ndarray) -> str:
    kl = kl_divergence(ref_logits, logits)
    top1 = np.mean(logits.argmax(-1) == ref_logits.argmax(-1))
    return f"KL mean {kl.mean():.2e} max {kl.max():.2e}, top-1 {top1 * 100:.1f}%"


def compare(path: Path, ref: dict, llama_one_by_one: np.ndarray) -> str:
    model, tokens = open_model(path), ref["tokens"]
    cache, routing = model.new_cache(len(tokens) + GREEDY), Routing(model.store, RoutingPolicy())
    logits = model.forward(tokens, cache, routing, all_logits=True)
    ids, last = [], logits[-1]
    for _ in range(GREEDY):
        ids.append(int(np.argmax(last)))
        last = model.forward(np.array([ids[-1]]), cache, routing)[-1]
    agree = next((i for i, (a, b) in enumerate(zip(ids, ref["greedy"].tolist())) if a != b), GREEDY)
    return (
        f"{agreement(ref['logits'], logits)}, greedy {agree}/{GREEDY} before the first difference "
        f"(llama.cpp one token per call vs its own batch: {agreement(ref['logits'], llama_one_by_one)}; "
        f"logit std {ref['logits'].std():.2f})"
    )


def llama_only(ref: dict, llama_one_by_one: np.ndarray) -> str:
    """What llama.cpp alone produced, for a file swapmoe is not compared on."""
    logits, greedy = ref["logits"], ref["greedy"].tolist()
    return (
        f"logits {'finite' if np.isfinite(logits).all() else 'NOT FINITE'}, std {logits.std():.2f}, "
        f"{len(set(logits.argmax(-1).tolist()))} distinct argmax over the prompt; greedy {greedy} "
        f"({len(set(greedy))} distinct); one token per call vs its own batch: "
        f"{agreement(logits, llama_one_by_one)}"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", type=Path, default=Path.home() / ".cache/swapmoe-ref")
    ap.add_argument("--out", type=Path, default=Path("/tmp/swapmoe-hf"))
    ap.add_argument("--model", nargs="*", default=list(MODELS), choices=list(MODELS))
    ap.add_argument(
        "--llama-only", action="store_true", help="make the GGUFs and llama.cpp's reference logits, and skip swapmoe"
    )
    args = ap.parse_args()
    build = args.ref / "llama-build-noamx"
    bin_dir = (build if (build / "bin/llama-quantize").exists() else args.ref / "llama-build") / "bin"
    env = dict(os.environ, LLAMA_CPP_LIB_PATH=str(bin_dir))
    for name in args.model:
        work = args.out / name
        work.mkdir(parents=True, exist_ok=True)
        checkpoint(name, work / "hf")
        f32 = work / f"{name}-F32.gguf"
        run([sys.executable, "-c", CONVERT, args.ref / "src", work / "hf", "--outfile", f32, "--outtype", "f32"])
        files = [("F32", f32)]
        text, imatrix = work / "imatrix.txt", work / "imatrix.gguf"
        text.write_text(TEXT * 8)
        run([bin_dir / "llama-imatrix", "-m", f32, "-f", text, "-o", imatrix, "-c", "128", "--chunks", "8", "-t", "2"])
        for quant in QUANTS + EXTRA_QUANTS.get(name, ()):
            files.append((quant, work / f"{name}-{quant}.gguf"))
            extra = ["--allow-requantize"] if name in REQUANTIZE else []
            if quant.startswith("IQ"):
                extra += ["--imatrix", imatrix]
                for override in IQ_TENSOR_TYPES.get(name, ()):
                    extra += ["--tensor-type", override]
                if name in MTP:  # llama-imatrix never runs the MTP block, and IQ types need its matrix
                    extra += ["--tensor-type", rf"blk\.{MODELS[name][2]['num_hidden_layers']}\.=q8_0"]
            run([bin_dir / "llama-quantize", *extra, f32, files[-1][1], quant, "2"])
        print(f"{name}: GGUFs in {work}: " + ", ".join(path.name for _, path in files), flush=True)
        arch = GGUFFile(f32).arch
        swapmoe = not args.llama_only and arch in ARCHITECTURES
        if not args.llama_only and not swapmoe:
            print(
                f"{name}: swapmoe has no architecture {arch!r} (swapmoe.runtime.models.ARCHITECTURES): "
                "llama.cpp's side only",
                flush=True,
            )
        ref_py = [args.ref / "venv/bin/python", TOOLS / "llama_ref.py"]
        tokens = json.loads(run([*ref_py, f32, "--tokenize", PROMPTS.get(name, TEXT)], env))
        for quant, path in files:
            npz = work / f"{name}-{quant}.npz"
            run([*ref_py, path, "--tokens", ",".join(map(str, tokens)), "--greedy", GREEDY, "--out", npz], env)
            one_by_one = work / f"{name}-{quant}-one-by-one.npy"
            run(
                [args.ref / "venv/bin/python", "-c", LLAMA_SELF, TOOLS, path, ",".join(map(str, tokens)), one_by_one],
                env,
            )
            ref, one_by_one = np.load(npz), np.load(one_by_one)
            result = compare(path, ref, one_by_one) if swapmoe else f"llama.cpp {llama_only(ref, one_by_one)} ({npz})"
            print(f"{name} {quant} ({len(tokens)} tokens): {result}", flush=True)


if __name__ == "__main__":
    main()
