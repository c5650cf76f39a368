"""--trace: every layer's expert choice as JSON lines (RoutingTrace)."""

import json

import swapmoe
from swapmoe.runtime.models.base import Routing


def test_trace_records_every_layers_choice(tmp_path, monkeypatch):
    path = tmp_path / "t.jsonl"
    m = swapmoe.load(swapmoe.default_model_path(), trace=path, expert_cache_size=1)
    chosen = []
    select = Routing.select
    monkeypatch.setattr(
        Routing,
        "select",
        lambda self, layer, selection, k: chosen.append((layer, select(self, layer, selection, k))) or chosen[-1][1],
    )
    prompt = m.tokenize("def main():")
    out = list(m.generate_ids(prompt, 5, temperature=0))
    header, *lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert header["format"] == "swapmoe-trace" and header["n_layer"] == m.hparams.n_layer
    assert header["budget_bytes"] == m.plan.budget_bytes
    assert len(header["expert_bytes"]) == m.hparams.n_layer and len(header["expert_bytes"][0]) == m.index.n_expert
    assert [(line["layer"], line["ids"]) for line in lines] == [(layer, ids.tolist()) for layer, ids in chosen]
    prompt_lines = [line for line in lines if line["phase"] == "prompt"]
    assert {line["pass"] for line in prompt_lines} == {1} and len(prompt_lines[0]["ids"]) == len(prompt)
    assert len({line["pass"] for line in lines if line["phase"] == "decode"}) == len(out) - 1


def test_hash_layers_are_marked(synth_model, tmp_path):
    path = tmp_path / "t.jsonl"
    m = swapmoe.load(synth_model(preset="tiny-deepseek4", seed=3), trace=path)
    list(m.generate_ids([5, 17, 99], 3, temperature=0, ignore_eos=True))
    header, *lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert header["hash_layers"] == [0]
    assert all(line["hash"] == (line["layer"] == 0) for line in lines)
    table = m.index.hash_table(0)
    assert lines[0]["ids"] == table[[5, 17, 99]].tolist()
