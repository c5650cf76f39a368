"""deepseek2, minimax-m2 and gpt-oss against llama.cpp, through the model classes directly.

The F32 and MXFP4 golden cases of these architectures (tests/data/golden/manifest.json; every
type, with 32 greedy tokens, is in test_parity.py) and the layout variants (variants.json:
DeepSeek's legacy attn_kv_b, lite, YaRN, V2 gating, fused gate_up; gpt-oss with a sliding
window shorter than the prompt), both written by tools/make_golden.py. Plus the routing and
activation pieces these architectures add, checked on hand-made inputs.
"""

import json
import math
from pathlib import Path

import numpy as np
import pytest

import swapmoe
from swapmoe.inspect import summarize
from swapmoe.runtime import layers
from swapmoe.runtime.compare import kl_divergence
from swapmoe.runtime.models.base import sliding_window_layers
from swapmoe.runtime.routing import Routing, RoutingPolicy

from conftest import DATA, open_model, sha256_file, unzstd

GOLDEN = DATA / "golden"
ARCHS = ("deepseek2", "minimax-m2", "gpt-oss")
MANIFEST = json.loads((GOLDEN / "manifest.json").read_text()) if (GOLDEN / "manifest.json").exists() else None
GOLDEN_CASES = [
    c for c in (MANIFEST or {"cases": []})["cases"] if c["arch"] in ARCHS and c["type"] in ("F32", "MXFP4_MOE")
]
N_GREEDY = 8  # enough to run the cache through decoding; test_parity checks all 32
VARIANTS = json.loads((GOLDEN / "variants.json").read_text())["cases"] if (GOLDEN / "variants.json").exists() else []


def check_against(model, ref, limit: float, n_greedy: int) -> None:
    tokens = ref["tokens"]
    cache, routing = model.new_cache(len(tokens) + n_greedy), Routing(model.store, RoutingPolicy())
    logits = model.forward(tokens, cache, routing, all_logits=True)
    kl = kl_divergence(ref["logits"], logits)
    assert kl.mean() <= limit, f"mean KL {kl.mean():.2e} (max {kl.max():.2e})"
    assert np.mean(logits.argmax(-1) == ref["logits"].argmax(-1)) >= 0.98
    ids, last = [], logits[-1]
    for _ in range(n_greedy):
        ids.append(int(np.argmax(last)))
        last = model.forward(np.array([ids[-1]]), cache, routing)[-1]
    assert ids == ref["greedy"][:n_greedy].tolist()


def synth_exactly(tmp_path, name: str, arch: str, settings: dict, sha256: str) -> Path:
    path = swapmoe.synth(tmp_path / f"{name}.gguf", arch=arch, progress=False, **settings)
    assert sha256_file(path) == sha256, f"{name} differs from the fixture's file"
    return path


@pytest.mark.parametrize("case", VARIANTS, ids=[c["name"] for c in VARIANTS])
def test_layout_variant_matches_llama_cpp(case, tmp_path):
    path = synth_exactly(tmp_path, case["name"], case["arch"], case["synth"], case["sha256"])
    check_against(open_model(path), np.load(GOLDEN / case["reference"]), 1e-3, N_GREEDY)


@pytest.mark.parametrize("case", GOLDEN_CASES, ids=[f"{c['arch']}-{c['type']}" for c in GOLDEN_CASES])
def test_golden_case_matches_llama_cpp(case, tmp_path):
    if case["gguf"] is None:
        path = synth_exactly(tmp_path, case["arch"], case["arch"], case["synth"], case["sha256"])
    else:
        path = unzstd(GOLDEN / case["gguf"], tmp_path / f"{case['arch']}-{case['type']}.gguf")
    limit = 1e-3 if case["type"] == "F32" else 5e-3
    n_greedy = N_GREEDY if case["type"] == "F32" else 0
    check_against(open_model(path), np.load(GOLDEN / case["reference"]), limit, n_greedy)


# --- the pieces, on hand-made inputs ---------------------------------------------------------


def test_group_limit_keeps_groups_with_best_two_sum():
    # 4 groups of 2; the best single expert (0.9) sits in a group whose pair sums lowest
    selection = np.array([[0.9, -1.0, 0.5, 0.4, 0.3, 0.3, 0.1, 0.0]], np.float32)
    masked = layers.limit_to_groups(selection, n_groups=4, n_groups_used=2)
    assert np.isneginf(masked[0, [0, 1, 6, 7]]).all()
    assert np.array_equal(masked[0, 2:6], selection[0, 2:6])


def test_swiglu_oai_clamps_gate_above_and_up_both_ways():
    gate = np.array([-3.0, 0.5, 9.0], np.float32)
    up = np.array([-9.0, 0.25, 9.0], np.float32)
    g, u = np.array([-3.0, 0.5, 7.0]), np.array([-7.0, 0.25, 7.0])
    expected = g / (1 + np.exp(-1.702 * g)) * (u + 1)
    assert np.allclose(layers.swiglu_oai(gate, up), expected, rtol=1e-6)


class _Keys:
    def __init__(self, pattern=None):
        self.pattern = pattern

    def arch_get(self, key, default=None):
        return default if self.pattern is None else self.pattern


def test_sliding_window_layers_follow_llama_cpp_pattern():
    gpt_oss = dict(pattern=2, dense_first=False)  # default: the even layers
    assert sliding_window_layers(_Keys(), 4, **gpt_oss) == [True, False, True, False]
    assert sliding_window_layers(_Keys(3), 6, **gpt_oss) == [True, True, False, True, True, False]
    assert sliding_window_layers(_Keys([False, True, True]), 3, **gpt_oss) == [False, True, True]
    laguna = dict(pattern=4, dense_first=True)  # default: every 4th layer full, from layer 0
    assert sliding_window_layers(_Keys(), 6, **laguna) == [False, True, True, True, False, True]
    assert sliding_window_layers(_Keys([True, False]), 2, **laguna) == [True, False]


def test_deepseek_v3_yarn_moves_mscale_into_kq_scale(tmp_path):
    extra = {
        "q_lora_rank": 128,
        "kv_lora_rank": 64,
        "rope_dim": 32,
        "nope_dim": 32,
        "v_dim": 32,
        "yarn": {"factor": 40, "original_context_length": 4096, "log_mul": 1.0},
    }
    path = swapmoe.synth(tmp_path / "v3.gguf", arch="deepseek2", type="F32", progress=False, n_layer=2, extra=extra)
    model = open_model(path)
    mscale = 1 + 0.1 * math.log(40)  # ≈ 1.36889 for V3's factor 40 with mscale_all_dim 1
    assert model.kq_scale == pytest.approx(mscale * mscale / math.sqrt(64), rel=1e-6)
    assert model.rope.attn_factor == pytest.approx(1 / mscale, rel=1e-6)  # cancels the kernel's boost


def test_mtp_block_is_outside_the_forward_pass(tmp_path):
    """A multi-token-prediction block after the layers (llama.cpp's converter adds one by default)
    changes no logit, and inspect reports it apart from the layers that run."""
    settings = {"type": "F32", "seed": 7, "n_layer": 4, "progress": False}
    extra = {"ssm_state": 64, "ssm_groups": 2, "ssm_heads": 4}
    plain = swapmoe.synth(tmp_path / "plain.gguf", arch="qwen35moe", extra=extra, **settings)
    with_mtp = swapmoe.synth(tmp_path / "mtp.gguf", arch="qwen35moe", extra={**extra, "mtp": True}, **settings)
    ids = [1, 2, 3, 4, 5, 6]
    np.testing.assert_array_equal(swapmoe.load(with_mtp).logits(ids), swapmoe.load(plain).logits(ids))
    summary = summarize(swapmoe.open_gguf(with_mtp))
    assert summary["layers"] == 4 and summary["mtp_layers"] == [4] and summary["mtp_expert_bytes"] > 0
    assert sorted(summary["expert_slice_bytes"]) == ["0", "1", "2", "3"]


@pytest.mark.parametrize("arch", ["qwen35moe", "qwen3next"])
def test_hybrid_cache_bytes_are_those_of_its_caches(arch, tmp_path):
    """The memory plan's cache size for a hybrid: KV rows for its attention layers only, the fixed
    state for its DeltaNet layers, exactly what new_cache allocates."""
    path = swapmoe.synth(tmp_path / "h.gguf", arch=arch, type="F32", n_layer=4, progress=False)
    model = open_model(path)
    caches = model.new_cache(100)
    allocated = sum(a.nbytes for c in caches for a in vars(c).values() if isinstance(a, np.ndarray))
    assert type(model).cache_bytes(model.gguf, model.hp, 100) == allocated
    assert sum(isinstance(c, layers.RecurrentState) for c in caches) == 3
