"""Memory the process may use, and running a command under a memory cap that counts the page cache.

A memory cgroup charges a process for its own memory *and* for the page cache its reads
bring in, which is what "runs in 16 GB" has to mean for a model streamed from disk. Both
cgroup v1 (`memory.limit_in_bytes`) and v2 (`memory.max`) are handled; the process's own
cgroup is found in /proc/self/cgroup.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from swapmoe.errors import SwapmoeError

CGROUP_ROOT = Path("/sys/fs/cgroup")
UNLIMITED = 1 << 62  # cgroup v1 reports "no limit" as a huge number


@dataclass(frozen=True)
class Cgroup:
    path: Path
    version: int  # 1 or 2

    @property
    def limit_file(self) -> Path:
        return self.path / ("memory.limit_in_bytes" if self.version == 1 else "memory.max")

    def limit(self) -> int | None:
        try:
            text = self.limit_file.read_text().strip()
        except OSError:
            return None
        if text == "max" or int(text) >= UNLIMITED:
            return None
        return int(text)

    def peak(self) -> int:
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        try:
            return int((self.path / name).read_text())
        except (OSError, ValueError):  # memory.peak needs Linux 5.19
            return -1

    def oom_kills(self) -> int:
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        for line in (self.path / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0


def own_cgroup() -> Cgroup | None:
    """The memory cgroup this process is in, if any."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if "memory" in controllers.split(","):
            return Cgroup(CGROUP_ROOT / "memory" / rel.lstrip("/"), 1)
    for line in lines:
        if line.startswith("0::"):
            return Cgroup(CGROUP_ROOT / line[3:].lstrip("/"), 2)
    return None


def available_memory() -> tuple[int, str]:
    """Bytes this process may use and where that number comes from: the tightest memory
    cgroup limit on the way up from its own cgroup, or MemAvailable if that is smaller."""
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    best, source = int(meminfo["MemAvailable"].split()[0]) * 1024, "MemAvailable"
    cg = own_cgroup()
    while cg is not None and CGROUP_ROOT in cg.path.parents:
        limit = cg.limit()
        if limit is not None and limit < best:
            best, source = limit, f"memory cgroup limit of {cg.path}"
        cg = Cgroup(cg.path.parent, cg.version)
    return best, source


@dataclass(frozen=True)
class CappedRun:
    returncode: int
    limit: int
    peak: int
    oom_kills: int
    seconds: float


def run_capped(cmd: list[str], limit_bytes: int, **popen) -> CappedRun:
    """Run `cmd` in a new child cgroup capped at `limit_bytes` (process memory + page cache).

    Needs permission to create cgroups (root, or a delegated v2 subtree)."""
    parent = own_cgroup()
    if parent is None:
        raise SwapmoeError("no memory cgroup found in /proc/self/cgroup; cannot cap memory here")
    child = Cgroup(parent.path / f"swapmoe-cap-{os.getpid()}-{time.monotonic_ns()}", parent.version)
    try:
        child.path.mkdir()
        child.limit_file.write_text(str(limit_bytes))
        if child.version == 1:
            (child.path / "memory.swappiness").write_text("0")
        else:
            (child.path / "memory.swap.max").write_text("0")
    except OSError as e:
        raise SwapmoeError(f"cannot create a memory cgroup under {parent.path} ({e.strerror}); run as root") from None
    start = time.perf_counter()
    try:

        def enter_cgroup():
            (child.path / "cgroup.procs").write_text(str(os.getpid()))

        proc = subprocess.Popen(cmd, preexec_fn=enter_cgroup, **popen)
        try:
            returncode = proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            proc.wait()
            raise
        return CappedRun(returncode, limit_bytes, child.peak(), child.oom_kills(), time.perf_counter() - start)
    finally:
        for _ in range(50):  # the cgroup can only go once its last process has exited
            try:
                child.path.rmdir()
                break
            except OSError:
                time.sleep(0.1)
