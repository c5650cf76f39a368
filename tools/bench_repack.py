#!/usr/bin/env python3
"""Repack throughput as a ratio to `cp` of the same file on the same disk, and repack's peak RSS.

    swapmoe synth /tmp/big.gguf --preset qwen3-30b-a3b --type Q4_K_M --size-gb 10
    python tools/bench_repack.py /tmp/big.gguf --rounds 2

Each round runs `cp IN OUT && sync OUT` and then `swapmoe repack IN OUT` (which fsyncs its
output too), each started cold: dirty pages are flushed and, when run as root, the page
cache is dropped (`echo 3 > /proc/sys/vm/drop_caches`) before every run. Without root the
runs are only flushed, and the report says so. Peak RSS is the child's ru_maxrss from
wait4. Outputs are deleted at the end.

--expert-reads N then compares layouts the way the runtime will use them: for the original
file (indexed in place), a compat repack and a bundled repack, it reads the same N random
(layer, expert) slices cold, one pread per range the index gives, with readahead off
(POSIX_FADV_RANDOM), and reports time, preads and bytes the kernel had to read (ranges
rounded out to 4 KiB pages).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path


def settle(drop: bool) -> None:
    os.sync()
    if drop:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")


def timed(cmd: list[str]) -> tuple[float, int, float]:
    """Wall seconds, peak RSS (bytes) and CPU seconds (user + system) of one command."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"failed: {' '.join(cmd)}")
    return seconds, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime


def expert_reads(path: Path, n: int, drop: bool) -> tuple[float, int, int]:
    """Seconds, preads and page-rounded bytes to read n random expert slices of `path` cold."""
    import random

    from swapmoe.repack.index import load

    index = load(path)
    rng = random.Random(0)
    picks = [(rng.choice(index.moe_layers()), rng.randrange(index.n_expert)) for _ in range(n)]
    ranges = [r for layer, expert in picks for r in index.slice(layer, expert)]
    fds = [os.open(p, os.O_RDONLY) for p in index.paths]
    try:
        for fd in fds:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        settle(drop)
        start = time.perf_counter()
        for r in ranges:
            os.pread(fds[r.file], r.length, r.offset)
        seconds = time.perf_counter() - start
    finally:
        for fd in fds:
            os.close(fd)
    pages = sum((r.offset + r.length + 4095) // 4096 - r.offset // 4096 for r in ranges)
    return seconds, len(ranges), pages * 4096


def compare_layouts(model: Path, workdir: Path, n: int, drop: bool) -> None:
    from swapmoe.repack.index import sidecar_path
    from swapmoe.repack.write import index_gguf, repack

    made = [sidecar_path(model)]
    try:
        index_gguf(model, digests=False)
        files = {"original": model}
        for layout in ("compat", "bundled"):
            files[layout] = repack(model, workdir / f"bench-{layout}.gguf", layout=layout, force=True)
            made += [files[layout], sidecar_path(files[layout])]
        print(f"{n} random expert slices, cold, readahead off:")
        for layout, path in files.items():
            seconds, reads, nbytes = expert_reads(path, n, drop)
            print(
                f"  {layout:8s} {seconds * 1000:8.1f} ms  {reads:6d} preads  {nbytes / 2**20:8.1f} MiB read  "
                f"{seconds / n * 1000:6.2f} ms/slice  file {path.stat().st_size / 1e9:.3f} GB"
            )
    finally:
        for p in made:
            p.unlink(missing_ok=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--workdir", type=Path, help="where outputs go (default: beside the model, same disk)")
    ap.add_argument("--layout", default="bundled", choices=["bundled", "compat"])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument(
        "--expert-reads",
        type=int,
        default=0,
        metavar="N",
        help="also compare random expert reads in the original, compat and bundled layouts",
    )
    ap.add_argument("--skip-copy", action="store_true", help="skip the cp/repack throughput rounds")
    args = ap.parse_args()
    workdir = args.workdir or args.model.parent
    size = args.model.stat().st_size
    drop = os.geteuid() == 0
    cp_out, rp_out = workdir / "bench-cp.gguf", workdir / "bench-repack.gguf"
    swapmoe = [sys.executable, "-m", "swapmoe.cli"]
    print(
        f"model {args.model} ({size / 1e9:.2f} GB), outputs in {workdir}, layout {args.layout}, "
        f"cores {os.cpu_count()}, load average {os.getloadavg()[0]:.2f} at start"
    )
    print(f"before each run: sync{' + drop_caches' if drop else ' (not root: page cache NOT dropped)'}")
    results = {"cp": [], "repack": []}
    try:
        for round_no in range(1, 0 if args.skip_copy else args.rounds + 1):
            for name, cmd in (
                ("cp", ["sh", "-c", f'cp "{args.model}" "{cp_out}" && sync "{cp_out}"']),
                ("repack", swapmoe + ["repack", str(args.model), str(rp_out), "--force", "--layout", args.layout]),
            ):
                cp_out.unlink(missing_ok=True)
                settle(drop)
                seconds, rss, cpu = timed(cmd)
                results[name].append((seconds, rss))
                print(
                    f"round {round_no} {name:6s} {seconds:7.2f} s  {size / seconds / 1e6:7.0f} MB/s  "
                    f"peak RSS {rss / 2**20:6.0f} MiB  CPU {cpu:6.1f} s  load {os.getloadavg()[0]:.1f}"
                )
    finally:
        for p in (cp_out, rp_out, rp_out.with_name(rp_out.name + ".swapidx")):
            p.unlink(missing_ok=True)
    if args.expert_reads:
        compare_layouts(args.model, workdir, args.expert_reads, drop)
    if args.skip_copy:
        return
    cp_s = sum(s for s, _ in results["cp"]) / len(results["cp"])
    rp_s = sum(s for s, _ in results["repack"]) / len(results["repack"])
    print(
        f"mean: cp {size / cp_s / 1e6:.0f} MB/s, repack {size / rp_s / 1e6:.0f} MB/s, "
        f"ratio repack/cp = {cp_s / rp_s:.2f}; "
        f"repack peak RSS {max(r for _, r in results['repack']) / 2**20:.0f} MiB; "
        f"load average {os.getloadavg()[0]:.2f} at end"
    )


if __name__ == "__main__":
    main()
