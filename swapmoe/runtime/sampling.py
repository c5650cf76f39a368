"""Choosing the next token from logits: greedy, or temperature with top-k / top-p / min-p,
and repetition, presence and frequency penalties, in llama.cpp's order (penalties, top-k,
top-p, min-p, temperature)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0: greedy
    top_k: int = 40  # 0: off
    top_p: float = 0.95  # 1: off
    min_p: float = 0.05  # 0: off
    repeat_penalty: float = 1.0  # 1: off
    presence_penalty: float = 0.0  # subtracted once from a token seen in the last repeat_last_n
    frequency_penalty: float = 0.0  # ... and this times its count there
    repeat_last_n: int = 64
    seed: int | None = None


class Sampler:
    def __init__(self, params: Sampling):
        self.p = params
        self.rng = np.random.default_rng(params.seed)

    def __call__(self, logits: np.ndarray, history: list[int]) -> int:
        p = self.p
        logits = logits.astype(np.float64)
        if (p.repeat_penalty != 1.0 or p.presence_penalty or p.frequency_penalty) and history:
            recent, counts = np.unique(history[-p.repeat_last_n :], return_counts=True)
            chosen = logits[recent]
            chosen = np.where(chosen > 0, chosen / p.repeat_penalty, chosen * p.repeat_penalty)
            logits[recent] = chosen - counts * p.frequency_penalty - p.presence_penalty
        if p.temperature <= 0:
            return int(np.argmax(logits))
        order = np.argsort(-logits, kind="stable")
        if p.top_k > 0:
            order = order[: p.top_k]
        candidates = logits[order]
        probs = np.exp(candidates - candidates[0])
        probs /= probs.sum()
        keep = len(order)
        if p.top_p < 1.0:
            keep = min(keep, int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1)
        if p.min_p > 0.0:
            keep = min(keep, int(np.sum(probs >= p.min_p * probs[0])))
        candidates = candidates[: max(1, keep)] / p.temperature
        probs = np.exp(candidates - candidates[0])
        return int(order[self.rng.choice(len(probs), p=probs / probs.sum())])
