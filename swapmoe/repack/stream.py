"""Move tensor bytes between files in pieces, hashing every piece on the way.

A piece is one hash unit: one non-expert tensor, or one expert's part of a routed tensor.
Pieces are taken in source-file order (so the input is read sequentially even though a
bundled output is written in another order) and grouped into batches that one read of at
most CHUNK bytes covers (a bundled repack turns a 3-D expert tensor into many ~1 MB
pieces; reading them one by one from several threads defeats readahead). Worker threads
take a batch, read it into their own reusable buffer, feed each piece to hashlib (which
releases the GIL on big buffers, so hashing runs on every core), and then write it
(`copy`), compare it with the same bytes of a second file (`compare`), or nothing else
(`hash`). Memory stays at WORKERS x CHUNK (x2 for compare) whatever the model size.

Why not os.copy_file_range: every byte must be hashed anyway (the index holds a digest of
every piece, unpack checks the source digest), so it passes through userspace once. A
kernel copy followed by hashing from the page cache through a map of the source was
measured (docs/repack.md): no faster, and the mapped pages raised peak RSS to ~760 MiB.
"""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from swapmoe.errors import SwapmoeError
from swapmoe.progress import progress_bar

CHUNK = 8 << 20
WORKERS = (os.cpu_count() or 2) + 1  # one more than cores so a reader waits on I/O while others hash
MODES = ("copy", "hash", "compare")


@dataclass(frozen=True)
class Piece:
    src: int  # file number in the source list
    src_offset: int
    length: int
    slot: int  # row of the digest array this piece's sha256 goes to
    dst: int = -1  # file number in the destination list (copy, compare)
    dst_offset: int = 0


def _truncated(path: Path, offset: int) -> SwapmoeError:
    return SwapmoeError(
        f"{path}: ends at byte {offset:,}, before the data it should hold (file truncated while in use?)"
    )


def _read_exact(fd: int, view: memoryview, offset: int, path: Path) -> None:
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            raise _truncated(path, offset + done)
        done += n


def _write_all(fd: int, view: memoryview, offset: int) -> None:
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)


def _batches(pieces: list[Piece]) -> list[list[Piece]]:
    """Pieces in source order, grouped into runs that one read of at most CHUNK bytes covers
    (adjacent in the same file, padding between them included); a bigger piece is a run of its own."""
    out: list[list[Piece]] = []
    for piece in sorted(pieces, key=lambda p: (p.src, p.src_offset)):
        last = out[-1] if out else None
        if (
            last
            and last[0].src == piece.src
            and piece.src_offset >= last[-1].src_offset + last[-1].length
            and piece.src_offset + piece.length - last[0].src_offset <= CHUNK
        ):
            last.append(piece)
        else:
            out.append([piece])
    return out


def run(
    pieces: list[Piece],
    sources: list[Path],
    dests: list[Path] = (),
    mode: str = "hash",
    desc: str = "",
    progress: bool = False,
    n_slots: int | None = None,
) -> tuple[np.ndarray, list[int]]:
    """Process every piece; return (sha256 per slot as uint8 [n_slots, 32], slots that differed in compare)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}")
    n_slots = n_slots if n_slots is not None else max((p.slot for p in pieces), default=-1) + 1
    digests = np.zeros((n_slots, 32), np.uint8)
    mismatched: list[int] = []
    queue = iter(_batches(pieces))
    lock, stop, errors = threading.Lock(), threading.Event(), []
    src_fds, dst_fds = [], []
    bar = progress_bar(sum(p.length for p in pieces), desc, enabled=progress)

    def finish(piece: Piece, view: memoryview, h, offset: int, other: memoryview | None) -> bool:
        """Hash bytes of the piece already in `view` (at `offset` within the piece), then write or compare them."""
        h.update(view)
        if mode == "copy":
            _write_all(dst_fds[piece.dst], view, piece.dst_offset + offset)
        elif mode == "compare":
            theirs = other[: len(view)]
            _read_exact(dst_fds[piece.dst], theirs, piece.dst_offset + offset, dests[piece.dst])
            return np.array_equal(np.frombuffer(view, np.uint8), np.frombuffer(theirs, np.uint8))
        return True

    def one_piece(piece: Piece, batch_view: memoryview | None, buffer: memoryview, other: memoryview | None) -> bool:
        """Process a piece: from the batch already read, or (a piece bigger than CHUNK) chunk by chunk."""
        h, same = hashlib.sha256(), True
        if batch_view is not None:
            same = finish(piece, batch_view, h, 0, other)
        else:
            for offset in range(0, piece.length, CHUNK):
                if stop.is_set():
                    return True
                chunk = buffer[: min(CHUNK, piece.length - offset)]
                _read_exact(src_fds[piece.src], chunk, piece.src_offset + offset, sources[piece.src])
                same = finish(piece, chunk, h, offset, other) and same
        digests[piece.slot] = np.frombuffer(h.digest(), np.uint8)
        return same

    def work() -> None:
        buffer = memoryview(bytearray(CHUNK))
        other = memoryview(bytearray(CHUNK)) if mode == "compare" else None
        try:
            while not stop.is_set():
                with lock:
                    batch = next(queue, None)
                if batch is None:
                    return
                base = batch[0].src_offset
                span = batch[-1].src_offset + batch[-1].length - base
                read_batch = span <= CHUNK
                if read_batch:  # one read for the whole batch
                    _read_exact(src_fds[batch[0].src], buffer[:span], base, sources[batch[0].src])
                for piece in batch:
                    start = piece.src_offset - base
                    same = one_piece(piece, buffer[start : start + piece.length] if read_batch else None, buffer, other)
                    with lock:
                        bar.update(piece.length)
                        if not same:
                            mismatched.append(piece.slot)
        except BaseException as e:  # handed to the main thread, which re-raises it
            errors.append(e)
            stop.set()

    threads = [threading.Thread(target=work, daemon=True) for _ in range(min(WORKERS, max(1, len(pieces))))]
    try:
        src_fds = [os.open(p, os.O_RDONLY) for p in sources]
        dst_fds = [os.open(p, os.O_WRONLY if mode == "copy" else os.O_RDONLY) for p in dests]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():  # short joins so Ctrl-C reaches the main thread at once
                t.join(0.2)
    except BaseException:
        stop.set()
        for t in threads:
            if t.is_alive():
                t.join()
        raise
    finally:
        bar.close()
        for fd in src_fds + dst_fds:
            os.close(fd)
    if errors:
        raise errors[0]
    return digests, sorted(mismatched)
