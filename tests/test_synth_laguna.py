"""Synthetic Laguna (laguna) files: what llama.cpp's loader requires, and the presets' shapes.

The expected tensor set is llama.cpp's load_arch_tensors (src/models/laguna.cpp) written out again
from the file's own metadata, as llama.cpp reads it (per-layer head counts, the sliding-window
pattern or its default, the gate width told apart by ne1), independent of swapmoe's builder. No
llama.cpp run here (tools/llama_ref.py and tools/llama_check.py --arch laguna do that: the tiny
files load and generate).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

import swapmoe
from swapmoe.errors import SwapmoeError
from swapmoe.gguf_file import open_gguf
from swapmoe.synthetic import PRESETS, plan
from swapmoe.synthetic.archs import laguna_swa_layers
from swapmoe.synthetic.vocab import build_vocab

A = "laguna."
TINY = PRESETS["tiny-laguna"]
REQUIRED_KEYS = [  # the generic loader and load_arch_hparams: a missing one throws, or llama.cpp guesses
    "context_length",
    "embedding_length",
    "block_count",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.layer_norm_rms_epsilon",
    "leading_dense_block_count",
    "feed_forward_length",
    "expert_count",
    "expert_used_count",
    "expert_feed_forward_length",
    "expert_shared_feed_forward_length",
    "expert_gating_func",
    "expert_weights_scale",
    "expert_weights_norm",
    "rope.dimension_count",
    "rope.freq_base",
]
VARIANTS = {  # name -> extra changes
    "head-pattern": {},
    "element-pattern": {"gate": "element"},
    "head-default-pattern": {"swa_pattern": None},
    "element-default-pattern": {"gate": "element", "swa_pattern": None},
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("laguna")
    return {
        name: open_gguf(
            swapmoe.synth(
                folder / f"{name}.gguf",
                preset="tiny-laguna",
                type="Q8_0",
                progress=False,
                extra={**TINY.extra, **changes},
            )
        )
        for name, changes in VARIANTS.items()
    }


def is_swa(g) -> list[bool]:
    """llama.cpp's hparams.is_swa: none without a window; the pattern array if the file has one, else
    load_swa_pattern(4, dense_first): every 4th layer full, starting with layer 0."""
    n = g.get(A + "block_count")
    if not g.get(A + "attention.sliding_window", 0):
        return [False] * n
    pattern = g.get(A + "attention.sliding_window_pattern")
    return [bool(v) for v in pattern] if pattern is not None else [i % 4 != 0 for i in range(n)]


def expected_tensors(g) -> dict[str, tuple[int, ...]]:
    """name -> ne, as llama.cpp's load_arch_tensors creates them for this file's metadata; the gate's
    ne1 is read from the file as llama.cpp does, and must be one of the two widths."""
    k = lambda key: g.get(A + key)  # noqa: E731
    D, V, hd, n_kv = (
        k("embedding_length"),
        len(g.get("tokenizer.ggml.tokens")),
        k("attention.key_length"),
        k("attention.head_count_kv"),
    )
    E, F, Fs, Fd, lead = (
        k("expert_count"),
        k("expert_feed_forward_length"),
        k("expert_shared_feed_forward_length"),
        k("feed_forward_length"),
        k("leading_dense_block_count"),
    )
    out = {"token_embd.weight": (D, V), "output_norm.weight": (D,), "output.weight": (D, V)}
    for i, H in enumerate(k("attention.head_count")):
        p = f"blk.{i}."
        gate = g.tensor(p + "attn_gate.weight").ne[1]
        assert gate in (H, H * hd), (i, gate)
        out |= {
            p + "attn_norm.weight": (D,),
            p + "attn_q.weight": (D, H * hd),
            p + "attn_k.weight": (D, n_kv * hd),
            p + "attn_v.weight": (D, n_kv * hd),
            p + "attn_output.weight": (H * hd, D),
            p + "attn_q_norm.weight": (hd,),
            p + "attn_k_norm.weight": (hd,),
            p + "attn_gate.weight": (D, gate),
            p + "ffn_norm.weight": (D,),
        }
        if i < lead:
            out |= {p + "ffn_gate.weight": (D, Fd), p + "ffn_up.weight": (D, Fd), p + "ffn_down.weight": (Fd, D)}
        else:
            out |= {
                p + "ffn_gate_inp.weight": (D, E),
                p + "exp_probs_b.bias": (E,),
                p + "ffn_gate_exps.weight": (D, F, E),
                p + "ffn_up_exps.weight": (D, F, E),
                p + "ffn_down_exps.weight": (F, D, E),
                p + "ffn_gate_shexp.weight": (D, Fs),
                p + "ffn_up_shexp.weight": (D, Fs),
                p + "ffn_down_shexp.weight": (Fs, D),
            }
    return out


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_tensors_are_exactly_llama_cpps(files, variant):
    g = files[variant]
    want = expected_tensors(g)
    got = {name: t.ne for name, t in g.tensors.items()}
    assert set(got) == set(want), (sorted(set(got) - set(want)), sorted(set(want) - set(got)))
    for name, ne in want.items():
        assert got[name] == ne, name
    heads, hd = g.get(A + "attention.head_count"), g.get(A + "attention.key_length")
    per_head = "element" not in variant
    assert all(g.tensor(f"blk.{i}.attn_gate.weight").ne[1] == (H if per_head else H * hd) for i, H in enumerate(heads))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_keys_llama_cpp_reads(files, variant):
    g = files[variant]
    for key in REQUIRED_KEYS:
        assert g.get(A + key) is not None, key
    assert g.get(A + "expert_gating_func") == 2  # sigmoid
    assert g.get(A + "expert_weights_norm") is True and g.get(A + "expert_weights_scale") == 2.5
    assert g.get(A + "leading_dense_block_count") == 1
    n = g.get(A + "block_count")
    assert isinstance(g.get(A + "attention.head_count"), list) and len(g.get(A + "attention.head_count")) == n
    assert g.get(A + "attention.head_count_kv") == 2  # uniform, a scalar
    # sliding layers: their own rotary dims and base, no YaRN; full layers: partial rotary and YaRN
    assert g.get(A + "attention.sliding_window") == 32
    assert (g.get(A + "rope.dimension_count_swa"), g.get(A + "rope.freq_base_swa")) == (64, 1e4)
    assert (g.get(A + "rope.dimension_count"), g.get(A + "rope.freq_base")) == (32, 5e5)
    assert g.get(A + "rope.scaling.type") == "yarn" and g.get(A + "rope.scaling.factor") == 16.0
    assert g.get(A + "rope.scaling.original_context_length") == 256 and g.get(A + "context_length") == 4096
    assert (A + "attention.sliding_window_pattern" in g.keys()) == ("default" not in variant)
    assert A + "expert_shared_count" not in g.keys()  # as the converter writes it: llama.cpp's default 1


def test_tiny_has_every_path_llama_cpp_has(files):
    """Layer 0 dense, the MoE layers both full and sliding with the pattern key, different head counts for
    the two kinds, a window a ~100-token prompt crosses, dense / expert / shared widths all different."""
    g = files["head-pattern"]
    swa, heads = is_swa(g), g.get(A + "attention.head_count")
    assert swa == [False, True, False, True] and heads == [4, 6, 4, 6]
    assert {swa[i] for i in range(1, 4)} == {False, True}
    assert {h for h, s in zip(heads, swa) if s} == {6} and {h for h, s in zip(heads, swa) if not s} == {4}
    assert all(h % g.get(A + "attention.head_count_kv") == 0 for h in heads)
    assert g.get(A + "attention.sliding_window") < 93
    widths = {
        g.get(A + key)
        for key in ("feed_forward_length", "expert_feed_forward_length", "expert_shared_feed_forward_length")
    }
    assert len(widths) == 3
    # without the pattern key: llama.cpp's default, layer 0 full and 1-3 sliding
    d = files["head-default-pattern"]
    assert is_swa(d) == [False, True, True, True] and d.get(A + "attention.head_count") == [4, 6, 6, 6]
    assert laguna_swa_layers(replace(TINY, extra={**TINY.extra, "swa_pattern": None})) == is_swa(d)


def test_tiny_values(files):
    """Matrices Q8_0 (what llama-quantize quantizes), norms / router / bias F32; the output matrix spread
    0.25 (logits of spread ~4, far from uniform); the correction bias small, as trained ones are."""
    g = files["head-pattern"]
    for name in (
        "blk.0.attn_gate.weight",
        "blk.1.attn_q.weight",
        "blk.0.ffn_down.weight",
        "blk.3.ffn_up_shexp.weight",
        "blk.2.ffn_gate_exps.weight",
        "output.weight",
    ):
        assert g.tensor(name).ggml_type == T.Q8_0, name
    for name in ("blk.1.ffn_gate_inp.weight", "blk.1.exp_probs_b.bias", "blk.2.attn_q_norm.weight"):
        assert g.tensor(name).ggml_type == T.F32, name
        assert np.isfinite(g.array(name)).all()
    out = dequantize(np.asarray(g.raw("output.weight")), T.Q8_0)
    assert 0.2 < out.std() < 0.3
    gate = dequantize(np.asarray(g.raw("blk.0.attn_gate.weight")), T.Q8_0)
    assert 0.03 < gate.std() < 0.07
    assert np.abs(g.array("blk.1.exp_probs_b.bias")).max() < 0.2


def test_builder_variants_and_refusals():
    # Laguna-M.1's layout: no sliding window, so no SWA keys and one head count for every layer
    full = replace(TINY, extra={k: v for k, v in TINY.extra.items() if k not in ("sliding_window", "swa_pattern")})
    _, keys = plan(full)
    assert keys["{arch}.attention.head_count"] == [4] * 4
    assert not any("swa" in k or "sliding" in k for k in keys)
    with pytest.raises(SwapmoeError, match="gate"):
        plan(replace(TINY, extra={**TINY.extra, "gate": "both"}))
    with pytest.raises(SwapmoeError, match="multiple of n_head_kv"):
        plan(replace(TINY, extra={**TINY.extra, "n_head_swa": 5}))
    with pytest.raises(SwapmoeError, match="MoE layer"):
        plan(replace(TINY, n_dense_lead=4))
    # a shorter pattern repeats over the layers; scaling the layer count keeps the key's length right
    _, keys = plan(replace(TINY, n_layer=6))
    assert keys["{arch}.attention.sliding_window_pattern"] == [False, True] * 3
    assert keys["{arch}.attention.head_count"] == [4, 6] * 3


def test_s_2_1_preset_is_the_published_shape():
    c = PRESETS["laguna-s-2.1"]
    assert (c.n_layer, c.d_model, c.n_head, c.n_head_kv, c.head_dim) == (48, 3072, 48, 8, 128)
    assert (c.n_expert, c.n_expert_used, c.expert_ff, c.shared_ff, c.dense_ff, c.n_dense_lead) == (
        256,
        10,
        1024,
        1024,
        12288,
        1,
    )
    assert (c.ctx, c.rope_base, c.rms_eps) == (262144, 5e5, 1e-6)
    tensors, keys = plan(c)
    key = lambda k: keys["{arch}." + k]  # noqa: E731
    assert key("attention.head_count") == [48, 72, 72, 72] * 12
    assert key("attention.sliding_window") == 512 and "{arch}.attention.sliding_window_pattern" not in keys
    assert laguna_swa_layers(c) == [i % 4 != 0 for i in range(48)]  # llama.cpp's default: 12 full, 36 sliding
    assert (key("rope.dimension_count"), key("rope.dimension_count_swa"), key("rope.freq_base_swa")) == (64, 128, 1e4)
    assert (key("rope.scaling.type"), key("rope.scaling.factor"), key("rope.scaling.original_context_length")) == (
        "yarn",
        32.0,
        8192,
    )
    assert (key("expert_weights_scale"), key("expert_weights_norm"), key("expert_gating_func")) == (2.5, True, 2)
    assert all(
        ne[1] == h
        for (name, ne, _, _) in tensors
        if name.endswith("attn_gate.weight")
        for h in [key("attention.head_count")[int(name.split(".")[1])]]
    )  # per-head gate on every layer
    assert len(tensors) == 814  # as many as the lmstudio-community Q4_K_M GGUF holds
    # the model card's 117B-118B total and ~8B active, counted with the real 100352-token vocabulary (active:
    # 10 of the 256 routed experts, and one row of the embedding table)
    n_vocab, D = len(build_vocab().tokens), 3072
    params = {name: int(np.prod(ne)) for name, ne, _, _ in tensors}
    total = sum(params.values()) + 2 * (100352 - n_vocab) * D
    experts = sum(n for name, n in params.items() if "_exps." in name)
    assert 117e9 < total < 118e9
    assert 7.5e9 < total - experts + experts * 10 / 256 - 100352 * D < 8.5e9
