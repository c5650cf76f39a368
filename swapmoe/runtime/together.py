"""Sequences that decode together: one pass for all, one product per weight, each expert read once.

    logits = forward_together(net, tokens, caches, routings)   # [S, n_vocab]

Sequence s feeds tokens[s] after its caches[s] and chooses experts with routings[s]. Each
sequence's pass is the network's forward() itself, run as a greenlet (a coroutine on this
thread) that waits at every product (linear_each) and every layer's routed experts until all
passes are there (a Meeting); then one product takes every pass's rows, and each expert any of
them chose is read once and applied to all its rows. Rows are one-token products
(kernels.separate_tokens): every sequence gets the bits it gets decoding alone.
"""

from __future__ import annotations

import functools

import greenlet
import numpy as np

from swapmoe.runtime import kernels
from swapmoe.runtime.linear import Weight, linear_each, shared_products


def forward_together(net, tokens: list[int], caches: list[list], routings: list) -> np.ndarray:
    """Logits [S, n_vocab] of one decoding pass of S sequences (the module docstring)."""
    if len(tokens) == 1:
        return net.forward(np.array(tokens[:1]), caches[0], routings[0])
    meeting = Meeting(net)
    passes = [
        functools.partial(net.forward, np.array([t]), c, r, meeting=meeting)
        for t, c, r in zip(tokens, caches, routings)
    ]
    return np.concatenate(meeting.run(passes))


class Meeting:
    """Where the passes of forward_together wait for each other. A pass that reaches a product
    (linear_each: x and its weights) or a layer's routed experts (layer, x, ids, weights) hands it
    over and suspends. When every pass is suspended or done, the largest group waiting at the
    same place (ties: the one of the lowest pass) is computed in one call on their stacked rows,
    and its passes resume with their own rows. Passes of one model take the same steps, so
    normally all of them wait at the same place."""

    def __init__(self, net):
        self.net = net
        self.scheduler = greenlet.getcurrent()
        self.waiting: dict[int, tuple] = {}  # pass -> (place, x, ...)
        self.passes: list[greenlet.greenlet] = []

    def experts(self, layer: int, x: np.ndarray, ids: np.ndarray, weights: np.ndarray) -> np.ndarray:
        return self._suspend(("experts", layer), x, ids, weights)

    def products(self, x: np.ndarray, weights: tuple[Weight, ...]) -> list[np.ndarray] | None:
        """linear.shared_products' pool: None (compute it there) for a product that is not a
        pass's: the scheduler's own, or one on another thread."""
        if greenlet.getcurrent() not in self.passes:
            return None
        return self._suspend(("products", *map(id, weights)), x, weights)

    def _suspend(self, place: tuple, x: np.ndarray, *rest):
        self.waiting[self.passes.index(greenlet.getcurrent())] = (place, x, *rest)
        return self.scheduler.switch()

    def run(self, passes: list) -> list[np.ndarray]:
        self.passes = [greenlet.greenlet(p) for p in passes]
        results: list = [None] * len(passes)

        def resume(s: int, *value) -> None:
            out = self.passes[s].switch(*value)
            if self.passes[s].dead:
                results[s] = out

        with shared_products(self.products):
            for s in range(len(passes)):
                resume(s)
            while self.waiting:
                places = [w[0] for _, w in sorted(self.waiting.items())]
                place = max(places, key=places.count)
                group = sorted(s for s, w in self.waiting.items() if w[0] == place)
                parts = [self.waiting.pop(s) for s in group]
                for s, value in zip(group, self._compute(place, parts)):
                    resume(s, value)
        return results

    def _compute(self, place: tuple, parts: list[tuple]) -> list:
        """The values the passes of `parts` (waiting at `place`) resume with, in their order."""
        x = np.concatenate([p[1] for p in parts])
        ends = np.cumsum([len(p[1]) for p in parts])[:-1]
        with kernels.separate_tokens():
            if place[0] == "experts":
                ids, weights = np.concatenate([p[2] for p in parts]), np.concatenate([p[3] for p in parts])
                return np.split(self.net.mix_experts(place[1], x, ids, weights), ends)
            products = linear_each(x, *parts[0][2])
        return [list(rows) for rows in zip(*(np.split(y, ends) for y in products))]
