"""`swapmoe verify`: does a GGUF still match its sidecar index, and (optionally) the original?

Checks, in order: the index belongs to the file (size, header digest); every array of the
index equals one rebuilt from the file's own tensor table; the layout's promises hold
(bundled: each slice one page-aligned run, parts 64-byte aligned, no page shared; compat:
every tensor page-aligned; always: no two ranges overlap, all inside the file); every
piece's sha256 equals the index's; a repacked file's source digests equal those
recomputed from its bytes; with --against, every tensor equals the original's byte for byte
and the original's header and padding bytes equal those stored for unpack.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from swapmoe.gguf_file import open_gguf
from swapmoe.repack import stream
from swapmoe.repack.index import (
    FLAG_CONTIGUOUS,
    FLAG_PAGE_ALIGNED,
    FLAG_SHARES_PAGE,
    ExpertIndex,
    build,
    load,
    owned_ranges,
)
from swapmoe.repack.plan import PART_ALIGNMENT
from swapmoe.repack.stream import Piece
from swapmoe.repack.tensors import (
    KEY_SOURCE_DIGEST,
    LogicalTensor,
    content_digest,
    first_slots,
    layout_of,
    logical_tensors,
    read_manifest,
    tensor_digests,
)

_STRUCTURE = (
    "arch",
    "layout",
    "page_size",
    "n_layer",
    "n_expert",
    "n_expert_used",
    "parts",
    "part_type",
    "part_ne",
    "part_file",
    "part_offset",
    "part_length",
    "slice_offset",
    "slice_length",
    "slice_flags",
    "nonexpert",
    "tensor_names",
    "tensor_type",
    "tensor_ne",
    "tensor_file",
    "tensor_offset",
    "tensor_nbytes",
)
_SHOWN = 20  # problems listed in full; the rest are counted


@dataclass
class Report:
    path: Path
    layout: str
    tensors: int
    expert_slices: int
    bytes_checked: int = 0
    against: Path | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(a, b)
    return a == b


def _layout_problems(index: ExpertIndex, tensors: list[LogicalTensor]) -> list[str]:
    problems = []
    rows = owned_ranges(index, tensors)
    file, start, end, _ = rows.T
    overlap = (file[1:] == file[:-1]) & (start[1:] < end[:-1])
    if overlap.any():
        problems.append(f"{int(overlap.sum())} byte ranges overlap the one before them")
    beyond = end > index.file_sizes[file]
    if beyond.any():
        problems.append(f"{int(beyond.sum())} byte ranges reach past the end of their file")
    present = index.part_length.any(axis=2)
    flags = index.slice_flags[present]
    if index.layout == "bundled":
        whole = FLAG_CONTIGUOUS | FLAG_PAGE_ALIGNED
        if ((flags & whole) != whole).any() or (flags & FLAG_SHARES_PAGE).any():
            problems.append("bundled layout: some expert slices are not one page-aligned run of their own pages")
        parts = index.part_length > 0
        if (index.part_offset[parts] % PART_ALIGNMENT).any():
            problems.append(f"bundled layout: some expert parts are not {PART_ALIGNMENT}-byte aligned")
        if len(index.nonexpert) != 1:
            problems.append(f"bundled layout: non-expert tensors are in {len(index.nonexpert)} runs, not one")
    if index.layout == "compat":
        whole = index.tensor_offset[index.tensor_offset >= 0]
        if (whole % index.page_size).any():
            problems.append("compat layout: some tensors do not start on a page boundary")
    return problems


def verify(path: str | os.PathLike, against: str | os.PathLike | None = None, progress: bool = False) -> Report:
    g = open_gguf(path)
    index = load(path)
    tensors = logical_tensors(g)
    fresh = build(g, None, index.page_size, tensors)
    report = Report(g.path, index.layout, len(tensors), int(index.part_length.any(axis=2).sum()))
    problems = report.problems
    for name in _STRUCTURE:
        if not _same(getattr(index, name), getattr(fresh, name)):
            problems.append(f"index field {name} disagrees with the file's tensor table")
    if index.hash_layers() != fresh.hash_layers() or any(
        not np.array_equal(index.hash_table(layer), fresh.hash_table(layer)) for layer in fresh.hash_layers()
    ):
        problems.append("index hash tables disagree with the file's ffn_gate_tid2eid tensors")
    problems += _layout_problems(index, tensors)

    slots = first_slots(tensors)
    n_slots = sum(len(t.ranges) for t in tensors)
    if against is None:
        pieces = [Piece(f, o, n, slot + k) for t, slot in zip(tensors, slots) for k, (f, o, n) in enumerate(t.ranges)]
        digests, mismatched = stream.run(
            pieces,
            [s.path for s in g.shards],
            mode="hash",
            progress=progress,
            desc=f"verify {g.path.name}",
            n_slots=n_slots,
        )
    else:
        original = open_gguf(against)
        report.against = original.path
        problems += _original_problems(g, original)
        by_name = {t.name: t for t in logical_tensors(original)}
        pieces = []
        for t, slot in zip(tensors, slots):
            src = by_name.get(t.name)
            if src is None or len(src.ranges) != len(t.ranges) or src.nbytes != t.nbytes:
                problems.append(f"tensor {t.name}: missing from {original.path.name} or of another size")
                continue
            pieces += [
                Piece(sf, so, sn, slot + k, f, o)
                for k, ((sf, so, sn), (f, o, n)) in enumerate(zip(src.ranges, t.ranges))
            ]
        digests, mismatched = stream.run(
            pieces,
            [s.path for s in original.shards],
            [s.path for s in g.shards],
            mode="compare",
            progress=progress,
            desc=f"verify {g.path.name}",
            n_slots=n_slots,
        )
        if mismatched:
            owner = np.searchsorted(slots, mismatched, side="right") - 1
            names = sorted({tensors[i].name for i in owner})
            problems.append(f"{len(names)} tensors differ from {original.path.name}: {', '.join(names[:_SHOWN])}")
    report.bytes_checked = sum(p.length for p in pieces)

    per_tensor = tensor_digests(tensors, digests)
    if index.has_digests:
        bad = np.flatnonzero((per_tensor != index.tensor_digest).any(axis=1))
        if len(bad):
            problems.append(
                f"{len(bad)} tensors do not match their digest in the index: "
                + ", ".join(tensors[i].name for i in bad[:_SHOWN])
            )
        fresh_parts = build(g, digests, index.page_size, tensors).part_digest
        if not np.array_equal(fresh_parts, index.part_digest):
            problems.append("index field part_digest disagrees with the bytes of the expert parts")
    else:
        problems.append("the index holds no digests (made with --no-digests); rebuild it to check the bytes")
    if layout_of(g) != "original":
        manifest = read_manifest(g)
        expected = g.get(KEY_SOURCE_DIGEST)
        for shard, info in enumerate(manifest.shards):
            if content_digest(manifest, shard, per_tensor) != expected[shard]:
                problems.append(f"the bytes do not rebuild the original {info['name']} (source digest mismatch)")
    return report


def _original_problems(g, original) -> list[str]:
    """Header and padding bytes of the original must be what unpack would write."""
    if layout_of(g) == "original":
        return []
    manifest = read_manifest(g)
    if len(original.shards) != len(manifest.shards):
        return [
            f"{original.path.name} has {len(original.shards)} shards, the repacked file's original had "
            f"{len(manifest.shards)}"
        ]
    problems = []
    for i, shard in enumerate(original.shards):
        with open(shard.path, "rb") as f:
            header = f.read(manifest.shards[i]["header_length"])
            gaps_same = all(os.pread(f.fileno(), len(data), offset) == data for offset, data in manifest.gaps(i))
        if shard.size != manifest.shards[i]["size"] or header != manifest.header(i) or not gaps_same:
            problems.append(f"{shard.path.name}: header, padding or size differ from the original stored for unpack")
    return problems
