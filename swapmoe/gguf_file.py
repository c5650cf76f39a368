"""Read-only access to a GGUF model and its split shards, without reading tensor data.

The headers (metadata and tensor table) are parsed here, straight from a read-only map of
each file with struct and numpy: the gguf package's GGUFReader builds a Python object per
array element, which takes seconds for a real 150k-token vocabulary; this takes a fraction
of a second. The gguf package still provides the constants (value types, ggml types and
their block sizes). On top of parsing, this module gives split shards
(`name-00001-of-00003.gguf`), absolute byte ranges for every tensor, the byte spans of each
shard's header sections (so the repacker can copy metadata verbatim), clear errors for
damaged files, and the tensor classification table.

Tensor data is only ever reached through read-only memory maps.
"""

from __future__ import annotations

import math
import mmap
import os
import re
import struct
from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGMLQuantizationType, GGUFValueType, Keys

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
    (
        re.compile(_LAYER + r"ffn_(?P<projection>gate_up|gate|up|down)_exps\.(?P<part>weight|bias|scale)$"),
        TensorKind.ROUTED_EXPERT,
    ),
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


# --------------------------------------------------------------------------------------
# Header parsing
# --------------------------------------------------------------------------------------
_HEADER = struct.Struct("<4sIQQ")  # magic, version, tensor count, key/value count
_SUPPORTED_VERSIONS = (2, 3)
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
_ARRAY_HEADER = struct.Struct("<IQ")  # item type, item count
_TENSOR_TYPE_AND_OFFSET = struct.Struct("<IQ")  # ggml type, offset in the data section
_MAX_DIMS = 4  # GGML_MAX_DIMS
_MAX_STRING = 64 << 20  # bytes of one metadata string: chat templates are ~100 kB, tokens a few bytes
# The fixed-size value types: struct formats that are also numpy dtypes, for arrays of them.
_SCALAR_FORMATS = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
_SCALARS = {value_type: struct.Struct(fmt) for value_type, fmt in _SCALAR_FORMATS.items()}
_ARRAY_DTYPES = {value_type: np.dtype(fmt) for value_type, fmt in _SCALAR_FORMATS.items()}


@dataclass
class _ShardHeader:
    """One shard's parsed header, and the read-only map of the whole file."""

    shard: Shard
    map: mmap.mmap
    data: np.ndarray  # uint8 view of the map
    metadata: dict[str, Any]  # key -> value; numeric arrays as numpy arrays
    kv_spans: list[tuple[str, int, int]]
    tensors: list[TensorInfo]


def _open_shard(path: Path, index: int) -> _ShardHeader:
    """Map shard number `index` of a model and parse its header; damage is a SwapmoeError."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise SwapmoeError(f"{path}: no such file") from None
    except OSError as e:
        raise SwapmoeError(f"{path}: cannot open ({e.strerror})") from None
    if path.is_dir():
        raise SwapmoeError(f"{path}: is a directory, not a GGUF file")
    if size < _HEADER.size:
        raise SwapmoeError(f"{path}: not a GGUF file (only {size} bytes)")
    try:
        with open(path, "rb") as f:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise SwapmoeError(f"{path}: cannot open ({e.strerror})") from None
    magic, version, n_tensors, n_kv = _HEADER.unpack_from(data)
    if magic != b"GGUF":
        raise SwapmoeError(f"{path}: not a GGUF file (no GGUF magic at the start)")
    if version and not version & 0xFFFF:  # a small version number written in the other byte order
        raise SwapmoeError(f"{path}: big-endian GGUF files are not supported")
    if version not in _SUPPORTED_VERSIONS:
        raise SwapmoeError(f"{path}: GGUF version {version} is not supported (only versions 2 and 3 are)")
    try:
        return _parse_header(path, index, data, version, n_tensors, n_kv)
    except (struct.error, ValueError, OverflowError) as e:  # reads past the end, bad UTF-8, bad value types
        raise SwapmoeError(f"{path}: corrupt or truncated GGUF header ({type(e).__name__}: {e})") from None


def _parse_header(path: Path, index: int, data: mmap.mmap, version: int, n_tensors: int, n_kv: int) -> _ShardHeader:
    # The counts come from the file: the loops below trust them because every field moves `pos`
    # on by at least 12 bytes, so a damaged count soon reads past the end and raises.
    metadata: dict[str, Any] = {}
    kv_spans = []
    pos = _HEADER.size
    for _ in range(n_kv):
        start = pos
        key, pos = _read_string(data, pos)
        key = key.decode("utf-8")
        if key in metadata:
            raise SwapmoeError(f"{path}: metadata key {key} appears twice")
        (value_type,) = _U32.unpack_from(data, pos)
        if key == "general.alignment" and value_type != GGUFValueType.UINT32:
            raise SwapmoeError(f"{path}: general.alignment must be a uint32, not value type {value_type}")
        metadata[key], pos = _read_value(data, pos + 4, value_type)
        kv_spans.append((key, start, pos))
    kv_end = pos

    alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    if alignment == 0 or alignment & (alignment - 1):
        raise SwapmoeError(f"{path}: bad general.alignment {alignment}: it must be a non-zero power of two")

    # The tensor offsets count from the data section, which starts after the last tensor info.
    infos = []
    for _ in range(n_tensors):
        name, pos = _read_string(data, pos)
        (n_dims,) = _U32.unpack_from(data, pos)
        if n_dims > _MAX_DIMS:
            raise ValueError(f"tensor at byte {pos:,} has {n_dims} dimensions (at most {_MAX_DIMS})")
        ne = struct.unpack_from(f"<{n_dims}Q", data, pos + 4)
        raw_type, relative_offset = _TENSOR_TYPE_AND_OFFSET.unpack_from(data, pos + 4 + 8 * n_dims)
        pos += 4 + 8 * n_dims + _TENSOR_TYPE_AND_OFFSET.size
        infos.append((name.decode("utf-8"), ne, raw_type, relative_offset))
    tensor_info_end = pos
    data_offset = -(-tensor_info_end // alignment) * alignment

    tensors, names = [], set()
    for name, ne, raw_type, relative_offset in infos:
        if name in names:
            raise SwapmoeError(f"{path}: tensor {name} appears twice")
        names.add(name)
        try:
            ggml_type = GGMLQuantizationType(raw_type)
        except ValueError:
            raise SwapmoeError(f"{path}: tensor {name} has unknown ggml type {raw_type}") from None
        block, type_size = GGML_QUANT_SIZES[ggml_type]
        if 0 in ne:  # an empty tensor would let its other dimensions be anything at all
            raise SwapmoeError(f"{path}: tensor {name} has a dimension of 0 ({list(ne)})")
        if ne and ne[0] % block:
            raise SwapmoeError(
                f"{path}: tensor {name}: row of {ne[0]} is not a whole number of {ggml_type.name} blocks of {block}"
            )
        if relative_offset % alignment:
            raise SwapmoeError(
                f"{path}: tensor {name} starts at byte {relative_offset:,} of the data section, "
                f"not a multiple of general.alignment {alignment}"
            )
        nbytes = math.prod(ne) // block * type_size
        offset = data_offset + relative_offset
        if offset + nbytes > len(data):
            raise SwapmoeError(
                f"{path}: truncated: tensor {name} needs bytes up to {offset + nbytes:,} "
                f"but the file has {len(data):,} bytes"
            )
        tensors.append(TensorInfo(name, ggml_type, ne, index, offset, nbytes, classify(name)))
    by_offset = sorted(tensors, key=lambda t: t.offset)
    for before, after in zip(by_offset, by_offset[1:]):
        if after.offset < before.offset + before.nbytes:
            raise SwapmoeError(
                f"{path}: tensors {before.name} and {after.name} overlap (bytes {after.offset:,} to "
                f"{before.offset + before.nbytes:,})"
            )

    shard = Shard(
        path,
        len(data),
        version,
        alignment,
        (_HEADER.size, kv_end),
        (kv_end, tensor_info_end),
        data_offset,
        len(kv_spans),
    )
    return _ShardHeader(shard, data, np.frombuffer(data, np.uint8), metadata, kv_spans, tensors)


def _read_string(data: mmap.mmap, pos: int) -> tuple[bytes, int]:
    """The bytes of the length-prefixed string at `pos`, and the position after it."""
    (size,) = _U64.unpack_from(data, pos)
    end = pos + 8 + size
    if end > len(data) or size > _MAX_STRING:
        raise ValueError(
            f"string at byte {pos:,} claims {size:,} bytes"
            + (", past the end of the file" if end > len(data) else f" (at most {_MAX_STRING:,})")
        )
    return data[pos + 8 : end], end


def _read_value(data: mmap.mmap, pos: int, value_type: int) -> tuple[Any, int]:
    """The metadata value at `pos`, and the position after it. Strings are decoded as UTF-8 with
    bytes that are not UTF-8 kept as surrogate escapes (token texts are raw bytes that the
    tokenizer needs exactly); numeric arrays are numpy views of the map."""
    if value_type == GGUFValueType.STRING:
        text, pos = _read_string(data, pos)
        return text.decode("utf-8", "surrogateescape"), pos
    scalar = _SCALARS.get(value_type)
    if scalar is not None:
        return scalar.unpack_from(data, pos)[0], pos + scalar.size
    if value_type != GGUFValueType.ARRAY:
        raise ValueError(f"unknown value type {value_type} at byte {pos:,}")
    item_type, count = _ARRAY_HEADER.unpack_from(data, pos)
    pos += _ARRAY_HEADER.size
    if item_type == GGUFValueType.STRING:
        return _read_strings(data, pos, count)
    dtype = _ARRAY_DTYPES.get(item_type)
    if dtype is None:  # including arrays of arrays, which llama.cpp refuses too
        raise ValueError(f"array at byte {pos:,} has unsupported item type {item_type}")
    end = pos + count * dtype.itemsize
    if end > len(data):
        raise ValueError(f"array at byte {pos:,} runs past the end of the file")
    return np.frombuffer(data, dtype, count, pos), end


def _read_strings(data: mmap.mmap, pos: int, count: int) -> tuple[list[str], int]:
    """A string array's items (at `pos`, after the array header), and the position after them."""
    if count > (len(data) - pos) // 8:  # each string has an 8-byte length; this also bounds the loop
        raise ValueError(f"string array at byte {pos:,} runs past the end of the file")
    strings: list[str] = []
    append, unpack_size = strings.append, _U64.unpack_from
    limit = min(len(data), pos + count * (8 + _MAX_STRING))
    for _ in range(count):  # the hot loop (150k tokens and as many merges): kept minimal
        (size,) = unpack_size(data, pos)
        pos += 8
        if size > _MAX_STRING or pos + size > limit:  # a damaged length: no copy of the file behind it
            raise ValueError(f"string at byte {pos - 8:,} of an array claims {size:,} bytes")
        append(data[pos : pos + size].decode("utf-8", "surrogateescape"))
        pos += size
    if pos > len(data):
        raise ValueError("string array runs past the end of the file")
    return strings, pos


class GGUFFile:
    """A GGUF model: metadata of its first shard and the tensors of all shards."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._overrides: dict[str, Any] = {}
        self._headers = [_open_shard(p, index) for index, p in enumerate(shard_paths(self.path))]
        self.shards: list[Shard] = [header.shard for header in self._headers]
        self.tensors: dict[str, TensorInfo] = {}
        for header in self._headers:
            for t in header.tensors:
                if t.name in self.tensors:
                    raise SwapmoeError(f"{header.shard.path}: tensor {t.name} is also in an earlier shard")
                self.tensors[t.name] = t
        self._check_split_keys()
        check_model(self)

    def _check_split_keys(self) -> None:
        count = self.get("split.count")
        if count is not None and int(count) != len(self.shards):
            raise SwapmoeError(
                f"{self.path}: metadata says {count} shards but {len(self.shards)} were found "
                "(name them NAME-00001-of-0000N.gguf)"
            )

    # --- metadata -------------------------------------------------------------------
    def override(self, values: dict[str, Any]) -> None:
        """Answer these keys with these values from now on (llama.cpp's --override-kv); a key the
        file has must keep its type (int, float, bool or str)."""
        for key, value in values.items():
            current = self.get(key)
            if current is not None and type(current) is not type(value):
                raise SwapmoeError(
                    f"{self.path}: cannot override {key} ({type(current).__name__} in the file) "
                    f"with a {type(value).__name__}"
                )
        self._overrides.update(values)
        check_model(self)

    def get(self, key: str, default: Any = None) -> Any:
        """Value of a metadata key of the first shard (or its override): str, int, float, bool, or
        for an array a list (a new one on every call, so callers may change it)."""
        if key in self._overrides:
            return self._overrides[key]
        metadata = self._headers[0].metadata
        if key not in metadata:
            return default
        value = metadata[key]
        if isinstance(value, np.ndarray):
            return value.tolist()
        return list(value) if isinstance(value, list) else value

    def keys(self) -> list[str]:
        return list(dict.fromkeys([*self._headers[0].metadata, *self._overrides]))

    def metadata(self) -> dict[str, Any]:
        """All metadata of the first shard, key -> value as get() gives it."""
        return {key: self.get(key) for key in self.keys()}

    def kv_spans(self, shard: int = 0) -> list[tuple[str, int, int]]:
        """(key, start, end) byte span of every key/value field of a shard, in file order."""
        return list(self._headers[shard].kv_spans)

    @cached_property
    def arch(self) -> str:
        arch = self.get("general.architecture")
        if not arch:
            raise SwapmoeError(f"{self.path}: no general.architecture key")
        return arch

    def arch_key(self, key: str) -> str:
        """A per-architecture key template of gguf's (`Keys.LLM.EXPERT_COUNT` is
        "{arch}.expert_count") spelled for this file's architecture."""
        return key.format(arch=self.arch)

    def arch_get(self, key: str, default: Any = None) -> Any:
        """Value of a per-architecture key, e.g. arch_get(Keys.LLM.EXPERT_COUNT)."""
        return self.get(self.arch_key(key), default)

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
        data = self._headers[shard].map
        end = len(data) if length is None else min(len(data), offset + length)
        start = offset // mmap.PAGESIZE * mmap.PAGESIZE
        data.madvise(advice, start, end - start)

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 view of the mapped file (no copy)."""
        t = self.tensor(name)
        return self._headers[t.shard].data[t.offset : t.offset + t.nbytes]

    def array(self, name: str) -> np.ndarray:
        """Float/int tensors as typed numpy arrays in numpy shape; quantized ones as uint8 rows."""
        t = self.tensor(name)
        dtypes = {
            GGMLQuantizationType.F32: np.float32,
            GGMLQuantizationType.F16: np.float16,
            GGMLQuantizationType.I32: np.int32,
            GGMLQuantizationType.I16: np.int16,
            GGMLQuantizationType.I8: np.int8,
            GGMLQuantizationType.F64: np.float64,
            GGMLQuantizationType.I64: np.int64,
        }
        raw = self.raw(name)
        if t.ggml_type in dtypes:
            return raw.view(dtypes[t.ggml_type]).reshape(t.shape)
        return raw.reshape(t.shape[:-1] + (-1,))

    @property
    def total_size(self) -> int:
        return sum(s.size for s in self.shards)


# --------------------------------------------------------------------------------------
# Metadata against tensors: the one cross-check, run when a file is opened and after overrides
# --------------------------------------------------------------------------------------
_BUNDLED_EXPERT = re.compile(r"^(?P<name>blk\.\d+\.ffn_\w+_exps\.(weight|bias|scale))\.(?P<expert>\d+)$")
_PER_LAYER = (Keys.Attention.HEAD_COUNT, Keys.Attention.HEAD_COUNT_KV)  # a number, or one per layer
_WHOLE = (
    Keys.LLM.BLOCK_COUNT,
    Keys.LLM.EMBEDDING_LENGTH,
    Keys.LLM.EXPERT_COUNT,
    Keys.LLM.EXPERT_USED_COUNT,
    Keys.LLM.EXPERT_FEED_FORWARD_LENGTH,
    Keys.LLM.CONTEXT_LENGTH,
    Keys.LLM.NEXTN_PREDICT_LAYERS,
    Keys.LLM.EXPERT_GROUP_COUNT,
    Keys.LLM.EXPERT_GROUP_USED_COUNT,
    Keys.LLM.FULL_ATTENTION_INTERVAL,
    Keys.Attention.KEY_LENGTH,
    Keys.Attention.VALUE_LENGTH,
    Keys.Attention.KEY_LENGTH_MLA,
    Keys.Attention.VALUE_LENGTH_MLA,
    Keys.Attention.Q_LORA_RANK,
    Keys.Attention.KV_LORA_RANK,
    Keys.Rope.DIMENSION_COUNT,
    Keys.Rope.DIMENSION_COUNT_SWA,
    Keys.Rope.SCALING_ORIG_CTX_LEN,
    Keys.SSM.CONV_KERNEL,
) + _PER_LAYER
_NOT_ZERO = (Keys.LLM.FULL_ATTENTION_INTERVAL, Keys.Rope.SCALING_ORIG_CTX_LEN, Keys.SSM.CONV_KERNEL)  # divisors, logs
_REAL = (
    Keys.Attention.LAYERNORM_RMS_EPS,
    Keys.Attention.LAYERNORM_EPS,
    Keys.Rope.FREQ_BASE,
    Keys.Rope.SCALING_FACTOR,
    Keys.Rope.SCALING_ATTN_FACTOR,
)
_NORMS = ("attn_norm", "ffn_norm", "post_attention_norm")  # per layer, one weight per embedding dimension
_SHOWN = 60  # characters of a bad value quoted in an error


def _is_whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class _ModelCheck:
    """The metadata keys every loader reads, checked against the tensors they size. Only what the
    file has is checked (a vocab-only file passes); an architecture's own keys and tensors are
    its loader's business. The rules are llama.cpp's tensor shapes for these names."""

    def __init__(self, g: GGUFFile):
        self.g = g
        arch = g.get("general.architecture")
        self.arch = arch if isinstance(arch, str) and arch else None
        self.shapes = self._shapes()

    def _shapes(self) -> dict[str, tuple[int, ...]]:
        """ne of every tensor by name, a bundled file's expert tensors (`NAME.e`) joined back into NAME."""
        g, shapes, experts = self.g, {}, {}
        bundled = g.get("swapmoe.layout") == "bundled"
        for t in g.tensors.values():
            m = _BUNDLED_EXPERT.match(t.name) if bundled else None
            if m:
                experts.setdefault(m["name"], {})[int(m["expert"])] = t.ne
            else:
                shapes[t.name] = t.ne
        for name, parts in experts.items():
            if sorted(parts) != list(range(len(parts))) or len(set(parts.values())) != 1:
                raise SwapmoeError(
                    f"{g.path}: the expert tensors of {name} are not {len(parts)} tensors of one "
                    f"shape numbered 0..{len(parts) - 1}"
                )
            shapes[name] = parts[0] + (len(parts),)
        return shapes

    def key(self, template: str) -> str:
        return template.format(arch=self.arch)

    def value(self, template: str) -> Any:
        """A key's value, checked for its kind: whole numbers (or one per layer) and real numbers."""
        key = self.key(template)
        value = self.g.get(key)
        if value is None:
            return None
        if template in _REAL:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        else:
            ok = _is_whole(value) or (
                template in _PER_LAYER and isinstance(value, list) and all(_is_whole(v) for v in value)
            )
        if not ok:
            kind = (
                "a number"
                if template in _REAL
                else "a whole number" + (" or one per layer" if template in _PER_LAYER else "")
            )
            raise SwapmoeError(f"{self.g.path}: {key} must be {kind}, not {repr(value)[:_SHOWN]}")
        return value

    def fail(self, message: str) -> None:
        raise SwapmoeError(f"{self.g.path}: {message}")

    def want(self, name: str, dim: int, value: int | None, why: str) -> None:
        if value is not None:
            self._one_of(name, dim, (value,), why)

    def run(self) -> None:
        self._tokenizer()
        if not self.shapes:
            return
        if self.arch is None:
            self.fail("no general.architecture (a text), but the file has tensors")
        for template in _WHOLE + _REAL:
            self.value(template)
        for template in _NOT_ZERO:
            self._length(template, None)
        n_layer = self._layers()
        self.embd = self.value(Keys.LLM.EMBEDDING_LENGTH)
        self.embd_key = self.key(Keys.LLM.EMBEDDING_LENGTH)
        for name in ("token_embd.weight", "output.weight"):
            self.want(name, 0, self.embd, self.embd_key)
            self.want(name, 1, self.n_vocab, f"the vocabulary of {self.n_vocab} tokens")
        self.want("output_norm.weight", 0, self.embd, self.embd_key)
        routed = self._experts(n_layer)
        for layer in range(n_layer):
            self._layer(layer, routed)

    def _tokenizer(self) -> None:
        metadata = self.g._headers[0].metadata  # the arrays themselves: get() would copy them
        tokens = metadata.get(Keys.Tokenizer.LIST)
        self.n_vocab = len(tokens) if tokens is not None else None
        for key in (Keys.Tokenizer.SCORES, Keys.Tokenizer.TOKEN_TYPE):
            values = metadata.get(key)
            if values is not None and tokens is not None and len(values) != len(tokens):
                self.fail(f"{key} has {len(values)} entries for {len(tokens)} tokens")

    def _layers(self) -> int:
        """block_count, checked against the layers the tensors name (it sizes arrays: a damaged count
        must not)."""
        layers = {t.layer for t in self.g.tensors.values() if t.layer is not None}
        key = self.key(Keys.LLM.BLOCK_COUNT)
        claimed = self.value(Keys.LLM.BLOCK_COUNT)
        if not layers:
            return 0
        if claimed is None:
            self.fail(f"no {key} key, but the file has tensors for {max(layers) + 1} layers")
        if claimed != max(layers) + 1:
            self.fail(f"{key} is {claimed}, but the file has tensors for {max(layers) + 1} layers")
        if len(layers) != claimed:
            self.fail(f"{key} is {claimed}, but layer {min(set(range(claimed)) - layers)} has no tensors")
        mtp = self.value(Keys.LLM.NEXTN_PREDICT_LAYERS)
        if mtp is not None and mtp >= claimed:
            self.fail(f"{self.key(Keys.LLM.NEXTN_PREDICT_LAYERS)} is {mtp}, but the model has {claimed} layers")
        for template in _PER_LAYER:
            value = self.value(template)
            if isinstance(value, list) and len(value) != claimed:
                self.fail(f"{self.key(template)} has {len(value)} values for {claimed} layers")
        return claimed

    def _per_layer(self, template: str, layer: int) -> int | None:
        value = self.value(template)
        return value[layer] if isinstance(value, list) else value

    def _experts(self, n_layer: int) -> dict[int, dict[str, tuple[int, ...]]]:
        """layer -> part (gate, up, gate_up, down, gate.bias, ...) -> ne of its routed tensor; the
        expert count and experts per token checked."""
        routed: dict[int, dict[str, tuple[int, ...]]] = {}
        for name, ne in self.shapes.items():
            cls = classify(name)
            if cls.kind is TensorKind.ROUTED_EXPERT:
                part = cls.projection if cls.part == "weight" else f"{cls.projection}.{cls.part}"
                routed.setdefault(cls.layer, {})[part] = (name, ne)
        if not routed:
            return {}
        count_key, used_key = self.key(Keys.LLM.EXPERT_COUNT), self.key(Keys.LLM.EXPERT_USED_COUNT)
        n_expert, n_used = self.value(Keys.LLM.EXPERT_COUNT), self.value(Keys.LLM.EXPERT_USED_COUNT)
        if n_expert is None:
            self.fail(f"no {count_key} key, but the file has routed expert tensors")
        for parts in routed.values():
            for name, ne in parts.values():
                self.want(name, len(ne) - 1, n_expert, count_key)
        if n_used is None or not 1 <= n_used <= n_expert:
            self.fail(f"{used_key} is {n_used}; it must be 1..{n_expert} ({count_key})")
        groups, groups_used = self.value(Keys.LLM.EXPERT_GROUP_COUNT), self.value(Keys.LLM.EXPERT_GROUP_USED_COUNT)
        if groups and groups > 1 and (n_expert % groups or (groups_used or 0) > groups):
            self.fail(
                f"{self.key(Keys.LLM.EXPERT_GROUP_COUNT)} {groups} (of which "
                f"{self.key(Keys.LLM.EXPERT_GROUP_USED_COUNT)} {groups_used} are used) does not divide "
                f"{n_expert} experts"
            )
        self.n_expert, self.count_key = n_expert, count_key
        return routed

    def _layer(self, layer: int, routed: dict) -> None:
        p, d, embd_key = f"blk.{layer}.", self.embd, self.embd_key
        for norm in _NORMS:
            self.want(f"{p}{norm}.weight", 0, d, embd_key)
        self._attention(layer)
        for suffix in ("", "_shexp"):  # a dense FFN, a shared expert
            self.want(f"{p}ffn_gate{suffix}.weight", 0, d, embd_key)
            self.want(f"{p}ffn_up{suffix}.weight", 0, d, embd_key)
            self.want(f"{p}ffn_down{suffix}.weight", 1, d, embd_key)
        self.want(f"{p}ffn_gate_inp_shexp.weight", 0, d, embd_key)
        self.want(f"{p}ssm_conv1d.weight", 0, self.value(Keys.SSM.CONV_KERNEL), self.key(Keys.SSM.CONV_KERNEL))
        parts = routed.get(layer)
        if not parts:
            return
        weights = {part for part in parts if "." not in part}
        if "down" not in weights or not ("gate_up" in weights or {"gate", "up"} <= weights):
            missing = "down" if "down" not in weights else "gate" if "gate" not in weights else "up"
            self.fail(f"layer {layer} has routed expert tensors but no {p}ffn_{missing}_exps.weight")
        n_expert, count = self.n_expert, self.count_key
        ff_key = self.key(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH)
        ff = self.value(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH)
        for part, (name, ne) in parts.items():
            if part in ("gate", "up", "gate_up"):
                self.want(name, 0, d, embd_key)
                self.want(name, 1, None if ff is None else ff * (2 if part == "gate_up" else 1), ff_key)
            elif part == "down":
                self.want(name, 0, ff, ff_key)
                self.want(name, 1, d, embd_key)
        self.want(f"{p}ffn_gate_inp.weight", 0, d, embd_key)
        for name in ("ffn_gate_inp.weight", "ffn_gate_inp.bias", "exp_probs_b.bias"):
            self.want(p + name, 1 if name == "ffn_gate_inp.weight" else 0, n_expert, count)

    def _length(self, template: str, default: int | None) -> int | None:
        """A length key's value (at least 1), or `default` where the file has none."""
        value = self.value(template)
        if value == 0:
            self.fail(f"{self.key(template)} is 0")
        return default if value is None else value

    def _attention(self, layer: int) -> None:
        """Head counts and lengths against the projections (GQA, and the q and output projections of
        latent attention: key_length_mla / value_length_mla where the file has them)."""
        p, shapes, d = f"blk.{layer}.", self.shapes, self.embd
        names = (
            "attn_q.weight",
            "attn_k.weight",
            "attn_v.weight",
            "attn_output.weight",
            "attn_q_b.weight",
            "attn_sinks.weight",
        )
        if not any(p + name in shapes for name in names):
            return
        head_key, kv_key = self.key(Keys.Attention.HEAD_COUNT), self.key(Keys.Attention.HEAD_COUNT_KV)
        heads = self._per_layer(Keys.Attention.HEAD_COUNT, layer)
        if not heads:
            self.fail(f"layer {layer} has attention tensors but {head_key} is {heads}")
        kv_heads = self._per_layer(Keys.Attention.HEAD_COUNT_KV, layer)
        kv_heads = heads if kv_heads is None else kv_heads
        key_length = self._length(Keys.Attention.KEY_LENGTH, d // heads if d else None)
        value_length = self._length(Keys.Attention.VALUE_LENGTH, key_length)
        q_length = self._length(Keys.Attention.KEY_LENGTH_MLA, key_length)
        out_length = self._length(Keys.Attention.VALUE_LENGTH_MLA, value_length)
        if p + "attn_k.weight" in shapes:
            if not kv_heads or heads % kv_heads:
                self.fail(f"{head_key} ({heads}) is not a multiple of {kv_key} ({kv_heads}) in layer {layer}")
            for name in ("attn_q.weight", "attn_k.weight", "attn_v.weight"):
                self.want(p + name, 0, d, self.embd_key)
            if key_length is not None:
                self.want(
                    p + "attn_k.weight", 1, kv_heads * key_length, f"{kv_key} {kv_heads} x key_length {key_length}"
                )
                self._one_of(p + "attn_k_norm.weight", 0, (key_length, kv_heads * key_length), kv_key)
            if value_length is not None:
                self.want(
                    p + "attn_v.weight",
                    1,
                    kv_heads * value_length,
                    f"{kv_key} {kv_heads} x value_length {value_length}",
                )
        if q_length is not None:
            for name in ("attn_q.weight", "attn_q_b.weight"):  # gated attention doubles the rows
                self._one_of(p + name, 1, (heads * q_length, 2 * heads * q_length), f"{head_key} {heads}")
            self._one_of(p + "attn_q_norm.weight", 0, (q_length, heads * q_length), f"{head_key} {heads}")
        if out_length is not None:
            self.want(
                p + "attn_output.weight", 0, heads * out_length, f"{head_key} {heads} x value length {out_length}"
            )
        self.want(p + "attn_output.weight", 1, d, self.embd_key)
        self.want(p + "attn_sinks.weight", 0, heads, head_key)
        for template in (Keys.Rope.DIMENSION_COUNT, Keys.Rope.DIMENSION_COUNT_SWA):  # rotated pairs within a head
            rotated = self.value(template)
            if rotated is not None and (rotated < 2 or rotated % 2 or (q_length and rotated > q_length)):
                self.fail(
                    f"{self.key(template)} is {rotated}; it must be an even number of 2..{q_length} "
                    "(the length of a head)"
                )
        self._latent(p)

    def _latent(self, p: str) -> None:
        """The low-rank q and kv projections of latent attention (q_lora_rank 0: no q projection)."""
        d, rotated = self.embd, self.value(Keys.Rope.DIMENSION_COUNT)
        q_key, kv_key = self.key(Keys.Attention.Q_LORA_RANK), self.key(Keys.Attention.KV_LORA_RANK)
        q_rank, kv_rank = self.value(Keys.Attention.Q_LORA_RANK) or None, self.value(Keys.Attention.KV_LORA_RANK)
        self.want(p + "attn_q_a.weight", 0, d, self.embd_key)
        self.want(p + "attn_q_a.weight", 1, q_rank, q_key)
        self.want(p + "attn_q_a_norm.weight", 0, q_rank, q_key)
        self.want(p + "attn_q_b.weight", 0, q_rank, q_key)
        self.want(p + "attn_kv_a_mqa.weight", 0, d, self.embd_key)
        self.want(
            p + "attn_kv_a_mqa.weight",
            1,
            None if kv_rank is None or rotated is None else kv_rank + rotated,
            f"{kv_key} + rope.dimension_count",
        )
        self.want(p + "attn_kv_a_norm.weight", 0, kv_rank, kv_key)
        self.want(p + "attn_k_b.weight", 1, kv_rank, kv_key)
        self.want(p + "attn_v_b.weight", 0, kv_rank, kv_key)

    def _one_of(self, name: str, dim: int, values: tuple, why: str) -> None:
        ne = self.shapes.get(name)
        if ne is None:
            return
        have = ne[dim] if dim < len(ne) else 1
        if have not in values:
            self.fail(f"tensor {name} has ne[{dim}] = {have}, but {why} gives {' or '.join(map(str, values))}")


def check_model(g: GGUFFile) -> None:
    """Refuse a model whose metadata contradict its tensors, with a line naming the file, the key
    or tensor and the problem (see _ModelCheck). Run by GGUFFile when it opens and after overrides,
    so inspect, repack, index and run all refuse the same files."""
    _ModelCheck(g).run()


def open_gguf(path: str | os.PathLike) -> GGUFFile:
    """Open a GGUF (or the first shard of a split GGUF) for reading."""
    return GGUFFile(path)
