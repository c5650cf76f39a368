#!/usr/bin/env python3
"""A seeded fuzz corpus against the `swapmoe` command line: hostile GGUF headers, sidecars, chat
templates and options, each run through the real commands in a subprocess.

    python tools/fuzz.py                        # the whole corpus: 528 cases, seed 0
    python tools/fuzz.py --seed 3 --case 17     # one case again, with its commands' output
    python tools/fuzz.py --kind sidecar --jobs 2
    python tools/fuzz.py --list                 # what each case does, without running it

Case K of seed N is always the same: its inputs come from tiny `swapmoe synth` models (same
seed, same bytes), repacked and indexed by swapmoe itself, then mutated by a generator seeded
with "N/K". Four kinds:
  gguf      header mutations: string lengths, array counts, value and item types, tensor
            counts, dims, types and offsets, truncations, metadata values that contradict the
            tensors (expert_count 0, head_count 0, block_count 10**7, ...), missing keys and tensors
  sidecar   the `.swapidx` beside a repacked or indexed GGUF: array values out of range, meta
            fields, section headers, dtypes and shapes (with a valid checksum: crafted, not
            damaged), wrong checksums, truncations
  template  hostile Jinja as tokenizer.chat_template, rendered by `swapmoe run --chat`
  option    command lines with out-of-range, malformed or hostile values, files and variables

Every command must: exit 0, or 1 with one `swapmoe: error:` line (2 with click's `Error:` line
for a bad option); never print a traceback; finish within TIMEOUT; fail where the case made its
input inconsistent or its option invalid; stay under RSS_LIMIT (inspect, index, repack, verify,
unpack, synth) or a valid run's peak plus RUN_RSS_MARGIN (run); leave no file beside its
inputs but the outputs it announced, and those only when it succeeded; leave its inputs as
they were. Each command also runs under RLIMIT_DATA = DATA_LIMIT, so a runaway allocation
fails inside the child instead of exhausting the machine (the RSS check still reports it).

The summary has one row per kind; every failing case is listed with the command that
reproduces it. Exit status: 0 when every case passed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import zstandard
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 60.0  # seconds per command
RSS_LIMIT = 300 << 20  # inspect, index, repack, verify, unpack, synth: tiny files, so this is all overhead
RUN_RSS_MARGIN = 96 << 20  # over the peak of a valid `run` of the same model (prompt and options vary)
DATA_LIMIT = 3 << 30  # RLIMIT_DATA of every command: a runaway allocation fails before the machine does
KINDS = ("gguf", "sidecar", "template", "option")
CYCLE = ("gguf",) * 4 + ("sidecar",) * 3 + ("template",) * 2 + ("option",) * 2  # kind of case K: CYCLE[K % 11]
DEFAULT_CASES = 528  # 48 cycles: 192 gguf, 144 sidecar, 96 template, 96 option
PROMPT = "def fibonacci(n):"
U32, U64 = (1 << 32) - 1, (1 << 64) - 1


# ==========================================================================================
# GGUF, read and written independently of swapmoe (the fuzzer must not trust what it tests)
# ==========================================================================================
STRING, ARRAY = 8, 9
SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
INT_TYPES = (0, 1, 2, 3, 4, 5, 10, 11)
DEFAULT_ALIGNMENT = 32


@dataclass
class Field:
    """Where one header field is, for byte-level mutations: what it is, its bytes, whose it is."""

    what: str
    pos: int
    size: int
    owner: str


@dataclass
class Gguf:
    version: int
    kvs: list  # [key, value_type, value]; strings as bytes; arrays as (item_type, [items])
    tensors: list  # [name, [ne...], ggml_type, offset relative to the data section]
    data: bytes  # the data section, from data_offset to the end of the file
    fields: list[Field]
    data_offset: int

    def get(self, key: str, default=None):
        for k, _, value in self.kvs:
            if k == key:
                return value
        return default

    def kv(self, key: str) -> list | None:
        return next((kv for kv in self.kvs if kv[0] == key), None)

    @property
    def arch(self) -> str:
        return self.get("general.architecture", b"").decode()

    def tensor(self, name: str) -> list | None:
        return next((t for t in self.tensors if t[0] == name), None)


def _read_value(blob: bytes, pos: int, value_type: int, owner: str, fields: list[Field]):
    if value_type == STRING:
        (n,) = struct.unpack_from("<Q", blob, pos)
        fields.append(Field("string_length", pos, 8, owner))
        return blob[pos + 8 : pos + 8 + n], pos + 8 + n
    if value_type == ARRAY:
        item_type, count = struct.unpack_from("<IQ", blob, pos)
        fields += [Field("array_type", pos, 4, owner), Field("array_count", pos + 4, 8, owner)]
        pos += 12
        items = []
        for i in range(count):
            item, pos = _read_value(blob, pos, item_type, owner, fields if i < 3 else [])
            items.append(item)
        return (item_type, items), pos
    fmt = SCALAR[value_type]
    fields.append(Field("value", pos, struct.calcsize(fmt), owner))
    return struct.unpack_from(fmt, blob, pos)[0], pos + struct.calcsize(fmt)


def _read_name(blob: bytes, pos: int, what: str, fields: list[Field]) -> tuple[str, int]:
    """A key's or tensor's name at `pos` (its length field recorded as `what`), and the position after it."""
    (n,) = struct.unpack_from("<Q", blob, pos)
    name = blob[pos + 8 : pos + 8 + n].decode()
    fields.append(Field(what, pos, 8, name))
    return name, pos + 8 + n


def read_gguf(blob: bytes) -> Gguf:
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", blob)
    assert magic == b"GGUF"
    fields = [Field("n_tensors", 8, 8, "header"), Field("n_kv", 16, 8, "header")]
    pos, kvs = 24, []
    for _ in range(n_kv):
        key, pos = _read_name(blob, pos, "key_length", fields)
        (value_type,) = struct.unpack_from("<I", blob, pos)
        fields.append(Field("value_type", pos, 4, key))
        value, pos = _read_value(blob, pos + 4, value_type, key, fields)
        kvs.append([key, value_type, value])
    tensors = []
    for _ in range(n_tensors):
        name, pos = _read_name(blob, pos, "name_length", fields)
        (n_dims,) = struct.unpack_from("<I", blob, pos)
        fields.append(Field("n_dims", pos, 4, name))
        ne = list(struct.unpack_from(f"<{n_dims}Q", blob, pos + 4))
        fields += [Field("dim", pos + 4 + 8 * i, 8, name) for i in range(n_dims)]
        pos += 4 + 8 * n_dims
        ggml_type, offset = struct.unpack_from("<IQ", blob, pos)
        fields += [Field("tensor_type", pos, 4, name), Field("tensor_offset", pos + 4, 8, name)]
        pos += 12
        tensors.append([name, ne, ggml_type, offset])
    g = Gguf(version, kvs, tensors, b"", fields, 0)
    alignment = g.get("general.alignment", DEFAULT_ALIGNMENT)
    g.data_offset = -(-pos // alignment) * alignment
    g.data = blob[g.data_offset :]
    return g


def _encode_value(value_type: int, value) -> bytes:
    if value_type == STRING:
        return struct.pack("<Q", len(value)) + value
    if value_type == ARRAY:
        item_type, items = value
        return struct.pack("<IQ", item_type, len(items)) + b"".join(_encode_value(item_type, v) for v in items)
    return struct.pack(SCALAR[value_type], value)


def write_gguf(g: Gguf) -> bytes:
    """The file again, tensor data unchanged: offsets are relative to the data section, which
    starts at the next multiple of the alignment after the (possibly resized) header."""
    out = bytearray(struct.pack("<4sIQQ", b"GGUF", g.version, len(g.tensors), len(g.kvs)))
    for key, value_type, value in g.kvs:
        out += _encode_value(STRING, key.encode()) + struct.pack("<I", value_type) + _encode_value(value_type, value)
    for name, ne, ggml_type, offset in g.tensors:
        out += _encode_value(STRING, name.encode()) + struct.pack(f"<I{len(ne)}Q", len(ne), *ne)
        out += struct.pack("<IQ", ggml_type, offset)
    alignment = g.get("general.alignment", DEFAULT_ALIGNMENT)
    alignment = alignment if isinstance(alignment, int) and 0 < alignment <= 1 << 16 else DEFAULT_ALIGNMENT
    out += bytes(-len(out) % alignment)
    return bytes(out) + g.data


def tensor_nbytes(ggml_type: int, ne: list[int]) -> int | None:
    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        return None
    return int(np.prod(ne, dtype=object)) // block * size


# ==========================================================================================
# The sidecar (docs/index-format.md), read and written independently too
# ==========================================================================================
SIDECAR_HEADER = struct.Struct("<8sIIQ")


@dataclass
class Section:
    name: str
    kind: int
    dtype: str
    shape: tuple
    raw: bytes

    def array(self) -> np.ndarray:
        return np.frombuffer(self.raw, np.dtype(self.dtype)).reshape(self.shape).copy()

    def set_array(self, a: np.ndarray) -> None:
        self.raw, self.shape = np.ascontiguousarray(a).tobytes(), a.shape


def read_sidecar(blob: bytes) -> list[Section]:
    magic, version, n_sections, _ = SIDECAR_HEADER.unpack_from(blob)
    pos, sections, d = SIDECAR_HEADER.size, [], zstandard.ZstdDecompressor()
    for _ in range(n_sections):
        (n,) = struct.unpack_from("<H", blob, pos)
        name = blob[pos + 2 : pos + 2 + n].decode()
        pos += 2 + n
        kind, n = struct.unpack_from("<BB", blob, pos)
        dtype = blob[pos + 2 : pos + 2 + n].decode()
        pos += 2 + n
        ndim = blob[pos]
        shape = struct.unpack_from(f"<{ndim}Q", blob, pos + 1)
        raw_len, stored_len = struct.unpack_from("<QQ", blob, pos + 1 + 8 * ndim)
        pos += 1 + 8 * ndim + 16
        sections.append(
            Section(name, kind, dtype, shape, d.decompress(blob[pos : pos + stored_len], max_output_size=raw_len))
        )
        pos += stored_len
    return sections


def write_sidecar(sections: list[Section], version: int = 1, reserved: int = 0) -> tuple[bytearray, list[Field]]:
    """Bytes without the checksum trailer, and where each section-header field is."""
    out = bytearray(SIDECAR_HEADER.pack(b"SWAPIDX\0", version, len(sections), reserved))
    fields = [
        Field("version", 8, 4, "header"),
        Field("n_sections", 12, 4, "header"),
        Field("reserved", 16, 8, "header"),
    ]
    c = zstandard.ZstdCompressor(level=3)
    for s in sections:
        data = c.compress(s.raw)
        fields.append(Field("name_length", len(out), 2, s.name))
        out += struct.pack("<H", len(s.name)) + s.name.encode()
        fields += [Field("kind", len(out), 1, s.name), Field("dtype_length", len(out) + 1, 1, s.name)]
        out += struct.pack("<BB", s.kind, len(s.dtype)) + s.dtype.encode()
        fields.append(Field("ndim", len(out), 1, s.name))
        fields += [Field("dim", len(out) + 1 + 8 * i, 8, s.name) for i in range(len(s.shape))]
        out += struct.pack(f"<B{len(s.shape)}Q", len(s.shape), *s.shape)
        fields += [
            Field("raw_length", len(out), 8, s.name),
            Field("stored_length", len(out) + 8, 8, s.name),
            Field("frame", len(out) + 16, len(data), s.name),
        ]
        out += struct.pack("<QQ", len(s.raw), len(data)) + data
    return out, fields


def sealed(body: bytes) -> bytes:
    return bytes(body) + hashlib.sha256(body).digest()


# ==========================================================================================
# Base models: tiny synthetic files, repacked and indexed by swapmoe, made once per run
# ==========================================================================================
BASE_ARCHS = ("qwen3moe", "deepseek4", "gpt-oss", "deepseek2", "qwen35moe")


def cli(*args) -> list[str]:
    return [sys.executable, "-m", "swapmoe.cli", *(str(a) for a in args)]


def child_env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWAPMOE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra or {})
    return env


class Bases:
    """base(arch, form) -> {name: path}: form "original" (M.gguf), "repacked" (R.gguf and its
    sidecar), "compat" (C.gguf and sidecar, compat layout) or "indexed" (I.gguf and the sidecar
    `swapmoe index` wrote). Made on first use, under a lock (cases run in threads); the peak RSS
    of a valid `run` of each is measured for the run bound."""

    def __init__(self, root: Path):
        self.root = root
        self._lock = threading.Lock()
        self._made: dict[tuple[str, str], dict[str, Path]] = {}
        self.run_rss: dict[str, int] = {}

    def _sh(self, *args) -> None:
        proc = subprocess.run(cli(*args), env=child_env(), capture_output=True, text=True, timeout=600)
        if proc.returncode:
            sys.exit(f"fuzz: making a base model failed: swapmoe {' '.join(map(str, args))}\n{proc.stderr}")

    def get(self, arch: str, form: str) -> dict[str, Path]:
        with self._lock:
            key = (arch, form)
            if key not in self._made:
                self._made[key] = self._make(arch, form)
            return self._made[key]

    def _make(self, arch: str, form: str) -> dict[str, Path]:
        """Made once per work directory: a kept one (--work) serves later runs too."""
        folder = self.root / f"{arch}-{form}"
        done = folder / "made.json"
        if done.exists():
            made = json.loads(done.read_text())
            self.run_rss[arch] = made["run_rss"]
            return {name: folder / name for name in made["files"]}
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        original = folder / "M.gguf"
        self._sh("synth", original, "--arch", arch, "--seed", "0")
        if form in ("repacked", "compat"):
            out = folder / ("R.gguf" if form == "repacked" else "C.gguf")
            self._sh("repack", original, out, "--layout", "bundled" if form == "repacked" else "compat")
            original.unlink()
        elif form == "indexed":
            out = folder / "I.gguf"
            original.rename(out)
            self._sh("index", out)
        files = sorted(p.name for p in folder.iterdir())
        self.run_rss[arch] = self.run_rss.get(arch) or measure_run(folder / files[0], folder)
        done.write_text(json.dumps({"files": files, "run_rss": self.run_rss[arch]}))
        return {name: folder / name for name in files}


def measure_run(model: Path, folder: Path) -> int:
    """Peak RSS of a valid `swapmoe run` of the model (the bound for runs of its mutations)."""
    result = execute(cli("run", model, "--chat", "-p", PROMPT, "-n", "2"), folder, child_env())
    if result.code != 0:
        sys.exit(f"fuzz: a valid run of {model} failed:\n{result.stderr}")
    return result.rss


# ==========================================================================================
# Running one command
# ==========================================================================================
@dataclass
class Result:
    code: int | None  # None: killed after TIMEOUT
    stdout: str
    stderr: str
    rss: int  # bytes
    seconds: float


def _limit_child() -> None:
    os.setsid()  # its own process group, so a timeout kills the whole of it
    resource.setrlimit(resource.RLIMIT_DATA, (DATA_LIMIT, DATA_LIMIT))


# Runs a command and writes its peak RSS and wait status to a file. A process's peak RSS starts
# at what it had when it was forked, so a command forked straight from this (large) process
# would report this process's size; forked from this small one, it reports its own.
TRAMPOLINE = """
import os, sys
pid = os.fork()
if pid == 0:
    try:
        os.execvp(sys.argv[2], sys.argv[2:])
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(f"{usage.ru_maxrss} {status}")
"""


def execute(argv: list[str], cwd: Path, env: dict, timeout: float = TIMEOUT) -> Result:
    """Run argv (through TRAMPOLINE) with a timeout; its exit code, output and peak RSS."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as scratch:
        out, err, usage = (Path(scratch) / name for name in ("out", "err", "usage"))
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-S", "-c", TRAMPOLINE, str(usage), *argv],
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                preexec_fn=_limit_child,
            )
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        code, rss = None, 0
        if usage.exists():
            maxrss, status = (int(v) for v in usage.read_text().split())
            code, rss = os.waitstatus_to_exitcode(status), maxrss * 1024
        return Result(
            code, out.read_text("utf-8", "replace"), err.read_text("utf-8", "replace"), rss, time.monotonic() - start
        )


# ==========================================================================================
# Cases
# ==========================================================================================
@dataclass
class Command:
    args: list  # after `swapmoe`
    must_fail: bool = False  # its input or an option is invalid: exit 0 would accept it silently
    must_pass: bool = False
    writes: tuple[str, ...] = ()  # files (in the case folder) it may create or replace when it succeeds
    rss_limit: int | None = RSS_LIMIT
    env: dict = field(default_factory=dict)
    names: str | None = None  # an error line must name this file
    then: list["Command"] = field(default_factory=list)  # run only if this one succeeds
    logs: tuple[str, ...] = ()  # files it may leave whatever its exit (a --trace log)

    def line(self) -> str:
        env = "".join(f"{k}={v!r} " for k, v in self.env.items())
        return env + "swapmoe " + " ".join(_quote(str(a)) for a in self.args)


def _quote(s: str) -> str:
    s = s if len(s) < 80 else s[:60] + f"...({len(s)} chars)"
    return s if s and all(c.isalnum() or c in "-_./=:,+" for c in s) else repr(s)


@dataclass
class Case:
    number: int
    kind: str
    what: str  # the mutation, in words
    files: dict  # name -> bytes or a Path to copy
    commands: list[Command]


def case_rng(seed: int, number: int) -> random.Random:
    return random.Random(f"{seed}/{number}")


def make_case(seed: int, number: int, bases: Bases) -> Case:
    kind = CYCLE[number % len(CYCLE)]
    rng = case_rng(seed, number)
    what, files, commands = MAKERS[kind](rng, bases)
    return Case(number, kind, what, files, commands)


# --- shared pieces ------------------------------------------------------------------------
def pick(rng: random.Random, weighted: list[tuple]) -> object:
    """One item of [(weight, item), ...]."""
    return rng.choices([item for _, item in weighted], [w for w, _ in weighted])[0]


def number_for(rng: random.Random, value: int, limit: int = U64) -> int:
    """A hostile replacement for an integer field."""
    candidates = [
        0,
        1,
        value - 1,
        value + 1,
        value * 2,
        value // 2,
        1 << 31,
        U32,
        1 << 40,
        1 << 62,
        1 << 63,
        U64,
        rng.randrange(limit + 1),
    ]
    return min(max(0, rng.choice(candidates)), limit)


def run_cmd(
    model: str, *extra, must_fail=False, must_pass=False, rss: int | None = None, env=None, names=None
) -> Command:
    return Command(
        ["run", model, "-p", PROMPT, "-n", "2", *extra], must_fail, must_pass, rss_limit=rss, env=env or {}, names=names
    )


def chain_for_original(
    rng: random.Random, model: str, must_fail: bool, run_rss: int, run_must_fail: bool, names: str
) -> Command:
    """One of the commands a GGUF goes through, on the mutated file."""
    scenario = rng.choice(["inspect", "index", "repack", "run"])
    if scenario == "inspect":
        return Command(["inspect", model] + (["--json"] if rng.random() < 0.3 else []), must_fail, names=names)
    if scenario == "index":
        side = model + ".swapidx"
        return Command(
            ["index", model] + (["--no-digests"] if rng.random() < 0.3 else []),
            must_fail,
            writes=(side,),
            names=names,
            then=[Command(["verify", model], names=model)],
        )
    if scenario == "repack":
        layout = rng.choice(["bundled", "compat"])
        return Command(
            ["repack", model, "OUT.gguf", "--layout", layout],
            must_fail,
            writes=("OUT.gguf", "OUT.gguf.swapidx"),
            names=names,
            then=[Command(["verify", "OUT.gguf"]), run_cmd("OUT.gguf", rss=run_rss)],
        )
    return run_cmd(model, must_fail=must_fail or run_must_fail, rss=run_rss, names=names)


# --- gguf ---------------------------------------------------------------------------------
GENERIC_KEYS = (
    "block_count",
    "embedding_length",
    "expert_count",
    "expert_used_count",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "expert_feed_forward_length",
    "context_length",
    "rope.dimension_count",
)
# keys tied to tensor shapes for every base (llama.cpp's loader checks each tensor's shape against them)
TIED = ("block_count", "embedding_length", "expert_count", "expert_feed_forward_length")
REQUIRED = (
    "general.architecture",
    "{arch}.block_count",
    "{arch}.embedding_length",
    "{arch}.attention.head_count",
    "{arch}.expert_count",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.model",
)


def _gqa(g: Gguf) -> bool:
    """Whether the model's attention has separate k and v projections (their rows tie head
    counts and lengths to the metadata) and a plain per-head key length (not MLA's)."""
    return g.tensor("blk.0.attn_k.weight") is not None or any(t[0].endswith("attn_k.weight") for t in g.tensors)


def _tied_tensors(g: Gguf) -> list[list]:
    """Tensors whose every dimension some generic key (or the vocabulary) fixes."""
    suffixes = (
        "attn_norm.weight",
        "ffn_norm.weight",
        "ffn_gate_inp.weight",
        "_exps.weight",
        "token_embd.weight",
        "output.weight",
        "output_norm.weight",
    )
    if _gqa(g):
        suffixes += ("attn_k.weight", "attn_v.weight", "attn_output.weight")
    return [t for t in g.tensors if t[0].endswith(suffixes)]


def gguf_semantic(rng: random.Random, g: Gguf) -> tuple[str, bool, bool]:
    """Change g so that it still parses; return (what, inconsistent, unrunnable): inconsistent
    models must be refused by every command, unrunnable ones by run."""
    arch = g.arch
    choice = pick(
        rng,
        [
            (6, "key"),
            (2, "key_type"),
            (2, "remove_key"),
            (1, "no_tensors"),
            (2, "remove_tensor"),
            (3, "dims"),
            (2, "type"),
            (2, "offset"),
            (1, "rename"),
            (1, "vocab"),
            (1, "special_id"),
            (1, "arch"),
            (1, "alignment"),
        ],
    )
    if choice == "key":
        name = rng.choice(GENERIC_KEYS)
        kv = g.kv(f"{arch}.{name}")
        if kv is None or kv[1] not in INT_TYPES:
            return f"{arch}.{name} absent or not an integer: unchanged", False, False
        old = kv[2]
        limit = (1 << (8 * struct.calcsize(SCALAR[kv[1]]))) - 1
        new = rng.choice([0, 1, old - 1, old + 1, old * 2, 3, 10**7, limit])
        new = min(max(new, 0), limit)
        if kv[1] in (1, 3, 5, 11):  # signed
            new = min(new, limit >> 1)
        kv[2] = new
        tied = name in TIED or (name.startswith("attention.") and _gqa(g))
        if name == "expert_used_count":
            bad = not 1 <= new <= g.get(f"{arch}.expert_count", 0)
        elif name == "rope.dimension_count":  # rotates pairs of one head's dimensions
            head = g.get(f"{arch}.attention.key_length_mla") or g.get(f"{arch}.attention.key_length")
            bad = not (2 <= new <= head and new % 2 == 0)
        elif name == "context_length":
            bad = False
        else:
            bad = tied and new != old
        return f"{arch}.{name} {old} -> {new}", bad, bad or new == 0 and name != "context_length"
    if choice == "key_type":
        name = rng.choice(
            ("block_count", "expert_count", "expert_used_count", "attention.head_count", "embedding_length")
        )
        kv = g.kv(f"{arch}.{name}")
        if kv is None or not isinstance(kv[2], int):
            return f"{arch}.{name}: unchanged", False, False
        new_type = rng.choice([6, 12, STRING, ARRAY, 7])
        old = kv[2]
        kv[1], kv[2] = (
            new_type,
            {6: float(old), 12: float(old) + 0.5, STRING: str(old).encode(), ARRAY: (4, [old, old]), 7: True}[new_type],
        )
        return f"{arch}.{name} {old} stored as value type {new_type}", True, True
    if choice == "remove_key":
        key = rng.choice(REQUIRED).format(arch=arch)
        before = len(g.kvs)
        g.kvs = [kv for kv in g.kvs if kv[0] != key]
        every = key in ("general.architecture", f"{arch}.block_count", f"{arch}.expert_count")
        return f"key {key} removed", every and len(g.kvs) < before, len(g.kvs) < before
    if choice == "no_tensors":
        g.tensors, g.data = [], b""
        return "every tensor removed (metadata kept)", False, True
    if choice == "remove_tensor":
        candidates = [t for t in g.tensors if not t[0].startswith("output.")]  # output.weight is optional (tied)
        t = rng.choice(candidates)
        g.tensors.remove(t)
        return f"tensor {t[0]} removed", False, True
    if choice == "dims":
        tied = rng.random() < 0.75
        t = rng.choice(_tied_tensors(g) if tied else g.tensors)
        i = rng.randrange(len(t[1]))
        old = list(t[1])
        t[1][i] = rng.choice([0, 1, old[i] * 2, old[i] // 2, old[i] + 256, 1 << 32, 1 << 62])
        if t[1] == old:
            return f"tensor {t[0]}: dims unchanged", False, False
        return f"tensor {t[0]} ne {old} -> {t[1]}", tied, True
    if choice == "type":
        t = rng.choice(g.tensors)
        old = t[2]
        t[2] = rng.choice([int(x) for x in GGMLQuantizationType] + [4, 5, 99, U32])
        old_n, new_n = tensor_nbytes(old, t[1]), tensor_nbytes(t[2], t[1])
        block = GGML_QUANT_SIZES.get(GGMLQuantizationType(t[2])) if t[2] in set(GGMLQuantizationType) else None
        bad = new_n is None or t[1][0] % block[0] != 0 or new_n > old_n  # unknown, partial blocks, overlaps
        return f"tensor {t[0]} type {old} -> {t[2]}", bad and t[2] != old, bad and t[2] != old
    if choice == "offset":
        t = rng.choice(g.tensors)
        others = [o[3] for o in g.tensors if o is not t]
        old = t[3]
        alignment = g.get("general.alignment", DEFAULT_ALIGNMENT)
        t[3] = rng.choice([rng.choice(others), old + 1, old + alignment, len(g.data), 1 << 40, U64 - 7])
        end = t[3] + (tensor_nbytes(t[2], t[1]) or 0)
        overlap = any(o is not t and o[3] < end and t[3] < o[3] + (tensor_nbytes(o[2], o[1]) or 0) for o in g.tensors)
        bad = t[3] != old and (t[3] % alignment != 0 or end > len(g.data) or overlap)
        return f"tensor {t[0]} offset {old} -> {t[3]}", bad, bad
    if choice == "rename":
        t = rng.choice([t for t in g.tensors if not t[0].startswith("output.")])  # output.weight is optional
        old = t[0]
        t[0] = rng.choice(
            [
                g.tensors[0][0],
                old.replace("blk.0.", "blk.7."),
                old.replace("blk.1.", "blk.4000000000."),
                old + ".x",
                "blk.x." + old,
            ]
        )
        if t[0] == old:
            return f"tensor {old}: name unchanged", False, False
        duplicate = sum(o[0] == t[0] for o in g.tensors) > 1
        beyond = "blk.7." in t[0] or "blk.4000000000." in t[0]
        return f"tensor {old} renamed {t[0]}", duplicate or beyond, True
    if choice == "vocab":
        key = rng.choice(
            ["tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.scores"]
        )
        kv = g.kv(key)
        if kv is None:
            return f"{key} absent: unchanged", False, False
        item_type, items = kv[2]
        how = rng.choice(["drop", "duplicate", "empty", "garbage"])
        if how == "drop":
            items = items[: -rng.choice([1, 10, len(items)])]
        elif how == "duplicate":
            items = items + items[:5]
        elif how == "empty" and item_type == STRING:
            items = [b""] * len(items)
        elif item_type == STRING:
            items = [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 8))) for _ in items]
        else:
            items = [rng.randrange(0, 200) for _ in items]
        kv[2] = (item_type, items)
        vocab_changed = key == "tokenizer.ggml.tokens" and how in ("drop", "duplicate")
        return f"{key}: {how}", vocab_changed, vocab_changed
    if choice == "special_id":
        key = rng.choice(["tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"])
        new = rng.choice([U32, 1 << 31, len(g.get("tokenizer.ggml.tokens", (0, []))[1])])
        kv = g.kv(key)
        if kv is None:
            g.kvs.append([key, 4, new])
        else:
            kv[1], kv[2] = 4, new
        return f"{key} -> {new} (past the vocabulary)", False, False
    if choice == "arch":
        kv = g.kv("general.architecture")
        new = rng.choice([b"", b"foo", b"llama" if arch != "llama" else b"olmoe", arch.encode() + b"\0"])
        kv[2] = new
        return f"general.architecture {arch!r} -> {new!r}", False, True
    kv = g.kv("general.alignment")
    new = rng.choice([0, 1, 3, 48, 64, 1 << 31])
    if kv is None:
        g.kvs.append(["general.alignment", 4, new])
    else:
        kv[2] = new
    bad = new == 0 or new & (new - 1) != 0 or new == 1 << 31
    misaligned = new > DEFAULT_ALIGNMENT and any(t[3] % new for t in g.tensors)
    return f"general.alignment -> {new}", bad or misaligned, bad or misaligned


def gguf_bytes(rng: random.Random, blob: bytes, g: Gguf) -> tuple[bytes, str, bool]:
    """A byte-level mutation of a header field, a truncation or flipped bytes; (blob, what, must fail)."""
    data = bytearray(blob)
    choice = pick(rng, [(8, "field"), (2, "truncate"), (1, "flip"), (1, "append")])
    if choice == "field":
        kinds = sorted({f.what for f in g.fields})
        what = rng.choice(kinds)
        f = rng.choice([f for f in g.fields if f.what == what])
        old = int.from_bytes(data[f.pos : f.pos + f.size], "little")
        limit = (1 << (8 * f.size)) - 1
        new = number_for(rng, old, limit) if what != "value_type" else rng.choice([0, 6, 8, 9, 12, 13, 255, U32])
        data[f.pos : f.pos + f.size] = new.to_bytes(f.size, "little")
        return bytes(data), f"{what} of {f.owner} at byte {f.pos}: {old} -> {new}", False
    if choice == "truncate":
        end_of_data = g.data_offset + max((t[3] + (tensor_nbytes(t[2], t[1]) or 0) for t in g.tensors), default=0)
        cut = rng.choice([rng.randrange(24, g.data_offset), rng.randrange(g.data_offset, len(data)), 0, 23])
        return bytes(data[:cut]), f"truncated to {cut} of {len(data)} bytes", cut < end_of_data
    if choice == "flip":
        spots = [rng.randrange(24, g.data_offset) for _ in range(rng.randint(1, 8))]
        for pos in spots:
            data[pos] ^= 1 << rng.randrange(8)
        return bytes(data), f"header bits flipped at bytes {spots}", False
    return bytes(data) + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 5000))), "bytes appended", False


def make_gguf_case(rng: random.Random, bases: Bases):
    arch = rng.choice(BASE_ARCHS)
    form = pick(rng, [(4, "original"), (1, "repacked")])
    files = bases.get(arch, form)
    name = next(n for n in files if n.endswith(".gguf"))
    blob = files[name].read_bytes()
    g = read_gguf(blob)
    rss = bases.run_rss[arch] + RUN_RSS_MARGIN
    if rng.random() < 0.55:
        what, inconsistent, unrunnable = gguf_semantic(rng, g)
        blob = write_gguf(g)
        must_fail_all = inconsistent
    else:
        blob, what, must_fail_all = gguf_bytes(rng, blob, g)
        unrunnable = must_fail_all
    out = {n: p for n, p in files.items()}
    out[name] = blob
    what = f"{arch} {form}: {what}"
    if form == "original":
        cmd = chain_for_original(rng, name, must_fail_all, rss, unrunnable, name)
    else:
        # the header changed, so the sidecar no longer matches: run and verify must refuse it
        scenario = rng.choice(["inspect", "run", "verify", "unpack"])
        changed = blob != files[name].read_bytes()
        if scenario == "inspect":
            cmd = Command(["inspect", name], must_fail_all, names=name)
        elif scenario == "run":
            cmd = run_cmd(name, must_fail=changed, rss=rss, names=name)
        elif scenario == "verify":
            cmd = Command(["verify", name], must_fail=changed, names=name)
        else:
            cmd = Command(["unpack", name, "ORIG.gguf"], must_fail_all, writes=("ORIG.gguf",), names=name)
    return what, out, [cmd]


# --- sidecar --------------------------------------------------------------------------------
ARRAYS = (
    "part_offset",
    "part_length",
    "part_file",
    "part_type",
    "part_ne",
    "slice_offset",
    "slice_length",
    "slice_flags",
    "nonexpert",
    "tensor_type",
    "tensor_ne",
    "tensor_file",
    "tensor_offset",
    "tensor_nbytes",
    "file_sizes",
    "header_lengths",
    "header_digests",
    "part_digest",
    "tensor_digest",
)
IDENTITY = ("file_sizes", "header_lengths", "header_digests")


def _live(sections: dict[str, Section], name: str, a: np.ndarray) -> np.ndarray:
    """Mask of the entries of array `name` the runtime reads (present parts, contiguous slices,
    tensors stored whole)."""
    lengths = sections["part_length"].array()
    if name in ("part_offset", "part_length", "part_file", "part_digest"):
        mask = lengths > 0
        return mask[..., None] if name == "part_digest" else mask
    if name in ("slice_offset", "slice_length"):
        return (sections["slice_flags"].array() & 4) > 0
    if name in ("tensor_offset", "tensor_file", "tensor_nbytes"):
        return sections["tensor_offset"].array() >= 0
    return np.ones(a.shape, bool)


def _out_of_range(sections: dict[str, Section], size: int) -> bool:
    """Whether any range the runtime reads lies outside the file, names a file that is not there,
    or has a type that does not exist: these must be refused before use."""
    get = {name: s.array() for name, s in sections.items() if s.kind == 1 and name in ARRAYS}
    lengths, offsets, files = get["part_length"], get["part_offset"], get["part_file"]
    live = lengths > 0
    if (lengths < 0).any() or (offsets[live] < 0).any() or (offsets[live] + lengths[live] > size).any():
        return True
    if (files[live] != 0).any():
        return True
    types = get["part_type"]
    known = {int(t) for t in GGMLQuantizationType}
    if any(int(t) not in known for t in types[types >= 0]) or any(int(t) not in known for t in get["tensor_type"]):
        return True
    contiguous = (get["slice_flags"] & 4) > 0
    ends = get["slice_offset"][contiguous] + get["slice_length"][contiguous]
    if (get["slice_offset"][contiguous] < 0).any() or (ends > size).any():
        return True
    whole = get["tensor_offset"] >= 0
    if (get["tensor_offset"][whole] + get["tensor_nbytes"][whole] > size).any() or (get["tensor_file"] > 0).any():
        return True
    ne = get["nonexpert"]
    return bool(len(ne) and ((ne[:, 0] != 0).any() or (ne[:, 1] < 0).any() or (ne[:, 1] + ne[:, 2] > size).any()))


def sidecar_mutation(rng: random.Random, sections: list[Section], size: int, n_expert: int):
    """Change the sections (the checksum is made valid afterwards: a crafted file, not a damaged
    one); return (what, run must fail, verify must fail)."""
    by_name = {s.name: s for s in sections}
    choice = pick(
        rng, [(8, "value"), (3, "meta"), (1, "dtype"), (1, "shape"), (1, "drop"), (1, "reorder"), (1, "hash")]
    )
    if choice == "value":
        name = rng.choice(ARRAYS)
        s = by_name[name]
        a = s.array()
        live = _live(by_name, name, a)
        flat, mask = a.reshape(-1), np.broadcast_to(live, a.shape).reshape(-1)
        where = np.flatnonzero(mask) if mask.any() else np.arange(flat.size)
        i = int(rng.choice(list(where)))
        old = int(flat[i])
        info = np.iinfo(a.dtype)
        new = rng.choice(
            [
                0,
                -1,
                1,
                old + 1,
                old - 1,
                old + 4096,
                size,
                size + 1,
                1 << 31,
                1 << 62,
                info.max,
                info.min,
                int(flat[int(rng.choice(list(where)))]),
            ]
        )
        new = min(max(new, int(info.min)), int(info.max))
        flat[i] = new
        s.set_array(a)
        identity = name in IDENTITY and new != old
        bad = identity or _out_of_range(by_name, size)
        return f"{name}{[int(x) for x in np.unravel_index(i, a.shape)]} {old} -> {new}", bad, new != old
    if choice == "meta":
        meta = json.loads(by_name["meta"].raw)
        key = rng.choice(
            [
                "n_layer",
                "n_expert",
                "n_expert_used",
                "parts",
                "files",
                "layout",
                "page_size",
                "arch",
                "has_digests",
                "tensor_names",
                "hash_layers",
                "extra",
                "missing",
            ]
        )
        old = meta.get(key)
        bad = True
        if key == "parts":
            new = rng.choice([old[::-1], old[:-1], old + ["gate"], ["x"] * len(old), []])
        elif key == "files":
            new = rng.choice([old + ["other.gguf"], ["../../etc/passwd"], ["a/b.gguf"], [], [".."], ["M.gguf", ""]])
        elif key in ("layout", "arch"):
            new = rng.choice(["striped", "", 5, None])
        elif key == "page_size":
            new = rng.choice([0, 3, -4096, 1 << 40, "16384", None])
        elif key == "has_digests":
            new = not old
        elif key == "tensor_names":
            new = old[:-1] if rng.random() < 0.5 else old[::-1]
        elif key == "hash_layers":
            new = rng.choice([[99], [-1], ["x"], (old or []) + [0], None])
        elif key == "extra":
            key, new = "unknown_key", 1
        elif key == "missing":
            key = rng.choice(["n_layer", "parts", "files", "layout"])
            old, new = meta.pop(key), "(removed)"
        else:
            new = rng.choice([0, -1, old + 1, old - 1, 10**9, "8", None, 1.5])
        if new != "(removed)":
            meta[key] = new
        if key == "n_expert_used" and isinstance(new, int) and 1 <= new <= n_expert:
            bad = False  # a plausible value: only verify can tell
        if key == "arch" or key == "has_digests" or (key == "tensor_names" and len(new) == len(old)):
            bad = False  # nothing the runtime reads: verify's business
        by_name["meta"].raw = json.dumps(meta).encode()
        return f"meta {key} {old!r} -> {new!r}", bad, new != old
    if choice == "dtype":
        s = by_name[rng.choice(ARRAYS)]
        old = s.dtype
        s.dtype = rng.choice(["<f8", ">i8", "|O", "zz", "<U4", "", "<i4", "<u8", "V8"])
        return f"section {s.name} dtype {old} -> {s.dtype}", s.dtype != old, s.dtype != old
    if choice == "shape":
        s = by_name[rng.choice(ARRAYS)]
        old = s.shape
        n = int(np.prod(old))
        s.shape = rng.choice([(n,), tuple(reversed(old)), old + (1,), (1,) + old])
        return f"section {s.name} shape {old} -> {s.shape}", s.shape != old, s.shape != old
    if choice == "drop":
        s = rng.choice(sections)
        sections.remove(s)
        return f"section {s.name} removed", True, True
    if choice == "reorder":
        rng.shuffle(sections)
        return "sections in another order (allowed: readers go by name)", False, False
    tables = [s for s in sections if s.name.startswith("hash_table.")]
    if not tables:
        return "no hash tables: unchanged", False, False
    s = rng.choice(tables)
    a = s.array()
    how = rng.choice(["id", "rows", "cols"])
    if how == "id":
        a.reshape(-1)[rng.randrange(a.size)] = rng.choice([n_expert, np.iinfo(a.dtype).max])
    elif how == "rows":
        a = a[: rng.randrange(a.shape[0])]
    else:
        a = np.concatenate([a, a], axis=1)
    s.set_array(a)
    return f"{s.name}: {how}", True, True


def make_sidecar_case(rng: random.Random, bases: Bases):
    arch = rng.choice(BASE_ARCHS)
    form = pick(rng, [(3, "repacked"), (2, "indexed"), (1, "compat")])
    files = bases.get(arch, form)
    model = next(n for n in files if n.endswith(".gguf"))
    side = model + ".swapidx"
    blob = files[side].read_bytes()
    size = files[model].stat().st_size
    sections = read_sidecar(blob)
    n_expert = json.loads(sections[0].raw)["n_expert"]
    choice = pick(rng, [(6, "crafted"), (2, "header"), (1, "checksum"), (1, "truncate"), (1, "frame")])
    if choice == "crafted":
        what, run_fails, verify_fails = sidecar_mutation(rng, sections, size, n_expert)
        body, _ = write_sidecar(sections)
        new = sealed(body)
    else:
        body, fields = write_sidecar(sections)
        run_fails = verify_fails = True
        if choice == "header":
            f = rng.choice([f for f in fields if f.what != "frame"])
            old = int.from_bytes(body[f.pos : f.pos + f.size], "little")
            value = number_for(rng, old, (1 << (8 * f.size)) - 1)
            body[f.pos : f.pos + f.size] = value.to_bytes(f.size, "little")
            what = f"{f.what} of section {f.owner}: {old} -> {value} (checksum made valid)"
            run_fails = verify_fails = value != old and f.what != "reserved"
            new = sealed(body)
        elif choice == "checksum":
            new = bytearray(sealed(body))
            spot = rng.randrange(len(new))
            new[spot] ^= 0xFF
            new, what = bytes(new), f"byte {spot} flipped (checksum not updated)"
        elif choice == "truncate":
            cut = rng.randrange(len(body) + 32)
            new, what = sealed(body)[:cut], f"truncated to {cut} bytes"
        else:  # may decode to other values that look right: no expectation but a clean exit
            f = rng.choice([f for f in fields if f.what == "frame"])
            spot = f.pos + rng.randrange(f.size)
            body[spot] ^= 0x5A
            new, what = sealed(body), f"zstd frame of {f.owner} damaged at byte {spot} (checksum made valid)"
            run_fails = verify_fails = False
    out = dict(files)
    out[side] = new
    rss = bases.run_rss[arch] + RUN_RSS_MARGIN
    scenario = rng.choice(["run", "run-pread", "inspect", "verify"])
    if scenario == "inspect":  # a bad sidecar is set aside with a note: inspect builds from the tensor table
        cmd = Command(["inspect", model], names=model)
    elif scenario == "verify":
        cmd = Command(["verify", model], must_fail=verify_fails, names=model)
    else:
        io = ["--io", "pread"] if scenario == "run-pread" else ["--io", "mmap"]
        cmd = run_cmd(model, *io, must_fail=run_fails, rss=rss, names=model)
    return f"{arch} {form}: {what}", out, [cmd]


# --- template -------------------------------------------------------------------------------
TEMPLATE_TEXT = 1 << 24  # the longest text a template may build (swapmoe.runtime.chat.MAX_TEXT)
TEMPLATE_ITEMS = 1 << 20  # the longest list (MAX_ITEMS)
TEMPLATE_RANGE = 1 << 16  # the longest range() (MAX_RANGE)
FITS = 20_000  # characters of prompt that surely fit the tiny models' context (at least 4096 tokens)


def _verdict(size: int, bound: int = TEMPLATE_TEXT) -> bool | None:
    """Whether a template whose output (or largest value) has `size` items must fail (True), must
    render into a prompt that fits (False), or may do either (None: too long for the context)."""
    return True if size > bound else False if size <= FITS else None


def hostile_template(rng: random.Random) -> tuple[str, bool | None]:
    """(Jinja source, whether rendering must fail: True, must succeed: False, either: None)."""
    n = rng.choice([10**3, 10**5, 10**7, 10**9, 2**31, 10**12])
    templates = [
        ("{{ 'x' * N }}", _verdict(n)),
        (
            "{% for i in range(N) %}{% for j in range(N) %}{% endfor %}{% endfor %}",
            True if n > TEMPLATE_RANGE else None,
        ),  # or an empty prompt
        ("{% for i in range(N) %}{{ i }}{% endfor %}", True if n > TEMPLATE_RANGE else _verdict(5 * n)),
        (
            "{% set s = 'x' * 1000 %}{% for a in s %}{% for b in s %}{% for c in s %}{% for d in s %}"
            "{% endfor %}{% endfor %}{% endfor %}{% endfor %}",
            True,
        ),
        ("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}", True),
        ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", True),
        (
            "{% macro d(s, k) %}{% if k %}{{ d(s ~ s, k - 1) }}{% else %}{{ s | length }}{% endif %}{% endmacro %}"
            "{{ d('x', 64) }}",
            True,
        ),
        ("{% set s = 'x' %}" + "{% set s = s ~ s %}" * 48 + "{{ s | length }}", True),
        (
            "{% set ns = namespace(a=['x']) %}{% for i in range(64) %}{% set ns.a = ns.a + ns.a %}{% endfor %}"
            "{{ ns.a | length }}",
            True,
        ),
        (
            "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
            "{{ ns.s | length }}",
            True,
        ),
        ("{{ '%0*d' % (N, 1) }}", _verdict(n)),
        ("{{ '%.*f' % (N, 1.0) }}", _verdict(n)),
        ("{{ '{:>N}'.format(1) }}", _verdict(n)),
        ("{{ 'x'.ljust(N) }}", _verdict(n)),
        ("{{ 'x'.center(N) }}", _verdict(n)),
        ("{{ 'x'.zfill(N) }}", _verdict(n)),
        ("{{ 'a\tb'.expandtabs(N) }}", _verdict(n)),
        ("{{ ('x' * 4000000) | replace('x', 'yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy') | length }}", True),
        ("{{ ('x' * 4000000).replace('', 'yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy') | length }}", True),
        ("{{ range(65536) | join('x' * 100000) | length }}", True),
        ("{{ ('x' * 10000) | indent(N) | length }}", True if n + 10000 > TEMPLATE_TEXT else False),
        ("{{ 'x' | center(N) }}", _verdict(n)),
        ("{{ ('a ' * 5000000) | wordwrap(1) | length }}", None),
        ("{{ lipsum(N) | length }}", True if n > 10**5 else None),
        ("{{ messages | tojson(indent=N) }}", n > 64),
        ("{{ 2 ** 4096 ** 4096 ** 4096 }}", True),
        ("{{ (9 ** 4096) * (9 ** 4096) * (9 ** 4096) }}", None),
        ("{{ ''.__class__.__mro__[1].__subclasses__() }}", True),
        ("{{ cycler.__init__.__globals__ }}", True),
        ("{{ self.__init__.__globals__ }}", True),
        ("{{ raise_exception('no ' ~ 'x' * 100) }}", True),
        ("{{ 1 / 0 }}", True),
        ("{{ messages[5].content }}", True),
        (
            "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}"
            "assistant:{% endif %}",
            False,
        ),
        ("{{ bos_token }}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] | trim }}{% endfor %}", False),
        ("{% for", True),
        ("{{ x.y.z }}", None),
        (
            "{{ (messages | map(attribute='content') | list) * N }}",
            _verdict(n, TEMPLATE_ITEMS) if n > FITS // 6 else False,
        ),
        ("{{ messages | batch(N) | list | length }}", None),
        ("{{ strftime_now('%Y' * N) }}", _verdict(4 * n) if 2 * n <= TEMPLATE_TEXT else True),
        ("{{ (range(65536) | list | string | length) }}", False),
        ("{{ {'a': 1}.update(b=2) }}", True),
        ("{{ [1, 2].append(3) }}", True),
    ]
    source, must_fail = rng.choice(templates)
    return source.replace("N", str(n)) if "N" in source else source, must_fail


def make_template_case(rng: random.Random, bases: Bases):
    arch = rng.choice(("qwen3moe", "gpt-oss"))
    files = bases.get(arch, "original")
    g = read_gguf(files["M.gguf"].read_bytes())
    kv = g.kv("tokenizer.chat_template")
    choice = pick(rng, [(10, "hostile"), (1, "type"), (1, "remove"), (1, "bytes")])
    if choice == "hostile":
        source, must_fail = hostile_template(rng)
        kv[1], kv[2] = STRING, source.encode()
        what = f"chat template {source[:120]!r}"
    elif choice == "type":
        kv[1], kv[2] = rng.choice([(4, 7), (ARRAY, (STRING, [b"{{ 1 }}", b"{{ 2 }}"])), (7, True)])
        what, must_fail = f"chat template as value type {kv[1]}", True
    elif choice == "remove":
        g.kvs.remove(kv)
        what, must_fail = "chat template removed", True
    else:
        kv[2] = b"\xff\xfe{{ messages }}\xc0\x80"
        what, must_fail = "chat template not UTF-8", None
    rss = bases.run_rss[arch] + RUN_RSS_MARGIN
    cmd = Command(
        ["run", "M.gguf", "--chat", "-p", "hi", "-n", "2"],
        must_fail is True,
        must_fail is False,
        rss_limit=rss,
        names="M.gguf",
    )
    return f"{arch}: {what}", {"M.gguf": write_gguf(g)}, [cmd]


# --- option ----------------------------------------------------------------------------------
BAD_INTS = [
    "-1",
    "-5",
    "0x10",
    "abc",
    "",
    "1e3",
    "1.5",
    str(1 << 63),
    str(1 << 64),
    str(-(1 << 63) - 1),
    " ",
    "nan",
    "inf",
    "9" * 400,
]
BAD_FLOATS = ["nan", "-nan", "inf", "-inf", "1e309", "abc", "", "0x1p3z"]
SYNTH_TINY_USED = 2  # experts per token of the tiny presets


def _in_range(text: str, low: float, high: float | None, kind=int) -> bool:
    try:
        value = kind(text)
    except ValueError:
        return False
    return value == value and abs(value) != float("inf") and low <= value and (high is None or value <= high)


def int_option(rng: random.Random, name: str, low: int, high: int | None, usual: tuple[int, int]):
    """([option, value], invalid): mostly a usual value, else out of [low, high] or malformed.
    invalid is True (must be refused) or None (an unusual value click accepts: either outcome)."""
    r = rng.random()
    if r < 0.45:
        return [name, str(rng.randint(*usual))], False
    value = str(rng.choice([low - 1, high + 1 if high is not None else low - 2])) if r < 0.65 else rng.choice(BAD_INTS)
    return [name, value], None if _in_range(value, low, high) else True


def float_option(
    rng: random.Random, name: str, low: float, high: float, usual: tuple[float, float], low_open: bool = False
):
    r = rng.random()
    if r < 0.45:
        value = f"{rng.uniform(*usual):.3g}"
    elif r < 0.7:
        value = rng.choice([str(low - 1), str(high + 1), str(high * 10 + 1), "-0.001"])
    else:
        value = rng.choice(BAD_FLOATS)
    ok = _in_range(value, low, high, float) and not (low_open and float(value) <= low)
    return [name, value], False if ok and r < 0.45 else None if ok else True


def page_size_option(rng: random.Random):
    value = rng.choice(["4096", "16384", "65536", "3", "5000", "2048", "0", str(1 << 31), str(1 << 40), "abc"])
    return ["--page-size", value], None if value in ("4096", "16384", "65536") else True


def path_arg(rng: random.Random, files: dict, valid: str) -> tuple[str, bool]:
    """A path argument: the valid one, or something that is not a usable file (and must be refused)."""
    choice = rng.choice(["valid", "valid", "valid", "missing", "dir", "devnull", "empty", "text", "shard", "loop"])
    if choice == "valid":
        return valid, False
    made = {
        "empty": ("empty.gguf", b""),
        "text": ("notes.gguf", b"These are not the weights.\n" * 20),
        "shard": ("x-00002-of-00003.gguf", b"GGUF"),
        "loop": ("loop.gguf", "loop.gguf"),
    }  # a self-symlink
    if choice in made:
        name, content = made[choice]
        files[name] = content
        return name, True
    return {"missing": "absent.gguf", "dir": "subdir", "devnull": "/dev/null"}[choice], True


def override_spec(rng: random.Random, arch: str, truth: dict[str, int]) -> tuple[str, bool | None]:
    """An --override-kv spec and whether the run must refuse it (None: either outcome)."""
    if rng.random() < 0.1:
        return rng.choice(["novalue", "a=b", "=int:3", f"{arch}.expert_count=int", "k=float"]), True
    name = rng.choice(
        list(truth)
        + ["context_length", "rope.freq_base", "general.architecture", "tokenizer.ggml.bos_token_id", "unknown.key"]
    )
    key = f"{arch}.{name}" if name in truth or name in ("context_length", "rope.freq_base") else name
    kind = rng.choice(["int", "int", "float", "bool", "str", "xyz"])
    value = rng.choice(["0", "1", "2", "-1", "8", "10000000", str(1 << 70), "nan", "true", "llama"])
    spec = f"{key}={kind}:{value}"
    parse = {"int": int, "float": float, "str": str, "bool": lambda v: {"true": True, "false": False}[v]}
    try:
        typed = parse[kind](value)
    except (KeyError, ValueError):
        return spec, True
    if name == "expert_used_count":
        return spec, not (kind == "int" and 1 <= typed <= truth["expert_count"])
    if name in truth:  # a value the tensors' shapes fix: only the file's own passes
        return spec, None if kind == "int" and typed == truth[name] else True
    return spec, None


def combine(invalid: bool | None, bad: bool | None) -> bool | None:
    """True if either must be refused, else None if either is uncertain, else False."""
    if invalid is True or bad is True:
        return True
    return None if invalid is None or bad is None else False


RUN_OPTIONS = (
    "-n",
    "--temp",
    "--top-k",
    "--top-p",
    "--min-p",
    "--repeat-penalty",
    "--seed",
    "--ctx",
    "--threads",
    "--expert-cache-size",
    "--expert-keep-recent",
    "--expert-fixation",
    "--expert-prefetch",
    "--io",
    "--trace",
    "--override-kv",
    "--chat",
    "--ignore-eos",
    "--stats",
    "--expert-streaming",
    "--no-expert-streaming",
)


def run_option(rng: random.Random, option: str, arch: str, truth: dict[str, int]) -> tuple[list[str], bool | None]:
    if option == "-n":
        return int_option(rng, option, 1, None, (1, 8))
    if option == "--temp":
        return float_option(rng, option, 0, 100, (0, 2))
    if option == "--top-k":
        return int_option(rng, option, 0, None, (0, 50))
    if option in ("--top-p", "--min-p"):
        return float_option(rng, option, 0, 1, (0, 1))
    if option == "--repeat-penalty":
        return float_option(rng, option, 0, 100, (0.5, 2), low_open=True)
    if option == "--seed":
        return int_option(rng, option, 0, (1 << 63) - 1, (0, 1000))
    if option == "--ctx":
        extra, bad = int_option(rng, option, 1, 1 << 24, (64, 4096))
        return extra, bad
    if option == "--threads":
        return int_option(rng, option, 1, 4096, (1, 4))
    if option in ("--expert-cache-size", "--expert-keep-recent"):
        extra, bad = int_option(rng, option, 1, None, (1, 64))
        return extra, bad or None  # a cache too small for one layer is refused, a bigger one is fine
    if option == "--expert-fixation":
        return int_option(rng, option, 0, None, (0, 4))
    if option == "--expert-prefetch":
        value = rng.choice(["off", "previous", "lookahead", "both", "all", ""])
        return [option, value], value in ("all", "")
    if option == "--io":
        value = rng.choice(["auto", "mmap", "pread", "dma", ""])
        return [option, value], value in ("dma", "")
    if option == "--trace":
        value = rng.choice(["trace.jsonl", "trace.jsonl", "subdir", "nodir/trace.jsonl", "/proc/nope/trace"])
        return [option, value], value != "trace.jsonl"
    if option == "--override-kv":
        spec, bad = override_spec(rng, arch, truth)
        return [option, spec], bad
    return [option], False


def make_option_case(rng: random.Random, bases: Bases):
    arch = "qwen3moe"
    truth = {
        "expert_count": 8,
        "expert_used_count": 2,
        "block_count": 2,
        "attention.head_count": 4,
        "embedding_length": 256,
    }  # the tiny qwen3moe preset
    original = bases.get(arch, "original")["M.gguf"]
    packed = bases.get(arch, "repacked")
    files: dict = {
        "M.gguf": original,
        "R.gguf": packed["R.gguf"],
        "R.gguf.swapidx": packed["R.gguf.swapidx"],
        "subdir/": None,
    }
    rss = bases.run_rss[arch] + RUN_RSS_MARGIN
    command = pick(
        rng,
        [
            (6, "run"),
            (2, "inspect"),
            (2, "repack"),
            (1, "index"),
            (1, "verify"),
            (1, "unpack"),
            (2, "synth"),
            (1, "serve"),
            (1, "env"),
        ],
    )
    invalid: bool | None = False
    writes: tuple[str, ...] = ()
    logs: tuple[str, ...] = ()
    env: dict = {}
    limit: int | None = RSS_LIMIT
    then: list[Command] = []
    if command in ("run", "env"):
        model, invalid = path_arg(rng, files, rng.choice(["M.gguf", "R.gguf"]))
        args, limit = ["run", model], rss
        prompt = rng.choice(["p", "p", "p", "f", "f-huge", "f-bad", "f-long", "none", "empty"])
        if prompt == "p":
            args += ["-p", rng.choice([PROMPT, "ünïcödé ✓", "<|im_start|>x", "\x01\x02", "a" * 30000])]
        elif prompt == "f":
            files["prompt.txt"] = PROMPT.encode()
            args += ["-f", "prompt.txt"]
        elif prompt == "f-huge":  # far more text than any context holds: refused before tokenizing
            files["prompt.txt"] = b"Lorem ipsum dolor sit amet. " * (12_000_000 // 28)
            args, invalid = args + ["-f", "prompt.txt"], True
        elif prompt == "f-long":  # more tokens than the context
            files["prompt.txt"] = b"word " * 20000
            args, invalid = args + ["-f", "prompt.txt", "--ctx", "512"], True
        elif prompt == "f-bad":
            files["prompt.txt"] = b"\xff\xfe\x00bad"
            args, invalid = args + ["-f", "prompt.txt"], True
        elif prompt == "empty":
            args, invalid = args + ["-p", ""], combine(invalid, None)
        else:
            invalid = True
        args += ["-n", "2"] if rng.random() < 0.6 else []
        for _ in range(rng.randint(1, 4)):
            extra, bad = run_option(rng, rng.choice(RUN_OPTIONS), arch, truth)
            args += extra
            invalid = combine(invalid, bad)
            if extra[:2] == ["--trace", "trace.jsonl"]:
                logs = ("trace.jsonl",)
        if command == "env":
            name = rng.choice(
                [
                    "SWAPMOE_EXPERT_CACHE_SIZE",
                    "SWAPMOE_IO",
                    "SWAPMOE_EXPERT_PREFETCH",
                    "SWAPMOE_EXPERT_STREAMING",
                    "SWAPMOE_EXPERT_KEEP_RECENT",
                    "SWAPMOE_EXPERT_FIXATION",
                    "SWAPMOE_EXPERT_HASH_PREFETCH",
                ]
            )
            value = rng.choice(["-1", "0", "abc", "", "nan", "1e3", "maybe", "bogus", str(1 << 70)])
            env, invalid = {name: value}, combine(invalid, None)
    elif command == "inspect":
        model, invalid = path_arg(rng, files, rng.choice(["M.gguf", "R.gguf"]))
        args = ["inspect", model] + (["--json"] if rng.random() < 0.3 else [])
        if rng.random() < 0.5:
            extra, bad = page_size_option(rng)
            args, invalid = args + extra, combine(invalid, bad)
    elif command == "repack":
        src, invalid = path_arg(rng, files, "M.gguf")
        out = rng.choice(["OUT.gguf", "OUT.gguf", "M.gguf", "subdir", "nodir/OUT.gguf", "R.gguf"])
        force = rng.random() < 0.4
        args = ["repack", src, out] + (["--force"] if force else [])
        refused = out in ("M.gguf", "subdir", "nodir/OUT.gguf") or (out == "R.gguf" and not force)
        invalid = combine(invalid, refused)
        if rng.random() < 0.4:
            extra, bad = page_size_option(rng)
            args, invalid = args + extra, combine(invalid, bad)
        if rng.random() < 0.3:
            layout = rng.choice(["bundled", "compat", "striped"])
            args, invalid = args + ["--layout", layout], combine(invalid, layout == "striped")
        if out in ("OUT.gguf", "R.gguf"):
            writes, then = (out, out + ".swapidx"), [run_cmd(out, rss=rss)]
    elif command == "index":
        model, invalid = path_arg(rng, files, "M.gguf")
        args = ["index", model] + (["--no-digests"] if rng.random() < 0.5 else [])
        if rng.random() < 0.4:
            extra, bad = page_size_option(rng)
            args, invalid = args + extra, combine(invalid, bad)
        writes = (model + ".swapidx",)
    elif command == "verify":
        model, invalid = path_arg(rng, files, "R.gguf")
        args = ["verify", model]
        if rng.random() < 0.6:
            against, bad = path_arg(rng, files, "M.gguf")
            args, invalid = args + ["--against", against], combine(invalid, bad)
    elif command == "unpack":
        packed, invalid = path_arg(rng, files, "R.gguf")
        orig = rng.choice(
            ["ORIG.gguf", "ORIG.gguf", "M.gguf", "subdir", "R.gguf", "nodir/x.gguf", "x-00001-of-00002.gguf"]
        )
        force = rng.random() < 0.3
        args = ["unpack", packed, orig] + (["--force"] if force else [])
        refused = orig in ("R.gguf", "nodir/x.gguf", "x-00001-of-00002.gguf") or (orig == "M.gguf" and not force)
        invalid = combine(invalid, refused)
        writes = {"ORIG.gguf": ("ORIG.gguf",), "M.gguf": ("M.gguf",), "subdir": ("subdir/M.gguf",)}.get(orig, ())
    elif command == "synth":
        out = rng.choice(["S.gguf", "S.gguf", "M.gguf", "subdir", "nodir/S.gguf"])
        options = rng.sample(
            ["--arch", "--preset", "--type", "--layers", "--experts", "--size-gb", "--seed", "--force"],
            rng.randint(1, 3),
        )
        args = ["synth", out]
        invalid = combine(out in ("subdir", "nodir/S.gguf"), out == "M.gguf" and "--force" not in options)
        for option in options:
            if option == "--arch":
                value = rng.choice(["qwen3moe", "olmoe", "gpt-oss", "bert", ""])
                extra, bad = [option, value], value in ("bert", "")
            elif option == "--preset":
                value = rng.choice(["tiny-qwen3moe", "tiny-olmoe", "nope", ""])
                extra, bad = [option, value], value in ("nope", "")
            elif option == "--type":
                value = rng.choice(["Q8_0", "Q4_K", "IQ2_XXS", "Q4_K_M", "F16", "Q8_K", "I32", "XYZ", ""])
                extra, bad = [option, value], None if value in ("Q8_K", "I32") else value in ("XYZ", "")
            elif option == "--layers":
                extra, bad = int_option(rng, option, 1, 10_000, (1, 3))
            elif option == "--experts":
                extra, bad = int_option(rng, option, 1, 65_536, (1, 16))
                if bad is False and int(extra[1]) < SYNTH_TINY_USED:
                    bad = True  # fewer experts than a token uses: the model would be inconsistent
            elif option == "--size-gb":
                value = rng.choice(["-1", "0", "nan", "inf", "1e308", "100000", "0.001", "abc"])
                extra, bad = [option, value], value != "0.001"
            elif option == "--seed":
                extra, bad = int_option(rng, option, 0, (1 << 63) - 1, (0, 10))
            else:
                extra, bad = [option], False
            args += extra
            invalid = combine(invalid, bad)
        if out in ("S.gguf", "M.gguf"):
            writes = (out,)
            then = [Command(["inspect", out], must_pass=True)]  # what synth writes must be a consistent model
    else:  # serve, only with a bad value, so that it never starts listening
        option, value = rng.choice(
            [("--port", v) for v in ("0", "65536", "-1", "abc", "", "99999999999")]
            + [("--parallel", v) for v in ("0", "65", "-3", "x")]
        )
        args, invalid = ["serve", "M.gguf", option, value], True
    cmd = Command(args, must_fail=invalid is True, writes=writes, rss_limit=limit, env=env, then=then, logs=logs)
    return f"{command}: {cmd.line()}", files, [cmd]


MAKERS = {
    "gguf": make_gguf_case,
    "sidecar": make_sidecar_case,
    "template": make_template_case,
    "option": make_option_case,
}


# ==========================================================================================
# Checking a case
# ==========================================================================================
PROGRESS_MARKS = ("it/s]", "B/s]", "%|")


def message_lines(stderr: str) -> list[str]:
    """stderr without progress bars (tqdm redraws with \\r) and blank lines."""
    lines = []
    for line in stderr.replace("\r", "\n").split("\n"):
        if line.strip() and not any(mark in line for mark in PROGRESS_MARKS):
            lines.append(line)
    return lines


def check(cmd: Command, result: Result) -> list[str]:
    problems = []
    if result.code is None:
        return [f"hang: no exit after {TIMEOUT:.0f} s"]
    text = result.stderr + result.stdout
    if "Traceback (most recent call last)" in text or "Exception in thread" in text:
        last = [line for line in result.stderr.splitlines() if line.strip()][-1:] or ["?"]
        problems.append(f"traceback: {last[0][:200]}")
    if result.code < 0:
        problems.append(f"crash: killed by {signal.Signals(-result.code).name}")
    elif result.code not in (0, 1):  # a usage error is exit 1 too, one line as any other error
        problems.append(f"exit {result.code}")
    lines = message_lines(result.stderr)
    if result.code == 1:
        errors = [line for line in lines if line.startswith("swapmoe: error: ")]
        other = [line for line in lines if not line.startswith(("swapmoe: ", "problem: ", "prompt "))]
        if len(errors) != 1 or other:  # besides the error only --stats, verify's problems, warnings
            problems.append(f"error not one line: {lines[-3:]}")
        elif cmd.names and not any(name in errors[0] for name in (cmd.names, "prompt")) and not problems:
            problems.append(f"error does not name {cmd.names} (or the prompt): {errors[0][:200]}")
    if result.code == 0 and cmd.must_fail:
        problems.append("accepted: exit 0 on an input or option that must be refused")
    if result.code != 0 and cmd.must_pass and not problems:
        problems.append(f"refused a valid input: {(lines or ['?'])[-1][:200]}")
    if cmd.rss_limit is not None and result.rss > cmd.rss_limit:
        problems.append(f"memory: peak RSS {result.rss >> 20} MiB > {cmd.rss_limit >> 20} MiB")
    return problems


def _digest(path: Path) -> str:
    if path.is_symlink():
        return "link:" + os.readlink(path)
    if path.is_dir():
        return "dir"
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): _digest(p) for p in sorted(folder.rglob("*"))}


@dataclass
class Outcome:
    case: Case
    problems: list[str]  # "command: problem"
    commands: int
    log: list[str]


def lay_out(case: Case, folder: Path) -> None:
    folder.mkdir(parents=True)
    for name, content in case.files.items():
        path = folder / name
        if name.endswith("/"):
            path.mkdir()
        elif isinstance(content, Path):
            shutil.copyfile(content, path)
        elif isinstance(content, str):
            path.symlink_to(content)
        else:
            path.write_bytes(content)


def run_case(case: Case, folder: Path) -> Outcome:
    lay_out(case, folder)
    case.files = {}  # the outcome keeps the case: not its megabytes
    before = snapshot(folder)
    written: set[str] = set()  # what the commands that succeeded announced
    problems, log, count = [], [], 0
    queue = list(case.commands)
    while queue:
        cmd = queue.pop(0)
        count += 1
        result = execute(cli(*cmd.args), folder, child_env(cmd.env))
        problems += [f"`{cmd.line()}`: {p}" for p in check(cmd, result)]
        log.append(
            f"$ {cmd.line()}\n  exit {result.code}, {result.seconds:.1f} s, peak RSS {result.rss >> 20} MiB"
            + "".join(f"\n  | {line[:300]}" for line in message_lines(result.stderr)[-6:])
        )
        written |= set(cmd.logs)
        if result.code == 0:
            written |= set(cmd.writes)
            queue = cmd.then + queue
    after = snapshot(folder)
    for name, digest in after.items():
        if name in written:
            continue
        if name not in before:
            problems.append(f"leftover: {name}")
        elif digest != before[name]:
            problems.append(f"input changed: {name}")
    problems += [f"input removed: {name}" for name in before if name not in after and name not in written]
    return Outcome(case, problems, count, log)


# ==========================================================================================
# Main
# ==========================================================================================
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=0, help="corpus seed (default 0)")
    parser.add_argument("--cases", type=int, default=DEFAULT_CASES, help=f"corpus size (default {DEFAULT_CASES})")
    parser.add_argument("--case", type=int, action="append", help="run only this case number (repeatable)")
    parser.add_argument("--kind", choices=KINDS, action="append", help="run only cases of this kind (repeatable)")
    parser.add_argument("--jobs", type=int, default=1, help="cases run at once (default 1)")
    parser.add_argument(
        "--work",
        type=Path,
        help="work directory, kept with its base models and the folders of "
        "failing cases (default: a temp dir, removed)",
    )
    parser.add_argument("--list", action="store_true", help="describe the cases without running them")
    args = parser.parse_args(argv)
    numbers = (
        args.case
        if args.case
        else [k for k in range(args.cases) if not args.kind or CYCLE[k % len(CYCLE)] in args.kind]
    )
    work = args.work or Path(tempfile.mkdtemp(prefix="swapmoe-fuzz-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        if args.list:
            bases = Bases(work / "bases")
            for number in numbers:
                case = make_case(args.seed, number, bases)
                print(f"case {case.number:4} {case.kind:8} {case.what}")
            return 0
        verbose, started = bool(args.case), time.monotonic()

        def show(outcome: Outcome) -> None:
            c = outcome.case
            print(f"{'FAIL' if outcome.problems else 'ok  '} case {c.number:4} {c.kind:8} {c.what[:110]}", flush=True)
            if verbose:
                for entry in outcome.log:
                    print("  " + entry.replace("\n", "\n  "))
            elif outcome.problems:
                print(f"     {outcome.problems[0][:300]}", flush=True)

        outcomes = run_cases(args.seed, numbers, work, args.jobs, show)
        report(outcomes, args.seed, time.monotonic() - started)
        return 1 if any(o.problems for o in outcomes) else 0
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


def run_cases(seed: int, numbers: list[int], work: Path, jobs: int = 1, show=None) -> list[Outcome]:
    """Run these cases of the corpus of `seed` in `work` (base models are made there once), `jobs`
    at a time; show(outcome) is called as each ends. The folders of failing cases are kept."""
    bases = Bases(work / "bases")

    def one(number: int) -> Outcome:
        case = make_case(seed, number, bases)
        folder = work / f"case-{number}"
        shutil.rmtree(folder, ignore_errors=True)
        outcome = run_case(case, folder)
        if not outcome.problems:
            shutil.rmtree(folder, ignore_errors=True)
        return outcome

    outcomes = []
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        for outcome in pool.map(one, numbers):
            outcomes.append(outcome)
            if show:
                show(outcome)
    return outcomes


def report(outcomes: list[Outcome], seed: int, seconds: float) -> None:
    print(f"\n{'kind':10}{'cases':>7}{'commands':>10}{'failed':>8}   problems by class")
    for kind in KINDS + ("all",):
        mine = [o for o in outcomes if kind in ("all", o.case.kind)]
        if not mine:
            continue
        classes: dict[str, int] = {}
        for o in mine:
            for p in o.problems:
                name = p.split("`: ")[-1].split(":")[0]
                classes[name] = classes.get(name, 0) + 1
        failed = sum(bool(o.problems) for o in mine)
        text = ", ".join(f"{k} {v}" for k, v in sorted(classes.items())) or "-"
        print(f"{kind:10}{len(mine):7}{sum(o.commands for o in mine):10}{failed:8}   {text}")
    print(f"({seconds:.0f} s)")
    failing = [o for o in outcomes if o.problems]
    if failing:
        print("\nfailing cases:")
    for o in failing:
        print(f"case {o.case.number} ({o.case.kind}): {o.case.what}")
        for p in o.problems:
            print(f"    {p}")
        print(f"    reproduce: python tools/fuzz.py --seed {seed} --case {o.case.number}")


if __name__ == "__main__":
    sys.exit(main())
