"""Model.advance with several sequences: one pass for all, each expert read once, and every
sequence's logits the bits it gets decoding alone."""

import numpy as np
import pytest

import swapmoe
from swapmoe.runtime import kernels

N_NEW = 6


def _decode_alone(m, prompt):
    seq = m.start(prompt, N_NEW, ignore_eos=True)
    logits = [seq.logits]
    while not seq.finished:
        m.advance([seq])
        logits.append(seq.logits)
    return logits


def _decode_together(m, prompts):
    seqs = [m.start(p, N_NEW, ignore_eos=True) for p in prompts]
    logits = [[s.logits] for s in seqs]
    while not all(s.finished for s in seqs):
        m.advance(seqs)
        for out, s in zip(logits, seqs):
            out.append(s.logits)
    return logits


# nine sequences over four experts: ≥ 8 rows meet an expert, where a prompt-sized product takes
# another rounding route (IQ2_XXS: the tiled kernel)
@pytest.mark.parametrize(
    "settings",
    [
        dict(type="IQ2_XXS", n_expert=4),
        dict(preset="tiny-deepseek4", type="Q4_K_M"),
        dict(arch="qwen35moe", type="Q4_K_M"),
    ],
    ids=["iq2-4experts", "deepseek4", "qwen35moe"],
)
def test_together_is_bit_identical_to_alone(synth_model, settings):
    m = swapmoe.load(synth_model(**settings))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, m.net.n_vocab, size=n).tolist() for n in (3, 7, 5, 9, 4, 6, 8, 2, 11)]
    alone = [_decode_alone(m, p) for p in prompts]
    together = _decode_together(m, prompts)
    for a, t in zip(alone, together):
        assert len(a) == len(t) == N_NEW
        assert all(np.array_equal(x, y) for x, y in zip(a, t))


def test_the_one_token_route_is_what_makes_it_exact(synth_model, monkeypatch):
    """Without separate_tokens, nine rows through one IQ2_XXS expert round differently."""
    m = swapmoe.load(synth_model(type="IQ2_XXS", n_expert=4))
    prompts = [[i + 3, 2 * i + 5] for i in range(9)]
    alone = [_decode_alone(m, p) for p in prompts]
    monkeypatch.setattr(kernels, "separate_tokens", _nothing)
    together = _decode_together(m, prompts)
    assert not all(np.array_equal(x, y) for a, t in zip(alone, together) for x, y in zip(a, t))


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_each_expert_is_read_once_per_pass(synth_model):
    """Streaming with room for one layer's experts: a pass of several sequences asks the store for
    the union of their experts, not for each sequence's."""
    m = swapmoe.load(synth_model(type="Q8_0"), expert_cache_size=1)
    prompts = [[5, 17, 99], [7, 8], [40, 41, 42, 43]]
    seqs = [m.start(p, 3, ignore_eos=True) for p in prompts]
    requests = []
    ask = m.store.start_reads
    m.store.start_reads = lambda layer, ids: requests.append((layer, np.unique(ids).tolist())) or ask(layer, ids)
    before = m.store.stats.requests
    m.advance(seqs)
    per_layer = {layer: ids for layer, ids in requests}
    assert len(requests) == len(per_layer) == m.hparams.n_layer
    assert m.store.stats.requests - before == sum(len(ids) for ids in per_layer.values())


def test_every_product_takes_all_sequences_at_once(synth_model, monkeypatch):
    """Attention projections, router and output matrix: one product per weight for the pass of
    every sequence, with a row for each."""
    m = swapmoe.load(synth_model(type="Q8_0"))
    seqs = [m.start(p, 3, ignore_eos=True) for p in ([5, 17, 99], [7, 8], [40, 41, 42, 43])]
    rows_by_weight = {}
    product = kernels.matmul_q

    def counted(ggml_type, W, rows, cols, qx, *args, **kwargs):
        if not kwargs.get("stacked"):
            rows_by_weight.setdefault(W.ctypes.data, []).append(len(qx.qs))
        return product(ggml_type, W, rows, cols, qx, *args, **kwargs)

    monkeypatch.setattr(kernels, "matmul_q", counted)
    m.advance(seqs)
    assert m.net.output.raw.ctypes.data in rows_by_weight
    assert all(calls == [len(seqs)] for calls in rows_by_weight.values())


def test_finished_sequences_are_left_out(synth_model):
    m = swapmoe.load(synth_model(type="Q8_0"))
    short, long_ = m.start([5, 17], 1, ignore_eos=True), m.start([7, 8, 9], 4, ignore_eos=True)
    assert short.finished == "length" and short.generated == 1
    m.advance([short, long_])
    assert short.generated == 1 and long_.generated == 2
