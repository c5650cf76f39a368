"""Random but valid quantized blocks for every ggml type.

Any bit pattern is a valid quant block except for the scale fields: so a block is random
bytes with its scales overwritten by finite values, calibrated so that the dequantized
weights have the requested standard deviation. Big tensors are cut from a pool of such
blocks, which is what lets the generator write at disk speed.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T
from gguf.quants import dequantize

# Byte offsets of the fp16 scale fields inside one block, per type. Each field is scaled by
# the same per-block factor, so the weights stay a linear function of one "d".
_F16_SCALES: dict[T, tuple[int, ...]] = {
    T.Q4_0: (0,),
    T.Q4_1: (0, 2),
    T.Q5_0: (0,),
    T.Q5_1: (0, 2),
    T.Q8_0: (0,),
    T.Q2_K: (80, 82),
    T.Q3_K: (108,),
    T.Q4_K: (0, 2),
    T.Q5_K: (0, 2),
    T.Q6_K: (208,),
    T.IQ2_XXS: (0,),
    T.IQ2_XS: (0,),
    T.IQ2_S: (0,),
    T.IQ3_XXS: (0,),
    T.IQ3_S: (0,),
    T.IQ1_S: (0,),
    T.IQ4_NL: (0,),
    T.IQ4_XS: (0,),
}
# Byte offset of the fp16 min field of the types whose values are d * q + min (Q4_1, Q5_1) or
# d * scale * q - dmin * min (Q2_K, Q4_K, Q5_K): its other scale fields hold d.
_MIN_FIELD: dict[T, int] = {T.Q4_1: 2, T.Q5_1: 2, T.Q2_K: 82, T.Q4_K: 2, T.Q5_K: 2}
FLOAT_TYPES = (T.F32, T.F16, T.BF16)
QUANT_TYPES = tuple(_F16_SCALES) + (T.IQ1_M, T.MXFP4)

POOL_BYTES = 16 << 20


def _set_iq1m_scale(blocks: np.ndarray, d: np.ndarray) -> None:
    """IQ1_M keeps its fp16 block scale in the top nibble of each of its four uint16 scale words."""
    bits = d.astype(np.float16).view(np.uint16)
    scales = blocks[:, 48:56].copy().view(np.uint16)  # 4 words
    for i in range(4):
        nibble = (bits >> (4 * i)) & 0xF
        scales[:, i] = (scales[:, i] & 0x0FFF) | (nibble << 12)
    blocks[:, 48:56] = scales.view(np.uint8)


def _with_scale(ggml_type: T, raw: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Overwrite the scale fields of `raw` blocks with per-block scale `d` (float array)."""
    blocks = raw.copy()
    if ggml_type == T.IQ1_M:
        _set_iq1m_scale(blocks, d)
    elif ggml_type == T.MXFP4:
        # e8m0 exponent byte: value scale 2^(e-128); d is the log2 offset, kept integral
        blocks[:, 0] = np.clip(np.round(128 + d), 1, 254).astype(np.uint8)
    else:
        f16 = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
        for off in _F16_SCALES[ggml_type]:
            blocks[:, off : off + 2] = f16
    return blocks


@lru_cache(maxsize=None)
def _unit_std(ggml_type: T) -> float:
    """Std of dequantized random blocks whose scale is 1 (log2 offset 0 for MXFP4)."""
    rng = np.random.default_rng(0)
    block, size = GGML_QUANT_SIZES[ggml_type]
    raw = rng.integers(0, 256, (64, size), dtype=np.uint8)
    blocks = _with_scale(ggml_type, raw, np.zeros(64) if ggml_type == T.MXFP4 else np.ones(64))
    if ggml_type in _MIN_FIELD:
        blocks = _zero_mean(ggml_type, blocks)
    return float(dequantize(blocks.reshape(-1), ggml_type).std())


def random_blocks(ggml_type: T, n_blocks: int, std: float, rng: np.random.Generator) -> np.ndarray:
    """`n_blocks` valid blocks of `ggml_type` as uint8 [n_blocks, type_size]; weights have ~`std`."""
    block, size = GGML_QUANT_SIZES[ggml_type]
    raw = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    spread = rng.uniform(0.5, 1.5, n_blocks)  # blocks differ in scale, as real ones do
    if ggml_type == T.MXFP4:
        d = np.log2(std / _unit_std(ggml_type)) + np.log2(spread)
    else:
        d = std / _unit_std(ggml_type) * spread
    blocks = _with_scale(ggml_type, raw, d)
    return _zero_mean(ggml_type, blocks) if ggml_type in _MIN_FIELD else blocks


def _zero_mean(ggml_type: T, blocks: np.ndarray) -> np.ndarray:
    """Set each block's min field so that its values average zero.

    With random bytes there the quants (all >= 0) give every block a mean about as large as its
    spread; all rows of a matrix then share one direction (random Q4_K embedding rows: mean 1.0,
    std 1.1, pairwise cosine 0.46), and after one attention layer every token of a synthetic
    model carried nearly the same hidden state and chose the same experts."""
    off, n = _MIN_FIELD[ggml_type], len(blocks)
    block = GGML_QUANT_SIZES[ggml_type][0]
    one, zero = (np.array([v], np.float16).view(np.uint8) for v in (1, 0))
    without_min = blocks.copy()
    without_min[:, off : off + 2] = zero
    mean_without = dequantize(without_min.reshape(-1), ggml_type).reshape(n, block).mean(axis=1)
    min_only = blocks.copy()  # every d field 0, the min field 1: the block's mean per unit min
    for field in _F16_SCALES[ggml_type]:
        min_only[:, field : field + 2] = one if field == off else zero
    mean_per_min = dequantize(min_only.reshape(-1), ggml_type).reshape(n, block).mean(axis=1)
    safe = mean_per_min != 0  # a K-quant block whose mins are all 0 keeps its mean
    value = np.zeros(n)
    value[safe] = -mean_without[safe] / mean_per_min[safe]
    out = blocks.copy()
    out[:, off : off + 2] = np.clip(value, -60000, 60000).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return out


def random_floats(ggml_type: T, n: int, std: float, rng: np.random.Generator, mean: float = 0.0) -> np.ndarray:
    """`n` normal values stored as F32, F16 or BF16, returned as raw bytes."""
    x = (rng.standard_normal(n, dtype=np.float32) * std + mean).astype(np.float32)
    if ggml_type == T.F32:
        return x.view(np.uint8)
    if ggml_type == T.F16:
        return x.astype(np.float16).view(np.uint8)
    if ggml_type == T.BF16:
        return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)  # truncation is fine for noise
    raise ValueError(f"{ggml_type.name} is not a float type")


class BlockPool:
    """A few MiB of random data of one type; tensors are cut from it at random block offsets."""

    def __init__(self, ggml_type: T, std: float, rng: np.random.Generator, pool_bytes: int = POOL_BYTES):
        self.ggml_type = ggml_type
        block, self.type_size = GGML_QUANT_SIZES[ggml_type]
        # an odd block count keeps tensor sizes (powers of two) from lining up with the pool period
        n_blocks = (pool_bytes // self.type_size) | 1
        if ggml_type in FLOAT_TYPES:
            elements = n_blocks * block
            self.data = random_floats(ggml_type, elements, std, rng)
        else:
            self.data = random_blocks(ggml_type, n_blocks, std, rng).reshape(-1)
        self.n_blocks = n_blocks
        self.rng = rng

    def chunks(self, nbytes: int, max_chunk: int = 8 << 20):
        """Yield memoryviews totalling `nbytes`, starting at a random block of the pool."""
        pos = int(self.rng.integers(self.n_blocks)) * self.type_size
        while nbytes:
            n = min(nbytes, max_chunk, len(self.data) - pos)
            yield memoryview(self.data)[pos : pos + n]
            nbytes -= n
            pos = (pos + n) % len(self.data)
