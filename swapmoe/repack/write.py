"""`swapmoe repack` and `swapmoe index`: write a repacked GGUF with its sidecar, or only a sidecar."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from swapmoe.atomic import atomic_pair, check_free_space, check_output_path
from swapmoe.errors import SwapmoeError
from swapmoe.gguf_file import open_gguf
from swapmoe.repack import stream
from swapmoe.repack.index import ExpertIndex, build, sidecar_path
from swapmoe.repack.plan import DEFAULT_PAGE_SIZE, DIGEST_PLACEHOLDER, plan_repack
from swapmoe.repack.stream import Piece
from swapmoe.repack.tensors import content_digest, first_slots, logical_tensors, tensor_digests


def create(path: Path, size: int, chunks: list[tuple[int, bytes]]) -> None:
    """Create `path` with `size` bytes reserved on disk (so a full disk fails now, not at 90 %) and
    the given (offset, bytes) written; the rest reads as zeros until the copy fills it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise
            # the file system cannot preallocate (EOPNOTSUPP, EINVAL): the free-space check has to do
        os.ftruncate(fd, size)
        for offset, data in chunks:
            os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


def repack(
    in_path: str | os.PathLike,
    out_path: str | os.PathLike,
    layout: str = "bundled",
    page_size: int = DEFAULT_PAGE_SIZE,
    force: bool = False,
    progress: bool = False,
) -> Path:
    """Write `out_path`, a page-aligned copy of the GGUF `in_path`, and its sidecar index `out_path.swapidx`.

    Nothing is left at `out_path` if anything fails or is interrupted; the input is only read.
    """
    in_path, out_path = Path(in_path), Path(out_path)
    g = open_gguf(in_path)
    check_output_path(out_path, force, inputs=tuple(s.path for s in g.shards))
    plan = plan_repack(g, layout, page_size)
    check_free_space(out_path, plan.size + (64 << 20))
    side = sidecar_path(out_path)
    with atomic_pair(out_path, side) as (tmp, tmp_side):
        create(tmp, plan.size, [(0, plan.header([DIGEST_PLACEHOLDER] * len(plan.sources)))])
        digests, _ = stream.run(
            plan.pieces,
            plan.sources,
            [tmp],
            mode="copy",
            progress=progress,
            desc=f"repack {out_path.name}",
            n_slots=sum(len(t.ranges) for t in plan.tensors),
        )
        per_tensor = tensor_digests(plan.tensors, digests)
        sources = [content_digest(plan.manifest, shard, per_tensor) for shard in range(len(plan.sources))]
        with open(tmp, "r+b") as f:
            os.pwrite(f.fileno(), plan.header(sources), 0)
        out = open_gguf(tmp)
        index = build(out, digests)
        index.files = [out_path.name]
        tmp_side.write_bytes(index.to_bytes())
    return out_path


def index_gguf(
    path: str | os.PathLike, page_size: int = DEFAULT_PAGE_SIZE, digests: bool = True, progress: bool = False
) -> tuple[Path, ExpertIndex]:
    """Write the sidecar index of a GGUF as it is (no copy); return its path and the index.

    digests=False skips reading the tensor bytes (seconds instead of a full read of the file).
    """
    g = open_gguf(path)
    tensors = logical_tensors(g)
    if not any(t.routed for t in tensors):
        raise SwapmoeError(f"{g.path}: no routed expert tensors (blk.N.ffn_*_exps); nothing to index")
    piece_digests = None
    if digests:
        slots = first_slots(tensors)
        pieces = [Piece(f, o, n, slot + k) for t, slot in zip(tensors, slots) for k, (f, o, n) in enumerate(t.ranges)]
        piece_digests, _ = stream.run(
            pieces,
            [s.path for s in g.shards],
            mode="hash",
            progress=progress,
            desc=f"index {g.path.name}",
            n_slots=len(pieces),
        )
    index = build(g, piece_digests, page_size, tensors)
    side = sidecar_path(g.path)
    index.save(side)
    return side, index
