#!/usr/bin/env python3
"""Run a command under a RAM cap that counts the page cache it brings in.

    python tools/memcap.py MiB COMMAND [ARGS...]

The command runs in a fresh child of this process's memory cgroup (v1 or v2) with the
limit set; afterwards one line on stderr gives the limit, peak usage and OOM kills, and
the exit status is the command's. Needs root (or a delegated cgroup v2 subtree).
"""

import sys

from swapmoe.errors import SwapmoeError
from swapmoe.memcap import run_capped


def main():
    if len(sys.argv) < 3 or not sys.argv[1].isdigit():
        sys.exit(__doc__)
    mib = int(sys.argv[1])
    try:
        result = run_capped(sys.argv[2:], mib << 20)
    except SwapmoeError as e:
        sys.exit(f"memcap: {e}")
    print(
        f"memcap: limit {mib} MiB, peak {result.peak / 2**20:.0f} MiB, oom_kill {result.oom_kills}, "
        f"exit {result.returncode}, {result.seconds:.1f} s",
        file=sys.stderr,
    )
    sys.exit(result.returncode if result.returncode >= 0 else 128 - result.returncode)


if __name__ == "__main__":
    main()
