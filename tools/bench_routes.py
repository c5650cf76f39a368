"""Where each type's matmul should switch from the straight route to the decoded one.

    python tools/bench_routes.py [--types Q4_K,IQ2_XXS] [--rows 768 --cols 2048] [--threads 2]

The K- and IQ-quant kernels (and F16/BF16) have two routes for T tokens per row: straight
(every token's block sums taken from the row bytes, decoding them again per token) and decoded
(the row decoded once into int16 values times their sub-block scale, then one plain dot per
token).  kernels.KERNELS[type].straight_tokens picks straight up to that many tokens.  This
times both routes, forced, on the same stacked-expert matrix (Qwen3-30B-A3B's gate/up shape by
default) for a range of token counts, the two routes alternating so that both see the same
machine noise, and prints microseconds per call, decoded/straight, and the largest measured
token count up to which straight was at least 5 % faster (a suggestion for straight_tokens,
next to the current value; KERNELS takes the smaller of two runs).  Both routes give the same bits (tests/test_kernels.py), so the choice is
speed alone.
"""
from __future__ import annotations

import argparse

import numba
import numpy as np
from gguf import GGMLQuantizationType as T

from bench_kernels import best_time, random_weights
from swapmoe.runtime import kernels as K

TOKENS = (2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)


def route_timer(tp: T, W: np.ndarray, rows: int, cols: int, n_tok: int, rng):
    """A function timing one call of tp's kernel on n_tok stacked-expert tokens, route forced."""
    qx = K.quantize_activation(tp, rng.standard_normal((n_tok, cols)).astype(np.float32))
    out = np.empty((n_tok, rows), np.float32)
    order = K.ggml_order(tp, rows, cols, n_tok, False, True)
    kernel = K.KERNELS[int(tp)].matmul

    def timed(straight: bool, reps: int) -> float:
        return best_time(lambda: kernel(W, rows, rows, cols, qx.qs, qx.d, qx.extra, out, order, straight), reps)[0]
    return timed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    two_routes = [T(t).name for t, k in K.KERNELS.items() if k.straight_tokens]
    ap.add_argument("--types", default=",".join(two_routes))
    ap.add_argument("--rows", type=int, default=768)
    ap.add_argument("--cols", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--rounds", type=int, default=3, help="alternating timings per route (best of 3 calls each)")
    args = ap.parse_args()
    numba.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    tokens = [int(t) for t in args.tokens.split(",")]
    print(f"{args.rows} x {args.cols} stacked expert, {args.threads} threads; µs per call straight / decoded "
          f"(decoded ÷ straight)")
    for name in args.types.split(","):
        tp = T[name]
        W = random_weights(tp, args.rows * args.cols, rng)
        W.setflags(write=False)  # as kernels.matmul_q passes weights: one numba specialization
        cells, suggestion, behind = [], 0, False
        for n_tok in tokens:
            timed = route_timer(tp, W, args.rows, args.cols, n_tok, rng)
            timed(True, 1), timed(False, 1)  # compile, warm the caches
            straight = decoded = float("inf")
            for _ in range(args.rounds):
                straight = min(straight, timed(True, 3))
                decoded = min(decoded, timed(False, 3))
            cells.append(f"{n_tok}: {straight * 1e6:.0f}/{decoded * 1e6:.0f} ({decoded / straight:.2f})")
            behind = behind or decoded < 1.05 * straight
            suggestion = suggestion if behind else n_tok
        current = K.KERNELS[int(tp)].straight_tokens
        print(f"{name:8s} " + "  ".join(cells))
        print(f"{'':8s} straight >= 5 % faster up to {suggestion} tokens (straight_tokens now {current})", flush=True)


if __name__ == "__main__":
    main()
