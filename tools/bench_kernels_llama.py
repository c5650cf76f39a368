"""Our matvec kernels side by side with llama.cpp's, per ggml type, in one run.

    python tools/bench_kernels_llama.py PATH/TO/test-backend-ops [--types Q4_K,IQ2_XXS] [--rounds 2]

llama.cpp's number comes from its own benchmark, `test-backend-ops perf -o MUL_MAT -b CPU`, on
its matvec case m=4096, n=1, k=14336 (weights 4096 x 14336 of the type, one f32 activation
column): time per run includes quantizing the activation, as ours (kernels.matvec) does.
test-backend-ops runs the CPU backend on half the hardware threads, so ours runs on as many
numba threads.  Both read weights of the same size (random valid blocks); for each type the two
alternate --rounds times and the best of each is kept.  Prints GB/s of weight bytes and
ours / llama.cpp.

test-backend-ops is not part of llama.cpp's default build: configure the llama.cpp source with
-DLLAMA_BUILD_TESTS=ON and build the target test-backend-ops (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

import numba
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

from swapmoe.runtime import kernels as K

from bench_kernels import random_weights  # tools/ is on the path of a script run from it

ROWS, COLS = 4096, 14336  # test-backend-ops' matvec case: m = 4096, k = 14336


def ggml_name(tp: T) -> str:
    """The type's name as ggml prints it (q4_K, iq2_xxs, mxfp4, f16)."""
    name = tp.name.lower()
    return name[:-1] + "K" if name.endswith("_k") else name


def llama_rate(binary: str, tp: T) -> float:
    """llama.cpp's matvec throughput for `tp` in weight bytes/s."""
    case = rf"type_a={ggml_name(tp)},type_b=f32,m={ROWS},n=1,k={COLS},bs=\[1,1\],"
    run = subprocess.run(
        [binary, "perf", "-o", "MUL_MAT", "-b", "CPU", "-p", case], capture_output=True, text=True, timeout=600
    )
    found = re.search(r"([0-9.]+) us/run", run.stdout)
    if run.returncode != 0 or not found:
        sys.exit(f"{binary}: no MUL_MAT timing for {ggml_name(tp)}:\n{run.stdout[-2000:]}{run.stderr[-2000:]}")
    return weight_bytes(tp) / (float(found.group(1)) * 1e-6)


def weight_bytes(tp: T) -> int:
    block, size = GGML_QUANT_SIZES[tp]
    return ROWS * COLS // block * size


def our_rate(tp: T, W: np.ndarray, x: np.ndarray, reps: int = 10) -> float:
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        K.matvec(tp, W, ROWS, COLS, x)
        best = min(best, time.perf_counter() - t)
    return W.size / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("test_backend_ops", help="path to llama.cpp's test-backend-ops binary")
    ap.add_argument("--types", default=",".join(T(t).name for t in K.KERNELS))
    ap.add_argument("--rounds", type=int, default=2, help="alternations per type (best of each side kept)")
    args = ap.parse_args()
    if not os.access(args.test_backend_ops, os.X_OK):
        sys.exit(f"{args.test_backend_ops}: not an executable")
    threads = max(1, (os.cpu_count() or 2) // 2)  # what test-backend-ops gives its CPU backend
    numba.set_num_threads(threads)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(COLS).astype(np.float32)
    print(f"matvec {ROWS} x {COLS}, {threads} thread(s) each; weight GB/s, best of {args.rounds} alternations")
    print(f"{'type':8s} {'swapmoe':>8s} {'llama.cpp':>9s} {'ratio':>6s}")
    for name in args.types.split(","):
        tp = T[name]
        W = random_weights(tp, ROWS * COLS, rng)
        K.matvec(tp, W, ROWS, COLS, x)  # compile or load the kernels first
        ours = theirs = 0.0
        for _ in range(args.rounds):
            ours = max(ours, our_rate(tp, W, x))
            theirs = max(theirs, llama_rate(args.test_backend_ops, tp))
        print(f"{name:8s} {ours / 1e9:8.2f} {theirs / 1e9:9.2f} {ours / theirs:6.2f}", flush=True)
        del W


if __name__ == "__main__":
    main()
