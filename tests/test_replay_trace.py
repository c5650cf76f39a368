"""tools/replay_trace.py: a replay of the store's default policy reproduces the counters of the run
that recorded the trace, and MIN is the optimum (brute force on small traces) and never reads more
than the others."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

import swapmoe

from conftest import load_tool


@pytest.fixture(scope="module")
def rt():
    return load_tool("replay_trace")


def record(path: Path, n_tokens: int, sampled: bool, **options) -> dict:
    """Generate on the tiny model with a routing trace; the run's store counters."""
    model = swapmoe.load(swapmoe.default_model_path(), trace=path, expert_prefetch="off", **options)
    sampling = {"temperature": 0.8, "seed": 3} if sampled else {}
    for _ in model.generate("import os\n\ndef main(", max_tokens=n_tokens, ignore_eos=True, **sampling):
        pass
    model.close()
    return {
        "misses": model.stats.misses,
        "bytes_read": model.stats.bytes_read,
        "requests": model.stats.requests,
        "plan": model.plan,
    }


RUNS = {  # name: (tokens, sampled, load options)
    "greedy-1MiB": (32, False, {"expert_cache_size": 1, "io": "mmap"}),
    "sampled-keep2": (32, True, {"expert_cache_size": 2, "io": "mmap", "expert_keep_recent": 2}),
    "sampled-pread": (32, True, {"expert_cache_size": 2, "io": "pread"}),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("traces")
    out = {}
    for name, (n, sampled, options) in RUNS.items():
        out[name] = (folder / f"{name}.jsonl", record(folder / f"{name}.jsonl", n, sampled, **options))
    return out


@pytest.mark.parametrize("name", list(RUNS))
def test_default_policy_replay_reproduces_the_recorded_run(rt, runs, name):
    path, counters = runs[name]
    trace = rt.read_trace(path)
    assert trace.header["prefetch"] == "off" and trace.header["hash_layers"] == []
    s = rt.setup(trace, io=counters["plan"].engine)
    assert s.source == "model" and s.keep_recent == counters["plan"].keep_recent
    result = rt.replay(trace, s, trace.header["budget_bytes"], "expected")
    assert (result.misses, result.bytes_read, result.requests) == (
        counters["misses"],
        counters["bytes_read"],
        counters["requests"],
    )
    assert counters["misses"] < counters["requests"]  # the budget made it evict, and not everything missed


@pytest.mark.parametrize("name", ["greedy-1MiB", "sampled-keep2"])
def test_min_never_reads_more_than_the_others(rt, runs, name):
    trace = rt.read_trace(runs[name][0])
    s = rt.setup(trace)
    assert len(set(s.sizes.values())) == 1  # equal sizes: MIN is optimal, not a heuristic
    total = sum(s.sizes.values())
    budgets = rt.default_budgets(trace, s, (0.1, 0.2, 0.3, 0.5, 0.8, 1.0))
    feasible = 0
    for budget in budgets:
        best = rt.replay(trace, s, budget, "min")
        if best.misses is None:
            assert budget < rt.largest_visit(trace, s.sizes)
            continue
        feasible += 1
        for policy in ("expected", "lru", "lfu"):
            other = rt.replay(trace, s, budget, policy)
            assert other.requests == best.requests == trace.requests
            assert best.bytes_read <= other.bytes_read and best.misses <= other.misses, (budget, policy)
        if budget >= total:  # everything fits: one read per expert ever used
            assert best.misses == len({(layer, e) for _, layer, ids in trace.visits for e in ids})
    assert feasible >= 4


def write_trace(path: Path, visits, expert_bytes, n_expert_used=1, budget=None) -> Path:
    """A hand-made trace: visits as (pass, layer, [[ids of a token]...])."""
    n_layer, n_expert = np.shape(expert_bytes)
    header = {
        "format": "swapmoe-trace",
        "version": 1,
        "model": "/nonexistent/hand.gguf",
        "arch": "qwen3moe",
        "n_layer": n_layer,
        "n_expert": n_expert,
        "n_expert_used": n_expert_used,
        "expert_bytes": expert_bytes,
        "budget_bytes": budget,
        "keep_recent": None,
        "fixation": 0,
        "prefetch": "off",
        "hash_layers": [],
    }
    lines = [header] + [
        {"pass": p, "phase": "decode", "layer": layer, "ids": ids, "hash": False} for p, layer, ids in visits
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def brute_force_misses(visits: list[tuple[int, tuple[int, ...]]], capacity: int) -> int:
    """Fewest misses of any eviction choices holding `capacity` equal-size experts under the
    store's rules, where every visit fits with one to spare: a visit's experts (ascending) are
    resident together, and the expert computed last (the last one read, else the last resident
    one) is not evicted before the next visit's reads have started."""
    states = {(frozenset(), None): 0}
    for layer, ids in visits:
        needed = {(layer, e) for e in ids}
        assert len(needed) < capacity
        after: dict = {}
        for (held, last), misses in states.items():
            missing = sorted(needed - held)
            kept = needed | ({last} & held)
            new_last = (layer, max(e for _, e in missing) if missing else max(ids))
            cost = misses + len(missing)
            others = sorted(held - kept)
            room = capacity - len(kept)
            for keep in itertools.combinations(others, min(room, len(others))):
                state = (frozenset(kept | set(keep)), new_last)
                after[state] = min(after.get(state, cost), cost)
        states = after
    return min(states.values())


def test_min_on_a_cycle_is_the_known_optimum(rt, tmp_path):
    # a b c d, three times, with room for three: LRU misses all 12; the best under the store's
    # rules (the expert computed last kept until the next reads start) misses 8
    requests = [0, 1, 2, 3] * 3
    visits = [(t + 1, 0, [[e]]) for t, e in enumerate(requests)]
    trace = rt.read_trace(write_trace(tmp_path / "cycle.jsonl", visits, [[1000] * 4]))
    s = rt.setup(trace)
    assert s.source == "header"
    best = brute_force_misses([(0, (e,)) for e in requests], 3)
    assert rt.replay(trace, s, 3000, "min").misses == best == 8
    assert rt.replay(trace, s, 3000, "lru").misses == 12
    assert rt.replay(trace, s, 3000, "expected").misses == 12  # all four layers' worth in one layer: no layer order
    assert rt.replay(trace, s, 4000, "min").misses == 4
    too_small = rt.replay(trace, s, 999, "min")
    assert too_small.misses is None and too_small.note.startswith("too small")


def test_min_is_near_the_brute_force_optimum_on_random_traces(rt, tmp_path):
    rng = np.random.default_rng(7)
    exact = 0
    for case in range(12):
        n_layer, n_expert, k = 2, 5, 2
        visits = []
        for p in range(1, 8):
            for layer in range(n_layer):
                choice = rng.choice(n_expert, size=k, replace=False, p=rng.dirichlet(np.ones(n_expert) * 0.7))
                visits.append((p, layer, [choice.tolist()]))
        path = write_trace(tmp_path / f"r{case}.jsonl", visits, [[4096] * n_expert] * n_layer, n_expert_used=k)
        trace = rt.read_trace(path)
        s = rt.setup(trace)
        for capacity in (3, 4, 6):
            best = rt.replay(trace, s, capacity * 4096, "min")
            optimum = brute_force_misses([(layer, ids) for _, layer, ids in trace.visits], capacity)
            # farthest next use is optimal where the pinned expert never binds, and within a few
            # misses of it where it does (the pin depends on which experts were resident)
            assert optimum <= best.misses <= optimum + 2, (case, capacity)
            exact += best.misses == optimum
            for policy in ("expected", "lru", "lfu"):
                assert rt.replay(trace, s, capacity * 4096, policy).misses >= best.misses
    assert exact >= 30  # of 36


def test_a_visit_is_needed_together_unless_it_cannot_fit(rt, tmp_path):
    # layer 0 chooses experts 0 and 1 together: with room for both, the policies keep them; with
    # room for one they stream them one by one, as the store reads them; below one expert: too small
    visits = [(1, 0, [[0, 1]]), (2, 0, [[1, 2]])]
    trace = rt.read_trace(write_trace(tmp_path / "pair.jsonl", visits, [[10, 10, 10]], n_expert_used=2))
    s = rt.setup(trace)
    assert rt.largest_visit(trace, s.sizes) == 20
    assert rt.replay(trace, s, 9, "lru").misses is None
    assert rt.replay(trace, s, 20, "min").misses == 3
    assert rt.replay(trace, s, 10, "min").misses == 3  # 0, 1 (evicting 0), then 2: 1 is kept in between
    assert rt.replay(trace, s, 10, "expected").misses == 3


def test_command_line(rt, runs, capsys):
    path = runs["greedy-1MiB"][0]
    assert rt.main([str(path), "--budgets", "1.5,3", "--policies", "expected,lru,min"]) == 0
    out = capsys.readouterr().out
    assert "tiny-moe.gguf" in out and "32 passes" in out
    assert out.count("| expected |") == 3 and "1.00 MiB (10.5 %) *" in out  # the recorded budget added, marked
    assert rt.main([str(path), "--wide", "--budget-fractions", "0.5"]) == 0
    wide = capsys.readouterr().out
    assert "| budget | expected | lru | lfu | min: misses, MiB |" in wide
    assert len([line for line in wide.splitlines() if line.startswith("| 1.00 MiB")]) == 1


def test_pread_slots_come_in_each_slice_size():
    from swapmoe.runtime.experts.io import SlotPool, slot_plan

    needs = [3] * 6 + [5] * 6  # bytes: 18 of size 3, 30 of size 5
    assert slot_plan(needs, None, 1) == {3: 6, 5: 6}
    assert slot_plan(needs, 24, 1) == {3: 3, 5: 3}  # the budget split as the bytes are: 9 + 15
    assert slot_plan(needs, 8, 2) == {3: 2, 5: 2}  # at least `least` of each
    assert slot_plan([3] * 2 + [5] * 6, 1000, 1) == {3: 2, 5: 6}  # never more than the slices
    pool = SlotPool({3: 2, 5: 1})
    assert (pool.base, pool.free, pool.size) == ([0, 3, 6], {3: [0, 1], 5: [2]}, 11)


def test_the_store_evicts_an_expert_whose_slot_fits(rt):
    """Layer 0's experts take 4 KiB slots, layer 1's 8 KiB: room for a layer-0 expert comes from
    another layer-0 expert, although layer 1's, chosen once long ago, are the likelier victims."""
    from swapmoe.runtime.experts.store import ExpertStore

    index = rt.HeaderIndex([[4096] * 8, [8192] * 8])
    store = ExpertStore(index, rt.NullSlotEngine({4096: 2, 8192: 2}, 8192), 2 * 4096 + 2 * 8192)
    for layer, ids in [(1, [0, 1])] + [(0, [0, 1])] * 5:
        store.start_reads(layer, ids)
        for e in ids:
            store.expert(layer, e)
    store.start_reads(0, [2])
    store.expert(0, 2)
    assert sorted(store._entries) == [(0, 1), (0, 2), (1, 0), (1, 1)]
