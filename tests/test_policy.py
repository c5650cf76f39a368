"""Eviction policies (swapmoe/runtime/experts/policy.py): each compiled helper against its numpy
statement, the rules every policy keeps, and each policy's order on small cases."""

import numpy as np
import pytest

from swapmoe.runtime.experts import policy as pol
from swapmoe.runtime.experts.policy import DEMAND, EXPECTED, LFU, LRU, MIN, POLICIES, PREFETCH, USED, ExpectedUse


def test_highest_first_in_chunks_is_a_full_sort():
    """The chunked ranking yields the order of one full sort: highest score first, least
    recently used among equals (many ties and infinities, chunks smaller than the ties)."""
    rng = np.random.default_rng(5)
    score = rng.choice([1.0, 2.5, 7.0, np.inf], size=300)
    used_at = rng.permutation(300)
    candidates = np.flatnonzero(rng.random(300) < 0.8)
    want = candidates[np.lexsort((used_at[candidates], -score[candidates]))].tolist()
    for chunk in (1, 7, 64, 1000):
        assert list(pol._highest_first(candidates, score, used_at, chunk)) == want


def test_update_shares_is_the_running_average():
    """The compiled share update against its numpy statement: an even start on a layer's first
    visit, then per token (oldest first) every share decays and the token's own experts gain."""
    rng = np.random.default_rng(3)
    share = np.zeros(32)
    want = np.full(32, 4 / 32)
    for tokens in (1, 5, 1, 3):
        choice = np.array([rng.choice(32, 4, replace=False) for _ in range(tokens)], np.int64)
        pol._update_shares(share, choice, pol.SHARE_WEIGHT)
        for row in choice:
            want = want * (1.0 - pol.SHARE_WEIGHT)
            want[row] += pol.SHARE_WEIGHT
        np.testing.assert_array_equal(share, want)


def test_candidates_and_expected_distance_are_the_documented_ones():
    """_candidates and ExpectedUse's score against a numpy statement of the rule: resident experts
    not read for the current visit, not pinned, of the charge asked for (0: any); expected back
    after their layer's distance ahead in the cycle plus (1/share - 1) cycles (a guess: share 1;
    never chosen: infinitely far); the certain ones flagged."""
    rng = np.random.default_rng(4)
    n_layer, n_expert, cycle_length = 5, 16, 4
    origin = rng.integers(-1, 4, (n_layer, n_expert)).astype(np.int8)
    nbytes = rng.choice([100, 200], (n_layer, n_expert)).astype(np.int64)
    share = rng.random((n_layer, n_expert)) * (rng.random((n_layer, n_expert)) < 0.8)
    cycle = np.array([0, 1, 2, 3, 0], np.int64)  # layer 4 is dense in this cycle's terms: shares layer 0's place
    pinned = np.array([0 * n_expert + 3, 2 * n_expert + 7], np.int64)
    for layer in range(n_layer):
        for need in (0, 200):
            flat, certain = pol._candidates(origin, nbytes, need, pinned)
            expected = pol._expected_distance(flat, origin, share, cycle, layer, cycle_length)
            keep = (origin >= 0) & (origin != DEMAND)
            keep.ravel()[pinned] = False
            if need:
                keep &= nbytes == need
            layers_, experts = np.nonzero(keep)
            ahead = (cycle[layers_] - cycle[layer]) % cycle_length
            ahead[ahead == 0] = cycle_length
            p = np.where(origin[layers_, experts] == PREFETCH, 1.0, share[layers_, experts])
            with np.errstate(divide="ignore"):
                want = ahead + cycle_length * (1.0 / p - 1.0)
            np.testing.assert_array_equal(flat, layers_ * n_expert + experts)
            np.testing.assert_array_equal(expected, want)
            np.testing.assert_array_equal(certain, origin[layers_, experts] == EXPECTED)
            assert np.isinf(expected).any()


def _filled(policy, keys, origin=USED, nbytes=10):
    for key in keys:
        policy.admitted(key, origin, nbytes)
        if origin == USED:
            policy.used(key)
    return policy


NONE = np.zeros(0, np.int64)


def test_every_policy_keeps_the_common_rules():
    """Whatever its score: demand reads not yet used, pinned experts and other charges are never
    offered; certain ones come last; evicted ones are gone."""
    future = [(0, [0, 1, 2, 3])] * 4
    for name, cls in POLICIES.items():
        p = cls(2, 4, [0, 1], future) if cls is MIN else cls(2, 4, [0, 1])
        p.chosen(0, np.array([[0, 1]]))
        _filled(p, [(0, 0), (0, 1), (0, 2), (1, 0)])
        p.admitted((1, 1), DEMAND, 10)
        p.admitted((1, 2), EXPECTED, 10)
        p.admitted((1, 3), USED, 20)
        p.evicted((0, 2))
        order = list(p.victims(0, 10, np.array([1 * 4 + 0], np.int64)))
        assert set(order) == {(0, 0), (0, 1), (1, 2)}, name
        assert order[-1] == (1, 2), name
        assert set(p.victims(0, 0, NONE)) == {(0, 0), (0, 1), (1, 0), (1, 2), (1, 3)}, name


def test_lru_lfu_and_min_orders():
    keys = [(0, 0), (0, 1), (0, 2)]
    lru = _filled(LRU(1, 3, [0]), keys)
    lru.used((0, 0))
    assert list(lru.victims(0, 0, NONE)) == [(0, 1), (0, 2), (0, 0)]
    lfu = _filled(LFU(1, 3, [0]), keys)
    for _ in range(2):
        lfu.used((0, 1))
    lfu.used((0, 0))
    assert list(lfu.victims(0, 0, NONE)) == [(0, 2), (0, 0), (0, 1)]
    # visits 0..3; in visit 0 all three are used: 1 comes back at visit 1, 0 at 3, 2 never
    m = MIN(1, 3, [0], [(0, [0, 1, 2]), (0, [1]), (0, [1]), (0, [0])])
    m.chosen(0, np.array([[0, 1, 2]]))
    _filled(m, keys)
    assert list(m.victims(0, 0, NONE)) == [(0, 2), (0, 0), (0, 1)]
    m.chosen(0, np.array([[1]]))
    with pytest.raises(Exception, match="visits of the future"):
        for _ in range(3):
            m.chosen(0, np.array([[1]]))


def test_expected_use_keeps_what_recent_tokens_chose_and_the_next_layers():
    """Experts the layer's tokens keep choosing stay longest; at equal shares, an expert of the
    layer just served (a whole cycle away) goes before one of the next layer."""
    p = _filled(ExpectedUse(2, 4, [0, 1]), [(0, e) for e in range(4)] + [(1, e) for e in range(4)])
    for _ in range(10):
        p.chosen(0, np.array([[0, 1]]))
        p.chosen(1, np.array([[0, 1]]))
    order = list(p.victims(0, 0, NONE))
    assert order == [(0, 2), (0, 3), (1, 2), (1, 3), (0, 0), (0, 1), (1, 0), (1, 1)]
