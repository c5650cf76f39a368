"""Progress of a long byte-copying job (repack, unpack, verify, index, synth) on stderr.

On a terminal, a tqdm bar redrawn in place. Anywhere else (a log file, a pipe, CI) a redrawn bar
would leave hundreds of `\\r` updates behind, so the job writes one plain line at most every
LOG_INTERVAL seconds instead, and nothing at all if it ends sooner.
"""

from __future__ import annotations

import sys
import threading
from time import monotonic
from typing import Protocol

from tqdm import tqdm

LOG_INTERVAL = 10.0  # seconds between two plain progress lines


class Progress(Protocol):
    def update(self, n: int) -> object: ...

    def close(self) -> None: ...

    def __enter__(self) -> Progress: ...

    def __exit__(self, *exc) -> object: ...


def progress_bar(total: int, desc: str, enabled: bool = True) -> Progress:
    """Progress of `total` bytes named `desc`; nothing is written if not enabled."""
    if enabled and not sys.stderr.isatty():
        return LogLines(total, desc, LOG_INTERVAL)
    return tqdm(total=total, unit="B", unit_scale=True, desc=desc, disable=not enabled, mininterval=0.5, smoothing=0.1)


class LogLines:
    """Progress for a log: `swapmoe: DESC: 1.20 of 4.50 GB (27%), 310 MB/s`, at most once every
    `interval` seconds; thread-safe, as tqdm is."""

    def __init__(self, total: int, desc: str, interval: float):
        self.total, self.desc, self.interval = total, desc, interval
        self.done = 0
        self.started = self.last = monotonic()
        self.lock = threading.Lock()

    def update(self, n: int) -> None:
        with self.lock:
            self.done += n
            now = monotonic()
            if now - self.last < self.interval:
                return
            self.last = now
            rate = self.done / max(now - self.started, 1e-9)
            share = f" ({self.done / self.total:.0%})" if self.total else ""
            done = f"{self.done / 1e9:.2f} of {self.total / 1e9:.2f} GB{share}"
            print(f"swapmoe: {self.desc}: {done}, {rate / 1e6:.0f} MB/s", file=sys.stderr, flush=True)

    def close(self) -> None:
        pass

    def __enter__(self) -> LogLines:
        return self

    def __exit__(self, *exc) -> None:
        pass
