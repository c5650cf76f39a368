"""The expert store: the one way every architecture reaches its routed experts.

    store.start_reads(layer, ids)  these experts are needed now: start all their reads at once
    store.ready_first(layer, ids)  the order to compute them in, and how many lead it by being resident
    store.expert(layer, id)        -> Expert, resident and kept until the next expert is asked for
    store.prefetch(layer, ids)     start reading experts that will probably be needed soon
    store.end_pass()               one forward pass is done: apply keep-recent eviction

Where an expert's bytes are comes from the sidecar index; how they get into RAM is the
engine's business (io.Engine); how many stay is decided here: a byte budget (and the engine's
room), and optionally only the N most recently used experts of each layer. Which one goes
when room is needed is the eviction policy's (policy.py; by default the expert whose next use
is expected farthest ahead). Experts certain to be needed soon (a hash-routed layer's experts
for the next token) go last of all.
"""

from __future__ import annotations

import dataclasses
import resource
import time
from collections import OrderedDict, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from gguf import GGMLQuantizationType

from swapmoe.errors import SwapmoeError
from swapmoe.runtime.experts.io import Engine, Ranges
from swapmoe.runtime.experts.policy import ORIGINS, ExpectedUse, Policy
from swapmoe.runtime.linear import Weight


def _at(view: np.ndarray) -> int:
    """Where a view of an engine's buffer begins in it (Weight.at; -1 for an array of its own)."""
    return -1 if view.base is None else view.ctypes.data - view.base.ctypes.data


@dataclass(frozen=True)
class Expert:
    """One expert of one layer: its projections and any per-expert bias/scale vectors."""

    down: Weight
    gate: Weight | None = None
    up: Weight | None = None
    gate_up: Weight | None = None
    extras: dict[str, np.ndarray] = field(default_factory=dict)  # e.g. "gate.bias" -> f32 [rows]


class _Part(NamedTuple):
    """Where one part of an expert lies in its read ranges (ExpertStore._layout)."""

    name: str
    range: int  # which of the read ranges
    start: int  # bytes into it
    length: int
    ggml_type: GGMLQuantizationType | None = None  # None: a float32 bias or scale vector
    rows: int = 0
    cols: int = 0


@dataclass
class _Entry:
    key: tuple[int, int]
    read_ranges: Ranges
    nbytes: int  # its charge (Engine.charge)
    placement: Any = None  # the engine's, from start until release
    expert: Expert | None = None
    origin: str = "demand"  # demand: needed now; prefetch: read on a guess; expected: certain to be needed; used


@dataclass
class StoreStats:
    """The store's counters since it opened."""

    requests: int = 0
    hits: int = 0
    misses: int = 0
    prefetch_issued: int = 0
    prefetch_used: int = 0
    bytes_loaded: int = 0
    evictions: int = 0
    wait_seconds: float = 0.0
    hits_per_layer: dict = field(default_factory=lambda: defaultdict(int))
    misses_per_layer: dict = field(default_factory=lambda: defaultdict(int))
    peak_resident_bytes: int = 0


@dataclass(frozen=True)
class StoreSummary:
    """A snapshot of the store (ExpertStore.summary): its counters, what is resident, the major
    page faults of the process since the store opened, the engine's name. `as_dict()` for JSON."""

    requests: int
    hits: int
    misses: int
    prefetch_issued: int
    prefetch_used: int
    bytes_loaded: int
    evictions: int
    wait_seconds: float
    hits_per_layer: dict[int, int]
    misses_per_layer: dict[int, int]
    peak_resident_bytes: int
    resident_bytes: int
    major_faults: int
    engine: str
    policy: str

    @property
    def prefetch_precision(self) -> float | None:
        return self.prefetch_used / self.prefetch_issued if self.prefetch_issued else None

    @property
    def prefetch_recall(self) -> float | None:
        return self.prefetch_used / self.requests if self.requests else None

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["prefetch_precision"], out["prefetch_recall"] = self.prefetch_precision, self.prefetch_recall
        return out


class ExpertStore:
    def __init__(
        self,
        index,
        engine: Engine,
        budget_bytes: int | None = None,
        keep_recent: int | None = None,
        policy: Policy | None = None,
    ):
        """index: an ExpertIndex; engine: how bytes get into RAM (io.Engine); budget_bytes:
        resident expert bytes allowed (None: no limit); keep_recent: after each pass keep only this
        many most recently used experts per layer; policy: which expert goes first when room is
        needed (default ExpectedUse)."""
        self.index = index
        self.engine = engine
        self.budget = budget_bytes
        self.keep_recent = keep_recent
        self.evicts = budget_bytes is not None or engine.sized_rooms  # else all stay once read
        # told of every event only where it may be asked for a victim
        self.policy = policy or ExpectedUse(index.n_layer, index.n_expert, index.moe_layers())
        self.stats = StoreStats()
        self.resident_bytes = 0
        self._entries: dict[tuple[int, int], _Entry] = {}
        self._current: tuple[int, int] | None = None  # the expert being computed: never evicted
        self._needed: set[tuple[int, int]] = set()  # asked for by start_reads and not used yet
        self._guessed: dict[int, set[int]] = defaultdict(set)  # per layer: read on a guess for its next visit
        self._recent: dict[int, OrderedDict[int, None]] = defaultdict(OrderedDict)
        self._slices: dict[tuple[int, int], tuple[Ranges, int]] = {}  # per expert: its ranges and charge
        self._layouts: dict[tuple[int, int], list[_Part]] = {}  # per expert: see _layout
        self._majflt_start = resource.getrusage(resource.RUSAGE_SELF).ru_majflt

    # --- what an expert is made of ----------------------------------------------------------
    def _new_entry(self, layer: int, expert: int) -> _Entry:
        key = (layer, expert)
        if key not in self._slices:
            index = self.index
            in_range = 0 <= layer < index.n_layer and 0 <= expert < index.n_expert
            if not in_range or not index.part_length[layer, expert].any():
                raise SwapmoeError(f"no routed expert {expert} in layer {layer}")
            ranges = [(r.file, r.offset, r.length) for r in index.slice(layer, expert)]
            self._slices[key] = ranges, self.engine.charge(ranges)
        return _Entry(key, *self._slices[key])

    def _build_expert(self, entry: _Entry, range_views: list[np.ndarray]) -> Expert:
        layout = self._layouts.get(entry.key)
        if layout is None:
            layout = self._layouts[entry.key] = self._layout(entry)
        weights, extras = {}, {}
        for part in layout:
            raw = range_views[part.range][part.start : part.start + part.length]
            if part.ggml_type is None:
                extras[part.name] = raw.view(np.float32)
            else:
                weights[part.name] = Weight(raw, part.ggml_type, part.rows, part.cols, stacked=True, at=_at(raw))
        return Expert(extras=extras, **weights)

    def _layout(self, entry: _Entry) -> list[_Part]:
        """Where the expert's parts lie in its read ranges: the same on every read, so worked out
        once per expert."""
        index, (layer, expert) = self.index, entry.key
        parts = {}
        for p, name in enumerate(index.parts):
            length = int(index.part_length[layer, expert, p])
            if not length:
                continue
            f, off = int(index.part_file[layer, expert, p]), int(index.part_offset[layer, expert, p])
            for r, (rf, ro, rn) in enumerate(entry.read_ranges):
                if rf == f and ro <= off and off + length <= ro + rn:
                    break
            else:
                raise SwapmoeError(
                    f"index inconsistency: part {name} of expert {expert} layer {layer} not in its slice"
                )
            ne = [int(d) for d in index.part_ne[layer, p] if d]
            if "." in name:  # bias or scale: float32 per row
                parts[name] = _Part(name, r, off - ro, length)
            else:
                parts[name] = _Part(
                    name,
                    r,
                    off - ro,
                    length,
                    GGMLQuantizationType(int(index.part_type[layer, p])),
                    int(np.prod(ne[1:])),
                    ne[0],
                )
        if "down" not in parts:
            raise SwapmoeError(f"layer {layer} has no ffn_down_exps part")
        gate, up = parts.get("gate"), parts.get("up")
        if (
            gate is not None
            and up is not None
            and gate.range == up.range
            and gate.start + gate.length == up.start
            and gate.rows % 8 == 0
            and (gate.ggml_type, gate.rows, gate.cols) == (up.ggml_type, up.rows, up.cols)
            and "gate.bias" not in parts
            and "up.bias" not in parts
        ):
            # up's bytes follow gate's (a repacked file lays an expert out as gate, up, down): one
            # matrix of 2F rows, one kernel call instead of two.  Rows are computed independently,
            # so results are the same; F % 8 == 0 because llama.cpp's rounding route depends on
            # rows % 8 (kernels.ggml_order).
            parts["gate_up"] = gate._replace(name="gate_up", length=gate.length + up.length, rows=2 * gate.rows)
            del parts["gate"], parts["up"]
        return list(parts.values())

    # --- residency --------------------------------------------------------------------------
    def _victims(self, layer: int, need: int) -> Iterator[tuple[int, int]]:
        """Evictable experts while `layer` is being served and an expert of charge `need` waits for
        room, best victim first (the policy's order; never the expert being computed nor one
        start_reads asked for that is not used yet)."""
        n_expert = self.index.n_expert
        in_use = self._needed if self._current is None else self._needed | {self._current}
        pinned = np.array([k[0] * n_expert + k[1] for k in in_use], np.int64)
        yield from self.policy.victims(layer, need if self.engine.sized_rooms else 0, pinned)

    def _over(self, nbytes: int) -> bool:
        """Would `nbytes` more exceed the budget (or find no room in the engine)?"""
        if not self.engine.has_room(nbytes):
            return True
        return self.budget is not None and self.resident_bytes + nbytes > self.budget

    def _make_room(self, nbytes: int, layer: int, victims: dict | None = None) -> None:
        """Evict unpinned experts (in _victims order) until `nbytes` more fit the budget (and the
        engine has room). `victims`: rankings made earlier in the same start_reads, by bytes needed;
        its admissions change no other expert's rank, so one ranking serves them all."""
        if not self._over(nbytes):
            return
        ranking = None if victims is None else victims.get(nbytes)
        if ranking is None:
            ranking = self._victims(layer, nbytes)
            if victims is not None:
                victims[nbytes] = ranking
        for key in ranking:
            self._evict(key)
            if not self._over(nbytes):
                return
        if self._over(nbytes):
            raise SwapmoeError("the expert cache is too small for one layer's experts; raise --expert-cache-size")

    def _evict(self, key: tuple[int, int]) -> None:
        entry = self._entries.pop(key)
        self.engine.release(entry.placement)
        if self.evicts:
            self.policy.evicted(key)
        self.resident_bytes -= entry.nbytes
        self.stats.evictions += 1

    def _admit(self, layer: int, expert: int, origin: str, victims: dict | None = None) -> _Entry:
        """Make room for an expert and start reading it."""
        entry = self._new_entry(layer, expert)
        self._make_room(entry.nbytes, layer, victims)
        entry.placement = self.engine.start(entry.read_ranges, entry.nbytes)
        entry.origin = origin
        self._entries[entry.key] = entry
        if self.evicts:
            self.policy.admitted(entry.key, ORIGINS.index(origin), entry.nbytes)
        self.resident_bytes += entry.nbytes
        self.stats.bytes_loaded += entry.nbytes
        self.stats.peak_resident_bytes = max(self.stats.peak_resident_bytes, self.resident_bytes)
        return entry

    def _mark(self, entry: _Entry, origin: str) -> None:
        entry.origin = origin
        if self.evicts:
            self.policy.marked(entry.key, ORIGINS.index(origin))

    def _ready(self, entry: _Entry) -> Expert:
        if entry.expert is None:
            start = time.perf_counter()
            views = self.engine.finish(entry.placement)
            self.stats.wait_seconds += time.perf_counter() - start
            entry.expert = self._build_expert(entry, views)
        return entry.expert

    # --- the interface the models use ---------------------------------------------------------
    def start_reads(self, layer: int, ids) -> list[int]:
        """Start reading every expert the layer's tokens chose that is not resident, so the reads
        overlap each other and the computation of the ones already in (as far as the budget
        allows). `ids`: each token's experts, [tokens, k] oldest token first (a flat list: one
        token's). Returns the distinct experts chosen, ascending."""
        choice = np.asarray(ids, dtype=np.int64)
        choice = choice.reshape(-1, choice.shape[-1]) if choice.ndim > 1 else choice[None]
        if self.evicts:
            self.policy.chosen(layer, choice)
        # the resident ones are needed now too: never evict them to make room for the others
        ids = sorted(set(choice.ravel().tolist()))
        self._needed = {(layer, e) for e in ids}
        for e in self._guessed.pop(layer, ()):  # the visit they were read for: a wrong guess is
            entry = self._entries.get((layer, e))  # judged from now on like any expert
            if entry is not None and entry.origin in ("prefetch", "expected") and (layer, e) not in self._needed:
                self._mark(entry, "used")
        victims: dict = {}
        for e in ids:
            key = (layer, e)
            if key not in self._entries:
                try:
                    self._admit(*key, origin="demand", victims=victims)
                except SwapmoeError:  # the rest will be read one by one as they are asked for
                    break
        return ids

    def ready_first(self, layer: int, ids) -> tuple[list[int], int]:
        """`ids` (after start_reads) in the order to compute them, and how many of them lead that
        order by having been resident before start_reads: those first, then the ones it started
        reading, then any it found no room for (expert() reads those one at a time). The reads
        then overlap the computation of the experts already in. Asking for the resident ones
        admits nothing, so all of them stay resident until another expert is asked for: they can
        be computed together. The results do not depend on the order, and the order does not
        depend on timing, so a replay of the same requests stays exact."""
        resident, reading, later = [], [], []
        for e in _ints(ids):
            entry = self._entries.get((layer, e))
            (later if entry is None else reading if entry.origin == "demand" else resident).append(e)
        return resident + reading + later, len(resident)

    def expert(self, layer: int, expert: int) -> Expert:
        """Expert `expert` of `layer`, resident; it is not evicted before the next expert is asked for."""
        key = (layer, int(expert))
        self._current = None
        entry = self._entries.get(key)
        self.stats.requests += 1
        if entry is None:
            entry = self._admit(*key, origin="demand")
        if entry.origin == "demand":
            self.stats.misses += 1
            self.stats.misses_per_layer[layer] += 1
        else:
            self.stats.hits += 1
            self.stats.hits_per_layer[layer] += 1
            self.stats.prefetch_used += entry.origin in ("prefetch", "expected")
        entry.origin = "used"
        if self.evicts:
            self.policy.used(key)
        self._needed.discard(key)
        self._current = key
        if self.keep_recent is not None:
            recent = self._recent[layer]
            recent[key[1]] = None
            recent.move_to_end(key[1])
        return entry.expert if entry.expert is not None else self._ready(entry)

    def prefetch(self, layer: int, ids, evict: bool = True, certain: bool = False) -> None:
        """Start bringing in experts that will probably (certain=True: surely) be needed soon; never
        evicts ones in use (evict=False: none at all, only free room is filled)."""
        for e in ids:
            key = (layer, int(e))
            if key in self._entries:
                continue
            if not evict and self._over(self._new_entry(*key).nbytes):
                return
            try:
                self._admit(*key, origin="expected" if certain else "prefetch")
            except SwapmoeError:  # no room without evicting what is in use: skip the hint
                return
            self._guessed[layer].add(key[1])
            self.stats.prefetch_issued += 1

    def end_pass(self) -> None:
        """After a forward pass: keep only the `keep_recent` most recently used experts of each layer."""
        if self.keep_recent is None:
            return
        for layer, recent in self._recent.items():
            while len(recent) > self.keep_recent:
                expert, _ = recent.popitem(last=False)
                if (layer, expert) in self._entries and (layer, expert) != self._current:
                    self._evict((layer, expert))

    def preload(self) -> None:
        """Read every expert now (streaming off): nothing is read later, nothing is evicted."""
        for layer in self.index.moe_layers():
            for expert in range(self.index.n_expert):
                if (layer, expert) not in self._entries:
                    self._ready(self._admit(layer, expert, origin="used"))

    def summary(self) -> StoreSummary:
        s = self.stats
        return StoreSummary(
            s.requests, s.hits, s.misses, s.prefetch_issued, s.prefetch_used, s.bytes_loaded, s.evictions,
            s.wait_seconds, dict(s.hits_per_layer), dict(s.misses_per_layer), s.peak_resident_bytes,
            self.resident_bytes, resource.getrusage(resource.RUSAGE_SELF).ru_majflt - self._majflt_start,
            self.engine.name, self.policy.name,
        )  # fmt: skip

    def close(self) -> None:
        self.engine.close()


def _ints(ids) -> list[int]:
    """Expert ids as Python ints (one conversion for a whole array)."""
    return ids.tolist() if isinstance(ids, np.ndarray) else [int(e) for e in ids]
