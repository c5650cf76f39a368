"""Benchmark the quantized kernels against this machine's memory bandwidth.

    python tools/bench_kernels.py [--threads 2] [--mib 256] [--types Q4_K,Q8_0]
    python tools/bench_kernels.py --threads 1 --mib 1 --inner 10   # compute ceiling, L2-resident

Prints, per ggml type: numba compile time of its kernels in this process (≈ 0
when the on-disk cache is warm), matvec throughput in weight bytes/s on
--threads threads and its ratio to the memory read bandwidth measured first
(numpy's max over a 1 GiB buffer on the same number of threads, best of 3), and T=64 matmul
throughput (weight bytes/s per pass, each block read once for all 64 tokens).
"per CPU-s" divides the bytes by the process CPU time instead (a per-core
rate that stays meaningful when other jobs share the cores).
Weights are valid random blocks (swapmoe.synthetic.blocks.random_blocks: finite, normal-range
scales; raw random bytes put subnormal and NaN scales in the float path, which slows some
kernels several-fold and no real file has), a 4 MiB pool tiled to the size.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

from swapmoe.runtime import kernels as K
from swapmoe.synthetic.blocks import random_blocks

COLS = 4096


def random_weights(tp: T, n_values: int, rng: np.random.Generator) -> np.ndarray:
    """n_values weights of type tp as raw bytes: normal floats, or valid random blocks (a 4 MiB
    pool tiled to the size)."""
    if tp == T.F32:
        return rng.standard_normal(n_values, dtype=np.float32).view(np.uint8)
    if tp == T.F16:
        return rng.standard_normal(n_values).astype(np.float16).view(np.uint8)
    if tp == T.BF16:
        return (rng.standard_normal(n_values, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    block, size = GGML_QUANT_SIZES[tp]
    pool = random_blocks(tp, (4 << 20) // size, 0.02, rng).reshape(-1)
    return np.resize(pool, n_values // block * size)


def memory_bandwidth(threads: int) -> float:
    """Read bandwidth of `threads` threads, each taking numpy's max over its share of a 1 GiB
    uint64 buffer (best of 3).  max is cheap enough per byte to be memory bound on one core; a
    float32 sum is not (it reads ~20 GB/s on one core of this machine where max reads ~34)."""
    buf = np.ones(1 << 27, np.uint64)  # 1 GiB, touched once before timing
    parts = np.array_split(buf, threads)
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(np.max, parts))
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            list(pool.map(np.max, parts))
            best = min(best, time.perf_counter() - t)
    return buf.nbytes / best


def best_time(fn, reps: int, inner: int = 1) -> tuple[float, float]:
    """Best wall-clock time and best process CPU time (all threads) of one fn()
    call, each measured over `inner` back-to-back calls."""
    best_wall = best_cpu = float("inf")
    for _ in range(reps):
        w, c = time.perf_counter(), time.process_time()
        for _ in range(inner):
            fn()
        best_wall = min(best_wall, (time.perf_counter() - w) / inner)
        best_cpu = min(best_cpu, (time.process_time() - c) / inner)
    return best_wall, best_cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--mib",
        type=int,
        default=256,
        help="matvec weight size per type (MiB); 8x the 32 MiB L3 of an EPYC VM, where at 64 MiB part of "
        "the weights still came from cache (Q4_K, Q8_0, F16 read 1.2x the probe's bandwidth); on a "
        "Xeon VM reporting 480 MiB of L3, 1024 MiB read the same as 256",
    )
    ap.add_argument("--inner", type=int, default=1, help="calls per timing (use >1 for small --mib)")
    ap.add_argument("--types", default=",".join(T(t).name for t in K.KERNELS))
    args = ap.parse_args()
    numba.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    bw = memory_bandwidth(args.threads)
    print(
        f"memory read bandwidth (numpy max, {args.threads} threads): {bw / 1e9:.1f} GB/s; kernels on the same threads"
    )
    print(
        f"{'type':8s} {'compile s':>9s} {'matvec GB/s':>11s} {'x mem bw':>8s} {'per CPU-s':>9s} "
        f"{'matmul T=64 GB/s':>16s}"
    )
    total_compile = 0.0
    for name in args.types.split(","):
        tp = T[name]
        bs, ts = GGML_QUANT_SIZES[tp]
        row_bytes = COLS // bs * ts
        rows = max(8, (args.mib << 20) // row_bytes // 8 * 8)  # real tensors: rows % 8 == 0 (ggml repacks those)
        W = random_weights(tp, rows * COLS, rng)
        X = rng.standard_normal((64, COLS)).astype(np.float32)

        t = time.perf_counter()
        K.matvec(tp, W[: 8 * row_bytes], 8, COLS, X[0])
        K.dequantize_rows(tp, W[: 8 * row_bytes], 8, COLS, [0])
        compile_s = time.perf_counter() - t
        total_compile += compile_s

        qx = K.quantize_activation(tp, X[0])
        mv, mv_cpu = best_time(lambda: K.matvec_q(tp, W, rows, COLS, qx), 5, args.inner)
        mm_rows = max(16, rows // 8 // 16 * 16)  # as real tensors: a multiple of 16 (and so of 8)
        qX = K.quantize_activation(tp, X)
        mm, _ = best_time(lambda: K.matmul_q(tp, W, mm_rows, COLS, qX), 2)
        mv_bw = rows * row_bytes / mv
        print(
            f"{name:8s} {compile_s:9.1f} {mv_bw / 1e9:11.2f} {mv_bw / bw:8.2f} "
            f"{rows * row_bytes / mv_cpu / 1e9:9.2f} {mm_rows * row_bytes / mm / 1e9:16.3f}",
            flush=True,
        )
    print(f"total compile/load time: {total_compile:.1f} s")


if __name__ == "__main__":
    main()
