"""Expert-choice policies between the router and the expert store, one state per sequence.

    policy = RoutingPolicy(fixation=0, prefetch_previous=False, lookahead=False, hash_prefetch=True)
    routing = Routing(store, policy, trace)   # one per sequence: its own fixation window and history
    net.forward(tokens, cache, routing)        # the pass's blocks ask it which experts to use

Hash-routed layers (the sidecar's tables) take the experts their table gives the pass's input
tokens; no policy changes them. With hash_prefetch, `expect(tokens)` starts reading those
experts as soon as the tokens are known (before the pass that uses them).
fixation N: while decoding, each layer reuses the expert ids of the first pass of every window
    of N passes (the router still weighs the pinned experts); never for prompts.
prefetch_previous: at the start of a decoding pass, prefetch each layer's experts of the
    previous pass. lookahead: prefetch layer i+1's predicted experts after layer i.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from swapmoe.runtime import layers


@dataclass(frozen=True)
class RoutingPolicy:
    """The policies a model's plan asks for, shared by all its sequences."""

    fixation: int = 0
    prefetch_previous: bool = False
    lookahead: bool = False
    hash_prefetch: bool = True


class Routing:
    """One sequence's routing: the policies, and the state they keep between its passes."""

    def __init__(self, store, policy: RoutingPolicy, trace=None):
        """store: the ExpertStore; trace: told every pass and every layer's choice (a
        model.RoutingTrace), or None."""
        self.store = store
        self.policy = policy
        self.trace = trace
        self.hash_tables: dict[int, np.ndarray] = store.index.tables
        self.decoding = False  # the pass under way is a decoding pass (one token after others)
        self._pass = 0  # the trace's number of the pass under way
        self._tokens = np.zeros(0, np.int64)  # the pass's input tokens
        self._passes = 0  # decoding passes since the fixation window opened
        self._pinned: dict[int, np.ndarray] = {}
        self._last: dict[int, np.ndarray] = {}

    def expect(self, tokens: np.ndarray) -> None:
        """These tokens are the next input: start reading their hash-routed layers' experts, in
        layer order. One token may evict other experts (these are certain to be used); a prompt
        only fills free room, since its hash layers may need more experts than fit."""
        if not self.policy.hash_prefetch:
            return
        for layer, table in sorted(self.hash_tables.items()):
            self.store.prefetch(layer, np.unique(table[tokens]), evict=len(tokens) == 1, certain=True)

    def begin_pass(self, decoding: bool, tokens: np.ndarray) -> None:
        fixation = self.policy.fixation
        if self.trace:
            self._pass = self.trace.new_pass()
        self.decoding = decoding
        self._tokens = tokens
        self.expect(tokens)
        if not decoding:
            self._pinned.clear()
            self._passes = 0
        elif fixation and self._passes >= fixation:
            self._pinned.clear()
            self._passes = 0
        if decoding and self.policy.prefetch_previous:
            for layer, ids in self._last.items():
                self.store.prefetch(layer, np.unique(ids))
        elif decoding and self._pinned:  # fixed experts are known for the whole pass
            for layer, ids in self._pinned.items():
                self.store.prefetch(layer, ids)

    def hash_ids(self, layer: int) -> np.ndarray | None:
        """ids [T, k] of a hash-routed layer for the pass's tokens, in the table's order; None
        for a routed layer."""
        table = self.hash_tables.get(layer)
        return None if table is None else table[self._tokens].astype(np.int64)

    def select(self, layer: int, selection: np.ndarray, k: int) -> np.ndarray:
        """ids [T, k] of the chosen experts: the hash table's, else top-k of `selection` or the
        pinned ids under fixation."""
        ids = self.hash_ids(layer)
        if ids is not None:
            if self.trace:
                self.trace(self._pass, self.decoding, layer, ids, True)
            return ids
        fixing = self.decoding and self.policy.fixation
        if fixing and layer in self._pinned:
            ids = self._pinned[layer][None, :]
        else:
            ids = layers.top_k(selection, k)
            if fixing:
                self._pinned[layer] = ids[0]
        self._last[layer] = ids
        if self.trace:
            self.trace(self._pass, self.decoding, layer, ids, False)
        return ids

    def prefetch(self, layer: int, ids) -> None:
        if ids is not None and not (self.decoding and layer in self._pinned):
            self.store.prefetch(layer, ids)

    def end_pass(self) -> None:
        if self.decoding:
            self._passes += 1
        self.store.end_pass()
