"""Read-only access to a GGUF model and its split shards, without reading tensor data.

Parsing is done by the `gguf` package; this module adds what swapmoe needs on top:
split shards (`name-00001-of-00003.gguf`), absolute byte ranges for every tensor,
the byte spans of each shard's header sections (so the repacker can copy metadata
verbatim), clear errors for damaged files, and the tensor classification table.

Tensor data is only ever reached through read-only memory maps.
"""
from __future__ import annotations

import mmap
import os
import re
from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader

from swapmoe.errors import SwapmoeError

EXPERT_PROJECTIONS = ("gate", "up", "down", "gate_up")


class TensorKind(str, Enum):
    ROUTED_EXPERT = "routed_expert"  # streamed from disk, one slice per expert
    SHARED_EXPERT = "shared_expert"  # always-on expert, loaded like any other weight
    ROUTER = "router"  # picks the experts: ffn_gate_inp*, exp_probs_b*
    HASH_TABLE = "hash_table"  # DeepSeek-V4 token id -> expert ids
    OTHER = "other"


@dataclass(frozen=True)
class TensorClass:
    kind: TensorKind
    layer: int | None = None
    projection: str | None = None  # gate / up / down / gate_up, for routed experts
    part: str | None = None  # weight / bias / scale, for routed experts


# The one classification table, in priority order. It covers the tensor names of every
# MoE architecture llama.cpp knows (qwen2moe, qwen3moe, qwen35moe, olmoe, llama/Mixtral,
# deepseek2, deepseek4, minimax-m2, gpt-oss, laguna, ...): routed experts are always the
# 3-D `ffn_*_exps` tensors (plus their per-expert bias/scale companions).
_LAYER = r"^blk\.(?P<layer>\d+)\."
_CLASS_TABLE: list[tuple[re.Pattern[str], TensorKind]] = [
    (re.compile(_LAYER + r"ffn_gate_tid2eid\.weight$"), TensorKind.HASH_TABLE),
    (re.compile(_LAYER + r"ffn_(?P<projection>gate_up|gate|up|down)_exps\.(?P<part>weight|bias|scale)$"),
     TensorKind.ROUTED_EXPERT),
    (re.compile(_LAYER + r"(ffn_gate_inp(_shexp)?|exp_probs_b(_vl)?)\.(weight|bias)$"), TensorKind.ROUTER),
    (re.compile(_LAYER + r"ffn_\w+_shexp\.\w+$"), TensorKind.SHARED_EXPERT),
]


def classify(name: str) -> TensorClass:
    """Which kind of tensor `name` is, with its layer and (for experts) projection and part."""
    for pattern, kind in _CLASS_TABLE:
        m = pattern.match(name)
        if m:
            groups = m.groupdict()
            return TensorClass(kind, int(groups["layer"]), groups.get("projection"), groups.get("part"))
    m = re.match(_LAYER, name)
    return TensorClass(TensorKind.OTHER, int(m["layer"]) if m else None)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: GGMLQuantizationType
    ne: tuple[int, ...]  # ggml order: fastest-varying dimension first
    shard: int  # index into GGUFFile.shards
    offset: int  # absolute byte offset in that shard's file
    nbytes: int
    cls: TensorClass

    @property
    def kind(self) -> TensorKind:
        return self.cls.kind

    @property
    def layer(self) -> int | None:
        return self.cls.layer

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy order (slowest first)."""
        return tuple(reversed(self.ne))

    @property
    def n_experts(self) -> int:
        """Experts in a routed tensor: the last (slowest) ggml dimension."""
        return self.ne[-1]

    @property
    def expert_nbytes(self) -> int:
        """Bytes of one expert's slice of a routed tensor."""
        return self.nbytes // self.ne[-1]


@dataclass(frozen=True)
class Shard:
    path: Path
    size: int
    version: int
    alignment: int
    kv_span: tuple[int, int]  # [start, end) of the key/value section
    tensor_info_span: tuple[int, int]  # [start, end) of the tensor-info section
    data_offset: int  # start of the aligned tensor-data section
    n_kv: int


_SPLIT_NAME = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def shard_paths(path: str | os.PathLike) -> list[Path]:
    """All shard paths of a (possibly split) GGUF, given the file or its first shard."""
    path = Path(path)
    m = _SPLIT_NAME.match(path.name)
    if not m:
        return [path]
    no, count = int(m["no"]), int(m["count"])
    if no != 1:
        raise SwapmoeError(f"{path}: this is shard {no} of {count}; give the first shard (…-00001-of-{count:05d}.gguf)")
    paths = [path.with_name(f"{m['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    for i, p in enumerate(paths, 1):
        if not p.exists():
            raise SwapmoeError(f"{p}: missing shard {i} of {count} of {path}")
    return paths


def _open_reader(path: Path) -> GGUFReader:
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise SwapmoeError(f"{path}: no such file") from None
    except OSError as e:
        raise SwapmoeError(f"{path}: cannot open ({e.strerror})") from None
    if path.is_dir():
        raise SwapmoeError(f"{path}: is a directory, not a GGUF file")
    if size < 24:
        raise SwapmoeError(f"{path}: not a GGUF file (only {size} bytes)")
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise SwapmoeError(f"{path}: not a GGUF file (no GGUF magic at the start)")
    try:
        return _TableReader(path)
    except SwapmoeError:
        raise
    except PermissionError as e:
        raise SwapmoeError(f"{path}: cannot open ({e.strerror})") from None
    except Exception as e:  # the gguf parser signals damage with many exception types
        raise SwapmoeError(f"{path}: corrupt or truncated GGUF header ({type(e).__name__}: {e})") from None


class _TableReader(GGUFReader):
    """GGUFReader that records the tensor table instead of building a numpy view per tensor,
    and refuses tensors that lie outside the file (a truncated download)."""

    def _build_tensors(self, start_offs: int, fields) -> None:
        self.tensor_table = []
        self.tensor_info_end = 0
        names = set()
        size = len(self.data)
        for field in fields:
            _, name_data, _, dims, raw_type, rel_offset = field.parts
            name = bytes(name_data).decode("utf-8")
            if name in names:
                raise SwapmoeError(f"{self.path}: tensor {name} appears twice")
            names.add(name)
            try:
                ggml_type = GGMLQuantizationType(int(raw_type[0]))
            except ValueError:
                raise SwapmoeError(f"{self.path}: tensor {name} has unknown ggml type {int(raw_type[0])}") from None
            ne = tuple(int(d) for d in dims)
            block, type_size = GGML_QUANT_SIZES[ggml_type]
            n_elements = int(np.prod(ne, dtype=np.int64))
            if ne and ne[0] % block:
                raise SwapmoeError(f"{self.path}: tensor {name}: row of {ne[0]} is not a whole number of "
                                   f"{ggml_type.name} blocks of {block}")
            nbytes = n_elements // block * type_size
            offset = int(start_offs) + int(rel_offset[0])
            if offset + nbytes > size:
                raise SwapmoeError(f"{self.path}: truncated: tensor {name} needs bytes up to {offset + nbytes:,} "
                                   f"but the file has {size:,} bytes")
            self.tensor_table.append((name, ggml_type, ne, offset, nbytes))
            self.tensor_info_end = max(self.tensor_info_end, field.offset + sum(p.nbytes for p in field.parts))

    def __init__(self, path: Path):
        self.path = path
        super().__init__(path, "r")


class GGUFFile:
    """A GGUF model: metadata of its first shard and the tensors of all shards."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._readers = [_open_reader(p) for p in shard_paths(self.path)]
        self.shards: list[Shard] = []
        self.tensors: dict[str, TensorInfo] = {}
        for index, reader in enumerate(self._readers):
            self.shards.append(self._shard(reader))
            for name, ggml_type, ne, offset, nbytes in reader.tensor_table:
                if name in self.tensors:
                    raise SwapmoeError(f"{reader.path}: tensor {name} is also in an earlier shard")
                self.tensors[name] = TensorInfo(name, ggml_type, ne, index, offset, nbytes, classify(name))
        self._check_split_keys()

    @staticmethod
    def _shard(reader: _TableReader) -> Shard:
        kv_fields = [f for key, f in reader.fields.items() if not key.startswith("GGUF.")]
        kv_start = 24  # magic, version, tensor count, kv count
        kv_end = kv_start + sum(sum(p.nbytes for p in f.parts) for f in kv_fields)
        tensor_info_end = int(max(reader.tensor_info_end, kv_end))
        return Shard(Path(reader.path), len(reader.data), int(reader.fields["GGUF.version"].parts[0][0]),
                     int(reader.alignment), (kv_start, kv_end), (kv_end, tensor_info_end),
                     int(reader.data_offset), len(kv_fields))

    def _check_split_keys(self) -> None:
        count = self.get("split.count")
        if count is not None and int(count) != len(self.shards):
            raise SwapmoeError(f"{self.path}: metadata says {count} shards but {len(self.shards)} were found "
                               "(name them NAME-00001-of-0000N.gguf)")

    # --- metadata -------------------------------------------------------------------
    def get(self, key: str, default: Any = None) -> Any:
        """Value of a metadata key of the first shard (str, int, float, bool or list)."""
        field = self._readers[0].fields.get(key)
        return default if field is None else field.contents()

    def keys(self) -> list[str]:
        return [k for k in self._readers[0].fields if not k.startswith("GGUF.")]

    def kv_spans(self, shard: int = 0) -> list[tuple[str, int, int]]:
        """(key, start, end) byte span of every key/value field of a shard, in file order."""
        return [(key, int(f.offset), int(f.offset) + sum(int(p.nbytes) for p in f.parts))
                for key, f in self._readers[shard].fields.items() if not key.startswith("GGUF.")]

    @cached_property
    def arch(self) -> str:
        arch = self.get("general.architecture")
        if not arch:
            raise SwapmoeError(f"{self.path}: no general.architecture key")
        return arch

    def arch_get(self, suffix: str, default: Any = None) -> Any:
        """Value of `{arch}.{suffix}`, e.g. arch_get("expert_count")."""
        return self.get(f"{self.arch}.{suffix}", default)

    # --- tensors --------------------------------------------------------------------
    def tensors_of_kind(self, kind: TensorKind) -> list[TensorInfo]:
        return [t for t in self.tensors.values() if t.kind is kind]

    def tensor(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise SwapmoeError(f"{self.path}: missing tensor {name}") from None

    def advise(self, advice: int, shard: int, offset: int = 0, length: int | None = None) -> None:
        """madvise() this object's own map of a shard, page-aligned outwards (e.g. MADV_RANDOM so that
        reading a tensor does not drag neighbouring bytes in with readahead)."""
        data = self._readers[shard].data
        end = len(data) if length is None else min(len(data), offset + length)
        start = offset // mmap.PAGESIZE * mmap.PAGESIZE
        data._mmap.madvise(advice, start, end - start)

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 view of the mapped file (no copy)."""
        t = self.tensor(name)
        return self._readers[t.shard].data[t.offset:t.offset + t.nbytes]

    def array(self, name: str) -> np.ndarray:
        """Float/int tensors as typed numpy arrays in numpy shape; quantized ones as uint8 rows."""
        t = self.tensor(name)
        dtypes = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
                  GGMLQuantizationType.I32: np.int32, GGMLQuantizationType.I16: np.int16,
                  GGMLQuantizationType.I8: np.int8, GGMLQuantizationType.F64: np.float64,
                  GGMLQuantizationType.I64: np.int64}
        raw = self.raw(name)
        if t.ggml_type in dtypes:
            return raw.view(dtypes[t.ggml_type]).reshape(t.shape)
        return raw.reshape(t.shape[:-1] + (-1,))

    @property
    def total_size(self) -> int:
        return sum(s.size for s in self.shards)


def open_gguf(path: str | os.PathLike) -> GGUFFile:
    """Open a GGUF (or the first shard of a split GGUF) for reading."""
    return GGUFFile(path)
