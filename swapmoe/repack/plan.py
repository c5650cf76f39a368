"""Where every byte of a repacked file goes, decided before a byte is copied.

Both layouts put the header first, then every non-expert tensor (original order) so the
runtime loads them with one sequential read, then the routed experts layer by layer.

bundled: expert e of layer L is one *slice*: its parts (each routed tensor's expert-e
    rows, original order) as GGUF tensors of their own, `NAME.e`, each 64-byte aligned;
    the slice starts on a page boundary and the next slice starts on the next one. The
    data section is not tightly packed, which the GGUF spec allows (offsets need only be
    multiples of general.alignment, which stays as it was) but ggml's own gguf.cpp refuses:
    this layout is for the swapmoe runtime.
compat: the original 3-D expert tensors, each layer's together. general.alignment is set
    to the page size: that is the only way ggml's loader (which wants tensors packed in
    tensor-info order with `general.alignment` padding) accepts page-aligned tensors.

The header is the input's first-shard KV bytes copied verbatim (less split.* keys when
the input is split into shards, and general.alignment in compat, which is re-added with
the new value), then the swapmoe.* keys, then the tensor infos in data order.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from gguf import GGUF_DEFAULT_ALIGNMENT, GGMLQuantizationType, GGUFValueType, Keys

from swapmoe.errors import SwapmoeError
from swapmoe.gguf_file import GGUFFile
from swapmoe.repack.stream import Piece
from swapmoe.repack.tensors import (
    KEY_LAYOUT,
    KEY_LAYOUT_VERSION,
    KEY_PAGE_SIZE,
    KEY_SOURCE_DIGEST,
    KEY_UNPACK,
    LAYOUT_VERSION,
    LAYOUTS,
    LogicalTensor,
    Manifest,
    expert_tensor_name,
    first_slots,
    hash_tables,
    layout_of,
    logical_tensors,
)

DEFAULT_PAGE_SIZE = 16384  # a multiple of both 4 KiB (x86, most Linux) and 16 KiB (Apple silicon) pages
PART_ALIGNMENT = 64  # cache line; SIMD loads of a part never straddle one
SPLIT_KEYS = (Keys.Split.LLM_KV_SPLIT_NO, Keys.Split.LLM_KV_SPLIT_COUNT, Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT)
DIGEST_PLACEHOLDER = "0" * 64


def align(n: int, a: int) -> int:
    return -(-n // a) * a


# --- GGUF encoding (little-endian, GGUF v2/v3) -------------------------------------------
def _gguf_str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def kv_u32(key: str, value: int) -> bytes:
    return _gguf_str(key) + struct.pack("<II", GGUFValueType.UINT32, value)


def kv_string(key: str, value: str) -> bytes:
    return _gguf_str(key) + struct.pack("<I", GGUFValueType.STRING) + _gguf_str(value)


def kv_strings(key: str, values: list[str]) -> bytes:
    head = struct.pack("<IIQ", GGUFValueType.ARRAY, GGUFValueType.STRING, len(values))
    return _gguf_str(key) + head + b"".join(_gguf_str(v) for v in values)


def kv_bytes(key: str, data: bytes) -> bytes:
    return _gguf_str(key) + struct.pack("<IIQ", GGUFValueType.ARRAY, GGUFValueType.UINT8, len(data)) + data


def tensor_info(name: str, ne: tuple[int, ...], ggml_type: GGMLQuantizationType, relative_offset: int) -> bytes:
    return _gguf_str(name) + struct.pack(f"<I{len(ne)}Q", len(ne), *ne) + struct.pack("<IQ", ggml_type, relative_offset)


# --- the plan ---------------------------------------------------------------------------
@dataclass(frozen=True)
class OutputTensor:
    name: str
    ggml_type: GGMLQuantizationType
    ne: tuple[int, ...]
    offset: int  # absolute in the output
    nbytes: int


@dataclass
class Plan:
    layout: str
    page_size: int
    sources: list[Path]  # input shards
    version: int  # GGUF version, kept from the input
    kv: bytes  # kept KV fields of the input's first shard, verbatim
    n_kv: int
    alignment: int  # general.alignment of the output
    tensors: list[LogicalTensor]  # the input's, original order
    outputs: list[OutputTensor]  # data order
    pieces: list[Piece]
    data_offset: int
    size: int
    manifest: Manifest
    unpack_blob: bytes  # manifest.encode(), made once

    def header(self, source_digests: list[str]) -> bytes:
        """Header bytes [0, data_offset): the same length whatever the digests."""
        kv = [
            kv_u32(KEY_LAYOUT_VERSION, LAYOUT_VERSION),
            kv_string(KEY_LAYOUT, self.layout),
            kv_u32(KEY_PAGE_SIZE, self.page_size),
            kv_strings(KEY_SOURCE_DIGEST, source_digests),
            kv_bytes(KEY_UNPACK, self.unpack_blob),
        ]
        if self.layout == "compat":
            kv.append(kv_u32(Keys.General.ALIGNMENT, self.alignment))
        infos = [tensor_info(t.name, t.ne, t.ggml_type, t.offset - self.data_offset) for t in self.outputs]
        head = b"GGUF" + struct.pack("<IQQ", self.version, len(self.outputs), self.n_kv + len(kv))
        header = head + self.kv + b"".join(kv) + b"".join(infos)
        if self.data_offset and len(header) > self.data_offset:
            raise AssertionError("header grew after planning")
        return header.ljust(self.data_offset, b"\0")


def _check_page_size(page_size: int, alignment: int) -> None:
    if page_size < 4096 or page_size & (page_size - 1):
        raise SwapmoeError(f"page size {page_size} must be a power of two of at least 4096")
    if alignment <= 0 or alignment & (alignment - 1) or alignment > page_size:
        raise SwapmoeError(
            f"general.alignment {alignment} must be a power of two no larger than the page size {page_size}"
        )


def _source_layout(g: GGUFFile, tensors: list[LogicalTensor]) -> Manifest:
    """Header bytes and gaps of every input shard, read now (a few MB at most)."""
    shards, pool = [], []
    for index, shard in enumerate(g.shards):
        spans = sorted((t.source[1], t.source[1] + t.nbytes, t.name) for t in tensors if t.source[0] == index)
        gaps, pos = [], shard.data_offset
        with open(shard.path, "rb") as f:
            pool.append(f.read(shard.data_offset))
            for start, end, name in spans:
                if start < pos:
                    raise SwapmoeError(f"{shard.path}: tensor {name} overlaps the one before it; cannot repack")
                if start > pos:
                    gaps.append([pos, start - pos])
                pos = end
            if pos < shard.size:
                gaps.append([pos, shard.size - pos])
            for offset, length in gaps:
                f.seek(offset)
                pool.append(f.read(length))
        shards.append({"name": shard.path.name, "size": shard.size, "header_length": shard.data_offset, "gaps": gaps})
    return Manifest(shards, [(t.name, t.source[0], t.source[1], t.nbytes) for t in tensors], b"".join(pool))


def plan_repack(g: GGUFFile, layout: str = "bundled", page_size: int = DEFAULT_PAGE_SIZE) -> Plan:
    if layout not in LAYOUTS:
        raise SwapmoeError(f"unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    if layout_of(g) != "original":
        raise SwapmoeError(
            f"{g.path}: already repacked ({layout_of(g)} layout); use it as it is, or `swapmoe unpack` it first"
        )
    alignment = int(g.get(Keys.General.ALIGNMENT, GGUF_DEFAULT_ALIGNMENT))
    _check_page_size(page_size, alignment)
    version = g.shards[0].version
    if version < 2:
        raise SwapmoeError(f"{g.path}: GGUF version {version} is too old; convert it with a current llama.cpp")
    tensors = logical_tensors(g)
    routed = [t for t in tensors if t.routed]
    if not routed:
        raise SwapmoeError(
            f"{g.path}: no routed expert tensors (blk.N.ffn_*_exps); this is not a Mixture-of-Experts "
            "model, so there is nothing to repack"
        )
    hash_tables(g, tensors, max(t.ne[-1] for t in routed))  # refuse bad tables before copying anything

    dropped = set(SPLIT_KEYS) if len(g.shards) > 1 else set()
    if layout == "compat":
        dropped.add(Keys.General.ALIGNMENT)
    spans = [(start, end) for key, start, end in g.kv_spans(0) if key not in dropped]
    with open(g.shards[0].path, "rb") as f:
        kv = b"".join(os.pread(f.fileno(), end - start, start) for start, end in spans)

    out_alignment = page_size if layout == "compat" else alignment
    part_alignment = max(PART_ALIGNMENT, alignment)
    slots = first_slots(tensors)
    nonexpert = [i for i, t in enumerate(tensors) if not t.routed]
    layers: dict[int, list[int]] = {}
    for i, t in enumerate(tensors):
        if t.routed:
            layers.setdefault(t.cls.layer, []).append(i)
    n_expert = {layer: {tensors[i].ne[-1] for i in members} for layer, members in layers.items()}
    for layer, counts in n_expert.items():
        if len(counts) > 1:
            raise SwapmoeError(
                f"{g.path}: the routed tensors of layer {layer} disagree on the expert count ({sorted(counts)})"
            )

    # (tensor index, expert or None, output name, ne) in data order
    order: list[tuple[int, int | None, str, tuple[int, ...]]] = [
        (i, None, tensors[i].name, tensors[i].ne) for i in nonexpert
    ]
    for layer in sorted(layers):
        if layout == "compat":
            order += [(i, None, tensors[i].name, tensors[i].ne) for i in layers[layer]]
        else:
            for e in range(n_expert[layer].pop()):
                order += [(i, e, expert_tensor_name(tensors[i].name, e), tensors[i].ne[:-1]) for i in layers[layer]]

    manifest = _source_layout(g, tensors)
    plan = Plan(
        layout,
        page_size,
        [s.path for s in g.shards],
        version,
        kv,
        len(spans),
        out_alignment,
        tensors,
        [],
        [],
        0,
        0,
        manifest,
        manifest.encode(),
    )
    plan.outputs = [OutputTensor(name, tensors[i].ggml_type, ne, 0, 0) for i, _, name, ne in order]
    plan.data_offset = align(len(plan.header([DIGEST_PLACEHOLDER] * len(g.shards))), out_alignment)

    pos, previous_expert = plan.data_offset, None
    outputs, pieces = [], []
    for i, e, name, ne in order:
        t = tensors[i]
        if layout == "compat":
            pos = align(pos, page_size)
        elif e is None:
            pos = align(pos, alignment)
        elif (t.cls.layer, e) != previous_expert:  # a new slice
            pos, previous_expert = align(pos, page_size), (t.cls.layer, e)
        else:
            pos = align(pos, part_alignment)
        ranges = t.ranges if e is None else (t.ranges[e],)
        nbytes = sum(length for _, _, length in ranges)
        outputs.append(OutputTensor(name, t.ggml_type, ne, pos, nbytes))
        dst = pos
        for k, (src, src_offset, length) in enumerate(ranges):
            slot = slots[i] + (k if e is None else e)
            pieces.append(Piece(src, src_offset, length, slot, 0, dst))
            dst += length
        pos += nbytes
    plan.outputs, plan.pieces = outputs, pieces
    plan.size = align(pos, page_size)
    return plan
