"""Writing big output files safely: temp file beside the target, fsync, rename.

A crash, a full disk or Ctrl-C leaves the target untouched and no temp file behind.
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path
from typing import Iterator

from swapmoe.errors import SwapmoeError


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
        raise SwapmoeError(f"{out}: not enough free space in {out.parent}: need {needed / 1e9:.2f} GB, "
                           f"have {free / 1e9:.2f} GB")


@contextlib.contextmanager
def atomic_output(out: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path next to `out`; on success fsync it and rename it onto `out`."""
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, out)
        dir_fd = os.open(out.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise SwapmoeError(f"{out}: disk full while writing; nothing was written") from None
        raise SwapmoeError(f"{out}: write failed ({e.strerror or e}); nothing was written") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
