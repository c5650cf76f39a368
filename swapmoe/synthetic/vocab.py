"""A small byte-level BPE vocabulary (GPT-2 style) for synthetic models.

256 byte tokens, merges learnt from a short built-in text, and ChatML special tokens:
enough for llama.cpp to load a synthetic model and tokenize any text with it.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

from gguf import TokenType

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TOKEN_NORMAL, TOKEN_CONTROL = int(TokenType.NORMAL), int(TokenType.CONTROL)

_CORPUS = """
The quick brown fox jumps over the lazy dog. A mixture of experts routes every token to a
few experts of many; the rest of the weights stay on the disk until they are needed.
def main(argv=None):
    parser = argparse.ArgumentParser(description="example")
    for index, value in enumerate(values):
        if value is None:
            return self.default
        result.append(value * 2)
    return result
class Model:
    def __init__(self, path, threads=2):
        self.path = path
        self.threads = threads
import os, sys, json
print("hello, world", file=sys.stderr)
"""


@lru_cache(maxsize=None)
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable unicode characters."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


@dataclass(frozen=True)
class Vocab:
    tokens: list[str]
    token_types: list[int]
    merges: list[str]

    @property
    def eos_id(self) -> int:
        return self.tokens.index("<|endoftext|>")


def _words(text: str) -> list[tuple[str, ...]]:
    enc = byte_to_unicode()
    pieces = re.findall(r" ?\w+| ?[^\w\s]+|\s+", text)
    return [tuple(enc[b] for b in p.encode()) for p in pieces]


@lru_cache(maxsize=None)
def build_vocab(n_merges: int = 253) -> Vocab:
    """Byte tokens, then `n_merges` greedy BPE merges of the built-in text, then specials."""
    words = Counter(_words(_CORPUS))
    merges: list[tuple[str, str]] = []
    while len(merges) < n_merges:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += count
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        merged = Counter()
        for word, count in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += count
        words = merged
    tokens = list(byte_to_unicode().values())
    seen = set(tokens)
    for a, b in merges:
        if a + b not in seen:
            tokens.append(a + b)
            seen.add(a + b)
    types = [TOKEN_NORMAL] * len(tokens) + [TOKEN_CONTROL] * len(SPECIAL_TOKENS)
    return Vocab(tokens + list(SPECIAL_TOKENS), types, [f"{a} {b}" for a, b in merges])
