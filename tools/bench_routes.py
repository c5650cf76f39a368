"""Where each type's matmul should switch from the straight route to the decoded one.

    python tools/bench_routes.py [--types Q4_K,IQ2_XXS] [--rows 768 --cols 2048] [--threads 2]

The K- and IQ-quant kernels (and F16/BF16) have two routes for T tokens per row: straight
(every token's block sums taken from the row bytes, decoding them again per token) and decoded
(the row decoded once into int16 values times their sub-block scale, then one plain dot per
token).  kernels.KERNELS[type].straight_tokens picks straight up to that many tokens.  This
times both routes, forced, on stacked-expert matrices (Qwen3-30B-A3B's gate/up shape by
default) for a range of token counts, each call on the next of --pool-mib of experts so that its
weights come from memory as a prompt's experts do (with one matrix kept in cache the decoded
route looked 10-30 % faster at few tokens than it is in the runtime), in 4 KiB pages like the
runtime's file mappings; the two routes alternate so that both see the same machine noise.
Prints microseconds per call, decoded/straight, and the largest measured token count up to
which straight was at least 5 % faster (a suggestion for straight_tokens, next to the current
value; KERNELS takes the smaller of two runs).  Both routes give the same bits
(tests/test_kernels.py), so the choice is speed alone.
"""

from __future__ import annotations

import argparse
import itertools
import mmap

import numba
import numpy as np
from gguf import GGMLQuantizationType as T

from swapmoe.runtime import kernels as K

from bench_kernels import best_time, random_weights

TOKENS = (2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)


def expert_pool(one: np.ndarray, size: int) -> list[np.ndarray]:
    """Copies of one expert's bytes filling `size` bytes of 4 KiB pages, as the runtime's file
    mappings have (numpy's own large arrays get 2 MiB pages here, and fewer TLB misses)."""
    n = max(1, size // one.nbytes)
    memory = mmap.mmap(-1, n * one.nbytes)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):  # Linux
        memory.madvise(mmap.MADV_NOHUGEPAGE)
    pool = np.frombuffer(memory, np.uint8).reshape(n, one.nbytes)
    pool[:] = one
    return list(pool)


def route_timer(tp: T, experts: list[np.ndarray], rows: int, cols: int, n_tok: int, rng):
    """A function timing calls of tp's matmul on n_tok stacked-expert tokens, route forced, each
    call on the next expert matrix (best of `reps` calls)."""
    qx = K.quantize_activation(tp, rng.standard_normal((n_tok, cols)).astype(np.float32))
    turn = itertools.count()

    def call(straight: bool) -> None:
        K.matmul_q(tp, experts[next(turn) % len(experts)], rows, cols, qx, stacked=True, straight=straight)

    def timed(straight: bool, reps: int) -> float:
        return best_time(lambda: call(straight), reps)[0]

    return timed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    two_routes = [T(t).name for t, k in K.KERNELS.items() if k.straight_tokens]
    ap.add_argument("--types", default=",".join(two_routes))
    ap.add_argument("--rows", type=int, default=768)
    ap.add_argument("--cols", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument(
        "--pool-mib", type=int, default=1024, help="expert weights cycled through (MiB): more than the last-level cache"
    )
    ap.add_argument("--rounds", type=int, default=3, help="alternating timings per route (best of 3 calls each)")
    args = ap.parse_args()
    numba.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    tokens = [int(t) for t in args.tokens.split(",")]
    print(
        f"{args.rows} x {args.cols} stacked experts ({args.pool_mib} MiB of them), {args.threads} threads; "
        f"µs per call straight / decoded (decoded ÷ straight)"
    )
    for name in args.types.split(","):
        tp = T[name]
        experts = expert_pool(random_weights(tp, args.rows * args.cols, rng), args.pool_mib << 20)
        cells, suggestion, behind = [], 0, False
        for n_tok in tokens:
            timed = route_timer(tp, experts, args.rows, args.cols, n_tok, rng)
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
