#!/usr/bin/env python3
"""Decode and prompt speed of swapmoe next to llama.cpp, on a model that fits in RAM.

    python tools/bench_decode.py [--size-gb 4] [--type Q4_K_M] [--llama-bin DIR] [--threads 2]

Writes a synthetic qwen3moe of the Qwen3-30B-A3B shape, scaled to --size-gb (a file made
once and kept in --dir), reads it once so it is cached, then measures side by side in one
run: swapmoe (prompt of --prompt tokens, then --decode greedy tokens, streaming off) and,
when a llama.cpp build is given or found, `llama-bench` on the same file with the same
thread count. Prints tok/s for both and the ratios.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def swapmoe_speed(path: Path, n_prompt: int, n_decode: int, threads: int, rounds: int) -> tuple[float, float]:
    import swapmoe

    model = swapmoe.load(path, threads=threads, expert_streaming=False)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, model.net.n_vocab, n_prompt).tolist()
    list(model.generate_ids(prompt[:8], max_tokens=2, ignore_eos=True))  # compile and warm up
    best_pp = best_tg = 0.0
    for _ in range(rounds):
        list(model.generate_ids(prompt, max_tokens=n_decode, ignore_eos=True))
        s = model.stats
        best_pp = max(best_pp, s["prompt_tokens"] / s["prompt_seconds"])
        best_tg = max(best_tg, s["decode_tokens"] / s["decode_seconds"])
    return best_pp, best_tg


def llama_speed(llama_bin: Path, path: Path, n_prompt: int, n_decode: int, threads: int, rounds: int,
                extra: list[str]) -> tuple[float, float]:
    cmd = [str(llama_bin / "llama-bench"), "-m", str(path), "-p", str(n_prompt), "-n", str(n_decode),
           "-t", str(threads), "-r", str(rounds), "-o", "json", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    results = json.loads(out)
    pp = next(r["avg_ts"] for r in results if r["n_prompt"] > 0)
    tg = next(r["avg_ts"] for r in results if r["n_gen"] > 0)
    return pp, tg


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gb", type=float, default=4.0)
    ap.add_argument("--type", default="Q4_K_M")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/swapmoe-bench"))
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    default_bin = os.environ.get("SWAPMOE_LLAMA_BIN", str(Path.home() / ".cache/swapmoe-ref/llama-build/bin"))
    ap.add_argument("--llama-bin", type=Path, default=Path(default_bin))
    ap.add_argument("--llama-args", default="", help="extra llama-bench arguments")
    args = ap.parse_args()
    import swapmoe

    args.dir.mkdir(parents=True, exist_ok=True)
    path = args.dir / f"qwen3-30b-a3b-{args.size_gb:g}gb-{args.type}.gguf"
    if not path.exists():
        swapmoe.synth(path, preset="qwen3-30b-a3b", type=args.type, size_gb=args.size_gb)
    with open(path, "rb") as f:  # cache the file: this benchmark is about compute, not disk
        while f.read(64 << 20):
            pass
    start = time.perf_counter()
    pp, tg = swapmoe_speed(path, args.prompt, args.decode, args.threads, args.rounds)
    print(f"model   {path.name} ({path.stat().st_size / 1e9:.2f} GB), {args.threads} threads, "
          f"prompt {args.prompt} tokens, decode {args.decode} tokens, best of {args.rounds}")
    print(f"swapmoe   prompt {pp:8.1f} tok/s   decode {tg:7.2f} tok/s   ({time.perf_counter() - start:.0f} s)")
    if (args.llama_bin / "llama-bench").exists():
        lpp, ltg = llama_speed(args.llama_bin, path, args.prompt, args.decode, args.threads, args.rounds,
                               args.llama_args.split())
        print(f"llama.cpp prompt {lpp:8.1f} tok/s   decode {ltg:7.2f} tok/s   ({args.llama_bin})")
        print(f"ratio     prompt {pp / lpp:8.2f}         decode {tg / ltg:7.2f}         (targets 0.3 and 0.5)")
    else:
        print(f"llama.cpp not found at {args.llama_bin}; no ratio", file=sys.stderr)


if __name__ == "__main__":
    main()
