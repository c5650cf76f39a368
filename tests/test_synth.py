import numpy as np
import pytest
from gguf import GGMLQuantizationType as T, GGUFReader, Keys
from gguf.quants import dequantize

import swapmoe
from swapmoe.errors import SwapmoeError
from swapmoe.gguf_file import TensorKind, open_gguf
from swapmoe.synthetic import ARCHS, PRESETS, plan
from swapmoe.synthetic.blocks import FLOAT_TYPES, QUANT_TYPES, random_blocks
from swapmoe.synthetic.vocab import build_vocab


@pytest.mark.parametrize("ggml_type", QUANT_TYPES, ids=lambda t: t.name)
def test_random_blocks_are_finite_with_the_requested_spread(ggml_type):
    rng = np.random.default_rng(1)
    blocks = random_blocks(ggml_type, 512, 0.05, rng)
    w = dequantize(blocks.reshape(-1), ggml_type)
    assert np.isfinite(w).all()
    assert 0.02 < w.std() < 0.12  # MXFP4 scales are powers of two, so only roughly on target
    # about zero-mean: random quants alone (all >= 0 in the types with a min field) gave each
    # block a mean as large as its spread, so all rows of a matrix pointed one way
    assert abs(w.mean()) < 0.15 * w.std()


@pytest.mark.parametrize("arch", list(ARCHS))
def test_every_arch_writes_a_readable_gguf(tmp_path, arch):
    path = swapmoe.synth(tmp_path / f"{arch}.gguf", arch=arch, progress=False)
    reader = GGUFReader(path)  # the reference parser accepts it
    g = open_gguf(path)
    assert g.arch == arch and len(reader.tensors) == len(g.tensors)
    routed = g.tensors_of_kind(TensorKind.ROUTED_EXPERT)
    assert routed and all(t.n_experts == g.arch_get(Keys.LLM.EXPERT_COUNT) for t in routed)
    for t in g.tensors.values():
        if t.ggml_type in (T.F32, T.F16):
            assert np.isfinite(g.array(t.name)).all(), t.name
    for t in g.tensors_of_kind(TensorKind.HASH_TABLE):
        ids = g.array(t.name)
        assert ids.shape == (len(build_vocab().tokens), g.arch_get(Keys.LLM.EXPERT_USED_COUNT))
        assert ids.min() >= 0 and ids.max() < g.arch_get(Keys.LLM.EXPERT_COUNT)
        assert all(len(set(row)) == len(row) for row in ids[:50])


@pytest.mark.parametrize("type_name", [t.name for t in FLOAT_TYPES + QUANT_TYPES])
def test_every_type(tmp_path, type_name):
    path = swapmoe.synth(tmp_path / "m.gguf", type=type_name, progress=False)
    g = open_gguf(path)
    assert g.tensor("blk.0.ffn_up_exps.weight").ggml_type == T[type_name]
    w = dequantize(np.asarray(g.raw("blk.0.ffn_up_exps.weight")), T[type_name])
    assert np.isfinite(w).all()


def test_q2_k_mix_follows_llama_quantize():
    """llama-quantize's Q2_K is a mix: Q3_K ffn_down and attention output, Q4_K attn_v and the
    DeltaNet input projection where many q heads share a kv head, Q2_K elsewhere."""
    tensors, _ = plan(PRESETS["qwen3.5-122b-a10b"], "Q2_K")
    types = {name: t for name, _, _, t in tensors}
    assert types["output.weight"] == T.Q6_K and types["blk.0.ffn_gate_up_exps.weight"] == T.Q2_K
    assert types["blk.0.ffn_down_exps.weight"] == T.Q3_K and types["blk.0.ffn_down_shexp.weight"] == T.Q3_K
    assert types["blk.0.attn_qkv.weight"] == T.Q4_K and types["blk.3.attn_v.weight"] == T.Q4_K
    assert types["blk.3.attn_output.weight"] == T.Q3_K and types["blk.0.ssm_out.weight"] == T.Q2_K
    tiny = {name: t for name, _, _, t in plan(PRESETS["tiny-qwen3moe"], "Q2_K")[0]}  # 8 experts: llama.cpp's bumps
    assert tiny["blk.0.attn_v.weight"] == T.Q8_0 and tiny["blk.0.attn_output.weight"] == T.Q5_K


def test_q4_k_m_mix_follows_llama_quantize():
    tensors, _ = plan(PRESETS["qwen3-30b-a3b"], "Q4_K_M")
    types = {name: t for name, _, _, t in tensors}
    assert types["output.weight"] == T.Q6_K and types["token_embd.weight"] == T.Q4_K
    assert types["blk.0.ffn_down_exps.weight"] == T.Q6_K  # first eighth of the layers
    assert types["blk.6.ffn_down_exps.weight"] == T.Q4_K
    assert types["blk.8.ffn_down_exps.weight"] == T.Q6_K  # (8 - 6) % 3 == 2
    assert types["blk.20.ffn_gate_exps.weight"] == T.Q4_K
    assert types["blk.0.ffn_gate_inp.weight"] == T.F32 and types["blk.0.attn_norm.weight"] == T.F32


def test_size_knob_scales_layers():
    from swapmoe.synthetic import _scale_layers

    config = _scale_layers(PRESETS["qwen3-30b-a3b"], "Q4_K_M", 4.5)
    assert 10 <= config.n_layer <= 14  # the 48-layer 17 GB model at about a quarter
    _, keys = plan(config, "Q4_K_M")
    assert keys[Keys.LLM.BLOCK_COUNT] == config.n_layer


def test_same_seed_same_bytes(tmp_path):
    a = swapmoe.synth(tmp_path / "a.gguf", seed=3, progress=False).read_bytes()
    b = swapmoe.synth(tmp_path / "b.gguf", seed=3, progress=False).read_bytes()
    c = swapmoe.synth(tmp_path / "c.gguf", seed=4, progress=False).read_bytes()
    assert a == b and a != c


def test_bad_requests(tmp_path):
    with pytest.raises(SwapmoeError, match="unknown architecture"):
        swapmoe.synth(tmp_path / "m.gguf", arch="gpt-5", progress=False)
    with pytest.raises(SwapmoeError, match="unknown tensor type"):
        swapmoe.synth(tmp_path / "m.gguf", type="Q9_K", progress=False)
    with pytest.raises(SwapmoeError, match="unknown preset"):
        swapmoe.synth(tmp_path / "m.gguf", preset="nope", progress=False)
    path = swapmoe.synth(tmp_path / "m.gguf", progress=False)
    with pytest.raises(SwapmoeError, match="already exists"):
        swapmoe.synth(path, progress=False)
    assert not list(tmp_path.glob(".*tmp*"))
