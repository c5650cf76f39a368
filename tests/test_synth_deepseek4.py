"""Synthetic DeepSeek-V4 (deepseek4) files: what llama.cpp's loader requires, and the presets' shapes.

The expected tensor set is llama.cpp's load_arch_tensors (src/models/deepseek4.cpp) written out
again from the file's own metadata, as llama.cpp reads it, independent of swapmoe's builder. No
llama.cpp run here (tools/llama_ref.py does that: the tiny file loads and generates).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from swapmoe.errors import SwapmoeError
from swapmoe.gguf_file import open_gguf
from swapmoe.synthetic import PRESETS, plan
from swapmoe.synthetic.archs import compress_ratios

A = "deepseek4."
REQUIRED_KEYS = [  # load_arch_hparams and the generic loader: a missing one throws
    "context_length",
    "embedding_length",
    "block_count",
    "attention.head_count",
    "attention.layer_norm_rms_epsilon",
    "attention.q_lora_rank",
    "attention.sliding_window",
    "expert_feed_forward_length",
    "expert_shared_count",
    "expert_weights_scale",
    "expert_weights_norm",
    "swiglu_clamp_exp",
    "attention.indexer.head_count",
    "attention.indexer.key_length",
    "attention.indexer.top_k",
    "attention.output_group_count",
    "attention.output_lora_rank",
    "attention.compress_rope_freq_base",
    "hyper_connection.count",
    "hyper_connection.sinkhorn_iterations",
    "hyper_connection.epsilon",
    "hash_layer_count",
    "attention.compress_ratios",
    "expert_gating_func",
]


@pytest.fixture(scope="module")
def tiny(synth_model):
    return open_gguf(synth_model(arch="deepseek4", type="Q8_0"))


def expected_tensors(g) -> dict[str, tuple[int, ...]]:
    """name -> ne, as llama.cpp's load_arch_tensors creates them for this file's metadata."""
    k = lambda key: g.get(A + key)  # noqa: E731
    D, H, V = k("embedding_length"), k("attention.head_count"), len(g.get("tokenizer.ggml.tokens"))
    hd, ql, F = k("attention.key_length"), k("attention.q_lora_rank"), k("expert_feed_forward_length")
    E, K, n_sh = k("expert_count"), k("expert_used_count"), k("expert_shared_count")
    G, R, hc = k("attention.output_group_count"), k("attention.output_lora_rank"), k("hyper_connection.count")
    n_idx, idx_hd, n_hash = k("attention.indexer.head_count"), k("attention.indexer.key_length"), k("hash_layer_count")
    hc_dim, mix = hc * D, (2 + hc) * hc
    out = {
        "token_embd.weight": (D, V),
        "output_norm.weight": (D,),
        "output.weight": (D, V),
        "output_hc_fn.weight": (hc_dim, hc),
        "output_hc_base.weight": (hc,),
        "output_hc_scale.weight": (1,),
    }
    for i, ratio in enumerate(k("attention.compress_ratios")[: k("block_count")]):
        p = f"blk.{i}."
        out |= {
            p + "attn_norm.weight": (D,),
            p + "attn_sinks.weight": (H,),
            p + "attn_q_a.weight": (D, ql),
            p + "attn_q_a_norm.weight": (ql,),
            p + "attn_q_b.weight": (ql, H * hd),
            p + "attn_kv.weight": (D, hd),
            p + "attn_kv_a_norm.weight": (hd,),
            p + "attn_output_a.weight": (H * hd // G, R * G),
            p + "attn_output_b.weight": (G * R, D),
            p + "ffn_gate_inp.weight": (D, E),
            p + "ffn_norm.weight": (D,),
            p + "ffn_gate_exps.weight": (D, F, E),
            p + "ffn_up_exps.weight": (D, F, E),
            p + "ffn_down_exps.weight": (F, D, E),
            p + "ffn_gate_shexp.weight": (D, F * n_sh),
            p + "ffn_up_shexp.weight": (D, F * n_sh),
            p + "ffn_down_shexp.weight": (F * n_sh, D),
        }
        for half in ("attn", "ffn"):
            out |= {
                p + f"hc_{half}_fn.weight": (hc_dim, mix),
                p + f"hc_{half}_base.weight": (mix,),
                p + f"hc_{half}_scale.weight": (3,),
            }
        if ratio:
            c = 2 if ratio == 4 else 1
            out |= {
                p + "attn_compressor_kv.weight": (D, c * hd),
                p + "attn_compressor_gate.weight": (D, c * hd),
                p + "attn_compressor_ape.weight": (c * hd, ratio),
                p + "attn_compressor_norm.weight": (hd,),
            }
        if ratio == 4:
            out |= {
                p + "indexer.proj.weight": (D, n_idx),
                p + "indexer.attn_q_b.weight": (ql, n_idx * idx_hd),
                p + "indexer_compressor_kv.weight": (D, 2 * idx_hd),
                p + "indexer_compressor_gate.weight": (D, 2 * idx_hd),
                p + "indexer_compressor_ape.weight": (2 * idx_hd, ratio),
                p + "indexer_compressor_norm.weight": (idx_hd,),
            }
        if i < n_hash:
            out[p + "ffn_gate_tid2eid.weight"] = (K, V)
        else:
            out[p + "exp_probs_b.bias"] = (E,)
    return out


def test_tiny_has_every_path_llama_cpp_has(tiny):
    ratios = tiny.get(A + "attention.compress_ratios")
    assert tiny.get(A + "block_count") == 4 and ratios == [0, 0, 4, 128]
    assert tiny.get(A + "hash_layer_count") == 1
    for key in REQUIRED_KEYS:
        assert tiny.get(A + key) is not None, key
    assert tiny.get(A + "expert_gating_func") == 4  # sqrt(softplus); anything else throws
    assert tiny.get(A + "hyper_connection.count") == 4
    assert tiny.get(A + "attention.key_length") == tiny.get(A + "attention.value_length") == 128
    # the indexer: no Hadamard rotation of the raw caches (key lengths differ), no ties of relu scores
    # (16 heads), a top-k below the 75 compressed rows of a 300-token prompt, a window it crosses
    assert tiny.get(A + "attention.indexer.key_length") == 64 and tiny.get(A + "attention.indexer.head_count") >= 16
    assert tiny.get(A + "attention.indexer.top_k") < 300 // 4 and tiny.get(A + "attention.sliding_window") < 300
    assert tiny.get(A + "rope.dimension_count") <= tiny.get(A + "attention.indexer.key_length")
    # YaRN as the converter writes it, so compressed layers rotate with freq_scale 1/16
    assert tiny.get(A + "rope.scaling.type") == "yarn" and tiny.get(A + "rope.scaling.factor") == 16.0
    assert tiny.get(A + "rope.scaling.original_context_length") == 256
    # SwiGLU limits low enough to clamp gate/up values of spread ~0.85, and per layer
    for key in ("swiglu_clamp_exp", "swiglu_clamp_shexp"):
        limits = tiny.get(A + key)
        assert len(limits) == 4 and max(limits) <= 2.0
    assert len(set(tiny.get(A + "swiglu_clamp_exp"))) > 1


def test_tiny_tensors_are_exactly_llama_cpps(tiny):
    want = expected_tensors(tiny)
    got = {name: t.ne for name, t in tiny.tensors.items()}
    assert set(got) == set(want), (sorted(set(got) - set(want)), sorted(set(want) - set(got)))
    for name, ne in want.items():
        assert got[name] == ne, name
    assert sorted(ne[1] for name, ne in got.items() if name.endswith("attn_compressor_ape.weight")) == [4, 128]
    assert not any(name.startswith(("blk.0.attn_compressor", "blk.1.attn_compressor", "blk.3.indexer")) for name in got)


def test_tiny_hash_table(tiny):
    n_expert, k = tiny.get(A + "expert_count"), tiny.get(A + "expert_used_count")
    n_vocab = len(tiny.get("tokenizer.ggml.tokens"))
    t = tiny.tensor("blk.0.ffn_gate_tid2eid.weight")
    assert t.ggml_type == T.I32 and t.ne == (k, n_vocab)
    table = tiny.array(t.name)
    assert table.shape == (n_vocab, k) and table.min() >= 0 and table.max() < n_expert
    assert all(len(set(row)) == k for row in table.tolist())  # k distinct experts per token
    assert all(set(table[:, j].tolist()) == set(range(n_expert)) for j in range(k))  # tokens route differently
    assert "blk.0.exp_probs_b.bias" not in tiny.tensors and "blk.1.ffn_gate_tid2eid.weight" not in tiny.tensors


def test_tiny_values_make_every_part_matter(tiny):
    """Mixer scales near 1 and bases of spread 1 (not the 0.02 of plain vectors: the mixing was then a
    plain average of the streams); position biases of the compressors that change the pooling."""
    for name in ("blk.0.hc_attn_scale.weight", "blk.3.hc_ffn_scale.weight", "output_hc_scale.weight"):
        assert np.all(tiny.array(name) > 0.2)
    for name in (
        "blk.0.hc_attn_base.weight",
        "blk.2.attn_compressor_ape.weight",
        "blk.2.indexer_compressor_ape.weight",
        "blk.3.attn_compressor_ape.weight",
    ):
        assert tiny.array(name).std() > 0.5, name
    assert tiny.array("blk.0.attn_sinks.weight").std() > 0.3
    assert tiny.tensor("blk.0.hc_attn_fn.weight").ggml_type == T.Q8_0  # a matrix llama-quantize would quantize
    assert tiny.tensor("blk.0.ffn_gate_inp.weight").ggml_type == T.F32


@pytest.mark.parametrize("n_layer, ratios", [(1, [4]), (2, [0, 4]), (3, [0, 0, 4]), (6, [0, 0, 4, 128, 4, 128])])
def test_compress_ratios_always_have_an_indexer_layer(n_layer, ratios):
    """llama.cpp divides by zero on a file with no ratio-4 layer (its indexer cache stays empty)."""
    assert compress_ratios(replace(PRESETS["tiny-deepseek4"], n_layer=n_layer)) == ratios


def test_builder_refuses_what_llama_cpp_would_not_run_as_real_files_do():
    config = PRESETS["tiny-deepseek4"]
    with pytest.raises(SwapmoeError, match="indexer_dim != head_dim"):
        plan(replace(config, extra={**config.extra, "indexer_dim": 128}))
    with pytest.raises(SwapmoeError, match="compress ratios"):
        plan(replace(config, extra={**config.extra, "compress_cycle": [4, 64]}))


def test_flash_preset_is_the_published_shape():
    c = PRESETS["deepseek-v4-flash"]
    assert (c.n_layer, c.d_model, c.n_head, c.n_head_kv, c.head_dim) == (43, 4096, 64, 1, 512)
    assert (c.n_expert, c.n_expert_used, c.expert_ff, c.shared_ff) == (256, 6, 2048, 2048)
    assert (c.ctx, c.rope_base, c.rms_eps) == (1048576, 1e4, 1e-6)
    tensors, keys = plan(c)
    key = lambda k: keys["{arch}." + k]  # noqa: E731
    assert key("attention.compress_ratios") == [0, 0] + [4, 128] * 20 + [4]
    assert (key("hash_layer_count"), key("attention.q_lora_rank"), key("rope.dimension_count")) == (3, 1024, 64)
    assert (key("attention.output_group_count"), key("attention.output_lora_rank")) == (8, 1024)
    assert (
        key("attention.indexer.head_count"),
        key("attention.indexer.key_length"),
        key("attention.indexer.top_k"),
    ) == (64, 128, 512)
    assert (key("attention.sliding_window"), key("attention.compress_rope_freq_base")) == (128, 160000.0)
    assert (key("rope.scaling.type"), key("rope.scaling.factor"), key("rope.scaling.original_context_length")) == (
        "yarn",
        16.0,
        65536,
    )
    assert (
        key("hyper_connection.count"),
        key("hyper_connection.sinkhorn_iterations"),
        key("hyper_connection.epsilon"),
    ) == (4, 20, 1e-6)
    assert (key("expert_weights_scale"), key("expert_weights_norm"), key("expert_gating_func")) == (1.5, True, 4)
    assert key("swiglu_clamp_exp") == [10.0] * 43 == key("swiglu_clamp_shexp")
    # the model card's 284B total and 13B active, counted with the real 129280-token vocabulary (active:
    # 6 of the 256 routed experts, and one row of the embedding table)
    n_vocab, D = 485, 4096
    params = {name: int(np.prod(ne)) for name, ne, _, _ in tensors}
    total = sum(params.values()) + 2 * (129280 - n_vocab) * D
    experts = sum(n for name, n in params.items() if "_exps." in name)
    assert 283.5e9 < total < 285e9
    assert 12.5e9 < total - experts + experts * 6 / 256 - 129280 * D < 13.5e9


def test_flash_iq1_m_is_the_community_mix():
    types = {name: t for name, _, _, t in plan(PRESETS["deepseek-v4-flash"], "IQ1_M")[0]}
    assert Counter(t for name, t in types.items() if "_exps." in name) == Counter({T.IQ1_M: 123, T.Q2_K: 6})
    assert [i for i in range(43) if types[f"blk.{i}.ffn_down_exps.weight"] == T.Q2_K] == list(range(6))
    assert types["blk.42.ffn_gate_exps.weight"] == types["blk.0.ffn_up_exps.weight"] == T.IQ1_M
    for name in (
        "token_embd.weight",
        "blk.2.attn_q_b.weight",
        "blk.2.attn_output_a.weight",
        "blk.7.attn_kv.weight",
        "blk.0.ffn_down_shexp.weight",
        "blk.5.hc_ffn_fn.weight",
        "output_hc_fn.weight",
        "blk.2.indexer.attn_q_b.weight",
        "blk.2.indexer_compressor_kv.weight",
        "blk.3.attn_compressor_gate.weight",
    ):
        assert types[name] == T.Q8_0, name
    assert types["output.weight"] == T.Q6_K
    assert types["blk.0.ffn_gate_inp.weight"] == T.F32 and types["blk.0.ffn_gate_tid2eid.weight"] == T.I32
    assert types["blk.3.exp_probs_b.bias"] == types["blk.2.attn_compressor_ape.weight"] == T.F32
    # elsewhere IQ1_M still means IQ1_M for every matrix
    other = {name: t for name, _, role, t in plan(PRESETS["tiny-qwen3moe"], "IQ1_M")[0] if role == "matrix"}
    assert set(other.values()) == {T.IQ1_M}
