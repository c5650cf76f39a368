"""Writing big output files safely: temp file beside the target, fsync, rename.

A crash, a full disk or Ctrl-C leaves the target untouched and no temp file behind.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import threading
from pathlib import Path
from typing import Iterator

from swapmoe.errors import SwapmoeError

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def check_output_path(out: Path, force: bool, inputs: tuple[Path, ...] = ()) -> None:
    """Refuse to overwrite an input or (without force) an existing file."""
    for src in inputs:
        if out.exists() and src.exists() and os.path.samefile(out, src):
            raise SwapmoeError(f"{out}: output is the same file as the input; choose another path")
    if out.exists() and not force:
        raise SwapmoeError(f"{out}: already exists (use --force to overwrite)")
    if not out.parent.exists():
        raise SwapmoeError(f"{out.parent}: output directory does not exist")


def check_free_space(out: Path, needed: int) -> None:
    free = shutil.disk_usage(out.parent).free
    if free < needed:
        raise SwapmoeError(
            f"{out}: not enough free space in {out.parent}: need {needed / 1e9:.2f} GB, have {free / 1e9:.2f} GB"
        )


@contextlib.contextmanager
def atomic_output(out: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path next to `out`; on success fsync it and rename it onto `out`."""
    with atomic_pair(out) as (tmp,):
        yield tmp


@contextlib.contextmanager
def atomic_pair(out: str | os.PathLike, companion: str | os.PathLike | None = None) -> Iterator[tuple[Path, ...]]:
    """Yield temp paths next to `out` (and `companion`, a file that describes it: a sidecar); on
    success fsync them and publish in an order that never pairs an old `out` with a new companion
    or leaves a companion without its `out`: the old companion is removed, then `out` renamed
    into place, then the companion. Ctrl-C, SIGTERM and SIGHUP wait until the steps are done; only
    a crash between them (SIGKILL, power loss) leaves `out` without a companion (old or new),
    which the runtime reports as such."""
    targets = [Path(out)] + ([Path(companion)] if companion is not None else [])
    tmps = [t.with_name(f".{t.name}.tmp-{os.getpid()}") for t in targets]
    try:
        yield tuple(tmps)
        for tmp in tmps:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        with _signals_held():
            if len(targets) > 1:
                with contextlib.suppress(FileNotFoundError):
                    targets[1].unlink()
            for tmp, target in zip(tmps, targets):
                os.replace(tmp, target)
        for directory in {t.parent for t in targets}:
            dir_fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise SwapmoeError(f"{out}: disk full while writing; nothing was written") from None
        raise SwapmoeError(f"{out}: write failed ({e.strerror or e}); nothing was written") from None
    finally:
        for tmp in tmps:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold Ctrl-C, SIGTERM and SIGHUP while files are put in place, then act on the first that
    came: a stop finds all of them published or none, never a file without its sidecar. Python
    runs signal handlers in the main thread only, so elsewhere there is nothing to hold."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {signum: signal.signal(signum, lambda signum, frame: caught.append(signum)) for signum in _STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if caught:
            handler = previous[caught[0]]
            if callable(handler):
                handler(caught[0], None)
            elif handler != signal.SIG_IGN:  # the default action (or one set outside Python): let it happen now
                os.kill(os.getpid(), caught[0])
