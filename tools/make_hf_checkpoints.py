#!/usr/bin/env python3
"""Tiny random Hugging Face checkpoints converted by llama.cpp's own converter, and swapmoe's
logits checked against llama.cpp on them.

    python tools/make_hf_checkpoints.py [--ref ~/.cache/swapmoe-ref] [--out /tmp/swapmoe-hf] [--model NAME ...]

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

Per model: random weights (matrices with std 0.1 so the logits are far from uniform, 0.07 for
the 26-layer model, which turns chaotic at 0.1; norm weights, biases, sinks, routing biases and
the DeltaNet's A_log and dt_bias perturbed so that they matter, A drawn from [0.05, 1] so the
recurrent state outlasts a few tokens), a small byte-level BPE tokenizer, save_pretrained →
convert_hf_to_gguf.py --outtype f32 → llama-quantize Q8_0, Q4_K_M, Q2_K and IQ2_XXS (with an
importance matrix from llama-imatrix; gpt-oss also MXFP4_MOE; the Qwen hybrids also IQ1_M, with
the importance matrix, and MXFP4_MOE; their IQ files keep the MTP block at Q8_0, since
llama-imatrix never runs it) →
tools/llama_ref.py → swapmoe; prints mean/max KL, top-1 agreement
and how many of the 32 greedy tokens agree, next to how far llama.cpp itself moves when fed the
prompt one token per decode call instead of in one batch (its kernels differ by batch size).

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
DS_V3_YARN = {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 256, "beta_fast": 32.0,
              "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": 10000.0}
QWEN_HYBRID = dict(  # layers 3 and 7 full attention, the rest gated DeltaNet
    hidden_size=256, num_hidden_layers=8, full_attention_interval=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64, linear_value_head_dim=64,
    linear_conv_kernel_dim=4, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256,
    shared_expert_intermediate_size=256)
QWEN_ROPE = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}
MODELS = {  # name: (config class, model class, config arguments)
    "deepseek-v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", dict(
        hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_hidden_layers=3, first_k_dense_replace=1,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8, num_experts_per_tok=2,
        n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=64, kv_lora_rank=64,
        qk_rope_head_dim=32, qk_nope_head_dim=32, v_head_dim=32, max_position_embeddings=10240,
        rope_parameters=DS_V3_YARN, scoring_func="sigmoid", topk_method="noaux_tc")),
    "deepseek-v2-lite": ("DeepseekV2Config", "DeepseekV2ForCausalLM", dict(
        hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=26, first_k_dense_replace=1,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=2, n_routed_experts=8, num_experts_per_tok=2,
        routed_scaling_factor=1.0, norm_topk_prob=False, q_lora_rank=None, kv_lora_rank=64, qk_rope_head_dim=32,
        qk_nope_head_dim=32, v_head_dim=32, max_position_embeddings=10240, topk_method="greedy", scoring_func="softmax",
        initializer_range=0.07,
        rope_parameters={**DS_V3_YARN, "mscale": 0.707, "mscale_all_dim": 0.707})),
    "minimax-m2": ("MiniMaxM2Config", "MiniMaxM2ForCausalLM", dict(
        hidden_size=256, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, rotary_dim=32, num_local_experts=8, num_experts_per_tok=2, scoring_func="sigmoid",
        use_routing_bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 0.5})),
    "gpt-oss": ("GptOssConfig", "GptOssForCausalLM", dict(
        hidden_size=256, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, num_local_experts=8, num_experts_per_tok=2, sliding_window=16,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"])),
    "qwen3.5-moe": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", QWEN_HYBRID | dict(
        mtp_num_hidden_layers=1, rope_parameters=QWEN_ROPE | {"mrope_section": [3, 3, 2], "mrope_interleaved": True})),
    "qwen3-next": ("Qwen3NextConfig", "Qwen3NextForCausalLM", QWEN_HYBRID | dict(  # its config names no MTP layers:
        intermediate_size=512, norm_topk_prob=True, rope_parameters=QWEN_ROPE)),  # the converter counts mtp.layers.*
}
QUANTS = ("Q8_0", "Q4_K_M", "Q2_K", "IQ2_XXS")  # the acceptance's types; IQ2_XXS with an importance matrix
EXTRA_QUANTS = {"gpt-oss": ("MXFP4_MOE",), "qwen3.5-moe": ("IQ1_M", "MXFP4_MOE"), "qwen3-next": ("IQ1_M", "MXFP4_MOE")}
MTP = ("qwen3.5-moe", "qwen3-next")  # models whose checkpoints carry a multi-token-prediction block
CONVERT = '''import runpy, sys
src = sys.argv.pop(1)
sys.path[:0] = [src + "/gguf-py", src]
import conversion.base
conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
sys.argv[0] = src + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
'''
LLAMA_SELF = '''import sys, numpy as np
sys.path.insert(0, sys.argv[1])
import llama_ref as R
L = R.L
model, tokens = R.load(sys.argv[2]), [int(t) for t in sys.argv[3].split(",")]
n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
cp = L.llama_context_default_params()
cp.n_ctx, cp.n_threads, cp.n_threads_batch, cp.type_k, cp.type_v = 512, 2, 2, 0, 0
cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
ctx, batch = L.llama_init_from_model(model, cp), L.llama_batch_init(1, 0, 1)
logits = np.empty((len(tokens), n_vocab), np.float32)
for j, t in enumerate(tokens):
    batch.token[0], batch.pos[0], batch.n_seq_id[0], batch.seq_id[0][0], batch.logits[0] = t, j, 1, 0, 1
    batch.n_tokens = 1
    assert L.llama_decode(ctx, batch) == 0
    logits[j] = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, 0), shape=(n_vocab,))
np.save(sys.argv[4], logits)
'''  # llama.cpp fed one token per decode call: how much it disagrees with its own one-batch prompt


def run(cmd, env=None):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(map(str, cmd))}\n{proc.stderr[-3000:]}")
    return proc.stdout


def tokenizer(directory: Path) -> transformers.PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[END],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator([TEXT] * 4, trainer)
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=END, eos_token=END)
    tok.save_pretrained(directory)
    return tok


def checkpoint(name: str, directory: Path) -> None:
    """A random-weight checkpoint of `name` with its tokenizer, in `directory`."""
    config_cls, model_cls, args = MODELS[name]
    end = tokenizer(directory).convert_tokens_to_ids(END)
    config = getattr(transformers, config_cls)(**({"vocab_size": VOCAB, "bos_token_id": end, "eos_token_id": end,
                                                   "initializer_range": 0.1} | args))
    torch.manual_seed(0)
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
    tensors |= {"mtp.fc.weight": torch.empty(n, 2 * n), "mtp.pre_fc_norm_embedding.weight": torch.empty(n),
                "mtp.pre_fc_norm_hidden.weight": torch.empty(n), "mtp.norm.weight": torch.empty(n)}
    torch.manual_seed(1)
    for key, t in tensors.items():  # its 1-D tensors are all norms, zero-centred (the converter adds 1)
        tensors[key] = torch.randn(t.shape) * 0.1
    safetensors.torch.save_file({k: t.contiguous() for k, t in tensors.items()}, directory / "model-mtp.safetensors",
                                metadata={"format": "pt"})


def open_model(path: Path):
    g = GGUFFile(path)
    return ARCHITECTURES[g.arch](g, ExpertStore(index.build(g), MmapEngine([s.path for s in g.shards], None)))


def agreement(ref_logits: np.ndarray, logits: np.ndarray) -> str:
    kl = kl_divergence(ref_logits, logits)
    top1 = np.mean(logits.argmax(-1) == ref_logits.argmax(-1))
    return f"KL mean {kl.mean():.2e} max {kl.max():.2e}, top-1 {top1 * 100:.1f}%"


def compare(path: Path, ref: dict, llama_one_by_one: np.ndarray) -> str:
    model, tokens = open_model(path), ref["tokens"]
    cache = model.new_cache(len(tokens) + GREEDY)
    logits = model.forward(tokens, cache, all_logits=True)
    ids, last = [], logits[-1]
    for _ in range(GREEDY):
        ids.append(int(np.argmax(last)))
        last = model.forward(np.array([ids[-1]]), cache)[-1]
    agree = next((i for i, (a, b) in enumerate(zip(ids, ref["greedy"].tolist())) if a != b), GREEDY)
    return (f"{agreement(ref['logits'], logits)}, greedy {agree}/{GREEDY} before the first difference "
            f"(llama.cpp one token per call vs its own batch: {agreement(ref['logits'], llama_one_by_one)}; "
            f"logit std {ref['logits'].std():.2f})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", type=Path, default=Path.home() / ".cache/swapmoe-ref")
    ap.add_argument("--out", type=Path, default=Path("/tmp/swapmoe-hf"))
    ap.add_argument("--model", nargs="*", default=list(MODELS), choices=list(MODELS))
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
            extra = ["--imatrix", imatrix] if quant.startswith("IQ") else []
            if extra and name in MTP:  # llama-imatrix never runs the MTP block, and IQ types need its matrix
                extra += ["--tensor-type", rf"blk\.{MODELS[name][2]['num_hidden_layers']}\.=q8_0"]
            run([bin_dir / "llama-quantize", *extra, f32, files[-1][1], quant, "2"])
        ref_py = [args.ref / "venv/bin/python", TOOLS / "llama_ref.py"]
        tokens = json.loads(run([*ref_py, f32, "--tokenize", TEXT], env))
        for quant, path in files:
            npz = work / f"{name}-{quant}.npz"
            run([*ref_py, path, "--tokens", ",".join(map(str, tokens)), "--greedy", GREEDY, "--out", npz], env)
            one_by_one = work / f"{name}-{quant}-one-by-one.npy"
            run([args.ref / "venv/bin/python", "-c", LLAMA_SELF, TOOLS, path, ",".join(map(str, tokens)),
                 one_by_one], env)
            print(f"{name} {quant} ({len(tokens)} tokens): {compare(path, np.load(npz), np.load(one_by_one))}",
                  flush=True)


if __name__ == "__main__":
    main()
