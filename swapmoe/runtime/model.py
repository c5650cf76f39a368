"""`swapmoe.load(path)`: a GGUF MoE model ready to score and generate text."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Iterator

import numba
import numpy as np

from swapmoe.errors import SwapmoeError
from swapmoe.gguf_file import open_gguf
from swapmoe.runtime.experts.store import MappedExpertStore
from swapmoe.runtime.models import ARCHITECTURES
from swapmoe.runtime.sampling import Sampler, Sampling
from swapmoe.runtime.tokenizer import Tokenizer

BATCH = 256  # prompt tokens per forward pass: each expert is read once per batch


class Model:
    """A loaded model. `stats` describes the last call of logits() or generate()."""

    def __init__(self, path: str | os.PathLike, ctx: int | None = None, threads: int | None = None):
        self.path = Path(path)
        self.gguf = open_gguf(self.path)
        arch = self.gguf.arch
        if arch not in ARCHITECTURES:
            raise SwapmoeError(f"{self.path}: architecture {arch} is not supported yet "
                               f"(supported: {', '.join(sorted(ARCHITECTURES))})")
        if threads:
            numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        self.store = MappedExpertStore(self.gguf)
        self.net = ARCHITECTURES[arch](self.gguf, self.store)
        self.tokenizer = Tokenizer.from_gguf(self.path)
        self.n_ctx = ctx or min(self.net.hp.n_ctx_train, 4096)
        self.stats: dict = {}

    # --- text <-> tokens -------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special)

    def detokenize(self, ids) -> str:
        return self.tokenizer.decode(list(ids))

    # --- scoring and generation -------------------------------------------------------------
    def _check_ids(self, ids: np.ndarray) -> None:
        if ids.size and (ids.min() < 0 or ids.max() >= self.net.n_vocab):
            raise SwapmoeError(f"token id out of range 0..{self.net.n_vocab - 1}")

    def _prefill(self, ids: np.ndarray, cache, all_logits: bool) -> np.ndarray:
        outs = [self.net.forward(ids[i:i + BATCH], cache, all_logits) for i in range(0, len(ids), BATCH)]
        return np.concatenate(outs) if all_logits else outs[-1]

    def _start_stats(self) -> None:
        self.stats = {"prompt_tokens": 0, "prompt_seconds": 0.0, "decode_tokens": 0, "decode_seconds": 0.0}
        self._bytes_before = self.store.stats.bytes_requested

    def _finish_stats(self) -> None:
        self.stats["bytes_read"] = self.store.stats.bytes_requested - self._bytes_before

    def logits(self, token_ids) -> np.ndarray:
        """float32 [n_tokens, n_vocab]: the logits after every position, in a fresh context."""
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        self._check_ids(ids)
        if len(ids) > self.n_ctx:
            raise SwapmoeError(f"{len(ids)} tokens exceed the context of {self.n_ctx}")
        self._start_stats()
        start = time.perf_counter()
        out = self._prefill(ids, self.net.new_cache(len(ids)), all_logits=True)
        self.stats.update(prompt_tokens=len(ids), prompt_seconds=time.perf_counter() - start)
        self._finish_stats()
        return out

    def generate(self, prompt: str | list[int], max_tokens: int = 128, ignore_eos: bool = False,
                 **sampling) -> Iterator[str]:
        """Yield text pieces of the continuation of `prompt` (text, or token ids)."""
        ids = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        self._check_ids(np.asarray(ids))
        if not ids:
            raise SwapmoeError("empty prompt")
        if len(ids) + max_tokens > self.n_ctx:
            raise SwapmoeError(f"prompt ({len(ids)} tokens) + {max_tokens} new tokens exceed the context of "
                               f"{self.n_ctx}; use a larger --ctx or fewer tokens")
        sampler = Sampler(Sampling(**sampling))
        stop = set() if ignore_eos else set(self.tokenizer.eot_ids)
        decoder = self.tokenizer.decoder()
        cache = self.net.new_cache(len(ids) + max_tokens)
        self._start_stats()
        start = time.perf_counter()
        logits = self._prefill(np.asarray(ids), cache, all_logits=False)[-1]
        self.stats.update(prompt_tokens=len(ids), prompt_seconds=time.perf_counter() - start)
        history = list(ids)
        start = time.perf_counter()
        try:
            for n in range(max_tokens):
                token = sampler(logits, history)
                if token in stop:
                    break
                history.append(token)
                self.stats["decode_tokens"] += 1
                piece = decoder.push(token)
                if piece:
                    yield piece
                if n + 1 < max_tokens:
                    logits = self.net.forward(np.array([token]), cache)[-1]
            tail = decoder.flush()
            if tail:
                yield tail
        finally:
            self.stats["decode_seconds"] = time.perf_counter() - start
            self._finish_stats()


def load(path: str | os.PathLike, **options) -> Model:
    """Open a GGUF MoE model for inference. Options: ctx (context length), threads."""
    return Model(path, **options)
