"""Synthetic MoE GGUF files of any supported architecture, shape, size and tensor type.

    swapmoe.synth("model.gguf", arch="qwen3moe", preset="qwen3-30b-a3b", size_gb=4, type="Q4_K_M")

Weights are random (valid quant blocks, finite scales) and the vocabulary is a small
byte-level BPE, so llama.cpp loads and runs the file. Writing streams from a pool of
random blocks: memory stays flat and a 30 GB file is written at disk speed.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGML_QUANT_VERSION, GGMLQuantizationType as T, GGUFValueType, GGUFWriter, Keys

from swapmoe.atomic import atomic_output, check_free_space, check_output_path
from swapmoe.errors import SwapmoeError
from swapmoe.progress import progress_bar
from swapmoe.synthetic.archs import ARCHS, SynthConfig, Tensor
from swapmoe.synthetic.blocks import FLOAT_TYPES, QUANT_TYPES, BlockPool, random_floats
from swapmoe.synthetic.presets import PRESETS, preset_for
from swapmoe.synthetic.vocab import build_vocab

__all__ = ["synth", "plan", "PRESETS", "ARCHS", "TYPES"]

MIXES = ("Q4_K_M", "Q2_K")  # llama-quantize's mixes; its Q2_K is one too, not Q2_K everywhere
TYPES = tuple(dict.fromkeys([t.name for t in FLOAT_TYPES + QUANT_TYPES] + list(MIXES)))
MATRIX_STD = 0.05
HOT_BIAS = 10.0  # added to a hot expert's exp_probs_b (SynthConfig.hot_experts): beyond any router score
ALIGNMENT = 32
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _use_more_bits(i: int, n: int) -> bool:
    """llama-quantize's rule for which layers get the bigger type in *_M mixes."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _fits(ggml_type: T, ne0: int) -> T:
    """The type itself if rows are whole blocks, else llama-quantize's fallback."""
    if ne0 % GGML_QUANT_SIZES[ggml_type][0] == 0:
        return ggml_type
    return T.Q8_0 if ne0 % GGML_QUANT_SIZES[T.Q8_0][0] == 0 else T.F16


def _deepseek4_iq1_m(matrices: list[tuple[str, tuple[int, ...]]], config: SynthConfig) -> dict[str, T]:
    """A DeepSeek-V4 "IQ1_M" file as the community makes it, not llama-quantize's IQ1_M mix: the
    1.75-bit type only for the routed experts, everything else kept large because it is small.

    Routed gate/up IQ1_M; routed down IQ1_M too, except Q2_K on the first seventh of the layers
    (layers 0-5 of 43) as in the dynamic IQ1_M recipe of lvyufeng/DeepSeek-V4-Flash-IQ1_M on
    Hugging Face (its README: gate/up iq1_m on all 43 layers, down q2_k on 0-5, iq1_m on 6-42,
    the rest q8_0 / f16 / f32 / i32); unsloth's UD-IQ1_M (3 shards) also keeps down larger but its
    per-tensor list was not at hand. Attention projections, the shared expert, the hyper-connection
    mixers, the indexer, the compressors and token_embd Q8_0, output Q6_K, as ggml-org's
    DeepSeek-V4-Flash recipe (ggml-org/convert models/deepseek-v4-flash/convert.sh) sets them;
    the router (ffn_gate_inp) and the hash tables are not matrices here and stay F32 / I32, as
    llama-quantize leaves them."""
    down_q2 = max(1, config.n_layer // 7)
    types = {}
    for name, ne in matrices:
        layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
        if name == "output.weight":
            t = T.Q6_K
        elif "_exps." in name:
            t = T.Q2_K if ".ffn_down_exps." in name and layer < down_q2 else T.IQ1_M
        else:
            t = T.Q8_0
        types[name] = _fits(t, ne[0])
    return types


# Mixes one architecture's files of that name are, where community files differ from llama-quantize's.
ARCH_MIXES = {"deepseek4": {"IQ1_M": _deepseek4_iq1_m}}


def _matrix_types(tensors: list[Tensor], config: SynthConfig, type_name: str) -> dict[str, T]:
    """Type of every `matrix` tensor: one type for all, or the mix llama-quantize makes for an MoE
    file of that name (Q4_K_M; Q2_K, which is a mix there too: Q2_K most places, Q3_K or more
    where it hurts), or an architecture's community mix of that name (ARCH_MIXES: deepseek4 IQ1_M)."""
    matrices = [(name, ne) for name, ne, role in tensors if role == "matrix"]
    if type_name in ARCH_MIXES.get(config.arch, {}):
        return ARCH_MIXES[config.arch][type_name](matrices, config)
    if type_name not in MIXES:
        base = T[type_name]
        return {name: _fits(base, ne[0]) for name, ne in matrices}
    names = {name for name, _ in matrices}
    eight = config.n_expert == 8
    v_like = [n for n, _ in matrices if n.endswith(("attn_v.weight", "attn_qkv.weight", "attn_kv_b.weight"))]
    q2 = type_name == "Q2_K"
    types = {}
    for name, ne in matrices:
        layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
        t = T.Q2_K if q2 else T.Q4_K
        if name == "output.weight" or (name == "token_embd.weight" and "output.weight" not in names):
            t = T.Q6_K
        elif name in v_like:
            if eight:
                t = T.Q8_0
            elif q2:
                t = T.Q4_K if config.n_head >= 4 * config.n_head_kv else T.Q3_K
            elif _use_more_bits(v_like.index(name), len(v_like)):
                t = T.Q6_K
        elif name.endswith("attn_k.weight") and eight:
            t = T.Q8_0
        elif name.endswith("attn_output.weight") and (eight or q2):
            t = T.Q5_K if eight else T.Q3_K
        elif ".ffn_down" in name and (q2 or _use_more_bits(layer, config.n_layer)):
            t = T.Q3_K if q2 else T.Q6_K
        types[name] = _fits(t, ne[0])
    return types


def _tensor_nbytes(ne: tuple[int, ...], ggml_type: T) -> int:
    block, size = GGML_QUANT_SIZES[ggml_type]
    return int(np.prod(ne, dtype=np.int64)) // block * size


def plan(
    config: SynthConfig, type_name: str = "Q8_0"
) -> tuple[list[tuple[str, tuple[int, ...], str, T]], dict[str, Any]]:
    """The tensors (name, ne, role, type) and arch keys a synthetic file of `config` will hold, the keys
    as gguf's templates (`Keys.LLM.BLOCK_COUNT`, "{arch}.block_count")."""
    if type_name not in TYPES:
        raise SwapmoeError(f"unknown tensor type {type_name}; choose one of {', '.join(TYPES)}")
    vocab = build_vocab()
    tensors, keys = ARCHS[config.arch](config, len(vocab.tokens))
    matrix_types = _matrix_types(tensors, config, type_name)
    typed = [
        (name, ne, role, matrix_types.get(name, T.I32 if role == "table" else T.F32)) for name, ne, role in tensors
    ]
    return typed, keys


def _size_of(config: SynthConfig, type_name: str) -> int:
    tensors, _ = plan(config, type_name)
    return sum(_tensor_nbytes(ne, t) for _, ne, _, t in tensors)


def _scale_layers(config: SynthConfig, type_name: str, size_gb: float) -> SynthConfig:
    """Pick the layer count that brings the file closest to `size_gb`."""
    lead = config.n_dense_lead
    one = _size_of(replace(config, n_layer=lead + 1), type_name)
    two = _size_of(replace(config, n_layer=lead + 2), type_name)
    per_layer, fixed = two - one, one - (two - one) * (lead + 1)
    n_layer = max(lead + 1, round((size_gb * 1e9 - fixed) / per_layer))
    extra = dict(config.extra)
    if "hash_layers" in extra:
        extra["hash_layers"] = min(extra["hash_layers"], n_layer - 1) if n_layer > 1 else 0
    return replace(config, n_layer=n_layer, extra=extra)


def _add_key(w: GGUFWriter, key: str, value: Any) -> None:
    if isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        w.add_uint32(key, value)
    elif isinstance(value, float):
        w.add_float32(key, value)
    elif isinstance(value, str):
        w.add_string(key, value)
    elif isinstance(value, list) and value and isinstance(value[0], float):
        w.add_key_value(key, value, GGUFValueType.ARRAY, GGUFValueType.FLOAT32)
    else:
        w.add_array(key, value)


def _small_tensor(role: str, ne: tuple[int, ...], config: SynthConfig, rng: np.random.Generator) -> np.ndarray:
    """Contents of a non-matrix tensor as raw bytes."""
    n = int(np.prod(ne))
    if role == "table":  # DeepSeek-V4 hash routing: each token gets k distinct expert ids
        k, vocab = ne
        ids = np.argsort(rng.random((vocab, config.n_expert)), axis=1)[:, :k].astype(np.int32)
        return ids.view(np.uint8).reshape(-1)
    if role == "router":  # one row per expert; a wider row is chosen more often
        rows = random_floats(T.F32, n, 1.0 / np.sqrt(ne[0]) if config.fan_in_std else MATRIX_STD, rng)
        if config.router_spread:
            widths = np.exp(rng.standard_normal((ne[1], 1)) * config.router_spread).astype(np.float32)
            rows = (rows.view(np.float32).reshape(ne[1], ne[0]) * widths).reshape(-1).view(np.uint8)
        return rows
    mean, std = {
        "norm": (1.0, 0.1),
        "vector": (0.0, 0.02),
        "sinks": (0.0, 1.0),
        "decay": (-1.0, 0.2),
        "gain": (1.0, 0.25),
        "offset": (0.0, 1.0),
    }[role]
    return random_floats(T.F32, n, std, rng, mean)


def _metadata(w: GGUFWriter, arch: str, name: str, arch_keys: dict[str, Any]) -> None:
    vocab = build_vocab()
    w.add_name(name)
    w.add_quantization_version(GGML_QUANT_VERSION)
    w.add_custom_alignment(ALIGNMENT)
    for key, value in arch_keys.items():
        _add_key(w, key.format(arch=arch), value)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(vocab.tokens)
    w.add_token_types(vocab.token_types)
    w.add_token_merges(vocab.merges)
    w.add_eos_token_id(vocab.eos_id)
    w.add_bos_token_id(vocab.eos_id)
    w.add_pad_token_id(vocab.eos_id)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)


def _write_file(path: Path, w: GGUFWriter, tensors, fill, bar) -> None:
    """Write header, metadata and tensor infos with gguf's writer, then stream the data."""
    for name, ne, _, ggml_type in tensors:
        w.add_tensor_info(name, tuple(reversed(ne)), np.dtype(np.float32), _tensor_nbytes(ne, ggml_type), ggml_type)
    with atomic_output(path) as tmp:
        w.open_output_file(tmp)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        f = w.fout[0]
        w.write_padding(f, f.tell())
        for name, ne, role, ggml_type in tensors:
            nbytes = _tensor_nbytes(ne, ggml_type)
            for chunk in fill(name, role, ne, ggml_type, nbytes):
                f.write(chunk)
                bar.update(len(chunk))
            w.write_padding(f, nbytes)
        w.close()


def shard_names(path: Path, shards: int) -> list[Path]:
    """llama.cpp's split naming: x.gguf -> x-00001-of-00003.gguf, ..."""
    if shards == 1:
        return [path]
    return [path.with_name(f"{path.stem}-{i:05d}-of-{shards:05d}.gguf") for i in range(1, shards + 1)]


def synth(
    path: str | os.PathLike,
    arch: str | None = None,
    preset: str | None = None,
    size_gb: float | None = None,
    type: str = "Q8_0",
    seed: int = 0,
    shards: int = 1,
    force: bool = False,
    progress: bool = True,
    **overrides: Any,
) -> Path:
    """Write a synthetic MoE GGUF and return its path (the first shard's if split).

    arch: one of ARCHS (default: the preset's, else qwen3moe); preset: a name in PRESETS
    (default `tiny-{arch}`); size_gb: scale the layer count to about this size; type: a ggml
    type name for every weight matrix, or a mix as llama-quantize makes it (Q4_K_M, Q2_K); shards: split the tensors
    over this many files the way llama-gguf-split does; overrides: SynthConfig fields
    (n_layer, n_expert, d_model, ...).
    """
    path = Path(path)
    if preset is not None and preset not in PRESETS:
        raise SwapmoeError(f"unknown preset {preset}; choose one of {', '.join(PRESETS)}")
    arch = arch or (PRESETS[preset].arch if preset else "qwen3moe")
    if arch not in ARCHS:
        raise SwapmoeError(f"unknown architecture {arch}; choose one of {', '.join(ARCHS)}")
    config = preset_for(arch, preset)
    if config.arch != arch:
        raise SwapmoeError(f"preset {preset} is a {config.arch} model, not {arch}")
    config = replace(config, **overrides)
    if size_gb is not None:
        config = _scale_layers(config, type, size_gb)
    tensors, arch_keys = plan(config, type)
    if config.hot_experts and not any(name.endswith("exp_probs_b.bias") for name, *_ in tensors):
        raise SwapmoeError(f"hot_experts needs a selection bias (exp_probs_b); {arch} routing has none")
    if not 0 <= config.hot_experts < config.n_expert_used:
        raise SwapmoeError(f"hot_experts must be below the experts per token {config.n_expert_used}")
    if not 1 <= shards <= len(tensors):
        raise SwapmoeError(f"shards must be between 1 and the tensor count {len(tensors)}")
    paths = shard_names(path, shards)
    total = sum(_tensor_nbytes(ne, t) for _, ne, _, t in tensors)
    for p in paths:
        check_output_path(p, force)
    check_free_space(path, total + (64 << 20))

    rng = np.random.default_rng(seed)
    pools: dict[tuple[T, float], BlockPool] = {}

    def fill(name, role, ne, ggml_type, nbytes):
        if role != "matrix":
            data = _small_tensor(role, ne, config, rng)
            if name.endswith("attn_q_norm.weight") and config.attention_focus != 1.0:
                data = (data.view(np.float32) * np.float32(config.attention_focus)).view(np.uint8)
            if name.endswith("exp_probs_b.bias") and config.hot_experts:
                bias = data.view(np.float32).copy()
                bias[rng.choice(len(bias), config.hot_experts, replace=False)] += HOT_BIAS
                data = bias.view(np.uint8)
            return [data.data]
        if name == "token_embd.weight":
            std = config.embed_std
        elif name == "output.weight" and "output_std" in config.extra:  # sharper logits (tiny-laguna)
            std = config.extra["output_std"]
        else:
            std = 1.0 / np.sqrt(ne[0]) if config.fan_in_std else MATRIX_STD
            if name.endswith(("attn_output.weight", "attn_output_b.weight")):
                std *= config.context_gain
            elif name.endswith("ssm_out.weight"):
                std *= config.recurrent_gain
        if (ggml_type, std) not in pools:
            pools[ggml_type, std] = BlockPool(ggml_type, std, rng)
        return pools[ggml_type, std].chunks(nbytes)

    per_shard = -(-len(tensors) // shards)
    with progress_bar(total, f"synth {path.name}", enabled=progress) as bar:
        for i, shard_path in enumerate(paths):
            w = GGUFWriter(None, arch)
            if i == 0:
                _metadata(w, arch, f"swapmoe synthetic {preset or 'tiny-' + arch} {type}", arch_keys)
            if shards > 1:
                w.add_uint16(Keys.Split.LLM_KV_SPLIT_NO, i)
                w.add_uint16(Keys.Split.LLM_KV_SPLIT_COUNT, shards)
                w.add_int32(Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT, len(tensors))
            _write_file(shard_path, w, tensors[i * per_shard : (i + 1) * per_shard], fill, bar)
    return paths[0]
