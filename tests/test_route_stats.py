"""tools/route_stats.py's statistics on hand-made routing, and the synthetic generator's routing
shape (context gain, router spread, attention focus, hot experts) landing in the tensors it should."""

import numpy as np
import pytest

import swapmoe
from swapmoe.synthetic.presets import PRESETS, ROUTING_PROFILES

from conftest import load_tool


@pytest.fixture(scope="module")
def rs():
    return load_tool("route_stats")


def test_layer_statistics(rs):
    prompt = np.array([[0, 1], [2, 3]])  # history only
    decoded = [np.array([[1, 4]]), np.array([[4, 5]]), np.array([[0, 5]])]
    stats = rs.layer_stats([(False, prompt)] + [(True, ids) for ids in decoded], n_expert=20)
    # previous token: {1,4} vs {2,3}: 0; {4,5} vs {1,4}: 1/2; {0,5} vs {4,5}: 1/2
    assert stats["prev"] == pytest.approx(1 / 3)
    # within 8: {1,4}: 1 in history; {4,5}: 4; {0,5}: both
    assert stats["within8"] == pytest.approx((1 / 2 + 1 / 2 + 1) / 3)
    assert stats["distinct"] == 4  # 0, 1, 4, 5
    assert stats["top10"] == pytest.approx(4 / 6)  # the top 2 of 20 (4 and 5) got 4 of 6 requests


def test_route_stats_runs_on_the_tiny_model(rs):
    result = rs.route_stats(swapmoe.default_model_path(), decode=8)
    assert sorted(result["layers"]) == list(range(len(result["layers"]))) and len(result["layers"]) > 1
    o = result["overall"]
    assert 0 <= o["prev"] <= o["within8"] <= 1 and 2 <= o["distinct"] <= result["n_expert"]


def _tensor(path, name):
    g = swapmoe.open_gguf(path)
    return g.array(name).astype(np.float32)


def test_shape_knobs_reach_their_tensors(synth_model):
    base = synth_model(type="F32")
    shaped = synth_model(type="F32", context_gain=4.0, router_spread=1.0, attention_focus=0.5)
    ratio = _tensor(shaped, "blk.0.attn_output.weight").std() / _tensor(base, "blk.0.attn_output.weight").std()
    assert ratio == pytest.approx(4.0, rel=0.05)
    widths = np.linalg.norm(_tensor(shaped, "blk.0.ffn_gate_inp.weight"), axis=-1)
    plain = np.linalg.norm(_tensor(base, "blk.0.ffn_gate_inp.weight"), axis=-1)
    assert widths.std() / widths.mean() > 3 * plain.std() / plain.mean()  # experts' router rows differ in width
    q_norm = _tensor(shaped, "blk.0.attn_q_norm.weight").mean() / _tensor(base, "blk.0.attn_q_norm.weight").mean()
    assert q_norm == pytest.approx(0.5, rel=0.05)


def test_hot_experts_are_chosen_by_every_token(synth_model, rs):
    path = synth_model(arch="laguna", type="F32", hot_experts=1)
    base = synth_model(arch="laguna", type="F32")
    for layer in (1, 2, 3):  # the MoE layers (layer 0 is dense)
        bias = _tensor(path, f"blk.{layer}.exp_probs_b.bias")
        assert (bias > 5).sum() == 1 and (_tensor(base, f"blk.{layer}.exp_probs_b.bias") < 1).all()
    result = rs.route_stats(path, decode=6, expert_streaming=False)
    for stats in result["layers"].values():  # 1 of 2 experts is the hot one at every token
        assert stats["prev"] >= 0.5 and stats["within8"] >= 0.5


def test_hot_experts_need_a_selection_bias(tmp_path):
    with pytest.raises(swapmoe.SwapmoeError, match="exp_probs_b"):
        swapmoe.synth(tmp_path / "a.gguf", arch="qwen3moe", type="F32", hot_experts=1, progress=False)
    with pytest.raises(swapmoe.SwapmoeError, match="below the experts per token"):
        swapmoe.synth(tmp_path / "b.gguf", arch="laguna", type="F32", hot_experts=2, progress=False)


def test_profiled_presets_are_real_shapes():
    for name, profile in ROUTING_PROFILES.items():
        assert PRESETS[name].n_expert_used == profile.n_used, name
        assert 0 < profile.prev < profile.within8 < 1
