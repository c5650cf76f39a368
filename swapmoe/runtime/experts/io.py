"""How expert bytes get from the file into RAM: engines behind one protocol, `Engine`.

An engine works on whole expert slices given as byte ranges `(file, offset, length)` from the
sidecar index, and hands out zero-copy uint8 views for the kernels. The expert store decides
which experts are resident; the engine only moves bytes and says what an expert costs in RAM.

mmap   The files are mapped. Expert regions get MADV_RANDOM, so a fault never drags in an 8 MiB
       readahead window of neighbours. `start` asks for exactly the slice's pages (MADV_WILLNEED:
       large reads), `finish` waits for them (MADV_POPULATE_READ), `release` drops them from the
       mapping and the page cache. Room is only the store's byte budget.
pread  swapmoe owns the memory: a pool of slots, one expert slice each (one slot size per slice
       size), filled by `os.preadv` from worker threads (O_DIRECT where the file system allows,
       so the page cache neither doubles the memory nor competes with it). Reads run while
       numba computes (the kernels release the GIL). Room is a free slot of the slice's size.
"""

from __future__ import annotations

import mmap
import os
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from swapmoe.errors import SwapmoeError

MADV_POPULATE_READ = 22  # Linux 5.14; older kernels answer EINVAL and we touch the pages instead
WILLNEED_PIECE = 512 << 10  # 25 MiB experts: 2.1 GB/s in 512 KiB pieces, 0.08 GB/s in one call
PAGE = mmap.PAGESIZE
DIRECT_ALIGN = 4096  # O_DIRECT wants offsets, lengths and buffers aligned to the logical block size

Ranges = list[tuple[int, int, int]]  # (file, offset, length)


class Engine(Protocol):
    """What the expert store asks of an engine. A placement is the engine's own record of one
    expert's bytes in RAM (opaque to the store), from `start` until `release`.

    name            shown in stats and --stats.
    sized_rooms     True where room is a slot of one size: only releasing an expert whose charge
                    equals the one waiting frees room for it (the store picks victims of that size).
    charge(ranges)  the RAM bytes an expert of these ranges takes while resident; the same for the
                    same ranges every time.
    has_room(n)     can an expert of charge n be started without releasing another? (Beyond the
                    store's own byte budget, which the store checks.)
    start(ranges, n) begin bringing the ranges into RAM without waiting; the expert's charge is n
                    and has_room(n) was true. Returns its placement.
    finish(p)       wait until the placement's bytes are in RAM; views of them, one per range, valid
                    until release(p). May be called more than once.
    release(p)      give the room back; waits for a read still filling it. The views are invalid after.
    close()         release everything; no call follows.
    """

    name: str
    sized_rooms: bool

    def charge(self, ranges: Ranges) -> int: ...
    def has_room(self, nbytes: int) -> bool: ...
    def start(self, ranges: Ranges, nbytes: int) -> Any: ...
    def finish(self, placement: Any) -> list[np.ndarray]: ...
    def release(self, placement: Any) -> None: ...
    def close(self) -> None: ...


def _page_span(offset: int, length: int, inner: bool = False) -> tuple[int, int]:
    """The page-aligned (start, length) covering [offset, offset+length), or only the pages
    entirely inside it (inner=True, so that a neighbour sharing a page is left alone)."""
    if inner:
        start, end = -(-offset // PAGE) * PAGE, (offset + length) // PAGE * PAGE
    else:
        start, end = offset // PAGE * PAGE, -(-(offset + length) // PAGE) * PAGE
    return start, max(0, end - start)


class MmapEngine:
    """Engine on mapped files; a placement is the expert's ranges."""

    name = "mmap"
    sized_rooms = False

    def __init__(self, paths: list[Path], expert_regions: Ranges | None):
        self._files = [open(p, "rb") for p in paths]
        self._maps = [mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) for f in self._files]
        self._arrays = [np.frombuffer(m, np.uint8) for m in self._maps]
        self._populate = True
        for file, offset, length in expert_regions or ():
            start, n = _page_span(offset, length, inner=True)
            if n:
                self._maps[file].madvise(mmap.MADV_RANDOM, start, n)

    def charge(self, ranges: Ranges) -> int:
        return sum(n for _, _, n in ranges)

    def has_room(self, nbytes: int) -> bool:
        return True

    def start(self, ranges: Ranges, nbytes: int) -> Ranges:
        """MADV_WILLNEED in pieces: one call reads at most the device's readahead limit (8 MiB
        here, often less), and the rest of a larger range would then come in page by page."""
        for f, o, n in ranges:
            start, span = _page_span(o, n)
            for piece in range(start, start + span, WILLNEED_PIECE):
                self._maps[f].madvise(mmap.MADV_WILLNEED, piece, min(WILLNEED_PIECE, start + span - piece))
        return ranges

    def finish(self, ranges: Ranges) -> list[np.ndarray]:
        """Fault the pages in now. Asked for first (`start`), they come as large reads: on a
        MADV_RANDOM region MADV_POPULATE_READ alone faults them in one 4 KiB read at a time (0.06
        GB/s here, against 2 GB/s)."""
        for f, o, n in ranges:
            start, span = _page_span(o, n)
            if self._populate:
                try:
                    self._maps[f].madvise(MADV_POPULATE_READ, start, span)
                    continue
                except OSError:
                    self._populate = False
            self._arrays[f][start : start + span : PAGE].sum()  # touch every page
        return [self._arrays[f][o : o + n] for f, o, n in ranges]

    def release(self, ranges: Ranges) -> None:
        for f, o, n in ranges:
            start, span = _page_span(o, n, inner=True)
            if span:
                self._maps[f].madvise(mmap.MADV_DONTNEED, start, span)
                os.posix_fadvise(self._files[f].fileno(), start, span, os.POSIX_FADV_DONTNEED)

    def close(self) -> None:
        self._arrays.clear()
        for m in self._maps:
            try:
                m.close()
            except BufferError:  # views still alive; the map goes when they do
                pass
        for f in self._files:
            f.close()


def direct_spans(ranges: Ranges) -> list[tuple[int, int, int, int, int]]:
    """Where each range lands in a pread slot: (file, aligned offset, aligned length, slot position,
    bytes to skip before the range's first byte). Aligned to DIRECT_ALIGN for O_DIRECT."""
    out, pos = [], 0
    for f, o, n in ranges:
        start = o // DIRECT_ALIGN * DIRECT_ALIGN
        span = -(-(o + n - start) // DIRECT_ALIGN) * DIRECT_ALIGN
        out.append((f, start, span, pos, o - start))
        pos += span
    return out


def slot_need(ranges: Ranges) -> int:
    """Bytes of slot one expert slice needs in the pread engine."""
    return sum(span for _, _, span, _, _ in direct_spans(ranges))


def slot_plan(needs: list[int], budget: int | None, least: int) -> dict[int, int]:
    """How many pread slots of each size: one size per distinct slot need (`needs`: every expert
    slice's), the budget split between the sizes in proportion to their experts' bytes, at least
    `least` slots of each (or all its slices). One size for all would give a Q4_K_M file's
    experts with a Q4_K ffn_down slots sized for its Q6_K ones: 13 % of their room unused."""
    counts = Counter(needs)
    if budget is None:
        return dict(counts)
    total = sum(size * n for size, n in counts.items())
    return {size: min(n, max(least, budget * n // total)) for size, n in counts.items()}


class SlotPool:
    """Slots of fixed sizes in one buffer of `size` bytes: where each begins, and the free ones of
    each size (slots: how many of each size in bytes, as slot_plan gives)."""

    def __init__(self, slots: dict[int, int]):
        self.base, self.free, end = [], {}, 0
        for size, n in sorted(slots.items()):
            self.free[size] = list(range(len(self.base), len(self.base) + n))
            self.base += range(end, end + size * n, size)
            end += size * n
        self.size = end

    def has_room(self, need: int) -> bool:
        return bool(self.free.get(need))

    def take(self, need: int) -> int:
        return self.free[need].pop()

    def give(self, slot: int, need: int) -> None:
        self.free[need].append(slot)


@dataclass
class SlotPlacement:
    """Where a pread-style engine put an expert: its slot, its ranges, the read filling it."""

    slot: int
    need: int
    ranges: Ranges
    pending: Future | None


class PreadEngine:
    name = "pread"
    sized_rooms = True

    def __init__(self, paths: list[Path], slots: dict[int, int], workers: int = 4):
        """slots: how many slots of each size in bytes (slot_plan); a slice goes in a slot of its
        slot_need."""
        self.direct = True
        self._paths = paths
        self._fds = []
        for p in paths:
            try:
                self._fds.append(os.open(p, os.O_RDONLY | os.O_DIRECT))
            except OSError:  # tmpfs and some others refuse O_DIRECT
                self.direct = False
                self._fds.append(os.open(p, os.O_RDONLY))
        self.pool = SlotPool(slots)
        # private, not mmap's default shared mapping: only private anonymous memory can be backed
        # by 2 MiB pages, which save the expert products a TLB miss every 4 KiB
        self._pool = mmap.mmap(-1, max(1, self.pool.size), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            self._pool.madvise(mmap.MADV_HUGEPAGE)
        self._memory = np.frombuffer(self._pool, np.uint8)
        self._memory[::PAGE] = 0  # first touch is slow on this kind of VM: pay it at load, not per token
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="swapmoe-read")

    def charge(self, ranges: Ranges) -> int:
        return slot_need(ranges)

    def has_room(self, nbytes: int) -> bool:
        return self.pool.has_room(nbytes)

    def start(self, ranges: Ranges, nbytes: int) -> SlotPlacement:
        """Take a slot and fill it with the ranges on a worker thread."""
        slot = self.pool.take(nbytes)
        return SlotPlacement(slot, nbytes, ranges, self._executor.submit(self._read, slot, ranges))

    def finish(self, placement: SlotPlacement) -> list[np.ndarray]:
        if placement.pending is not None:
            placement.pending.result()
            placement.pending = None
        return slot_views(self._memory, self.pool.base[placement.slot], placement.ranges)

    def release(self, placement: SlotPlacement) -> None:
        if placement.pending is not None:
            placement.pending.result()  # never reuse a slot a read is still filling
        self.pool.give(placement.slot, placement.need)

    def _read(self, slot: int, ranges: Ranges) -> None:
        base = self.pool.base[slot]
        for (f, start, span, pos, skip), (_, offset, length) in zip(direct_spans(ranges), ranges):
            view = memoryview(self._memory[base + pos : base + pos + span])
            done = 0
            while done < span:
                n = os.preadv(self._fds[f], [view[done:]], start + done)
                if n == 0:  # end of file: the aligned span may run past it, the range itself must not
                    break
                done += n
            if done < skip + length:  # else the kernels would read what the slot held before
                raise SwapmoeError(
                    f"{self._paths[f]}: ends at byte {start + done:,}, before the expert bytes "
                    f"{offset:,}..{offset + length:,} (file truncated while in use?)"
                )

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        for fd in self._fds:
            os.close(fd)


def slot_views(memory: np.ndarray, base: int, ranges: Ranges) -> list[np.ndarray]:
    """Views of the ranges as direct_spans lays them out in the slot that begins at `base`."""
    return [
        memory[base + pos + skip : base + pos + skip + n]
        for (_, _, _, pos, skip), (_, _, n) in zip(direct_spans(ranges), ranges)
    ]


ENGINE_NAMES = (MmapEngine.name, PreadEngine.name)  # --io's choices besides auto
