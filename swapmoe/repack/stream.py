"""Move tensor bytes between files in pieces, hashing every piece on the way.

A piece is one hash unit: one non-expert tensor, or one expert's part of a routed tensor.
Pieces are taken in source-file order (so the input is read sequentially even though a
bundled output is written in another order) and grouped into batches of at most CHUNK
bytes; worker threads take batches. hashlib releases the GIL on big buffers, so hashing
runs on every core.

copy: each piece is copied in the kernel with os.copy_file_range (no userspace copy, the
    same path as `cp`), then hashed straight from the page cache through a read-only map
    of the source; the map's pages are dropped again at once (MADV_DONTNEED) so RSS stays
    flat. Where the kernel refuses (another file system on old kernels, some network file
    systems), the rest of the run falls back to buffered copies through the worker's
    buffer: one read per batch, hash, write.
hash: read into the buffer, hash. compare: read both files into two buffers, hash one,
    compare.
Memory: WORKERS x CHUNK (x2 for compare), whatever the model size.
"""
from __future__ import annotations

import errno
import hashlib
import mmap
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from swapmoe.errors import SwapmoeError

CHUNK = 8 << 20
WORKERS = (os.cpu_count() or 2) + 1  # one more than cores so a reader waits on I/O while others hash
MODES = ("copy", "hash", "compare")
_KERNEL_REFUSALS = (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)


@dataclass(frozen=True)
class Piece:
    src: int  # file number in the source list
    src_offset: int
    length: int
    slot: int  # row of the digest array this piece's sha256 goes to
    dst: int = -1  # file number in the destination list (copy, compare)
    dst_offset: int = 0


def _truncated(path: Path, offset: int) -> SwapmoeError:
    return SwapmoeError(f"{path}: ends at byte {offset:,}, before the data it should hold (file truncated while in use?)")


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


def _copy_in_kernel(src_fd: int, dst_fd: int, length: int, src_offset: int, dst_offset: int, path: Path) -> bool:
    """copy_file_range the whole range; False if the kernel refuses before copying anything."""
    done = 0
    while done < length:
        try:
            n = os.copy_file_range(src_fd, dst_fd, length - done, src_offset + done, dst_offset + done)
        except OSError as e:
            if done == 0 and e.errno in _KERNEL_REFUSALS:
                return False
            raise
        if n == 0:
            raise _truncated(path, src_offset + done)
        done += n
    return True


def _batches(pieces: list[Piece]) -> list[list[Piece]]:
    """Pieces in source order, grouped into runs that one read of at most CHUNK bytes covers
    (adjacent in the same file, padding between them included); a bigger piece is a run of its own."""
    out: list[list[Piece]] = []
    for piece in sorted(pieces, key=lambda p: (p.src, p.src_offset)):
        last = out[-1] if out else None
        if (last and last[0].src == piece.src and piece.src_offset >= last[-1].src_offset + last[-1].length
                and piece.src_offset + piece.length - last[0].src_offset <= CHUNK):
            last.append(piece)
        else:
            out.append([piece])
    return out


def run(pieces: list[Piece], sources: list[Path], dests: list[Path] = (), mode: str = "hash", desc: str = "",
        progress: bool = False, n_slots: int | None = None) -> tuple[np.ndarray, list[int]]:
    """Process every piece; return (sha256 per slot as uint8 [n_slots, 32], slots that differed in compare)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}")
    n_slots = n_slots if n_slots is not None else max((p.slot for p in pieces), default=-1) + 1
    digests = np.zeros((n_slots, 32), np.uint8)
    mismatched: list[int] = []
    queue = iter(_batches(pieces))
    lock, stop, errors = threading.Lock(), threading.Event(), []
    kernel_copy = [mode == "copy"]  # cleared for the whole run at the first refusal
    src_fds, dst_fds, maps = [], [], []
    bar = tqdm(total=sum(p.length for p in pieces), unit="B", unit_scale=True, desc=desc, disable=not progress,
               mininterval=0.5, smoothing=0.1)

    def kernel_chunk(piece: Piece, h, offset: int, n: int) -> bool:
        """Copy [offset, offset + n) of the piece in the kernel and hash it from the page cache."""
        start = piece.src_offset + offset
        if not _copy_in_kernel(src_fds[piece.src], dst_fds[piece.dst], n, start, piece.dst_offset + offset,
                               sources[piece.src]):
            return False
        with memoryview(maps[piece.src])[start:start + n] as view:
            h.update(view)
        first = start // mmap.PAGESIZE * mmap.PAGESIZE
        maps[piece.src].madvise(mmap.MADV_DONTNEED, first, start + n - first)  # unmap: RSS stays flat
        return True

    def buffered_chunk(piece: Piece, view: memoryview, h, offset: int, other: memoryview | None) -> bool:
        """Hash bytes of the piece already in `view` (at `offset` within the piece), then write or compare them."""
        h.update(view)
        if mode == "copy":
            _write_all(dst_fds[piece.dst], view, piece.dst_offset + offset)
        elif mode == "compare":
            theirs = other[:len(view)]
            _read_exact(dst_fds[piece.dst], theirs, piece.dst_offset + offset, dests[piece.dst])
            return np.array_equal(np.frombuffer(view, np.uint8), np.frombuffer(theirs, np.uint8))
        return True

    def one_piece(piece: Piece, batch_view: memoryview | None, buffer: memoryview, other: memoryview | None) -> bool:
        """Process a piece: from the batch's buffer if the batch was read, else chunk by chunk."""
        h, same = hashlib.sha256(), True
        if batch_view is not None:
            same = buffered_chunk(piece, batch_view, h, 0, other)
        else:
            for offset in range(0, piece.length, CHUNK):
                if stop.is_set():
                    return True
                n = min(CHUNK, piece.length - offset)
                if kernel_copy[0]:
                    if kernel_chunk(piece, h, offset, n):
                        continue
                    kernel_copy[0] = False
                    if offset:  # refused part-way: hash this piece again from its start, through the buffer
                        return one_piece(piece, None, buffer, other)
                chunk = buffer[:n]
                _read_exact(src_fds[piece.src], chunk, piece.src_offset + offset, sources[piece.src])
                same = buffered_chunk(piece, chunk, h, offset, other) and same
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
                read_batch = not kernel_copy[0] and len(batch) > 1
                if read_batch:  # small pieces through the buffer: one read for the whole batch
                    _read_exact(src_fds[batch[0].src], buffer[:span], base, sources[batch[0].src])
                for piece in batch:
                    start = piece.src_offset - base
                    same = one_piece(piece, buffer[start:start + piece.length] if read_batch else None, buffer, other)
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
        if mode == "copy":
            maps = [mmap.mmap(fd, 0, access=mmap.ACCESS_READ) for fd in src_fds]
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
        for m in maps:
            m.close()
        for fd in src_fds + dst_fds:
            os.close(fd)
    if errors:
        raise errors[0]
    return digests, sorted(mismatched)
