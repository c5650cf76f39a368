"""Eviction policies: which resident expert the store gives up first when it needs room.

The store owns residency (which experts are in RAM and why each was read) and tells its policy
every event: a layer visit's choices (`chosen`), an expert read (`admitted`), read on a guess or
needed after all (`marked`), computed (`used`), evicted (`evicted`). `victims` ranks what may go.

Every policy follows the same rules, kept by the base class: never an expert read for the
current visit and not yet used, nor one the store pins (in use), and where the engine's rooms
are sized (Engine.sized_rooms) only one of the charge that waits; experts certain to be needed
soon (origin "expected": a hash-routed layer's, for the next token) go after all others. A
policy is one subclass that scores the candidates: the highest goes first, the least recently
used first among equals.

POLICIES names them for the store (ExpertStore's `policy`) and tools/replay_trace.py, which
replays a recorded trace through the real store with any of them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numba
import numpy as np

from swapmoe.errors import SwapmoeError

ORIGINS = ("used", "prefetch", "expected", "demand")  # why an expert is resident; see the store's _Entry
USED, PREFETCH, EXPECTED, DEMAND = range(len(ORIGINS))
SHARE_WEIGHT = 0.1  # weight of a layer's newest token in its experts' running shares (ExpectedUse)


class Policy:
    """The base: per expert its origin's code (-1: not resident), charge and last use."""

    name = ""

    def __init__(self, n_layer: int, n_expert: int, moe_layers: Sequence[int]):
        shape = (n_layer, n_expert)
        self.n_expert = n_expert
        self.origin = np.full(shape, -1, np.int8)
        self.nbytes = np.zeros(shape, np.int64)
        self.used_at = np.zeros(shape, np.int64)
        self._clock = 0

    def chosen(self, layer: int, choice: np.ndarray) -> None:
        """A visit of `layer` begins: each token's experts, [tokens, k], oldest token first."""

    def admitted(self, key: tuple[int, int], origin: int, nbytes: int) -> None:
        self.origin[key] = origin
        self.nbytes[key] = nbytes
        self._touch(key)

    def marked(self, key: tuple[int, int], origin: int) -> None:
        self.origin[key] = origin

    def used(self, key: tuple[int, int]) -> None:
        self.origin[key] = USED
        self._touch(key)

    def evicted(self, key: tuple[int, int]) -> None:
        self.origin[key] = -1

    def _touch(self, key: tuple[int, int]) -> None:
        self._clock += 1
        self.used_at[key] = self._clock

    def scores(self, layer: int, flat: np.ndarray) -> np.ndarray:
        """Each candidate's score (flat indices layer * n_expert + expert) while `layer` is
        served: the highest is evicted first."""
        raise NotImplementedError

    def victims(self, layer: int, need: int, pinned: np.ndarray) -> Iterator[tuple[int, int]]:
        """The evictable experts, best victim first, while `layer` is served and an expert of
        charge `need` waits (need 0: of any charge); `pinned`: flat indices never to evict."""
        flat, certain = _candidates(self.origin, self.nbytes, need, pinned)
        score, last_used = self.scores(layer, flat), self.used_at.ravel()[flat]
        for group in (~certain, certain):
            for i in _highest_first(np.flatnonzero(group), score, last_used):
                yield divmod(int(flat[i]), self.n_expert)


class ExpectedUse(Policy):
    """The store's default: the expert whose next use is expected farthest ahead. An expert of
    layer l chosen by a share p of l's tokens is expected back at l's next visit with
    probability p, so after about 1/p visits of l: (l's distance ahead in the layer cycle) +
    (1/p - 1) cycles of layer visits. The shares are running averages over each layer's tokens,
    the newest weighted most (SHARE_WEIGHT), so after a prompt the experts of its last tokens,
    which decoding chooses again, stay. An expert read on a guess is expected at its layer's next
    visit (its share judges it once that visit has not chosen it).

    Replayed on recorded traces (tools/replay_trace.py) this reads 9-31 % less than LRU where the
    budget holds a fifth of the experts or less, 0-21 % less with more."""

    name = "expected"

    def __init__(self, n_layer: int, n_expert: int, moe_layers: Sequence[int]):
        super().__init__(n_layer, n_expert, moe_layers)
        self.share = np.zeros((n_layer, n_expert))  # per layer and expert: the share of its tokens that chose it
        self.cycle = np.zeros(n_layer, np.int64)  # each MoE layer's place in the layer cycle
        self.cycle[list(moe_layers)] = np.arange(len(moe_layers))
        self.cycle_length = max(1, len(moe_layers))

    def chosen(self, layer: int, choice: np.ndarray) -> None:
        _update_shares(self.share[layer], choice, SHARE_WEIGHT)

    def scores(self, layer: int, flat: np.ndarray) -> np.ndarray:
        return _expected_distance(flat, self.origin, self.share, self.cycle, layer, self.cycle_length)


class LRU(Policy):
    """The least recently used expert first, over all layers."""

    name = "lru"

    def scores(self, layer: int, flat: np.ndarray) -> np.ndarray:
        return -self.used_at.ravel()[flat]


class LFU(Policy):
    """The expert used least often so far first (counted over the whole run, also while evicted)."""

    name = "lfu"

    def __init__(self, n_layer: int, n_expert: int, moe_layers: Sequence[int]):
        super().__init__(n_layer, n_expert, moe_layers)
        self.count = np.zeros((n_layer, n_expert), np.int64)

    def used(self, key: tuple[int, int]) -> None:
        super().used(key)
        self.count[key] += 1

    def scores(self, layer: int, flat: np.ndarray) -> np.ndarray:
        return -self.count.ravel()[flat]


class MIN(Policy):
    """Belady's offline MIN at the store's granularity: the resident expert whose next visit
    that uses it is farthest in the future (or never comes) first. `future`: (layer, experts)
    of every visit the store will see, in order: a recorded trace's. Optimal (fewest reads)
    when all experts have one size; with unequal sizes the usual farthest-next-use heuristic."""

    name = "min"
    NEVER = np.iinfo(np.int64).max

    def __init__(
        self, n_layer: int, n_expert: int, moe_layers: Sequence[int], future: Sequence[tuple[int, Sequence[int]]]
    ):
        super().__init__(n_layer, n_expert, moe_layers)
        self.next_use = np.full((n_layer, n_expert), self.NEVER, np.int64)
        self._visit = -1
        self._after: list[dict[int, int]] = [{}] * len(future)  # per visit: expert -> its next visit
        upcoming: dict[tuple[int, int], int] = {}
        for v in range(len(future) - 1, -1, -1):
            layer, experts = future[v]
            self._after[v] = {int(e): upcoming.get((layer, int(e)), self.NEVER) for e in experts}
            upcoming.update({(layer, int(e)): v for e in experts})

    def chosen(self, layer: int, choice: np.ndarray) -> None:
        self._visit += 1
        if self._visit >= len(self._after):
            raise SwapmoeError(f"MIN was given {len(self._after)} visits of the future and asked for more")

    def used(self, key: tuple[int, int]) -> None:
        super().used(key)
        self.next_use[key] = self._after[self._visit].get(key[1], self.NEVER)

    def scores(self, layer: int, flat: np.ndarray) -> np.ndarray:
        return self.next_use.ravel()[flat]


POLICIES: dict[str, type[Policy]] = {p.name: p for p in (ExpectedUse, LRU, LFU, MIN)}
DEFAULT_POLICY = ExpectedUse.name


@numba.njit(cache=True, nogil=True)
def _candidates(origin, nbytes, need, pinned):
    """The evictable experts as flat indices layer * n_expert + expert (resident, not read for the
    current visit and unused, not `pinned`, of charge `need` unless need is 0), and whether each
    is certain to be needed soon (origin EXPECTED)."""
    held = np.zeros(origin.size, np.bool_)
    held[pinned] = True
    flat_origin, flat_bytes = origin.ravel(), nbytes.ravel()
    flat = np.empty(origin.size, np.int64)
    certain = np.empty(origin.size, np.bool_)
    n = 0
    for i in range(origin.size):
        o = flat_origin[i]
        if o < 0 or o == DEMAND or held[i] or (need != 0 and flat_bytes[i] != need):
            continue
        flat[n] = i
        certain[n] = o == EXPECTED
        n += 1
    return flat[:n], certain[:n]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _expected_distance(flat, origin, share, cycle, layer, cycle_length):
    """ExpectedUse's score: each candidate's expected distance to its next use, in layer visits."""
    n_expert = origin.shape[1]
    out = np.empty(len(flat))
    for n in range(len(flat)):
        other, e = flat[n] // n_expert, flat[n] % n_expert
        ahead = (cycle[other] - cycle[layer]) % cycle_length
        if ahead == 0:
            ahead = cycle_length
        p = 1.0 if origin[other, e] == PREFETCH else share[other, e]
        out[n] = ahead + cycle_length * (1.0 / p - 1.0)
    return out


@numba.njit(cache=True, nogil=True)
def _update_shares(share: np.ndarray, choice: np.ndarray, weight: float) -> None:
    """Each row of `choice` (a token's experts, oldest first) decays every share by (1 - weight)
    and adds `weight` to its own experts'. A layer's first visit starts from an even share."""
    if not share.any():
        share[:] = choice.shape[1] / share.size
    for row in choice:
        share *= 1.0 - weight
        for e in row:
            share[e] += weight


def _highest_first(candidates: np.ndarray, score: np.ndarray, used_at: np.ndarray, chunk: int = 64) -> Iterator[int]:
    """`candidates` (indices into score and used_at) by score, highest first, the least recently
    used first among equals. Sorted a chunk at a time: an eviction usually needs the first few of
    thousands of resident experts."""
    while len(candidates):
        if len(candidates) > chunk:
            cut = np.partition(score[candidates], len(candidates) - chunk)[len(candidates) - chunk]
            top, candidates = candidates[score[candidates] >= cut], candidates[score[candidates] < cut]
        else:
            top, candidates = candidates, candidates[:0]
        yield from top[np.lexsort((used_at[top], -score[top]))].tolist()
