"""Comparing two models' next-token distributions (parity with llama.cpp, fixation quality)."""

from __future__ import annotations

import numpy as np


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log p over the last axis, in double."""
    x = logits.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def kl_divergence(ref_logits: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """KL(ref || other) in nats, per position, from two sets of logits [..., n_vocab]."""
    ref, other = log_softmax(ref_logits), log_softmax(logits)
    return (np.exp(ref) * (ref - other)).sum(axis=-1)
