"""Expert streaming: both engines, the byte budget, keep-recent, fixation and prefetch.

Behaviour only; nothing here measures time."""

import ctypes
import mmap
import os
import re

import numpy as np
import pytest

import swapmoe
from swapmoe.errors import SwapmoeError
from swapmoe.runtime.experts.options import StreamingOptions, plan
from swapmoe.runtime.models import base
from swapmoe.runtime.routing import Routing

PROMPT = [5, 60, 7, 300, 41, 42, 9, 120, 200, 11, 3, 77]


@pytest.fixture(scope="module")
def model_path(synth_model):
    """A qwen3moe with 16 experts (top-2) in 3 layers; each expert slice is 288 KiB."""
    return synth_model(arch="qwen3moe", type="Q8_0", n_layer=3, n_expert=16, seed=3)


@pytest.fixture(scope="module")
def reference(model_path):
    m = swapmoe.load(model_path, expert_streaming=False)
    return m.logits(PROMPT), list(m.generate_ids(PROMPT, max_tokens=8, ignore_eos=True))


@pytest.mark.parametrize("io", ["mmap", "pread"])
def test_engines_compute_the_same(model_path, reference, io):
    m = swapmoe.load(model_path, io=io, expert_streaming=True, expert_cache_size=4)
    assert m.store.engine.name == io
    np.testing.assert_array_equal(m.logits(PROMPT), reference[0])
    assert list(m.generate_ids(PROMPT, max_tokens=8, ignore_eos=True)) == reference[1]


@pytest.mark.parametrize("io", ["mmap", "pread"])
def test_budget_holds(model_path, io):
    m = swapmoe.load(model_path, io=io, expert_cache_size=2)  # 2 MiB: 7 of the 48 slices
    budget = 2 << 20
    m.logits(PROMPT)
    list(m.generate_ids(PROMPT, max_tokens=6, ignore_eos=True))
    assert m.store.stats.evictions > 0
    assert m.store.stats.peak_resident_bytes <= budget
    assert m.store.resident_bytes <= budget


GiB = 1 << 30


def test_defaults_fit_the_machine():
    def choose(expert_gb, available_gb, repacked=False, **given):
        return plan(
            StreamingOptions(**given),
            int(expert_gb * GiB),
            GiB // 2,
            64 << 20,
            16 << 20,
            repacked,
            (int(available_gb * GiB), "test"),
        )

    fits = choose(4, 24)
    assert not fits.streaming and fits.engine == "mmap" and fits.budget_bytes is None
    assert choose(4, 24, repacked=True).streaming  # repacked: never read experts at load time
    big = choose(60, 16)
    usable = int(16 * GiB * 0.9) - GiB // 2 - (64 << 20) - (384 << 20)
    assert big.streaming and big.engine == "pread" and big.budget_bytes == usable
    tiny = choose(60, 16, expert_cache_size=1)  # smaller than one layer needs: raised
    assert tiny.budget_bytes == 16 << 20 and any("raised" in r for r in tiny.reasons)
    assert choose(4, 24, expert_cache_size=100).streaming  # a cache size implies streaming


def _capacity(m) -> int:
    """How many experts the pread engine can hold at once (all slices have the same size)."""
    ((size, free),) = m.store.engine.pool.free.items()
    assert len(free) * size == len(free) * m.store._new_entry(0, 0).nbytes <= m.store.budget
    return len(free)


def test_eviction_follows_the_layer_cycle(model_path):
    """Every token needs the same experts, one more than fit: a global LRU would evict exactly
    the expert needed next and miss all of them every token; evicting the expert whose layer
    comes back last misses one or two per token (two when layer 0 evicts from the last layer,
    which the same token needs again)."""
    m = swapmoe.load(model_path, io="pread", expert_cache_size=2)
    n = _capacity(m) + 1
    needs = {0: list(range(n - 2 * (n // 3))), 1: list(range(n // 3)), 2: list(range(n // 3))}
    misses = []
    for _ in range(6):
        before = m.store.stats.misses
        for layer, ids in needs.items():
            m.store.start_reads(layer, ids)
            for e in ids:
                m.store.expert(layer, e)
        m.store.end_pass()
        misses.append(m.store.stats.misses - before)
    assert misses[0] == n and max(misses[1:]) <= 2


def test_stale_experts_go_first(model_path):
    """An expert its layer did not use on its last visit is evicted before the (older) ones
    that the layers keep using."""
    m = swapmoe.load(model_path, io="pread", expert_cache_size=2)
    full = _capacity(m)

    def use(layer, ids):
        m.store.start_reads(layer, ids)
        for e in ids:
            m.store.expert(layer, e)

    use(1, list(range(full - 2)))  # the oldest entries, still fresh for layer 1
    use(0, [0])
    use(0, [1])  # layer 0 moved on: (0, 0) is stale; the cache is full
    use(2, [0])
    assert (0, 0) not in m.store._entries
    assert all((1, e) in m.store._entries for e in range(full - 2))


def test_a_prompts_last_tokens_keep_their_experts(model_path):
    """A prompt's tokens chose experts F-1, ..., 1, 0, then F (one each): when room is needed, the
    expert of its first token goes first (decoding continues from its last tokens), although the
    layer computed them in the order 0, 1, ..., F."""
    m = swapmoe.load(model_path, io="pread", expert_cache_size=2)
    full = _capacity(m)
    first, last = full - 3, full - 2
    choice = np.array([*range(first, -1, -1), last])[:, None]
    m.store.start_reads(0, choice)
    for e in m.store.ready_first(0, list(range(last + 1)))[0]:
        m.store.expert(0, e)
    m.store.end_pass()
    m.store.start_reads(1, [0, 1])  # one more than is free: one eviction
    assert (0, first) not in m.store._entries
    assert all((0, e) in m.store._entries for e in range(last + 1) if e != first)


def test_a_wrong_guess_is_not_kept_as_one(model_path):
    """An expert prefetched for its layer's next visit counts as needed then; once that visit
    chose other experts it is judged by its share like any other, not kept for good."""
    m = swapmoe.load(model_path, io="pread", expert_cache_size=2)
    full = _capacity(m)
    m.store.start_reads(0, list(range(full - 1)))
    for e in range(full - 1):
        m.store.expert(0, e)
    m.store.prefetch(1, [5])  # the cache is full now
    m.store.start_reads(1, [6])  # layer 1 chose another expert: the guess goes first
    assert (1, 5) not in m.store._entries
    assert all((0, e) in m.store._entries for e in range(full - 1))


def test_start_reads_keeps_resident_experts_it_needs(model_path):
    m = swapmoe.load(model_path, io="pread", expert_cache_size=2)
    full = _capacity(m)
    for e in range(full):
        m.store.expert(1, e)  # full; expert 0 of layer 1 is the least recently used
    m.store.start_reads(1, [0, full, full + 1])  # two misses need room: not at the cost of expert 0
    assert (1, 0) in m.store._entries
    before = m.store.stats.hits
    m.store.expert(1, 0)
    assert m.store.stats.hits == before + 1


def test_resident_experts_are_computed_while_the_others_are_read(model_path):
    """A layer's experts already in come first, then those whose reads start_reads began, then
    the ones it found no room for; a layer mixes them in that order."""
    m = swapmoe.load(model_path, io="pread", expert_cache_size=2)
    asked = []
    expert = m.store.expert
    m.store.expert = lambda layer, e: asked.append((layer, e)) or expert(layer, e)
    expert(1, 12)
    m.net.mix_experts(1, np.ones((1, m.net.hp.d_model), np.float32), np.array([[3, 12]]), np.ones((1, 2), np.float32))
    assert asked == [(1, 12), (1, 3)]  # 12 resident, 3 not

    full = _capacity(m)
    for e in range(full):
        expert(0, e)  # full of layer 0
    m.store.start_reads(2, [2, 5, 7, 0])
    assert m.store.ready_first(2, [2, 5, 7, 0]) == ([2, 5, 7, 0], 0)  # all being read: as given
    m.store.start_reads(2, list(range(full + 1)))  # one more than fits: the last is read later
    order, _ = m.store.ready_first(2, list(range(full + 1)))
    assert sorted(order) == list(range(full + 1)) and order[-1] == full


@pytest.mark.parametrize("io", ["mmap", "pread"])
@pytest.mark.parametrize("repacked", [False, True], ids=["gate-up-apart", "repacked"])
def test_resident_experts_computed_together_are_the_same(model_path, tmp_path, monkeypatch, io, repacked):
    """While decoding, a layer's experts that were resident are computed with one kernel call per
    projection for all of them (linear_apart), with the bits of one call each."""
    path = swapmoe.repack(model_path, tmp_path / "r.gguf", progress=False) if repacked else model_path
    m = swapmoe.load(path, io=io, expert_streaming=True, expert_cache_size=4)

    def decode() -> list[np.ndarray]:
        seq = m.start(PROMPT, 8, ignore_eos=True)
        logits = [seq.logits]
        while not seq.finished:
            m.advance([seq])
            logits.append(seq.logits)
        return logits

    together = []
    apart = base.linear_apart
    monkeypatch.setattr(base, "linear_apart", lambda ws, x: together.append(len(ws)) or apart(ws, x))
    shared = decode()
    assert together and max(together) >= 2  # top-2: both experts resident in some layer
    monkeypatch.setattr(base.Transformer, "_experts_together", lambda self, layer, experts, x: None)
    alone = decode()
    assert all(np.array_equal(a, b) for a, b in zip(shared, alone, strict=True))


def test_keep_recent_evicts_older_experts(model_path):
    m = swapmoe.load(model_path, io="mmap", expert_streaming=True, expert_keep_recent=2)
    seq = m.start(PROMPT, max_tokens=5, ignore_eos=True)
    while not seq.finished:
        m.advance([seq])
    for layer in m.index.moe_layers():
        resident = [key for key in m.store._entries if key[0] == layer]
        assert len(resident) <= 2
        # the survivors are the last experts that layer used
        last = np.unique(seq.routing._last[layer]).tolist()
        assert sorted(e for _, e in resident) == sorted(last)


def test_fixation_pins_ids_for_the_window(model_path, monkeypatch):
    seen = []
    m = swapmoe.load(model_path, expert_fixation=3)
    select = Routing.select

    def spy(routing, layer, selection, k):
        ids = select(routing, layer, selection, k)
        seen.append((routing.decoding, layer, tuple(ids[0]) if len(ids) == 1 else None))
        return ids

    monkeypatch.setattr(Routing, "select", spy)
    list(m.generate_ids(PROMPT, max_tokens=7, ignore_eos=True))
    decode = [(layer, ids) for decoding, layer, ids in seen if decoding]
    n_layer = len(m.index.moe_layers())
    passes = [decode[i : i + n_layer] for i in range(0, len(decode), n_layer)]
    assert len(passes) == 6  # the first token comes from the prompt pass
    assert passes[1] == passes[0] and passes[2] == passes[0]  # one window of 3
    assert passes[4] == passes[3] and passes[5] == passes[3]
    assert not any(decoding for decoding, _, ids in seen[:n_layer])  # the prompt pass is never fixed


def test_fixation_changes_little_on_prompt_logits(model_path, reference):
    m = swapmoe.load(model_path, expert_fixation=4)
    np.testing.assert_array_equal(m.logits(PROMPT), reference[0])  # prompts are never fixed


def test_lookahead_prefetches_the_predicted_experts(model_path):
    m = swapmoe.load(model_path, io="mmap", expert_streaming=True, expert_prefetch="lookahead")
    hinted = []
    engine_start = m.store.engine.start
    m.store.engine.start = lambda ranges, nbytes: (hinted.append(list(ranges)), engine_start(ranges, nbytes))[1]
    predicted = []
    predict = m.net.predict_experts
    m.net.predict_experts = lambda i, h, routing: (predicted.append((i, predict(i, h, routing))), predicted[-1][1])[1]
    list(m.generate_ids(PROMPT, max_tokens=3, ignore_eos=True))
    assert predicted and all(i >= 1 for i, _ in predicted)  # layer 0 has nothing before it
    # every hinted range is exactly an index slice of a predicted expert of that layer
    expected = {(r.file, r.offset, r.length) for i, ids in predicted for e in ids for r in m.index.slice(i, int(e))}
    assert hinted and {r for ranges in hinted for r in ranges} <= expected | {
        (r.file, r.offset, r.length)
        for layer in m.index.moe_layers()
        for e in range(16)
        for r in m.index.slice(layer, e)
    }
    assert m.store.stats.prefetch_issued > 0


def _resident_pages(array: np.ndarray, offset: int, length: int) -> int:
    """Pages of array[offset:offset+length] (page-aligned) that are in RAM, by mincore(2)."""
    libc = ctypes.CDLL(None, use_errno=True)
    pages = length // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    if libc.mincore(ctypes.c_void_p(array.ctypes.data + offset), ctypes.c_size_t(length), vec) != 0:
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(v & 1 for v in vec)


def test_mmap_release_drops_pages(tmp_path):
    """Resident experts are wholly in RAM, evicted and unused ones hold no page (mincore)."""
    original = swapmoe.synth(tmp_path / "m.gguf", type="F16", n_layer=6, n_expert=16, seed=3, progress=False)
    packed = swapmoe.repack(original, tmp_path / "p.gguf")
    with open(packed, "rb") as f:  # start cold: writing the file left it in the page cache
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    m = swapmoe.load(packed, io="mmap", expert_keep_recent=1)
    list(m.generate_ids(PROMPT, max_tokens=4, ignore_eos=True))
    engine, checked = m.store.engine, 0
    # opening a GGUF faults its header in with the kernel's readahead (a window of read_ahead_kb,
    # 8 MiB here, and the next one started asynchronously): the first 16 MiB are not ours to judge
    skip = (16 << 20) + (64 << 10)
    for layer in m.index.moe_layers():
        for e in range(16):
            (r,) = m.index.slice(layer, e)  # bundled: one range per expert
            if r.offset < skip:
                continue
            in_ram = _resident_pages(engine._arrays[r.file], r.offset, r.length // mmap.PAGESIZE * mmap.PAGESIZE)
            expected = r.length // mmap.PAGESIZE if (layer, e) in m.store._entries else 0
            assert in_ram == expected, (layer, e)
            checked += 1
    assert checked >= 20 and m.store.stats.evictions > 0


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads the mapping's flags from Linux's /proc")
def test_pread_pool_asks_for_huge_pages(model_path):
    """The pread engine's expert pool is private anonymous memory advised for 2 MiB pages (smaps
    flag "hg"): a shared mapping could not get them, whatever the advice."""
    m = swapmoe.load(model_path, io="pread", expert_cache_size=2)
    address, mapping = m.store.engine._memory.ctypes.data, None
    for line in open("/proc/self/smaps"):
        fields = line.split()
        if re.fullmatch(r"[0-9a-f]+-[0-9a-f]+", fields[0]):  # a mapping's first line: its range, then perms
            start, end = (int(a, 16) for a in fields[0].split("-"))
            mapping = fields if start <= address < end else None
        elif mapping and fields[0] == "VmFlags:":
            assert mapping[1].endswith("p"), mapping  # private
            assert "hg" in fields[1:], line  # advised for huge pages
            return
    raise AssertionError("the pool's mapping is not in /proc/self/smaps")


def test_bad_options():
    with pytest.raises(SwapmoeError, match="expert-cache-size must be at least 1"):
        swapmoe.load(swapmoe.default_model_path(), expert_cache_size=0)
    with pytest.raises(SwapmoeError, match="expert-prefetch must be one of"):
        swapmoe.load(swapmoe.default_model_path(), expert_prefetch="always")


@pytest.mark.parametrize("io", ["mmap", "pread"])
def test_repacked_file_computes_the_same(model_path, reference, tmp_path, io):
    """A repacked expert is gate, up, down back to back: the store hands gate and up to the
    kernels as one matrix (one call), which must not change a bit."""
    repacked = swapmoe.repack(model_path, tmp_path / "r.gguf", progress=False)
    m = swapmoe.load(repacked, io=io, expert_streaming=True, expert_cache_size=4)
    expert = m.store.expert(0, 0)
    assert expert.gate_up is not None and expert.gate is None and expert.gate_up.rows % 16 == 0
    assert swapmoe.load(model_path, expert_streaming=False).store.expert(0, 0).gate_up is None
    np.testing.assert_array_equal(m.logits(PROMPT), reference[0])
    assert list(m.generate_ids(PROMPT, max_tokens=8, ignore_eos=True)) == reference[1]
