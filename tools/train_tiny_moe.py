#!/usr/bin/env python3
"""Train the tiny qwen3moe model that ships as swapmoe/data/tiny-moe.gguf, end to end.

Stages (all deterministic: fixed seeds, sorted file lists, fixed hold-out rule):
  1. corpus     the CPython standard library sources (*.py, no site-packages); about 2 % of the
                files (chosen by a CRC32 of their relative path) are held out for evaluation.
  2. tokenizer  byte-level BPE trained with `tokenizers`, pre-tokenized with exactly the regex of
                llama.cpp's "qwen2" pre-tokenizer, so llama.cpp tokenizes text the same way.
  3. training   a small qwen3moe (RMSNorm, per-head q/k norm, NEOX RoPE, GQA, softmax top-k
                router with renormalised weights, SwiGLU experts) in PyTorch on CPU, with a
                Switch-style load-balancing loss so every expert gets used.
  4. export     GGUF for llama.cpp's qwen3moe loader: Q8_0 matrices, F32 norms and routers,
                tied output embedding, the BPE vocab/merges and a ChatML template.
  5. evaluation held-out perplexity (float weights and the dequantized Q8_0 weights), routing
                locality per layer, and reference logits for tools/llama_check_tiny.py.

    python tools/train_tiny_moe.py                       # full run (~30 min on 2 cores)
    python tools/train_tiny_moe.py --steps 50 --out /tmp/t.gguf --work-dir /tmp/tw   # smoke test
    python tools/train_tiny_moe.py --skip-train          # re-export/re-evaluate a saved checkpoint

Needs torch (CPU) in addition to swapmoe's own dependencies: pip install torch==2.13.0
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

# torch's OpenMP threads spin-wait by default; on a shared 2-core machine a descheduled
# partner thread then makes every op wait (measured 6x slower steps under load).  Passive
# waiting keeps 2 threads useful.  Must be set before torch (libgomp) is loaded.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

REPO = Path(__file__).resolve().parent.parent
DEFAULT_STDLIB = "/root/.pyenv/versions/3.11.7/lib/python3.11"

# llama.cpp's "qwen2" pre-tokenizer regex (src/llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_QWEN2), in
# its original tokenizer.json form; llama.cpp spells the (?i:...) group out case by case.
QWEN2_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
EOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = [EOS_TOKEN, "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Files that are data tables or generated text rather than Python code worth imitating.
EXCLUDED_PREFIXES = (
    "site-packages/",
    "encodings/",
    "pydoc_data/",
    "lib2to3/tests/data/",
    "test/tokenizedata/",
    "test/encoded_modules/",
    "idlelib/idle_test/",
)
HOLDOUT_MODULUS = 50  # files whose crc32(relative path) % 50 == 0 are held out (about 2 %)


@dataclass
class ModelConfig:
    vocab_size: int = 6144
    d_model: int = 256
    n_layers: int = 6
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 64
    n_experts: int = 16
    n_experts_used: int = 2
    expert_ffn: int = 128
    context_length: int = 256
    rms_eps: float = 1e-6
    rope_base: float = 10000.0


# --------------------------------------------------------------------------------------------
# 1. corpus
# --------------------------------------------------------------------------------------------


def list_corpus_files(stdlib_dir: Path) -> tuple[list[Path], list[Path]]:
    """Sorted (train, held-out) lists of readable UTF-8 stdlib sources."""
    train, held_out = [], []
    for path in sorted(stdlib_dir.rglob("*.py")):
        rel = path.relative_to(stdlib_dir).as_posix()
        if rel.startswith(EXCLUDED_PREFIXES) or "__pycache__" in rel:
            continue
        try:
            path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # a few test files are deliberately not UTF-8
        is_held_out = zlib.crc32(rel.encode()) % HOLDOUT_MODULUS == 0
        (held_out if is_held_out else train).append(path)
    return train, held_out


def read_text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


# --------------------------------------------------------------------------------------------
# 2. tokenizer
# --------------------------------------------------------------------------------------------


def train_tokenizer(files: list[Path], vocab_size: int):
    """Byte-level BPE whose pre-tokenization is llama.cpp's qwen2 one."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator((read_text(p) for p in files), trainer=trainer)
    return tokenizer


def encode_files(tokenizer, files: list[Path]) -> np.ndarray:
    """One token stream: each file's tokens followed by <|endoftext|>."""
    eos = tokenizer.token_to_id(EOS_TOKEN)
    encodings = tokenizer.encode_batch([read_text(p) for p in files], add_special_tokens=False)
    pieces = []
    for enc in encodings:
        pieces.append(np.asarray(enc.ids, dtype=np.int32))
        pieces.append(np.asarray([eos], dtype=np.int32))
    return np.concatenate(pieces)


def held_out_text(files: list[Path]) -> str:
    """The evaluation text: held-out files joined by blank lines (no special tokens, since
    llama-perplexity does not parse them)."""
    return "\n\n".join(read_text(p) for p in files)


# --------------------------------------------------------------------------------------------
# 3. model (computes what llama.cpp's qwen3moe graph computes)
# --------------------------------------------------------------------------------------------


def build_model(cfg: ModelConfig):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    def rope_tables(cfg: ModelConfig, n_pos: int):
        """cos/sin like ggml's rope: theta_{i+1} = theta_i * base^(-2/d) as an f32 recurrence."""
        half = cfg.head_dim // 2
        theta_scale = np.float32(cfg.rope_base) ** np.float32(-2.0 / cfg.head_dim)
        scales = np.empty(half, dtype=np.float32)
        s = np.float32(1.0)
        for i in range(half):
            scales[i] = s
            s = np.float32(s * theta_scale)
        # theta_i = pos * theta_scale^i, accumulated in f32 from theta_0 = pos
        theta = np.empty((n_pos, half), dtype=np.float32)
        theta[:, 0] = np.arange(n_pos, dtype=np.float32)
        for i in range(1, half):
            theta[:, i] = theta[:, i - 1] * theta_scale
        return torch.from_numpy(np.cos(theta)), torch.from_numpy(np.sin(theta))

    def rms_norm(x, weight, eps):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    def apply_neox_rope(x, cos, sin):
        # x: (B, heads, T, d); rotate the pairs (x[i], x[i + d/2])
        half = x.shape[-1] // 2
        x0, x1 = x[..., :half], x[..., half:]
        return torch.cat([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1)

    class MoEFeedForward(nn.Module):
        """Softmax router over all experts, top-k, weights renormalised to sum 1, SwiGLU experts.
        Expert weights are stored in GGUF numpy order: gate/up (E, F, D), down (E, D, F)."""

        def __init__(self, cfg: ModelConfig):
            super().__init__()
            E, Fw, D = cfg.n_experts, cfg.expert_ffn, cfg.d_model
            self.k = cfg.n_experts_used
            self.router = nn.Parameter(torch.randn(E, D) * 0.02)
            self.gate = nn.Parameter(torch.randn(E, Fw, D) * 0.02)
            self.up = nn.Parameter(torch.randn(E, Fw, D) * 0.02)
            self.down = nn.Parameter(torch.randn(E, D, Fw) * (0.02 / math.sqrt(2 * cfg.n_layers)))

        def forward(self, x):
            shape = x.shape
            x = x.reshape(-1, shape[-1])
            n_tokens, n_experts = x.shape[0], self.router.shape[0]
            probs = torch.softmax(x @ self.router.t(), dim=-1)
            top_w, top_i = probs.topk(self.k, dim=-1)
            top_w = top_w / top_w.sum(-1, keepdim=True)

            # Group the (token, slot) pairs by expert, run each expert once on its rows.
            flat_expert = top_i.reshape(-1)
            order = torch.argsort(flat_expert, stable=True)
            token_of_slot = order // self.k
            counts = torch.bincount(flat_expert, minlength=n_experts).tolist()
            xs = x[token_of_slot]
            outputs, start = [], 0
            for e, count in enumerate(counts):
                if count == 0:
                    continue
                chunk = xs[start : start + count]
                h = F.silu(chunk @ self.gate[e].t()) * (chunk @ self.up[e].t())
                outputs.append(h @ self.down[e].t())
                start += count
            ys = torch.cat(outputs).to(x.dtype) * top_w.reshape(-1)[order].unsqueeze(-1)
            out = torch.zeros_like(x).index_add_(0, token_of_slot, ys)

            # Switch-Transformer balance loss: E * sum_e (share of slots routed to e) * (mean prob of e)
            slot_share = torch.bincount(flat_expert, minlength=n_experts).float() / (n_tokens * self.k)
            balance_loss = n_experts * (slot_share * probs.mean(0)).sum()
            return out.reshape(shape), balance_loss, top_i.reshape(*shape[:-1], self.k)

    class Block(nn.Module):
        def __init__(self, cfg: ModelConfig):
            super().__init__()
            self.cfg = cfg
            D, H, Hkv, d = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
            self.attn_norm = nn.Parameter(torch.ones(D))
            self.wq = nn.Parameter(torch.randn(H * d, D) * 0.02)
            self.wk = nn.Parameter(torch.randn(Hkv * d, D) * 0.02)
            self.wv = nn.Parameter(torch.randn(Hkv * d, D) * 0.02)
            self.wo = nn.Parameter(torch.randn(D, H * d) * (0.02 / math.sqrt(2 * cfg.n_layers)))
            self.q_norm = nn.Parameter(torch.ones(d))
            self.k_norm = nn.Parameter(torch.ones(d))
            self.ffn_norm = nn.Parameter(torch.ones(D))
            self.moe = MoEFeedForward(cfg)

        def forward(self, h, cos, sin):
            cfg = self.cfg
            B, T, _ = h.shape
            H, Hkv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
            x = rms_norm(h, self.attn_norm, cfg.rms_eps)
            q = (x @ self.wq.t()).view(B, T, H, d)
            k = (x @ self.wk.t()).view(B, T, Hkv, d)
            v = (x @ self.wv.t()).view(B, T, Hkv, d)
            q = rms_norm(q, self.q_norm, cfg.rms_eps).transpose(1, 2)  # per-head norm before RoPE
            k = rms_norm(k, self.k_norm, cfg.rms_eps).transpose(1, 2)
            v = v.transpose(1, 2)
            q, k = apply_neox_rope(q, cos, sin), apply_neox_rope(k, cos, sin)
            # GQA: query head h reads kv head h // (H / Hkv)
            k = k.repeat_interleave(H // Hkv, dim=1)
            v = v.repeat_interleave(H // Hkv, dim=1)
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(d))
            h = h + attn.transpose(1, 2).reshape(B, T, H * d) @ self.wo.t()
            moe_out, balance_loss, chosen = self.moe(rms_norm(h, self.ffn_norm, cfg.rms_eps))
            return h + moe_out, balance_loss, chosen

    class TinyQwen3Moe(nn.Module):
        def __init__(self, cfg: ModelConfig):
            super().__init__()
            self.cfg = cfg
            self.embed = nn.Parameter(torch.randn(cfg.vocab_size, cfg.d_model) * 0.02)
            self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
            self.output_norm = nn.Parameter(torch.ones(cfg.d_model))
            cos, sin = rope_tables(cfg, cfg.context_length)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)

        def forward(self, tokens):
            """tokens (B, T) -> logits (B, T, V), mean balance loss, chosen experts per layer."""
            T = tokens.shape[1]
            cos, sin = self.rope_cos[:T], self.rope_sin[:T]
            h = self.embed[tokens]
            balance_losses, chosen = [], []
            for block in self.blocks:
                h, bl, ch = block(h, cos, sin)
                balance_losses.append(bl)
                chosen.append(ch)
            h = rms_norm(h, self.output_norm, self.cfg.rms_eps)
            logits = h @ self.embed.t()  # output tied to token_embd
            return logits, torch.stack(balance_losses).mean(), chosen

    return TinyQwen3Moe(cfg)


# --------------------------------------------------------------------------------------------
# 3b. training
# --------------------------------------------------------------------------------------------


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to 10 % of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(model, train_ids: np.ndarray, eval_ids: np.ndarray, args, log) -> None:
    import torch
    import torch.nn.functional as F

    cfg = model.cfg
    rng = np.random.default_rng(args.seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "router" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "router" not in n)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    T = cfg.context_length
    t0 = time.time()
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        starts = rng.integers(0, len(train_ids) - T - 1, size=args.batch_size)
        batch = torch.from_numpy(np.stack([train_ids[s : s + T + 1] for s in starts]).astype(np.int64))
        logits, balance_loss, _ = model(batch[:, :-1])
        lm_loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), batch[:, 1:].reshape(-1))
        loss = lm_loss + args.balance_coef * balance_loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 25 == 0 or step == args.steps - 1:
            log(
                f"step {step:5d}  lm {lm_loss.item():.4f}  balance {balance_loss.item():.4f}  "
                f"lr {optimizer.param_groups[0]['lr']:.2e}  {time.time() - t0:7.1f}s"
            )
        if (step + 1) % args.eval_every == 0:
            ppl = perplexity_all_tokens(model, eval_ids[: 32 * T], T)
            log(f"step {step + 1:5d}  held-out ppl (first {32 * T} tokens) {ppl:.3f}")
    log(f"training took {time.time() - t0:.1f}s for {args.steps} steps ({args.steps * args.batch_size * T} tokens)")


# --------------------------------------------------------------------------------------------
# 4. export to GGUF
# --------------------------------------------------------------------------------------------


def model_tensors(model) -> dict[str, np.ndarray]:
    """GGUF tensor name -> float32 numpy array in GGUF numpy order (reverse of ggml ne)."""
    tensors = {"token_embd.weight": model.embed, "output_norm.weight": model.output_norm}
    for i, b in enumerate(model.blocks):
        tensors.update(
            {
                f"blk.{i}.attn_norm.weight": b.attn_norm,
                f"blk.{i}.attn_q.weight": b.wq,
                f"blk.{i}.attn_k.weight": b.wk,
                f"blk.{i}.attn_v.weight": b.wv,
                f"blk.{i}.attn_output.weight": b.wo,
                f"blk.{i}.attn_q_norm.weight": b.q_norm,
                f"blk.{i}.attn_k_norm.weight": b.k_norm,
                f"blk.{i}.ffn_norm.weight": b.ffn_norm,
                f"blk.{i}.ffn_gate_inp.weight": b.moe.router,
                f"blk.{i}.ffn_gate_exps.weight": b.moe.gate,
                f"blk.{i}.ffn_up_exps.weight": b.moe.up,
                f"blk.{i}.ffn_down_exps.weight": b.moe.down,
            }
        )
    return {name: p.detach().float().numpy().copy() for name, p in tensors.items()}


def keeps_f32(name: str, arr: np.ndarray) -> bool:
    """Norms, 1-D tensors and the routers stay F32, as llama-quantize and the converters do."""
    return arr.ndim == 1 or name.endswith("_norm.weight") or ".ffn_gate_inp." in name


def export_gguf(model, tokenizer, out_path: Path, quantize: bool) -> None:
    import gguf

    cfg: ModelConfig = model.cfg
    arch = "qwen3moe"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(out_path), arch)
    w.add_name("swapmoe tiny-moe (CPython stdlib)")
    w.add_description(
        "Tiny qwen3moe trained on CPython 3.11 standard-library sources by "
        "swapmoe/tools/train_tiny_moe.py; a test model, not a useful assistant."
    )
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if quantize else gguf.LlamaFileType.ALL_F32)
    w.add_context_length(cfg.context_length)
    w.add_embedding_length(cfg.d_model)
    w.add_block_count(cfg.n_layers)
    w.add_feed_forward_length(cfg.expert_ffn * cfg.n_experts_used)
    w.add_expert_feed_forward_length(cfg.expert_ffn)
    w.add_expert_count(cfg.n_experts)
    w.add_expert_used_count(cfg.n_experts_used)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_eps)
    w.add_rope_freq_base(cfg.rope_base)

    vocab = tokenizer.get_vocab()
    tokens = [None] * len(vocab)
    for text, idx in vocab.items():
        tokens[idx] = text
    assert all(t is not None for t in tokens), "token ids are not contiguous"
    token_types = [gguf.TokenType.CONTROL if t in SPECIAL_TOKENS else gguf.TokenType.NORMAL for t in tokens]
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    eos = tokenizer.token_to_id(EOS_TOKEN)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(token_types)
    w.add_token_merges(merges)
    w.add_eos_token_id(eos)
    w.add_bos_token_id(eos)
    w.add_pad_token_id(eos)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML_TEMPLATE)

    for name, arr in model_tensors(model).items():
        if quantize and not keeps_f32(name, arr):
            w.add_tensor(
                name,
                gguf.quants.quantize(arr, gguf.GGMLQuantizationType.Q8_0),
                raw_dtype=gguf.GGMLQuantizationType.Q8_0,
            )
        else:
            w.add_tensor(name, arr.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def load_gguf_weights_into(model, path: Path) -> None:
    """Overwrite the model's parameters with the (dequantized) tensors of an exported GGUF."""
    import gguf
    import torch

    reader = gguf.GGUFReader(str(path))
    by_name = {t.name: t for t in reader.tensors}
    params = dict(zip(model_tensors(model).keys(), _parameters_in_export_order(model)))
    with torch.no_grad():
        for name, param in params.items():
            t = by_name[name]
            arr = gguf.quants.dequantize(t.data, t.tensor_type).reshape(param.shape)
            param.copy_(torch.from_numpy(np.array(arr, dtype=np.float32)))  # a writable copy


def _parameters_in_export_order(model):
    yield model.embed
    yield model.output_norm
    for b in model.blocks:
        yield from (
            b.attn_norm,
            b.wq,
            b.wk,
            b.wv,
            b.wo,
            b.q_norm,
            b.k_norm,
            b.ffn_norm,
            b.moe.router,
            b.moe.gate,
            b.moe.up,
            b.moe.down,
        )


# --------------------------------------------------------------------------------------------
# 5. evaluation
# --------------------------------------------------------------------------------------------


def perplexity_all_tokens(model, ids: np.ndarray, T: int) -> float:
    """exp(mean NLL) over non-overlapping windows of T tokens, scoring every token but the first
    of each window."""
    import torch
    import torch.nn.functional as F

    n_windows = len(ids) // T
    nll, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, n_windows, 16):
            chunk = ids[i * T : min(n_windows, i + 16) * T].reshape(-1, T)
            x = torch.from_numpy(chunk.astype(np.int64))
            logits, _, _ = model(x)
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum")
            nll += loss.item()
            count += x[:, 1:].numel()
    return math.exp(nll / count)


def perplexity_llama_style(model, ids: np.ndarray, n_ctx: int) -> tuple[float, int]:
    """What llama-perplexity computes: chunks of n_ctx tokens, each scoring only the tokens after
    position n_ctx/2 (the predictions from positions n_ctx/2 .. n_ctx-2)."""
    import torch
    import torch.nn.functional as F

    first = n_ctx // 2
    n_chunks = len(ids) // n_ctx
    nll, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, n_chunks, 16):
            chunk = ids[i * n_ctx : min(n_chunks, i + 16) * n_ctx].reshape(-1, n_ctx)
            x = torch.from_numpy(chunk.astype(np.int64))
            logits, _, _ = model(x)
            pred = logits[:, first : n_ctx - 1].reshape(-1, logits.shape[-1])
            target = x[:, first + 1 :].reshape(-1)
            nll += F.cross_entropy(pred, target, reduction="sum").item()
            count += target.numel()
    return math.exp(nll / count), n_chunks


def routing_locality(model, ids: np.ndarray, T: int) -> dict:
    """Per layer: fraction of the k experts chosen for token t that were also chosen for t-1
    (within a window), averaged over tokens; with the baselines k/E (uniform random routing) and
    sum_e u_e^2 / k (independent routing with the observed per-expert usage u_e)."""
    import torch

    cfg = model.cfg
    k, E = cfg.n_experts_used, cfg.n_experts
    n_windows = len(ids) // T
    overlap_sum = np.zeros(cfg.n_layers)
    usage = np.zeros((cfg.n_layers, E))
    n_pairs, n_tokens = 0, 0
    with torch.no_grad():
        for i in range(0, n_windows, 16):
            chunk = ids[i * T : min(n_windows, i + 16) * T].reshape(-1, T)
            _, _, chosen = model(torch.from_numpy(chunk.astype(np.int64)))
            for layer, sel in enumerate(chosen):
                onehot = torch.zeros(*sel.shape[:2], E).scatter_(-1, sel, 1.0)  # (B, T, E)
                overlap_sum[layer] += (onehot[:, 1:] * onehot[:, :-1]).sum().item() / k
                usage[layer] += onehot.sum((0, 1)).numpy()
            n_pairs += chunk.shape[0] * (T - 1)
            n_tokens += chunk.size
    usage /= n_tokens  # expected number of times each expert is picked per token; sums to k
    per_layer = overlap_sum / n_pairs
    independent = (usage**2).sum(1) / k
    return {
        "per_layer": per_layer.round(4).tolist(),
        "overall": float(per_layer.mean().round(4)),
        "uniform_random_baseline": k / E,
        "independent_with_observed_usage_per_layer": independent.round(4).tolist(),
        "expert_usage_share_per_layer": (usage / k).round(4).tolist(),
        "token_pairs": int(n_pairs),
    }


def greedy_continuation(model, tokenizer, prompt: str, n_new: int) -> str:
    import torch

    ids = tokenizer.encode(prompt, add_special_tokens=False).ids
    eos = tokenizer.token_to_id(EOS_TOKEN)
    with torch.no_grad():
        for _ in range(n_new):
            logits, _, _ = model(torch.tensor([ids[-model.cfg.context_length :]]))
            nxt = int(logits[0, -1].argmax())
            if nxt == eos:
                break
            ids.append(nxt)
    return tokenizer.decode(ids)


# --------------------------------------------------------------------------------------------


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "swapmoe/data/tiny-moe.gguf", help="Q8_0 GGUF to write")
    ap.add_argument("--f32-out", type=Path, default=None, help="also write an all-F32 GGUF here (for checks)")
    ap.add_argument(
        "--work-dir",
        type=Path,
        default=Path("/tmp/tiny-moe-work"),
        help="tokenizer, checkpoint, eval data and report go here",
    )
    ap.add_argument("--stdlib-dir", type=Path, default=Path(DEFAULT_STDLIB))
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=8, help="sequences of context_length tokens per step")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--balance-coef", type=float, default=0.01)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-train", action="store_true", help="load WORK_DIR/model.pt instead of training")
    for field, default in asdict(ModelConfig()).items():
        ap.add_argument("--" + field.replace("_", "-"), type=type(default), default=default)
    return ap.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch
    from tokenizers import Tokenizer

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    log_file = open(args.work_dir / "train.log", "a")

    def log(msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    cfg = ModelConfig(**{f: getattr(args, f) for f in asdict(ModelConfig())})
    train_files, eval_files = list_corpus_files(args.stdlib_dir)
    log(f"corpus: {len(train_files)} training files, {len(eval_files)} held-out files")
    (args.work_dir / "held_out_files.txt").write_text(
        "\n".join(p.relative_to(args.stdlib_dir).as_posix() for p in eval_files) + "\n"
    )

    tokenizer_path = args.work_dir / "tokenizer.json"
    if args.skip_train:
        tokenizer = Tokenizer.from_file(str(tokenizer_path))
    else:
        t0 = time.time()
        tokenizer = train_tokenizer(train_files, cfg.vocab_size)
        tokenizer.save(str(tokenizer_path))
        log(f"tokenizer: {tokenizer.get_vocab_size()} tokens in {time.time() - t0:.1f}s")
    cfg.vocab_size = tokenizer.get_vocab_size()

    train_ids = encode_files(tokenizer, train_files)
    eval_text = held_out_text(eval_files)
    (args.work_dir / "held_out.txt").write_text(eval_text, encoding="utf-8")
    eval_ids = np.asarray(tokenizer.encode(eval_text, add_special_tokens=False).ids, dtype=np.int32)
    np.save(args.work_dir / "held_out_ids.npy", eval_ids)
    train_chars = sum(len(read_text(p)) for p in train_files)
    log(f"tokens: train {len(train_ids)} ({train_chars / len(train_ids):.2f} chars/token), held-out {len(eval_ids)}")

    torch.manual_seed(args.seed)
    model = build_model(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {cfg}  params {n_params}")
    checkpoint = args.work_dir / "model.pt"
    if args.skip_train:
        model.load_state_dict(torch.load(checkpoint))
    else:
        model.train()
        train(model, train_ids, eval_ids, args, log)
        torch.save(model.state_dict(), checkpoint)
    model.eval()

    export_gguf(model, tokenizer, args.out, quantize=True)
    log(f"wrote {args.out} ({args.out.stat().st_size} bytes)")
    if args.f32_out:
        export_gguf(model, tokenizer, args.f32_out, quantize=False)
        log(f"wrote {args.f32_out} ({args.f32_out.stat().st_size} bytes)")

    T = cfg.context_length
    # Reference logits for tools/llama_check_tiny.py: the first T held-out tokens.
    sample = eval_ids[:T].astype(np.int64)
    np.save(args.work_dir / "sample_ids.npy", sample)
    with torch.no_grad():
        np.save(args.work_dir / "sample_logits_f32.npy", model(torch.from_numpy(sample[None]))[0][0].numpy())
    report = {
        "config": asdict(cfg),
        "params": n_params,
        "args": {k: str(v) for k, v in vars(args).items()},
        "held_out_files": len(eval_files),
        "held_out_tokens": int(len(eval_ids)),
    }
    report["ppl_all_tokens_f32"] = perplexity_all_tokens(model, eval_ids, T)
    report["ppl_llama_style_f32"], report["llama_style_chunks"] = perplexity_llama_style(model, eval_ids, T)
    report["locality_f32"] = routing_locality(model, eval_ids, T)
    report["greedy_f32"] = greedy_continuation(model, tokenizer, "def main():\n    ", 64)
    log(
        f"float model: ppl {report['ppl_all_tokens_f32']:.3f} (all tokens), "
        f"{report['ppl_llama_style_f32']:.3f} (llama-perplexity style)"
    )

    # The same evaluation on the weights as shipped (Q8_0, dequantized).
    load_gguf_weights_into(model, args.out)
    with torch.no_grad():
        np.save(args.work_dir / "sample_logits_q8.npy", model(torch.from_numpy(sample[None]))[0][0].numpy())
    report["ppl_all_tokens_q8"] = perplexity_all_tokens(model, eval_ids, T)
    report["ppl_llama_style_q8"], _ = perplexity_llama_style(model, eval_ids, T)
    report["locality_q8"] = routing_locality(model, eval_ids, T)
    report["greedy_q8"] = greedy_continuation(model, tokenizer, "def main():\n    ", 64)
    log(
        f"Q8_0 weights: ppl {report['ppl_all_tokens_q8']:.3f} (all tokens), "
        f"{report['ppl_llama_style_q8']:.3f} (llama-perplexity style)"
    )
    log(
        f"locality (Q8_0 weights) per layer {report['locality_q8']['per_layer']} "
        f"overall {report['locality_q8']['overall']} vs random {report['locality_q8']['uniform_random_baseline']}"
    )
    (args.work_dir / "report.json").write_text(json.dumps(report, indent=2))
    log(f"report: {args.work_dir / 'report.json'}")


if __name__ == "__main__":
    sys.exit(main())
