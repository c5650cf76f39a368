"""The sidecar index: where every routed expert of a GGUF lives, known without parsing the GGUF.

    idx = swapmoe.index.load("model.gguf")       # reads model.gguf.swapidx, refuses a stale one
    idx.slice(layer, expert)                      # [(offset, length)]: one range when bundled
    idx.projection(layer, expert, "down")         # (offset, length, ggml_type, shape)
    idx.nonexpert_region(); idx.hash_layers(); idx.hash_table(layer); idx.page_size

Every range also carries `.file`, the number of the file that holds it in `idx.paths`
(always 0 except for an un-repacked split GGUF). For the hot path, use the numpy arrays
directly: `part_offset[layer, expert, part]`, `part_length`, `part_file`, `slice_offset[layer,
expert]`, `slice_length`, `slice_flags`, with `part` an index into `idx.parts`.
The byte format is in docs/index-format.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import zstandard
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, Keys

from swapmoe.errors import SwapmoeError
from swapmoe.gguf_file import GGUFFile, TensorKind, classify
from swapmoe.repack.tensors import (
    KEY_PAGE_SIZE,
    PARTS,
    LogicalTensor,
    hash_tables,
    layout_of,
    logical_tensors,
    part_name,
    tensor_digests,
)

SIDECAR_SUFFIX = ".swapidx"
MAGIC = b"SWAPIDX\0"
FORMAT_VERSION = 1
# decompressed bytes one index may claim: a 1000-layer, 1024-expert model's arrays are ~0.3 GB
MAX_RAW_BYTES = 1 << 30
_HEADER = struct.Struct("<8sIIQ")  # magic, version, section count, reserved

FLAG_PAGE_ALIGNED = 1  # every range slice() returns starts on a page boundary
FLAG_SHARES_PAGE = 2  # a page the slice touches also holds bytes of something else
FLAG_CONTIGUOUS = 4  # the slice is one run of bytes: slice_offset/slice_length are valid


class Range(tuple):
    """(offset, length) of bytes in file number `.file` of `ExpertIndex.paths`."""

    def __new__(cls, offset: int, length: int, file: int = 0):
        r = tuple.__new__(cls, (offset, length))
        r.file = file
        return r

    offset = property(lambda self: self[0])
    length = property(lambda self: self[1])

    def __getnewargs__(self):  # pickling (e.g. to worker processes)
        return (*self, self.file)

    def __repr__(self) -> str:
        return f"Range(offset={self[0]}, length={self[1]}, file={self.file})"


class Projection(tuple):
    """(offset, length, ggml_type, shape) of one expert part; shape in numpy order; `.file` as in Range."""

    def __new__(cls, offset: int, length: int, ggml_type: GGMLQuantizationType, shape: tuple[int, ...], file: int = 0):
        r = tuple.__new__(cls, (offset, length, ggml_type, shape))
        r.file = file
        return r

    offset = property(lambda self: self[0])
    length = property(lambda self: self[1])
    ggml_type = property(lambda self: self[2])
    shape = property(lambda self: self[3])

    def __getnewargs__(self):
        return (*self, self.file)

    def __repr__(self) -> str:
        return (
            f"Projection(offset={self[0]}, length={self[1]}, ggml_type={self[2].name}, shape={self[3]}, "
            f"file={self.file})"
        )


def sidecar_path(gguf_path: str | os.PathLike) -> Path:
    """`model.gguf.swapidx` beside the GGUF (beside the first shard of a split one)."""
    gguf_path = Path(gguf_path)
    return gguf_path.with_name(gguf_path.name + SIDECAR_SUFFIX)


def _shape(ne: np.ndarray) -> tuple[int, ...]:
    """numpy-order shape from a zero-padded ggml ne row."""
    return tuple(int(d) for d in reversed(ne) if d)


def _padded(ne: tuple[int, ...]) -> list[int]:
    return list(ne) + [0] * (4 - len(ne))


_KNOWN_TYPES = frozenset(int(t) for t in GGMLQuantizationType)


def _nbytes(ggml_type: int, ne: np.ndarray) -> int | None:
    """Bytes of a tensor of this type and zero-padded ne, or None if either is not valid."""
    if ggml_type not in _KNOWN_TYPES:
        return None
    dims = [int(d) for d in ne]
    n = dims.index(0) if 0 in dims else len(dims)  # the dimensions before the zero padding
    if not n or any(d < 0 for d in dims) or any(dims[n:]):
        return None
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    if dims[0] % block:
        return None
    return math.prod(dims[:n]) // block * size


# What each section must be: its kind (0 JSON, 1 array), numpy type, and shape in terms of the meta
# section's extents (L layers, E experts, P parts, F files, T tensors; None: any length).
_TABLE = "hash_table."
_TABLE_DTYPES = ("|u1", "<u2", "<i4")
_SECTIONS = {
    "file_sizes": ("<i8", "F"),
    "header_lengths": ("<i8", "F"),
    "header_digests": ("|u1", "F", 32),
    "part_type": ("<i4", "L", "P"),
    "part_ne": ("<i8", "L", "P", 4),
    "part_file": ("<u2", "L", "E", "P"),
    "part_offset": ("<i8", "L", "E", "P"),
    "part_length": ("<i8", "L", "E", "P"),
    "part_digest": ("|u1", "L", "E", "P", 32),
    "slice_offset": ("<i8", "L", "E"),
    "slice_length": ("<i8", "L", "E"),
    "slice_flags": ("|u1", "L", "E"),
    "nonexpert": ("<i8", None, 3),
    "tensor_type": ("<i4", "T"),
    "tensor_ne": ("<i8", "T", 4),
    "tensor_file": ("<i4", "T"),
    "tensor_offset": ("<i8", "T"),
    "tensor_nbytes": ("<i8", "T"),
    "tensor_digest": ("|u1", "T", 32),
}


def _read_sections(blob: bytes, n_sections: int) -> dict:
    """name -> JSON bytes or numpy array of every section, each section's type and declared size
    checked before it is decompressed (a crafted section must not make it allocate)."""
    decompressor, values, pos, view, total = zstandard.ZstdDecompressor(), {}, _HEADER.size, memoryview(blob), 0
    end = len(blob) - 32
    for _ in range(n_sections):
        (n,) = struct.unpack_from("<H", blob, pos)
        name = blob[pos + 2 : pos + 2 + n].decode("ascii")
        pos += 2 + n
        kind, n = struct.unpack_from("<BB", blob, pos)
        dtype = blob[pos + 2 : pos + 2 + n].decode("ascii")
        pos += 2 + n
        (ndim,) = struct.unpack_from("<B", blob, pos)
        shape = struct.unpack_from(f"<{ndim}Q", blob, pos + 1)
        raw_len, stored_len = struct.unpack_from("<QQ", blob, pos + 1 + 8 * ndim)
        pos += 1 + 8 * ndim + 16
        if name in values:
            raise ValueError(f"section {name} appears twice")
        expected = (
            (0, "")
            if name == "meta"
            else (1, _SECTIONS[name][0])
            if name in _SECTIONS
            else (1, dtype if name.startswith(_TABLE) and dtype in _TABLE_DTYPES else None)
        )
        if (kind, dtype) != expected:
            raise ValueError(f"section {name!r} of kind {kind} and type {dtype!r} is not part of the format")
        total += raw_len
        if (kind and raw_len != math.prod(shape) * np.dtype(dtype).itemsize) or total > MAX_RAW_BYTES:
            raise ValueError(f"section {name} claims {raw_len:,} bytes (shape {list(shape)})")
        if pos + stored_len > end:
            raise ValueError(f"section {name} runs past the end")
        # raw_len 0 is zstandard's "no limit": an empty section is not decompressed at all
        raw = decompressor.decompress(view[pos : pos + stored_len], max_output_size=raw_len) if raw_len else b""
        if len(raw) != raw_len:
            raise ValueError(f"section {name} holds {len(raw):,} bytes, not {raw_len:,}")
        pos += stored_len
        values[name] = raw if name == "meta" else np.frombuffer(raw, np.dtype(dtype)).reshape(shape)
    if pos != end:
        raise ValueError(f"{end - pos:,} bytes after the last section")
    if "meta" not in values:
        raise ValueError("no meta section")
    return values


def _check_meta(meta: dict, values: dict) -> None:
    """The meta section's fields and types, and every array's shape against its extents."""
    if not isinstance(meta, dict) or set(meta) != {*ExpertIndex._META, "hash_layers"}:
        raise ValueError("the meta section does not have the format's fields")
    whole = {key: meta[key] for key in ("n_layer", "n_expert", "n_expert_used", "page_size")}
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in whole.values()):
        raise ValueError(f"meta: {whole} are not all whole numbers")
    strings = ("files", "parts", "tensor_names")
    if not all(isinstance(meta[key], list) and all(isinstance(v, str) for v in meta[key]) for key in strings):
        raise ValueError("meta: files, parts and tensor_names must be lists of names")
    if not meta["files"] or any(
        not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name for name in meta["files"]
    ):
        raise ValueError(f"meta: files {meta['files']} are not plain file names")
    if (
        meta["layout"] not in ("bundled", "compat", "original")
        or not isinstance(meta["arch"], str)
        or not isinstance(meta["has_digests"], bool)
    ):
        raise ValueError(f"meta: layout {meta['layout']!r}, arch or has_digests is not valid")
    if meta["page_size"] < 4096 or meta["page_size"] & (meta["page_size"] - 1) or meta["page_size"] > 1 << 30:
        raise ValueError(f"meta: page size {meta['page_size']} is not a power of two from 4096 to 1 GiB")
    if meta["n_expert_used"] > meta["n_expert"]:
        raise ValueError(f"meta: {meta['n_expert_used']} experts used of {meta['n_expert']}")
    parts = meta["parts"]
    if len(set(parts)) != len(parts) or not set(parts) <= set(PARTS) or parts != sorted(parts, key=PARTS.index):
        raise ValueError(f"meta: parts {parts} are not the format's, in its order")
    layers = meta["hash_layers"]
    if (
        not isinstance(layers, list)
        or not all(isinstance(v, int) and 0 <= v < meta["n_layer"] for v in layers)
        or len(set(layers)) != len(layers)
    ):
        raise ValueError(f"meta: hash_layers {layers!r} are not layers of the model")
    tables = {name for name in values if name.startswith(_TABLE)}
    if tables != {f"{_TABLE}{layer}" for layer in layers} or not set(_SECTIONS) <= set(values):
        raise ValueError("the sections are not those the meta section lists")
    extent = {
        "L": meta["n_layer"],
        "E": meta["n_expert"],
        "P": len(parts),
        "F": len(meta["files"]),
        "T": len(meta["tensor_names"]),
    }
    for name, (_, *dims) in _SECTIONS.items():
        want = [extent.get(d, d) for d in dims]
        have = list(values[name].shape)
        if len(have) != len(want) or any(w is not None and h != w for h, w in zip(have, want)):
            raise ValueError(f"section {name} is {have}, the meta section makes it {want}")
    if any(values[name].ndim != 2 for name in tables):
        raise ValueError("a hash table is not two-dimensional")


@dataclass
class ExpertIndex:
    # identity of the GGUF: every file's size and the sha256 of its header bytes
    files: list[str]  # file names, shard order, relative to the GGUF's directory
    file_sizes: np.ndarray  # int64 [n_files]
    header_lengths: np.ndarray  # int64 [n_files]
    header_digests: np.ndarray  # uint8 [n_files, 32]
    arch: str
    layout: str  # bundled, compat, or original (not repacked)
    page_size: int
    n_layer: int
    n_expert: int
    n_expert_used: int
    parts: list[str]  # names of the part axis: gate, up, down, gate_up, gate.bias, ...
    part_type: np.ndarray  # int32 [n_layer, n_parts], -1 where the layer has no such part
    part_ne: np.ndarray  # int64 [n_layer, n_parts, 4], ggml order, zero-padded
    part_file: np.ndarray  # uint16 [n_layer, n_expert, n_parts]
    part_offset: np.ndarray  # int64 [n_layer, n_expert, n_parts], absolute in its file
    part_length: np.ndarray  # int64 [n_layer, n_expert, n_parts], 0 where absent
    part_digest: np.ndarray  # uint8 [n_layer, n_expert, n_parts, 32], sha256 (zeros without digests)
    slice_offset: np.ndarray  # int64 [n_layer, n_expert], -1 unless FLAG_CONTIGUOUS
    slice_length: np.ndarray  # int64 [n_layer, n_expert], 0 unless FLAG_CONTIGUOUS
    slice_flags: np.ndarray  # uint8 [n_layer, n_expert], FLAG_* bits
    nonexpert: np.ndarray  # int64 [n_ranges, 3]: file, offset, length of the non-expert runs
    tensor_names: list[str]  # every original tensor, original order
    tensor_type: np.ndarray  # int32 [n_tensors]
    tensor_ne: np.ndarray  # int64 [n_tensors, 4], ggml order, zero-padded
    tensor_file: np.ndarray  # int32 [n_tensors], -1 for a routed tensor split into expert tensors (bundled)
    tensor_offset: np.ndarray  # int64 [n_tensors], -1 likewise
    tensor_nbytes: np.ndarray  # int64 [n_tensors]
    tensor_digest: np.ndarray  # uint8 [n_tensors, 32]
    has_digests: bool
    tables: dict[int, np.ndarray]  # hash-routed layer -> [n_vocab, k] expert ids (uint8 up to 256 experts)
    paths: list[Path] = field(default_factory=list)  # absolute paths of `files`, set by load()

    # --- queries ------------------------------------------------------------------------
    def _part(self, name: str) -> int:
        try:
            return self.parts.index(name)
        except ValueError:
            raise SwapmoeError(f"no expert part {name!r} in this model; it has {', '.join(self.parts)}") from None

    def _check(self, layer: int, expert: int) -> None:
        if not (0 <= layer < self.n_layer and 0 <= expert < self.n_expert) or not self.part_length[layer, expert].any():
            raise SwapmoeError(f"no routed expert {expert} in layer {layer}")

    def slice(self, layer: int, expert: int) -> list[Range]:
        """Byte ranges of expert `expert` of layer `layer`: one if the slice is contiguous, else one per part."""
        self._check(layer, expert)
        if self.slice_flags[layer, expert] & FLAG_CONTIGUOUS:
            return [
                Range(
                    int(self.slice_offset[layer, expert]),
                    int(self.slice_length[layer, expert]),
                    int(self.part_file[layer, expert][self.part_length[layer, expert] > 0][0]),
                )
            ]
        present = np.flatnonzero(self.part_length[layer, expert])
        ranges = [
            Range(
                int(self.part_offset[layer, expert, p]),
                int(self.part_length[layer, expert, p]),
                int(self.part_file[layer, expert, p]),
            )
            for p in present
        ]
        return sorted(ranges, key=lambda r: (r.file, r.offset))

    def projection(self, layer: int, expert: int, name: str) -> Projection:
        """Where one part (gate, up, down, gate_up, or e.g. gate.bias) of an expert lives."""
        self._check(layer, expert)
        p = self._part(name)
        if not self.part_length[layer, expert, p]:
            raise SwapmoeError(f"layer {layer} has no {name!r} part")
        return Projection(
            int(self.part_offset[layer, expert, p]),
            int(self.part_length[layer, expert, p]),
            GGMLQuantizationType(int(self.part_type[layer, p])),
            _shape(self.part_ne[layer, p]),
            int(self.part_file[layer, expert, p]),
        )

    def moe_layers(self) -> list[int]:
        return [int(layer) for layer in np.flatnonzero(self.part_length.any(axis=(1, 2)))]

    def hash_layers(self) -> list[int]:
        return sorted(self.tables)

    def hash_table(self, layer: int) -> np.ndarray:
        """[n_vocab, k] expert ids of each token in a hash-routed layer, in the file's order; stored in the
        smallest unsigned type that holds them (uint8 up to 256 experts, else uint16)."""
        if layer not in self.tables:
            raise SwapmoeError(f"layer {layer} is not hash-routed (hash layers: {self.hash_layers() or 'none'})")
        return self.tables[layer]

    def nonexpert_ranges(self) -> list[Range]:
        """All non-expert tensor bytes as maximal runs without expert bytes inside (one when repacked)."""
        return [Range(int(o), int(n), int(f)) for f, o, n in self.nonexpert]

    def nonexpert_region(self) -> Range:
        """The one range holding every non-expert tensor (repacked files)."""
        ranges = self.nonexpert_ranges()
        if len(ranges) != 1:
            raise SwapmoeError(
                f"the non-expert tensors of this {self.layout} file are in {len(ranges)} runs, not "
                "one; use nonexpert_ranges() or repack the file"
            )
        return ranges[0]

    def resident_tensors(self, n_layer: int) -> list[Projection]:
        """Where each non-expert tensor the forward pass of `n_layer` layers reads lives: the global
        ones and those of layers < n_layer (not a multi-token-prediction block after them)."""
        kept = []
        for name in self.tensor_names:  # the original names, also in a repacked file
            cls = classify(name)
            if cls.kind is not TensorKind.ROUTED_EXPERT and (cls.layer is None or cls.layer < n_layer):
                kept.append(self.tensor(name))
        return kept

    def tensor(self, name: str) -> Projection:
        """Where an original tensor lives, if it is stored whole (every tensor but bundled expert tensors)."""
        try:
            i = self.tensor_names.index(name)
        except ValueError:
            raise SwapmoeError(f"no tensor {name}") from None
        if self.tensor_offset[i] < 0:
            raise SwapmoeError(f"{name} is split into expert slices in this {self.layout} file; use slice()")
        return Projection(
            int(self.tensor_offset[i]),
            int(self.tensor_nbytes[i]),
            GGMLQuantizationType(int(self.tensor_type[i])),
            _shape(self.tensor_ne[i]),
            int(self.tensor_file[i]),
        )

    # --- bytes ----------------------------------------------------------------------------
    _ARRAYS = (
        "file_sizes",
        "header_lengths",
        "header_digests",
        "part_type",
        "part_ne",
        "part_file",
        "part_offset",
        "part_length",
        "part_digest",
        "slice_offset",
        "slice_length",
        "slice_flags",
        "nonexpert",
        "tensor_type",
        "tensor_ne",
        "tensor_file",
        "tensor_offset",
        "tensor_nbytes",
        "tensor_digest",
    )
    _META = (
        "files",
        "arch",
        "layout",
        "page_size",
        "n_layer",
        "n_expert",
        "n_expert_used",
        "parts",
        "tensor_names",
        "has_digests",
    )

    def to_bytes(self) -> bytes:
        meta = {k: getattr(self, k) for k in self._META} | {"hash_layers": self.hash_layers()}
        sections: list[tuple[str, bytes | np.ndarray]] = [("meta", json.dumps(meta).encode())]
        sections += [(name, getattr(self, name)) for name in self._ARRAYS]
        sections += [(f"hash_table.{layer}", self.tables[layer]) for layer in self.hash_layers()]
        out = bytearray(_HEADER.pack(MAGIC, FORMAT_VERSION, len(sections), 0))
        compressor = zstandard.ZstdCompressor(level=3)
        for name, value in sections:
            if isinstance(value, bytes):
                kind, raw, dtype, shape = 0, value, b"", ()
            else:
                value = np.ascontiguousarray(value)
                kind, raw, dtype, shape = 1, value.tobytes(), value.dtype.str.encode(), value.shape
            data = compressor.compress(raw)
            out += struct.pack("<H", len(name)) + name.encode() + struct.pack("<BB", kind, len(dtype)) + dtype
            out += struct.pack(f"<B{len(shape)}Q", len(shape), *shape) + struct.pack("<QQ", len(raw), len(data)) + data
        return bytes(out + hashlib.sha256(out).digest())

    @classmethod
    def from_bytes(cls, blob: bytes, where: str = "index") -> "ExpertIndex":
        """Parse and check an index: every section's name, type and shape, and every value the
        runtime reads (ranges inside the files, file numbers, ggml types, lengths that match the
        type and shape, expert ids), before anything uses them. A sidecar is as untrusted as the
        model it sits beside."""
        if len(blob) < _HEADER.size + 32 or blob[:8] != MAGIC:
            raise SwapmoeError(f"{where}: not a swapmoe index")
        magic, version, n_sections, _ = _HEADER.unpack_from(blob)
        if version != FORMAT_VERSION:
            raise SwapmoeError(
                f"{where}: index format version {version}; this swapmoe reads version "
                f"{FORMAT_VERSION} (rebuild it with `swapmoe index`)"
            )
        if hashlib.sha256(memoryview(blob)[:-32]).digest() != blob[-32:]:
            raise SwapmoeError(f"{where}: index checksum mismatch (damaged file); rebuild it with `swapmoe index`")
        try:
            values = _read_sections(blob, n_sections)
            meta = json.loads(values.pop("meta"))
            _check_meta(meta, values)
        except (struct.error, ValueError, RecursionError, zstandard.ZstdError) as e:  # ValueError: bad JSON, UTF-8
            raise SwapmoeError(f"{where}: damaged index ({e}); rebuild it with `swapmoe index`") from None
        tables = {layer: values.pop(f"{_TABLE}{layer}") for layer in meta.pop("hash_layers")}
        index = cls(**meta, **values, tables=tables)
        problem = index._problem()
        if problem:
            raise SwapmoeError(f"{where}: damaged index: {problem}; rebuild it with `swapmoe index`")
        return index

    def _problem(self) -> str | None:
        """The first value that could send a read outside the files or give the kernels bytes that do
        not match their type and shape; None if there is none."""
        n_files, sizes = len(self.files), self.file_sizes
        if (sizes < 0).any() or (self.header_lengths < 0).any() or (self.header_lengths > sizes).any():
            return "file sizes or header lengths out of range"
        lengths, offsets, files = self.part_length, self.part_offset, self.part_file.astype(np.int64)
        present = lengths > 0
        if (lengths < 0).any():
            return "a negative part length"
        in_layer = present.any(axis=1)  # [layer, part]
        for layer, p in zip(*np.nonzero(in_layer)):
            nbytes = _nbytes(int(self.part_type[layer, p]), self.part_ne[layer, p])
            if nbytes is None:
                return (
                    f"layer {layer} part {self.parts[p]}: ggml type {self.part_type[layer, p]} or shape "
                    f"{self.part_ne[layer, p].tolist()} is not valid"
                )
            wrong = np.flatnonzero(present[layer, :, p] & (lengths[layer, :, p] != nbytes))
            if len(wrong):
                return (
                    f"layer {layer} expert {wrong[0]} part {self.parts[p]} has {lengths[layer, wrong[0], p]} "
                    f"bytes, its type and shape {nbytes}"
                )
        has_expert = present.any(axis=2)
        lacking = np.argwhere(has_expert[:, :, None] & (present != in_layer[:, None, :]))
        if len(lacking):
            layer, expert, p = lacking[0]
            return f"expert {expert} of layer {layer} differs from its layer in having part {self.parts[p]}"
        for layer in np.flatnonzero(in_layer.any(axis=1)):
            names = {self.parts[p] for p in np.flatnonzero(in_layer[layer])}
            if "down" not in names or not ("gate_up" in names or {"gate", "up"} <= names):
                return f"layer {layer} has routed experts without all of their projections ({', '.join(names)})"
        if (files[present] >= n_files).any():
            return f"a part names file {files[present].max()}, but the index lists {n_files}"
        ends = offsets + lengths
        if (offsets[present] < 0).any() or (ends[present] > sizes[np.minimum(files, n_files - 1)][present]).any():
            return "a part lies outside its file"
        problem = self._slice_problem(present, has_expert, files)
        if problem:
            return problem
        ne = self.nonexpert
        if len(ne) and (
            (ne[:, 0] < 0).any()
            or (ne[:, 0] >= n_files).any()
            or (ne[:, 1:] < 0).any()
            or (ne[:, 1] + ne[:, 2] > sizes[np.clip(ne[:, 0], 0, n_files - 1)]).any()
        ):
            return "a non-expert range lies outside its file"
        return self._tensor_problem(n_files, sizes) or self._table_problem()

    def _slice_problem(self, present: np.ndarray, has_expert: np.ndarray, files: np.ndarray) -> str | None:
        """A contiguous slice must lie in its parts' file and hold every part."""
        contiguous = has_expert & ((self.slice_flags & FLAG_CONTIGUOUS) != 0)
        if not contiguous.any():
            return None
        first = np.argmax(present, axis=2)  # the first present part: slice() reads its file number
        slice_file = np.take_along_axis(files, first[:, :, None], axis=2)[:, :, 0]
        start, end = self.slice_offset, self.slice_offset + self.slice_length
        outside = (start < 0) | (self.slice_length <= 0) | (end > self.file_sizes[slice_file])
        part_outside = present & (
            (files != slice_file[:, :, None])
            | (self.part_offset < start[:, :, None])
            | (self.part_offset + self.part_length > end[:, :, None])
        )
        bad = np.argwhere(contiguous & (outside | part_outside.any(axis=2)))
        if len(bad):
            return f"the slice of expert {bad[0][1]} of layer {bad[0][0]} lies outside its file or its parts"
        return None

    def _tensor_problem(self, n_files: int, sizes: np.ndarray) -> str | None:
        """Every tensor is stored whole inside its file, but the routed ones a bundled file splits."""
        for i, name in enumerate(self.tensor_names):
            nbytes = _nbytes(int(self.tensor_type[i]), self.tensor_ne[i])
            if nbytes is None or nbytes != self.tensor_nbytes[i]:
                return f"tensor {name}: type, shape and size disagree"
            file, offset = int(self.tensor_file[i]), int(self.tensor_offset[i])
            split = self.layout == "bundled" and classify(name).kind is TensorKind.ROUTED_EXPERT
            if split != (file == offset == -1):
                return f"where tensor {name} is stored does not fit a {self.layout} file"
            if not split and not (0 <= file < n_files and 0 <= offset and offset + nbytes <= sizes[file]):
                return f"tensor {name} lies outside its file"
        return None

    def _table_problem(self) -> str | None:
        for layer, table in self.tables.items():
            name = f"blk.{layer}.ffn_gate_tid2eid.weight"
            if name not in self.tensor_names:
                return f"a hash table for layer {layer}, which has no {name}"
            k, n_vocab = self.tensor_ne[self.tensor_names.index(name)][:2]
            if table.shape != (n_vocab, k):
                return f"the hash table of layer {layer} is {list(table.shape)}, its tensor {[int(n_vocab), int(k)]}"
            if table.size and int(table.max()) >= self.n_expert:
                return f"the hash table of layer {layer} names expert {int(table.max())} of {self.n_expert}"
        return None

    def save(self, path: str | os.PathLike) -> None:
        """Write atomically (temp file, fsync, rename)."""
        from swapmoe.atomic import atomic_output

        with atomic_output(path) as tmp:
            Path(tmp).write_bytes(self.to_bytes())

    # --- identity -------------------------------------------------------------------------
    def check_identity(self, paths: list[Path]) -> None:
        """Refuse if any file differs in size or header bytes from when the index was written."""
        if len(paths) != len(self.files):
            raise SwapmoeError(f"{paths[0]}: the index is for {len(self.files)} file(s), found {len(paths)}")
        for i, path in enumerate(paths):
            stale = (
                f"{sidecar_path(paths[0])}: stale index: {path} changed since the index was written; "
                f"rebuild it with `swapmoe index {paths[0]}`"
            )
            try:
                if path.stat().st_size != self.file_sizes[i]:
                    raise SwapmoeError(
                        stale + f" (size {path.stat().st_size:,}, index says {int(self.file_sizes[i]):,})"
                    )
                with open(path, "rb") as f:
                    header = f.read(int(self.header_lengths[i]))
            except FileNotFoundError:
                raise SwapmoeError(f"{path}: missing (the index lists it)") from None
            if hashlib.sha256(header).digest() != self.header_digests[i].tobytes():
                raise SwapmoeError(stale + " (header differs)")


def load(gguf_path: str | os.PathLike) -> ExpertIndex:
    """The index beside `gguf_path`, checked against the GGUF (size and header digest of each file)."""
    gguf_path = Path(gguf_path)
    side = sidecar_path(gguf_path)
    try:
        blob = side.read_bytes()
    except FileNotFoundError:
        raise SwapmoeError(
            f"{gguf_path}: no index beside it ({side.name}); create it with `swapmoe index {gguf_path}`"
        ) from None
    index = ExpertIndex.from_bytes(blob, str(side))
    index.paths = [gguf_path.resolve()] + [gguf_path.resolve().with_name(name) for name in index.files[1:]]
    index.check_identity(index.paths)
    return index


# --- building -----------------------------------------------------------------------------
def owned_ranges(index: ExpertIndex, tensors: list[LogicalTensor]) -> np.ndarray:
    """int64 [n, 4] of (file, start, end, owner) sorted by (file, start): owner is layer * n_expert + expert
    for expert parts, -1 for headers, -2 for non-expert tensors."""
    rows = [(f, 0, int(n), -1) for f, n in enumerate(index.header_lengths)]
    rows += [(f, o, o + n, -2) for t in tensors if not t.routed for f, o, n in t.ranges if n]
    lengths = index.part_length.reshape(-1, len(index.parts))
    owners = np.repeat(np.arange(lengths.shape[0]), len(index.parts))
    keep = lengths.reshape(-1) > 0
    parts = np.stack(
        [
            index.part_file.reshape(-1),
            index.part_offset.reshape(-1),
            index.part_offset.reshape(-1) + index.part_length.reshape(-1),
            owners,
        ],
        axis=1,
    )[keep]
    table = np.concatenate([np.array(rows, dtype=np.int64).reshape(-1, 4), parts.astype(np.int64)])
    return table[np.lexsort((table[:, 1], table[:, 0]))]


def _fill_slices(index: ExpertIndex, tensors: list[LogicalTensor]) -> None:
    """slice_offset/length/flags and the non-expert runs, from who owns which bytes."""
    page = index.page_size
    rows = owned_ranges(index, tensors)
    file, start, end, owner = rows.T
    # a new run begins where the owner or the file changes
    new_run = np.ones(len(rows), bool)
    new_run[1:] = (owner[1:] != owner[:-1]) | (file[1:] != file[:-1])
    n_slices = index.n_layer * index.n_expert
    expert = owner >= 0
    runs = np.bincount(owner[expert & new_run], minlength=n_slices)
    contiguous = runs == 1
    # neighbours in the same file with different owners whose boundary pages meet share a page
    meet = (file[1:] == file[:-1]) & (owner[1:] != owner[:-1]) & ((end[:-1] - 1) // page == start[1:] // page)
    shares = np.zeros(n_slices, bool)
    shares[owner[:-1][meet & (owner[:-1] >= 0)]] = True
    shares[owner[1:][meet & (owner[1:] >= 0)]] = True
    first = np.full(n_slices, np.iinfo(np.int64).max)
    last = np.zeros(n_slices, np.int64)
    np.minimum.at(first, owner[expert], start[expert])
    np.maximum.at(last, owner[expert], end[expert])
    # page-aligned: the single range when contiguous, else every part
    misaligned = np.zeros(n_slices, bool)
    misaligned[owner[expert][start[expert] % page != 0]] = True
    aligned = np.where(contiguous, first % page == 0, ~misaligned)
    present = runs > 0
    flags = (aligned * FLAG_PAGE_ALIGNED) | (shares * FLAG_SHARES_PAGE) | (contiguous * FLAG_CONTIGUOUS)
    shape = (index.n_layer, index.n_expert)
    index.slice_flags = np.where(present, flags, 0).astype(np.uint8).reshape(shape)
    index.slice_offset = np.where(contiguous, first, -1).astype(np.int64).reshape(shape)
    index.slice_length = np.where(contiguous, last - first, 0).astype(np.int64).reshape(shape)
    # non-expert runs: a run starts at a non-expert row that opens a run, ends at the row before the next run
    nonexpert = owner == -2
    run_start = np.flatnonzero(nonexpert & new_run)
    run_end = np.append(np.flatnonzero(new_run)[1:], len(rows)) - 1
    run_end = run_end[np.searchsorted(np.flatnonzero(new_run), run_start)]
    index.nonexpert = np.stack([file[run_start], start[run_start], end[run_end] - start[run_start]], axis=1)


def _id_dtype(n_expert: int) -> type:
    """Smallest type for expert ids: a DeepSeek-class table shrinks 4x, and so does its load time."""
    return np.uint8 if n_expert <= 1 << 8 else np.uint16 if n_expert <= 1 << 16 else np.int32


def build(
    g: GGUFFile,
    piece_digests: np.ndarray | None = None,
    page_size: int = 16384,
    tensors: list[LogicalTensor] | None = None,
) -> ExpertIndex:
    """Index of an opened GGUF (original or repacked). piece_digests: sha256 per piece slot (see
    tensors.first_slots), or None for an index without digests. page_size is used for files
    swapmoe did not repack; a repacked file's own page size wins."""
    tensors = tensors if tensors is not None else logical_tensors(g)
    layout = layout_of(g)
    page_size = int(g.get(KEY_PAGE_SIZE)) if layout != "original" else page_size
    routed = [t for t in tensors if t.routed]
    n_layer = max((t.cls.layer + 1 for t in tensors if t.cls.layer is not None), default=0)
    claimed = int(g.arch_get(Keys.LLM.BLOCK_COUNT) or 0)
    if claimed > n_layer:  # arrays below are sized by the layers: a damaged count must not size them
        raise SwapmoeError(
            f"{g.path}: {g.arch_key(Keys.LLM.BLOCK_COUNT)} is {claimed}, but the file has tensors for {n_layer} layers"
        )
    n_expert = max((t.ne[-1] for t in routed), default=0)
    parts = [p for p in PARTS if any(part_name(t.cls) == p for t in routed)]
    headers = []
    for shard in g.shards:
        with open(shard.path, "rb") as f:
            headers.append(hashlib.sha256(f.read(shard.data_offset)).digest())
    split = [layout == "bundled" and t.routed for t in tensors]  # stored as one GGUF tensor per expert
    L, E, P = n_layer, n_expert, len(parts)
    index = ExpertIndex(
        files=[s.path.name for s in g.shards],
        file_sizes=np.array([s.size for s in g.shards], np.int64),
        header_lengths=np.array([s.data_offset for s in g.shards], np.int64),
        header_digests=np.frombuffer(b"".join(headers), np.uint8).reshape(-1, 32).copy(),
        arch=g.arch,
        layout=layout,
        page_size=page_size,
        n_layer=L,
        n_expert=E,
        n_expert_used=int(g.arch_get(Keys.LLM.EXPERT_USED_COUNT) or 0),
        parts=parts,
        part_type=np.full((L, P), -1, np.int32),
        part_ne=np.zeros((L, P, 4), np.int64),
        part_file=np.zeros((L, E, P), np.uint16),
        part_offset=np.zeros((L, E, P), np.int64),
        part_length=np.zeros((L, E, P), np.int64),
        part_digest=np.zeros((L, E, P, 32), np.uint8),
        slice_offset=None,
        slice_length=None,
        slice_flags=None,
        nonexpert=None,
        tensor_names=[t.name for t in tensors],
        tensor_type=np.array([t.ggml_type for t in tensors], np.int32),
        tensor_ne=np.array([_padded(t.ne) for t in tensors], np.int64).reshape(-1, 4),
        tensor_file=np.array([-1 if in_parts else t.ranges[0][0] for t, in_parts in zip(tensors, split)], np.int32),
        tensor_offset=np.array([-1 if in_parts else t.ranges[0][1] for t, in_parts in zip(tensors, split)], np.int64),
        tensor_nbytes=np.array([t.nbytes for t in tensors], np.int64),
        tensor_digest=np.zeros((len(tensors), 32), np.uint8),
        has_digests=piece_digests is not None,
        tables={layer: table.astype(_id_dtype(n_expert)) for layer, table in hash_tables(g, tensors, n_expert).items()},
    )
    slot = 0
    for t in tensors:
        if t.routed:
            layer, p = t.cls.layer, parts.index(part_name(t.cls))
            index.part_type[layer, p] = t.ggml_type
            index.part_ne[layer, p] = _padded(t.ne[:-1])
            ranges = np.array(t.ranges, np.int64)
            index.part_file[layer, : len(ranges), p] = ranges[:, 0]
            index.part_offset[layer, : len(ranges), p] = ranges[:, 1]
            index.part_length[layer, : len(ranges), p] = ranges[:, 2]
            if piece_digests is not None:
                index.part_digest[layer, : len(ranges), p] = piece_digests[slot : slot + len(ranges)]
        slot += len(t.ranges)
    if piece_digests is not None:
        index.tensor_digest = tensor_digests(tensors, piece_digests)
    _fill_slices(index, tensors)
    return index
