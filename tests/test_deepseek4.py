"""DeepSeek-V4: its kernels against plain float64 statements of what they compute, its caches,
and hash-routed layers (experts from the sidecar's table, never fixated, read as soon as the
token is known). Parity with llama.cpp is in test_parity.py (golden fixtures)."""

import subprocess

import numpy as np
import pytest

import swapmoe
from swapmoe.runtime.kernels import hyper
from swapmoe.runtime.models import deepseek4
from swapmoe.runtime.models.base import Routing

from conftest import cli_command

F32 = np.float32
TINY = dict(preset="tiny-deepseek4", seed=3)


def sinkhorn_reference(mixes, scale, base, eps, iters):
    """pre, post and comb[t, dst, src] in float64, as archs-new.md states the mixing."""
    m = mixes.astype(np.float64)
    pre = 1 / (1 + np.exp(-(m[:, :4] * scale[0] + base[:4]))) + eps
    post = 2 / (1 + np.exp(-(m[:, 4:8] * scale[1] + base[4:8])))
    logits = (m[:, 8:] * scale[2] + base[8:]).reshape(-1, 4, 4)  # [t, src, dst]
    M = np.exp(logits - logits.max(axis=2, keepdims=True))
    M = M / M.sum(axis=2, keepdims=True) + eps
    M = M / (M.sum(axis=1, keepdims=True) + eps)
    for _ in range(iters - 1):
        M = M / (M.sum(axis=2, keepdims=True) + eps)
        M = M / (M.sum(axis=1, keepdims=True) + eps)
    return pre, post, M.transpose(0, 2, 1)


def test_hc_split_is_the_sinkhorn_mixing():
    rng = np.random.default_rng(0)
    T, eps, iters = 5, F32(1e-6), 20
    mixes = rng.standard_normal((T, 24)).astype(F32)
    scale, base = rng.uniform(0.5, 2, 3).astype(F32), rng.standard_normal(24).astype(F32)
    pre, post, comb = np.empty((T, 4), F32), np.empty((T, 4), F32), np.empty((T, 4, 4), F32)
    hyper.hc_split(mixes, scale, base, eps, iters, pre, post, comb)
    want = sinkhorn_reference(mixes, scale, base, float(eps), iters)
    for got, expected in zip((pre, post, comb), want):
        np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(comb.sum(axis=2), 1, atol=1e-3)  # doubly stochastic after 20 rounds
    np.testing.assert_allclose(comb.sum(axis=1), 1, atol=1e-5)


def test_hc_collapse_and_expand():
    rng = np.random.default_rng(1)
    T, D = 3, 40
    x = rng.standard_normal((T, 4, D)).astype(F32)
    w = rng.standard_normal((T, 4)).astype(F32)
    y = rng.standard_normal((T, D)).astype(F32)
    comb = rng.random((T, 4, 4)).astype(F32)
    h = np.empty((T, D), F32)
    hyper.hc_collapse(x, w, h)
    np.testing.assert_allclose(h, np.einsum("th,thd->td", w.astype(np.float64), x), rtol=1e-5, atol=1e-6)
    out = np.empty_like(x)
    hyper.hc_expand(y, x, w, comb, out)
    expected = w[:, :, None] * y[:, None, :].astype(np.float64) + np.einsum("tds,tse->tde", comb, x)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("d, block", [(64, 64), (128, 128), (192, 64)])
def test_hadamard_is_the_normalised_walsh_matrix_per_block(d, block):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 2, d)).astype(F32)
    H = np.ones((1, 1))
    while len(H) < block:
        H = np.block([[H, H], [H, -H]])
    expected = (x.reshape(-1, block).astype(np.float64) @ H.T / np.sqrt(block)).reshape(x.shape)
    got = deepseek4.hadamard(x)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(deepseek4.hadamard(got), x, rtol=1e-4, atol=1e-5)  # its own inverse


def test_indexer_scores_weigh_relu_dots_and_mask_unseen_rows():
    rng = np.random.default_rng(3)
    T, Hi, d, R = 4, 16, 64, 9
    q = rng.standard_normal((T, Hi, d)).astype(F32)
    keys = rng.standard_normal((R, d)).astype(F32)
    w = rng.standard_normal((T, Hi)).astype(F32)
    visible = np.array([0, 3, 9, 5])
    out = np.empty((T, R), F32)
    hyper.indexer_scores(q, keys, w, visible, out)
    expected = np.einsum("th,thj->tj", w, np.maximum(np.einsum("thd,jd->thj", q.astype(np.float64), keys), 0))
    seen = np.arange(R)[None, :] < visible[:, None]
    np.testing.assert_allclose(out[seen], expected[seen], rtol=1e-4, atol=1e-4)
    assert np.all(out[~seen] == -np.inf)


def test_compressed_rows_one_per_completed_block(synth_model):
    m = swapmoe.load(synth_model(**TINY))
    ratios = m.net.ratios
    assert set(ratios) == {0, 4, 128}
    cache = m.net.new_cache(300)
    ids = np.arange(300) % m.net.n_vocab
    routing = m.new_routing()
    m.net.forward(ids[:130], cache, routing)  # a block of 128 completes in the prompt
    m.net.forward(ids[130:131], cache, routing)
    m.net.forward(ids[131:132], cache, routing)  # a block of 4 completes at position 131, in a decode step
    for layer, ratio in enumerate(ratios):
        c = cache[layer]
        assert c.length == 132 and len(c.raw) == m.net.window
        if ratio:
            written = np.flatnonzero(np.abs(c.attn.rows).sum(axis=1))
            assert list(written) == list(range(132 // ratio))
        assert (c.indexer is not None) == (ratio == 4)
    assert m.net.cache_bytes(m.gguf, m.hparams, 300) == sum(
        a.nbytes
        for c in cache
        for a in (c.raw, *(s.__dict__[k] for s in (c.attn, c.indexer) if s for k in ("kv", "score", "rows")))
    )


def test_hash_layers_take_the_table_rows_and_ignore_fixation(synth_model, monkeypatch):
    m = swapmoe.load(synth_model(**TINY), expert_fixation=4)
    table = m.index.hash_table(0)
    assert m.index.hash_layers() == [0] and table.shape == (m.net.n_vocab, m.hparams.n_expert_used)
    chosen = []
    select = Routing.select
    monkeypatch.setattr(
        Routing,
        "select",
        lambda routing, layer, selection, k: (
            chosen.append((layer, select(routing, layer, selection, k))) or chosen[-1][1]
        ),
    )
    prompt = [5, 17, 99]
    out = list(m.generate_ids(prompt, 4, ignore_eos=True))
    inputs = prompt + out[:-1]
    layer0 = [ids for layer, ids in chosen if layer == 0]
    assert np.array_equal(layer0[0], table[prompt])  # in the table's order: the summation order
    assert [list(ids[0]) for ids in layer0[1:]] == [list(table[t]) for t in inputs[3:]]


@pytest.mark.parametrize("hash_prefetch", [True, False])
def test_hash_prefetch_has_every_expert_in_flight_before_the_layer_asks(synth_model, tmp_path, hash_prefetch):
    packed = tmp_path / "packed.gguf"
    swapmoe.repack(synth_model(**TINY), packed, progress=False)
    m = swapmoe.load(packed, io="pread", expert_cache_size=1, expert_hash_prefetch=hash_prefetch)
    list(m.generate_ids([5, 17, 99, 3], 12, ignore_eos=True))
    hits, requests = m.stats.decode_layers[0]
    assert requests == 11 * m.hparams.n_expert_used
    if hash_prefetch:
        assert hits == requests
    else:
        assert hits < requests


def _patched(src, out, find: bytes, skip: int, value: bytes):
    """A copy of src with `value` written `skip` bytes after the first occurrence of `find`."""
    data = bytearray(src.read_bytes())
    at = data.index(find) + skip
    data[at : at + len(value)] = value
    out.write_bytes(bytes(data))
    return out


def test_bad_hash_tables_are_refused_in_one_line(synth_model, tmp_path):
    from swapmoe.gguf_file import open_gguf

    src = synth_model(**TINY)
    g = open_gguf(src)
    t = g.tensor("blk.0.ffn_gate_tid2eid.weight")
    data = bytearray(src.read_bytes())
    data[t.offset + 4 * 7 : t.offset + 4 * 8] = np.int32(99).tobytes()  # token 3's second expert
    (tmp_path / "ids.gguf").write_bytes(bytes(data))
    key = b"deepseek4.expert_used_count"
    k = int(g.arch_get("{arch}.expert_used_count"))
    wrong_k = _patched(src, tmp_path / "k.gguf", key, len(key) + 4, np.uint32(k + 1).tobytes())
    for bad, message in (
        (tmp_path / "ids.gguf", "token 3 maps to expert 99"),
        (wrong_k, f"uses {k + 1} experts per token"),
    ):
        result = subprocess.run(cli_command("repack", bad, tmp_path / "out.gguf"), capture_output=True, text=True)
        assert result.returncode != 0 and message in result.stderr
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "out.gguf").exists()


def test_lossless_policies_keep_the_tokens(synth_model, tmp_path):
    """Prefetch (previous, lookahead: exact for hash layers, the streams' mean for the others),
    keep-recent and a tiny cache change what is read, never what is computed."""
    packed = tmp_path / "packed.gguf"
    swapmoe.repack(synth_model(**TINY), packed, progress=False)
    prompt = [5, 17, 99, 3, 250]
    want = list(swapmoe.load(packed).generate_ids(prompt, 10, ignore_eos=True))
    for options in (
        dict(expert_prefetch="both"),
        dict(expert_keep_recent=2, expert_cache_size=1, io="pread"),
        dict(expert_prefetch="lookahead", expert_hash_prefetch=False, io="mmap"),
    ):
        m = swapmoe.load(packed, **options)
        assert list(m.generate_ids(prompt, 10, ignore_eos=True)) == want, options
        assert m.stats.prefetch_issued > 0 or "expert_keep_recent" in options
