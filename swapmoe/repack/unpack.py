"""`swapmoe unpack`: rebuild the original GGUF, bit for bit, from a repacked file alone.

The repacked file's `swapmoe.unpack` key holds the original header bytes, gap bytes and
tensor table of every original shard; its `swapmoe.source_digest` pins the result. A split
original comes back as the same shards with the same names pattern.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from swapmoe.atomic import atomic_output, check_free_space, check_output_path
from swapmoe.errors import SwapmoeError
from swapmoe.gguf_file import open_gguf
from swapmoe.repack import stream
from swapmoe.repack.stream import Piece
from swapmoe.repack.tensors import (
    KEY_SOURCE_DIGEST,
    Manifest,
    content_digest,
    first_slots,
    layout_of,
    logical_tensors,
    read_manifest,
    tensor_digests,
)
from swapmoe.repack.write import create

_FIRST_SHARD = re.compile(r"^(?P<stem>.*)-00001-of-(?P<count>\d{5})\.gguf$")


def target_paths(orig: Path, manifest: Manifest) -> list[Path]:
    """Where each original shard goes: ORIG itself, or for a split original the shards named after ORIG
    (which must be `NAME-00001-of-0000N.gguf`); a directory gets the original file names."""
    names = [s["name"] for s in manifest.shards]
    if orig.is_dir():
        return [orig / name for name in names]
    if len(names) == 1:
        return [orig]
    m = _FIRST_SHARD.match(orig.name)
    if not m or int(m["count"]) != len(names):
        raise SwapmoeError(
            f"{orig}: the original was split into {len(names)} shards; give the first shard's name "
            f"(NAME-00001-of-{len(names):05d}.gguf) or a directory"
        )
    return [orig.with_name(f"{m['stem']}-{i:05d}-of-{len(names):05d}.gguf") for i in range(1, len(names) + 1)]


def unpack(
    packed: str | os.PathLike, orig: str | os.PathLike, force: bool = False, progress: bool = False
) -> list[Path]:
    """Write the original GGUF (or its shards) that `packed` was repacked from; return the paths written."""
    g = open_gguf(packed)
    if layout_of(g) == "original":
        raise SwapmoeError(f"{g.path}: not a file repacked by swapmoe; nothing to unpack")
    manifest = read_manifest(g)
    expected = g.get(KEY_SOURCE_DIGEST)
    tensors = logical_tensors(g)
    targets = target_paths(Path(orig), manifest)
    for target in targets:
        check_output_path(target, force, inputs=(g.path,))
    check_free_space(targets[0], sum(s["size"] for s in manifest.shards))

    pieces = []
    for t, slot, (_, shard, offset, _) in zip(tensors, first_slots(tensors), manifest.tensors):
        for k, (f, o, n) in enumerate(t.ranges):
            pieces.append(Piece(f, o, n, slot + k, shard, offset))
            offset += n
    with contextlib.ExitStack() as stack:
        tmps = [stack.enter_context(atomic_output(target)) for target in targets]
        for shard, tmp in enumerate(tmps):
            create(tmp, manifest.shards[shard]["size"], [(0, manifest.header(shard))] + manifest.gaps(shard))
        digests, _ = stream.run(
            pieces,
            [g.shards[0].path],
            tmps,
            mode="copy",
            progress=progress,
            desc=f"unpack {targets[0].name}",
            n_slots=sum(len(t.ranges) for t in tensors),
        )
        per_tensor = tensor_digests(tensors, digests)
        for shard, target in enumerate(targets):
            if content_digest(manifest, shard, per_tensor) != expected[shard]:
                raise SwapmoeError(
                    f"{g.path}: the rebuilt {target.name} does not match the original's digest; the "
                    "repacked file is damaged (run `swapmoe verify`); nothing was written"
                )
    return targets
