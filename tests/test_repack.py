"""Repack, index, verify and unpack round trips on tiny synthetic models of every family."""

from __future__ import annotations

import errno
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import gguf
import numpy as np
import pytest

import swapmoe
from swapmoe.errors import SwapmoeError
from swapmoe.gguf_file import TensorKind, open_gguf
from swapmoe.repack import stream
from swapmoe.repack.index import FLAG_CONTIGUOUS, FLAG_PAGE_ALIGNED, FLAG_SHARES_PAGE, sidecar_path
from swapmoe.repack.tensors import part_name
from swapmoe.repack.unpack import unpack
from swapmoe.repack.verify import verify
from swapmoe.repack.write import index_gguf

from conftest import cli_command, run_cli, sha256_file

ARCHS = ["qwen3moe", "qwen2moe", "olmoe", "llama", "deepseek2", "deepseek4", "minimax-m2", "gpt-oss", "qwen35moe"]
TYPES = ["F32", "F16", "BF16", "Q4_K", "Q2_K", "IQ2_XXS", "MXFP4", "Q4_K_M"]


@pytest.fixture(scope="module")
def models(synth_model):
    """Synthetic inputs, made once: models(arch, type) -> path."""
    return lambda arch, type_="Q8_0": synth_model(arch=arch, type=type_)


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".tmp-" in p.name)


def check_round_trip(src: Path, out: Path, layout: str, page_size: int = 16384) -> None:
    """The acceptance checks: slices page-aligned and equal, other tensors equal, verify, unpack."""
    before = sha256_file(src)
    swapmoe.repack(src, out, layout=layout, page_size=page_size)
    g_in, g_out = open_gguf(src), open_gguf(out)
    idx = swapmoe.index.load(out)
    assert idx.layout == layout and idx.page_size == page_size

    # every routed expert part: same bytes as the input's expert slice of that tensor
    routed = g_in.tensors_of_kind(TensorKind.ROUTED_EXPERT)
    assert routed
    for t in routed:
        n = t.expert_nbytes
        src_bytes = g_in.raw(t.name)
        for e in range(t.n_experts):
            offset, length, ggml_type, shape = idx.projection(t.layer, e, part_name(t.cls))
            assert (length, ggml_type, shape) == (n, t.ggml_type, t.shape[1:])
            with open(out, "rb") as f:
                assert os.pread(f.fileno(), length, offset) == src_bytes[e * n : (e + 1) * n].tobytes()
    for layer in idx.moe_layers():
        for e in range(idx.n_expert):
            ranges = idx.slice(layer, e)
            if layout == "bundled":
                assert len(ranges) == 1 and ranges[0].offset % page_size == 0
                assert idx.slice_flags[layer, e] == FLAG_CONTIGUOUS | FLAG_PAGE_ALIGNED
                parts = [idx.projection(layer, e, p) for i, p in enumerate(idx.parts) if idx.part_length[layer, e, i]]
                assert all(p.offset % 64 == 0 for p in parts)
                assert min(p.offset for p in parts) == ranges[0].offset
                assert max(p.offset + p.length for p in parts) == ranges[0].offset + ranges[0].length
            else:
                assert len(ranges) == len([p for p in idx.parts if idx.part_length[layer, e, idx.parts.index(p)]])
    # every other tensor byte-identical and findable
    for name, t in g_in.tensors.items():
        if t.kind is not TensorKind.ROUTED_EXPERT:
            assert g_out.raw(name).tobytes() == g_in.raw(name).tobytes(), name
            loc = idx.tensor(name)
            assert (loc.offset, loc.length) == (g_out.tensor(name).offset, t.nbytes)
    region = idx.nonexpert_region()
    first_slice = min(r.offset for layer in idx.moe_layers() for e in range(idx.n_expert) for r in idx.slice(layer, e))
    assert region.offset + region.length <= first_slice

    # a valid GGUF to the gguf package, with every input key kept
    reader_in, reader_out = gguf.GGUFReader(src), gguf.GGUFReader(out)
    for key, field in reader_in.fields.items():
        if key.startswith("GGUF.") or (layout == "compat" and key == "general.alignment"):
            continue
        assert reader_out.fields[key].contents() == field.contents(), key
    assert reader_out.fields["swapmoe.layout"].contents() == layout
    if layout == "compat":
        assert reader_out.fields["general.alignment"].contents() == page_size
        assert [t.name for t in reader_out.tensors if "exps" in t.name] == [t.name for t in routed]

    assert verify(out).ok, verify(out).problems
    assert verify(out, against=src).ok
    back = out.with_name(out.stem + "-back.gguf")
    unpack(out, back)
    assert sha256_file(back) == before == sha256_file(src)
    assert not leftovers(out.parent)


@pytest.mark.parametrize("layout", ["bundled", "compat"])
@pytest.mark.parametrize("arch", ARCHS)
def test_round_trip_every_arch(models, tmp_path, arch, layout):
    check_round_trip(models(arch), tmp_path / "out.gguf", layout)


@pytest.mark.parametrize("type_", TYPES)
def test_round_trip_types(models, tmp_path, type_):
    check_round_trip(models("qwen3moe", type_), tmp_path / "out.gguf", "bundled")


def test_round_trip_gpt_oss_biases_4k_pages(models, tmp_path):
    check_round_trip(models("gpt-oss", "MXFP4"), tmp_path / "out.gguf", "bundled", page_size=4096)
    idx = swapmoe.index.load(tmp_path / "out.gguf")
    assert {"gate.bias", "up.bias", "down.bias"} <= set(idx.parts)
    assert idx.projection(0, 1, "down.bias").shape == (256,)


def test_fused_gate_up(models, tmp_path):
    swapmoe.repack(models("qwen35moe"), tmp_path / "out.gguf")
    idx = swapmoe.index.load(tmp_path / "out.gguf")
    assert idx.parts == ["gate_up", "down"]
    assert idx.projection(0, 0, "gate_up").shape == (512, 256)


def test_deepseek4_hash_tables(models, tmp_path):
    src = models("deepseek4")
    swapmoe.repack(src, tmp_path / "out.gguf")
    idx = swapmoe.index.load(tmp_path / "out.gguf")
    g = open_gguf(src)
    tables = {t.layer: g.array(t.name) for t in g.tensors_of_kind(TensorKind.HASH_TABLE)}
    assert tables and idx.hash_layers() == sorted(tables)
    for layer, table in tables.items():
        assert np.array_equal(idx.hash_table(layer), table)  # [n_vocab, k], order kept
        assert idx.hash_table(layer).shape == (table.shape[0], g.arch_get(gguf.Keys.LLM.EXPERT_USED_COUNT))
    with pytest.raises(SwapmoeError, match="not hash-routed"):
        idx.hash_table(max(tables) + 1)


def test_index_of_original_file_marks_unaligned_slices(models, tmp_path):
    src = tmp_path / "in.gguf"
    shutil.copy(models("qwen3moe"), src)
    side, idx = index_gguf(src)
    assert side == sidecar_path(src) and idx.layout == "original"
    g = open_gguf(src)
    t = g.tensor("blk.1.ffn_down_exps.weight")
    assert idx.projection(1, 2, "down")[:2] == (t.offset + 2 * t.expert_nbytes, t.expert_nbytes)
    assert len(idx.slice(1, 2)) == 3
    flags = idx.slice_flags[idx.part_length.any(axis=2)]
    assert (flags & FLAG_SHARES_PAGE).all() and not (flags & FLAG_CONTIGUOUS).any()
    assert len(idx.nonexpert_ranges()) == 2
    with pytest.raises(SwapmoeError, match="nonexpert_ranges"):
        idx.nonexpert_region()
    loaded = swapmoe.index.load(src)
    assert np.array_equal(loaded.part_digest, idx.part_digest) and loaded.has_digests
    assert verify(src, against=src).ok


def split_gguf(src: Path, directory: Path, max_tensors: int) -> Path:
    """Rewrite a GGUF as NAME-0000i-of-0000N.gguf shards with gguf-py's writer (as llama.cpp's gguf-split does)."""
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(directory / "split.gguf", arch, split_max_tensors=max_tensors)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    for t in reader.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    shards = sorted(directory.glob("split-*-of-*.gguf"))
    assert len(shards) > 1
    return shards[0]


def test_split_input(models, tmp_path):
    first = split_gguf(models("qwen2moe"), tmp_path, max_tensors=12)
    shards = sorted(tmp_path.glob("split-*.gguf"))
    digests = [sha256_file(s) for s in shards]
    # the sidecar of an un-repacked split file: ranges carry their shard number
    _, idx = index_gguf(first)
    assert len(idx.files) == len(shards) and {r.file for layer in idx.moe_layers() for r in idx.slice(layer, 0)} - {0}
    loaded = swapmoe.index.load(first)
    assert [p.name for p in loaded.paths] == [s.name for s in shards]
    # repack makes one file; unpack gives the shards back, bit for bit
    out = tmp_path / "out.gguf"
    swapmoe.repack(first, out, layout="compat")
    assert open_gguf(out).get("split.count") is None and len(open_gguf(out).shards) == 1
    assert verify(out, against=first).ok
    restored = tmp_path / "restored"
    restored.mkdir()
    paths = unpack(out, restored)
    assert [p.name for p in paths] == [s.name for s in shards]
    assert [sha256_file(p) for p in paths] == digests
    with pytest.raises(SwapmoeError, match="split into"):
        unpack(out, tmp_path / "x.gguf")
    named = unpack(out, tmp_path / "named-00001-of-{:05d}.gguf".format(len(shards)))
    assert [sha256_file(p) for p in named] == digests


def test_api_is_callable_after_submodule_import():
    import importlib

    import swapmoe.repack.write  # noqa: F401  (rebinds swapmoe.repack to the package)

    assert callable(importlib.import_module("swapmoe").repack)
    assert swapmoe.index.load is importlib.import_module("swapmoe.repack.index").load


# --- stale sidecar, bad input, failures -------------------------------------------------------
def test_stale_or_foreign_sidecar_refused(models, tmp_path):
    out, other = tmp_path / "out.gguf", tmp_path / "other.gguf"
    swapmoe.repack(models("qwen3moe"), out)
    swapmoe.repack(models("olmoe"), other)
    shutil.copy(sidecar_path(other), sidecar_path(out))
    with pytest.raises(SwapmoeError, match="stale index"):
        swapmoe.index.load(out)
    swapmoe.repack(models("qwen3moe"), out, force=True)  # rewrites the sidecar too
    swapmoe.index.load(out)
    data = bytearray(out.read_bytes())
    data[100] ^= 0xFF  # inside the KV section: the model changed
    out.write_bytes(bytes(data))
    with pytest.raises(SwapmoeError, match="stale index"):
        swapmoe.index.load(out)
    side = sidecar_path(other)
    blob = bytearray(side.read_bytes())
    blob[40] ^= 1
    side.write_bytes(bytes(blob))
    with pytest.raises(SwapmoeError, match="checksum"):
        swapmoe.index.load(other)
    side.unlink()
    with pytest.raises(SwapmoeError, match="swapmoe index"):
        swapmoe.index.load(other)


def test_verify_finds_changed_bytes(models, tmp_path):
    out = tmp_path / "out.gguf"
    swapmoe.repack(models("qwen3moe"), out)
    idx = swapmoe.index.load(out)
    offset = idx.projection(1, 5, "up").offset + 10
    with open(out, "r+b") as f:
        byte = os.pread(f.fileno(), 1, offset)
        os.pwrite(f.fileno(), bytes([byte[0] ^ 1]), offset)
    report = verify(out)
    assert not report.ok and any("blk.1.ffn_up_exps.weight" in p for p in report.problems)
    assert any("source digest" in p for p in report.problems)
    with pytest.raises(SwapmoeError, match="damaged"):
        unpack(out, tmp_path / "back.gguf")
    assert not (tmp_path / "back.gguf").exists() and not leftovers(tmp_path)
    result = run_cli("verify", out, "--against", models("qwen3moe"))
    assert result.exit_code == 1 and "differ from" in result.output


def test_cli_round_trip(models, tmp_path):
    src, out = models("deepseek2"), tmp_path / "out.gguf"
    result = run_cli("repack", src, out, "--layout", "compat", "--page-size", 4096)
    assert result.exit_code == 0, result.output
    assert "compat layout" in result.output and sidecar_path(out).exists()
    assert run_cli("verify", out, "--against", src).exit_code == 0
    result = run_cli("inspect", out, "--json")
    assert result.exit_code == 0 and '"swapmoe_layout": "compat"' in result.output
    assert run_cli("unpack", out, tmp_path / "back.gguf").exit_code == 0
    assert sha256_file(tmp_path / "back.gguf") == sha256_file(src)
    copy = tmp_path / "orig.gguf"
    shutil.copy(src, copy)
    result = run_cli("index", copy)
    assert result.exit_code == 0 and "share a page" in result.output
    assert run_cli("verify", copy).exit_code == 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--page-size", "5000"], "power of two"),
        (["--page-size", "2048"], "power of two"),
        (["--layout", "striped"], "Invalid value"),
    ],
)
def test_cli_bad_options(models, tmp_path, args, message):
    result = run_cli("repack", models("qwen3moe"), tmp_path / "out.gguf", *args)
    assert result.exit_code == 1 and message in result.output


def test_refuses_same_file_and_existing_output(models, tmp_path):
    src = models("qwen3moe")
    result = run_cli("repack", src, src, "--force")
    assert result.exit_code == 1 and "same file" in result.output
    out = tmp_path / "out.gguf"
    out.write_bytes(b"keep me")
    result = run_cli("repack", src, out)
    assert result.exit_code == 1 and "already exists" in result.output and out.read_bytes() == b"keep me"


def corrupt_copy(src: Path, tmp_path: Path, edit) -> Path:
    bad = tmp_path / "bad.gguf"
    data = bytearray(src.read_bytes())
    edit(data)
    bad.write_bytes(bytes(data))
    return bad


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.__delitem__(slice(len(d) - 300_000, None)), "truncated"),
        (lambda d: d.__setitem__(slice(30, 60), b"\xff" * 30), "corrupt or truncated GGUF header"),
        (lambda d: d.__setitem__(slice(0, 4), b"GGML"), "not a GGUF"),
    ],
)
def test_bad_input(models, tmp_path, edit, message):
    bad = corrupt_copy(models("qwen3moe"), tmp_path, edit)
    before = sha256_file(bad)
    for command in (["repack", bad, tmp_path / "out.gguf"], ["index", bad], ["inspect", bad]):
        result = run_cli(*command)
        assert result.exit_code == 1 and message in result.output, result.output
        assert "Traceback" not in result.output
    assert not (tmp_path / "out.gguf").exists() and not sidecar_path(bad).exists() and not leftovers(tmp_path)
    assert sha256_file(bad) == before


def test_hash_table_id_out_of_range(models, tmp_path):
    src = models("deepseek4")
    table = open_gguf(src).tensor("blk.0.ffn_gate_tid2eid.weight")

    def edit(data):
        data[table.offset + 4 * 7 : table.offset + 4 * 8] = np.int32(99).tobytes()  # token 1, slot 1 of k=2? entry 7

    bad = corrupt_copy(src, tmp_path, edit)
    for command in (["repack", bad, tmp_path / "out.gguf"], ["index", bad]):
        result = run_cli(*command)
        assert result.exit_code == 1 and "maps to expert 99" in result.output and "8 experts" in result.output
    assert not (tmp_path / "out.gguf").exists() and not leftovers(tmp_path)


def test_no_routed_experts(tmp_path):
    dense = tmp_path / "dense.gguf"
    w = gguf.GGUFWriter(dense, "llama")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 32), np.float32))
    w.add_tensor("blk.0.ffn_up.weight", np.zeros((8, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for command in (["repack", dense, tmp_path / "out.gguf"], ["index", dense]):
        result = run_cli(*command)
        assert result.exit_code == 1 and "no routed expert tensors" in result.output
    assert run_cli("inspect", dense).exit_code == 0
    assert not (tmp_path / "out.gguf").exists()


def test_disk_full_leaves_nothing(models, tmp_path, monkeypatch):
    src = models("qwen3moe")
    before = sha256_file(src)
    calls = []
    real = os.pwrite

    def full(*args):
        calls.append(args)
        if len(calls) > 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*args)

    monkeypatch.setattr(stream.os, "pwrite", full)
    result = run_cli("repack", src, tmp_path / "out.gguf")
    assert result.exit_code == 1 and "disk full" in result.output, result.output
    assert len(calls) > 3 and list(tmp_path.iterdir()) == [] and sha256_file(src) == before


@pytest.mark.parametrize(
    "signum, code, said",
    [
        (signal.SIGINT, 130, "interrupted"),
        (signal.SIGTERM, 143, "stopped by SIGTERM"),
        (signal.SIGHUP, 129, "stopped by SIGHUP"),
    ],
)
def test_interrupt_leaves_nothing(tmp_path, signum, code, said):
    """Ctrl-C for real, and SIGTERM/SIGHUP (timeout, systemd, docker stop, a closed terminal):
    the signal to a repack running in its own process, once its temp file exists."""
    src = swapmoe.synth(tmp_path / "src.gguf", preset="qwen3-30b-a3b", type="Q4_K", n_layer=1, progress=False)
    before = sha256_file(src)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    # a background job (CI) may run with SIGINT ignored, and Python then keeps ignoring it: give the
    # child a terminal's default disposition, as a user pressing Ctrl-C has
    proc = subprocess.Popen(
        cli_command("repack", src, out_dir / "out.gguf"),
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60
    while not any(".tmp-" in p.name for p in out_dir.iterdir()):
        assert proc.poll() is None and time.monotonic() < deadline, "repack ended before it could be interrupted"
        time.sleep(0.01)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code and said in err and "Traceback" not in err
    assert list(out_dir.iterdir()) == [] and sha256_file(src) == before


def test_publishing_never_pairs_an_old_file_with_a_new_sidecar(models, tmp_path, monkeypatch):
    """With --force over an existing pair: the old sidecar goes first, then OUT, then the new
    sidecar; a failure after OUT leaves OUT alone, never beside the old sidecar."""
    from swapmoe import atomic

    out, src = tmp_path / "out.gguf", models("qwen2moe")
    swapmoe.repack(models("qwen3moe"), out)
    old_side = (tmp_path / "out.gguf.swapidx").read_bytes()
    real, renamed = os.replace, []

    def fail_second(src, dst):
        renamed.append(Path(dst).name)
        if len(renamed) == 2:
            raise OSError(errno.EIO, "simulated failure")
        return real(src, dst)

    monkeypatch.setattr(atomic.os, "replace", fail_second)
    with pytest.raises(swapmoe.SwapmoeError):
        swapmoe.repack(src, out, force=True)
    assert renamed == ["out.gguf", "out.gguf.swapidx"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.gguf"]  # the new OUT; no sidecar, no temp
    assert old_side


def test_disk_full_at_preallocation(models, tmp_path, monkeypatch):
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    result = run_cli("repack", models("qwen3moe"), tmp_path / "out.gguf")
    assert result.exit_code == 1 and "disk full" in result.output
    assert list(tmp_path.iterdir()) == []


def test_unpack_refuses_original_and_existing_target(models, tmp_path):
    src = models("qwen3moe")
    result = run_cli("unpack", src, tmp_path / "x.gguf")
    assert result.exit_code == 1 and "not a file repacked by swapmoe" in result.output
    out = tmp_path / "out.gguf"
    swapmoe.repack(src, out)
    result = run_cli("unpack", out, src)
    assert result.exit_code == 1 and "already exists" in result.output
    result = run_cli("unpack", out, out, "--force")
    assert result.exit_code == 1 and "same file" in result.output
    result = run_cli("repack", out, tmp_path / "again.gguf")
    assert result.exit_code == 1 and "already repacked" in result.output


# --- stopped at any moment ----------------------------------------------------------------------
# Each writing command, stopped by a signal at a random moment (seeded) of its run: what is left
# at its output must be nothing, the untouched old output (--force over an existing one), or the
# complete output a run that was not stopped writes. A model of ~150 MB gives each run a second
# or so of writing to land in.
STOP_LAYERS = 80


@pytest.fixture(scope="module")
def stop_bench(tmp_path_factory):
    """The source model and, per command, its arguments (SRC, OUT stand for paths), the files it
    writes, those files from a run that was not stopped, other contents for them (an old output),
    and how long that run took."""
    root = tmp_path_factory.mktemp("stop")
    src = swapmoe.synth(root / "src.gguf", n_layer=STOP_LAYERS, progress=False)
    packed = root / "packed.gguf"
    swapmoe.repack(src, packed)
    commands = {
        "repack": (["repack", "SRC", "OUT/out.gguf"], src, ("out.gguf", "out.gguf.swapidx")),
        "unpack": (["unpack", "SRC", "OUT/orig.gguf"], packed, ("orig.gguf",)),
        "index": (["index", "OUT/model.gguf"], src, ("model.gguf.swapidx",)),
        "synth": (["synth", "OUT/new.gguf", "--layers", str(STOP_LAYERS)], None, ("new.gguf",)),
    }
    bench = {}
    for name, (args, source, outputs) in commands.items():
        folder = root / name
        folder.mkdir()
        if name == "index":
            shutil.copy(src, folder / "model.gguf")
        argv = cli_command(*[a.replace("SRC", str(source)).replace("OUT", str(folder)) for a in args])
        started = time.monotonic()
        subprocess.run(argv, check=True, capture_output=True)
        seconds = time.monotonic() - started
        complete = {out: (folder / out).read_bytes() for out in outputs}
        old = {out: b"an older " + out.encode() for out in outputs}
        bench[name] = (argv, folder, complete, old, seconds)
    return bench


def _stop_once(bench, command: str, signum: int, force: bool, seed: int) -> None:
    argv, folder, complete, old, seconds = bench[command]
    for path in folder.iterdir():
        if path.name != "model.gguf":  # index's input
            path.unlink()
    if force:
        for name, data in old.items():
            (folder / name).write_bytes(data)
        argv = argv + (["--force"] if command != "index" else [])  # index always rewrites the sidecar
    delay = random.Random(f"{command}/{signum}/{force}/{seed}").uniform(0.05, 1.2 * seconds)
    proc = subprocess.Popen(
        argv, stderr=subprocess.PIPE, text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)
    )
    time.sleep(delay)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    handled = 130 if signum == signal.SIGINT else 128 + signum
    context = f"{command} stopped by {signal.Signals(signum).name} after {delay:.2f} s: exit {proc.returncode}"
    # -signum: stopped before swapmoe took over the signal (Python itself starting: Ctrl-C there is
    # a KeyboardInterrupt traceback, exit 1 or -2; in click before the command runs, click's
    # "Aborted!", exit 1; both before anything was written)
    starting = signum == signal.SIGINT and err.strip().endswith(("\nKeyboardInterrupt", "Aborted!"))
    assert proc.returncode in (0, handled, -signum) or (starting and proc.returncode == 1), context + "\n" + err
    if proc.returncode == handled:
        assert "Traceback" not in err and err.strip().endswith(("interrupted", signal.Signals(signum).name)), err
    left = {p.name: p.read_bytes() for p in folder.iterdir() if p.name != "model.gguf"}
    assert not [name for name in left if ".tmp-" in name], context
    assert left in ({}, complete) or (force and left == old), f"{context}: left {sorted(left)}"


@pytest.mark.parametrize("command", ["repack", "unpack", "index", "synth"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_at_any_moment_leaves_nothing_the_old_or_the_whole_output(stop_bench, command, signum):
    _stop_once(stop_bench, command, signum, force=signum == signal.SIGTERM, seed=0)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["repack", "unpack", "index", "synth"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
@pytest.mark.parametrize("force", [False, True])
def test_stops_at_many_moments(stop_bench, command, signum, force):
    for seed in range(1, 9):
        _stop_once(stop_bench, command, signum, force, seed)
