"""The tensors of the *original* model, wherever a file keeps their bytes.

An original GGUF, a `compat` repack and a `bundled` repack all hold the same logical
tensors; only where the bytes live differs. `logical_tensors(g)` hides that: it returns
every original tensor, in the original tensor-info order, with the byte ranges that hold
it in this file. A routed-expert tensor has one range per expert (expert e's part); any
other tensor has one range. Everything else in swapmoe.repack (plan, index, verify,
unpack) works from this list, so it treats the three kinds of file alike.

A repacked file carries the original's tensor table and header bytes in its
`swapmoe.unpack` key (see `Manifest`), which is how this module finds its way back.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field

import numpy as np
import zstandard
from gguf import GGMLQuantizationType, Keys

from swapmoe.errors import SwapmoeError
from swapmoe.gguf_file import GGUFFile, TensorClass, TensorKind, classify

LAYOUTS = ("bundled", "compat")
LAYOUT_VERSION = 1
MANIFEST_VERSION = 1
KEY_LAYOUT = "swapmoe.layout"
KEY_LAYOUT_VERSION = "swapmoe.layout_version"
KEY_PAGE_SIZE = "swapmoe.page_size"
KEY_SOURCE_DIGEST = "swapmoe.source_digest"
KEY_UNPACK = "swapmoe.unpack"

# Parts of an expert slice, in the index's order: each routed projection's weight, then
# per-expert bias and scale rows (gpt-oss has biases).
PARTS = tuple(p + suffix for suffix in ("", ".bias", ".scale") for p in ("gate", "up", "gate_up", "down"))


def part_name(cls: TensorClass) -> str:
    """Index name of a routed tensor's part: `gate`, `down`, `gate.bias`, ..."""
    return cls.projection if cls.part == "weight" else f"{cls.projection}.{cls.part}"


def expert_tensor_name(name: str, expert: int) -> str:
    """Name of expert `expert`'s own GGUF tensor in a bundled file: `blk.3.ffn_up_exps.weight.17`."""
    return f"{name}.{expert}"


@dataclass(frozen=True)
class LogicalTensor:
    name: str
    ggml_type: GGMLQuantizationType
    ne: tuple[int, ...]  # ggml order, as in the original file
    cls: TensorClass
    ranges: tuple[tuple[int, int, int], ...]  # (file, offset, length); routed: one per expert
    source: tuple[int, int]  # (shard, offset) in the original GGUF

    @property
    def routed(self) -> bool:
        return self.cls.kind is TensorKind.ROUTED_EXPERT

    @property
    def nbytes(self) -> int:
        return sum(length for _, _, length in self.ranges)


@dataclass
class Manifest:
    """What `unpack` needs to rebuild the original GGUF bit for bit, stored in the repacked file.

    Byte layout of the `swapmoe.unpack` value (a GGUF UINT8 array): zstd frame of
    `u32 json_length | JSON | pool`. JSON: {"version", "shards": [{"name", "size",
    "header_length", "gaps": [[offset, length], ...]}], "tensors": [[name, shard, offset,
    nbytes], ...]} with tensors in the original tensor-info order. The pool is, shard by
    shard, the shard's header bytes [0, data_offset) followed by its gap bytes in order
    (every byte of the shard that no tensor covers: alignment padding and any tail).
    """

    shards: list[dict]  # name, size, header_length, gaps
    tensors: list[tuple[str, int, int, int]]  # name, shard, offset, nbytes
    pool: bytes = field(repr=False)

    def encode(self) -> bytes:
        text = json.dumps(
            {"version": MANIFEST_VERSION, "shards": self.shards, "tensors": self.tensors}, separators=(",", ":")
        ).encode()
        return zstandard.ZstdCompressor(level=9).compress(struct.pack("<I", len(text)) + text + self.pool)

    @classmethod
    def decode(cls, blob: bytes) -> "Manifest":
        raw = zstandard.ZstdDecompressor().decompress(blob)
        (n,) = struct.unpack_from("<I", raw)
        meta = json.loads(raw[4 : 4 + n])
        if meta.get("version") != MANIFEST_VERSION:
            raise SwapmoeError(
                f"unpack manifest version {meta.get('version')} is not supported "
                f"(this swapmoe reads version {MANIFEST_VERSION})"
            )
        return cls(meta["shards"], [tuple(t) for t in meta["tensors"]], raw[4 + n :])

    def _pool_start(self, shard: int) -> int:
        return sum(s["header_length"] + sum(length for _, length in s["gaps"]) for s in self.shards[:shard])

    def header(self, shard: int) -> bytes:
        start = self._pool_start(shard)
        return self.pool[start : start + self.shards[shard]["header_length"]]

    def gaps(self, shard: int) -> list[tuple[int, bytes]]:
        """(offset, bytes) of every gap of a shard."""
        s = self.shards[shard]
        pos = self._pool_start(shard) + s["header_length"]
        out = []
        for offset, length in s["gaps"]:
            out.append((offset, self.pool[pos : pos + length]))
            pos += length
        return out


def read_manifest(g: GGUFFile) -> Manifest:
    blob = g.get(KEY_UNPACK)
    if blob is None:
        raise SwapmoeError(
            f"{g.path}: repacked file without its {KEY_UNPACK} key; it was not written by swapmoe or is damaged"
        )
    try:
        return Manifest.decode(bytes(np.asarray(blob, dtype=np.uint8)))
    except SwapmoeError:
        raise
    except Exception as e:
        raise SwapmoeError(f"{g.path}: damaged {KEY_UNPACK} key ({type(e).__name__}: {e})") from None


def layout_of(g: GGUFFile) -> str:
    """`bundled`, `compat`, or `original` for a file swapmoe did not repack."""
    layout = g.get(KEY_LAYOUT)
    if layout is None:
        return "original"
    if layout not in LAYOUTS or g.get(KEY_LAYOUT_VERSION) != LAYOUT_VERSION:
        raise SwapmoeError(
            f"{g.path}: swapmoe layout {layout!r} version {g.get(KEY_LAYOUT_VERSION)} is not "
            f"supported by this swapmoe (layout version {LAYOUT_VERSION})"
        )
    return layout


def _in_place(t, source: tuple[int, int]) -> LogicalTensor:
    """A tensor stored whole, as in the original file (routed ones split into expert ranges)."""
    if t.kind is TensorKind.ROUTED_EXPERT:
        n = t.expert_nbytes
        ranges = tuple((t.shard, t.offset + e * n, n) for e in range(t.n_experts))
    else:
        ranges = ((t.shard, t.offset, t.nbytes),)
    return LogicalTensor(t.name, t.ggml_type, t.ne, t.cls, ranges, source)


def logical_tensors(g: GGUFFile) -> list[LogicalTensor]:
    """Every tensor of the original model, in original order, located in this file."""
    layout = layout_of(g)
    if layout == "original":
        return [_in_place(t, (t.shard, t.offset)) for t in g.tensors.values()]
    manifest = read_manifest(g)
    out = []
    for name, shard, offset, nbytes in manifest.tensors:
        cls = classify(name)
        if layout == "bundled" and cls.kind is TensorKind.ROUTED_EXPERT:
            first = g.tensor(expert_tensor_name(name, 0))
            if first.nbytes == 0 or nbytes % first.nbytes:
                raise SwapmoeError(f"{g.path}: expert tensors of {name} do not add up to its {nbytes:,} bytes")
            parts = [g.tensor(expert_tensor_name(name, e)) for e in range(nbytes // first.nbytes)]
            for p in parts:
                if p.ggml_type != first.ggml_type or p.ne != first.ne:
                    raise SwapmoeError(f"{g.path}: expert tensor {p.name} differs in type or shape from {first.name}")
            lt = LogicalTensor(
                name,
                first.ggml_type,
                first.ne + (len(parts),),
                cls,
                tuple((p.shard, p.offset, p.nbytes) for p in parts),
                (shard, offset),
            )
        else:
            lt = _in_place(g.tensor(name), (shard, offset))
        if lt.nbytes != nbytes:
            raise SwapmoeError(f"{g.path}: tensor {name} has {lt.nbytes:,} bytes but the original had {nbytes:,}")
        out.append(lt)
    return out


def hash_tables(g: GGUFFile, tensors: list[LogicalTensor], n_expert: int) -> dict[int, np.ndarray]:
    """DeepSeek-V4 hash routing: layer -> int32 [n_vocab, k] table of expert ids, checked < n_expert."""
    tables = {}
    for t in tensors:
        if t.cls.kind is not TensorKind.HASH_TABLE:
            continue
        if t.ggml_type != GGMLQuantizationType.I32 or len(t.ne) != 2:
            raise SwapmoeError(
                f"{g.path}: hash table {t.name} should be a 2-D I32 tensor, not {t.ggml_type.name} {list(t.ne)}"
            )
        table = g.array(t.name)  # numpy shape [n_vocab, k]
        n_vocab = len(g.get(Keys.Tokenizer.LIST, ()) or ()) or table.shape[0]
        k = g.arch_get(Keys.LLM.EXPERT_USED_COUNT, table.shape[1])
        if table.shape != (n_vocab, k):
            raise SwapmoeError(
                f"{g.path}: hash table {t.name} is {table.shape[0]} tokens x {table.shape[1]} experts, "
                f"but the model has {n_vocab} tokens and uses {k} experts per token"
            )
        bad = np.argwhere((table < 0) | (table >= n_expert))
        if len(bad):
            token, slot = (int(x) for x in bad[0])
            expert = int(table[token, slot])
            raise SwapmoeError(
                f"{g.path}: hash table {t.name}: token {token} maps to expert {expert}, "
                f"but the layer has {n_expert} experts (ids must be 0..{n_expert - 1}); "
                f"{len(bad)} bad entries"
            )
        tables[t.cls.layer] = table.copy()
    return tables


def first_slots(tensors: list[LogicalTensor]) -> list[int]:
    """Digest slot of each tensor's first range: ranges are numbered in tensor order, then expert order."""
    out, slot = [], 0
    for t in tensors:
        out.append(slot)
        slot += len(t.ranges)
    return out


def tensor_digests(tensors: list[LogicalTensor], piece_digests: np.ndarray) -> np.ndarray:
    """sha256 of each tensor: of its bytes, or for a routed tensor of its experts' part digests in order."""
    out = np.zeros((len(tensors), 32), np.uint8)
    for i, (t, slot) in enumerate(zip(tensors, first_slots(tensors))):
        if t.routed:
            pieces = piece_digests[slot : slot + len(t.ranges)].tobytes()
            out[i] = np.frombuffer(hashlib.sha256(pieces).digest(), np.uint8)
        else:
            out[i] = piece_digests[slot]
    return out


def content_digest(manifest: Manifest, shard: int, digests: np.ndarray) -> str:
    """Hex sha256 of an original shard with each tensor's bytes replaced by the tensor's digest.

    Header, gaps and tensors partition the shard, so this pins every byte of it while
    hashing each byte only once (the tensor digests are computed anyway).
    """
    items = [(0, 0, manifest.header(shard))]
    items += [(offset, 1, data) for offset, data in manifest.gaps(shard)]
    items += [
        (offset, 2 + i, digests[i].tobytes()) for i, (_, s, offset, _) in enumerate(manifest.tensors) if s == shard
    ]
    h = hashlib.sha256()
    for _, _, data in sorted(items, key=lambda item: item[:2]):
        h.update(data)
    return h.hexdigest()
