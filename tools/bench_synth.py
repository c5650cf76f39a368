#!/usr/bin/env python3
"""How fast `swapmoe synth` writes a big model, next to `cp` and `dd` on the same disk.

    python tools/bench_synth.py [--size-gb 10] [--dir /tmp/swapmoe-bench]

Runs, side by side in one process, each as a child whose peak RSS is recorded:
  synth  swapmoe synth (qwen3-30b-a3b shape, Q4_K_M) of about --size-gb, fsync included;
  cp     cp of a file of the same size, then sync (cold page cache when run as root);
  dd     dd from /dev/zero of the same size with conv=fsync: the disk's plain write speed.
The three alternate for --rounds rounds (the machine is shared and noisy); each figure is
the median over rounds. Prints GB/s for each, synth's ratio to cp and to dd, and synth's
peak RSS.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def drop_caches():
    """Start every run with a cold page cache, when we may (root)."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def timed(cmd):
    """Wall seconds and peak RSS (MB) of a child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"failed: {' '.join(map(str, cmd))}")
    return seconds, usage.ru_maxrss / 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gb", type=float, default=10.0)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/swapmoe-bench"))
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    model, copy, zeros = args.dir / "synth.gguf", args.dir / "copy.gguf", args.dir / "zeros.bin"
    times = {"synth": [], "cp": [], "dd": []}
    rss = []
    try:
        for _ in range(args.rounds):
            cold = drop_caches()
            seconds, peak = timed(
                [
                    sys.executable,
                    "-m",
                    "swapmoe.cli",
                    "synth",
                    model,
                    "--preset",
                    "qwen3-30b-a3b",
                    "--type",
                    "Q4_K_M",
                    "--size-gb",
                    str(args.size_gb),
                    "--force",
                ]
            )
            times["synth"].append(seconds)
            rss.append(peak)
            size = model.stat().st_size
            drop_caches()
            times["cp"].append(timed(["sh", "-c", f"cp '{model}' '{copy}' && sync"])[0])
            copy.unlink()
            drop_caches()
            times["dd"].append(
                timed(
                    ["dd", "if=/dev/zero", f"of={zeros}", "bs=16M", f"count={size >> 24}", "conv=fsync", "status=none"]
                )[0]
            )
            zeros.unlink()
    finally:
        for p in (model, copy, zeros):
            p.unlink(missing_ok=True)
    t_synth, t_cp, t_dd = (statistics.median(times[k]) for k in ("synth", "cp", "dd"))
    rss = max(rss)
    gb = size / 1e9
    print(
        f"file size            {gb:.2f} GB, {args.rounds} rounds, medians "
        f"(page cache dropped before each run: {'yes' if cold else 'no, not root'})"
    )
    print(f"swapmoe synth        {gb / t_synth:6.2f} GB/s  ({t_synth:.1f} s), peak RSS {rss:.0f} MB")
    print(f"cp + sync            {gb / t_cp:6.2f} GB/s  ({t_cp:.1f} s)")
    print(f"dd /dev/zero fsync   {gb / t_dd:6.2f} GB/s  ({t_dd:.1f} s)")
    print(f"synth / cp           {t_cp / t_synth:6.2f}   (target >= 0.8)")
    print(f"synth / dd           {t_dd / t_synth:6.2f}")


if __name__ == "__main__":
    main()
