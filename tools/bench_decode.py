#!/usr/bin/env python3
"""Decode and prompt speed of swapmoe next to llama.cpp, on a model that fits in RAM.

    python tools/bench_decode.py [--preset qwen3-30b-a3b] [--size-gb 4] [--type Q4_K_M] [--llama-bin DIR]

Writes a synthetic model of a real shape (--preset, default Qwen3-30B-A3B), scaled to --size-gb
(a file made once and kept in --dir), reads it once so it is cached, then measures side by side in one
run: rounds alternate between swapmoe (prompt of --prompt tokens, then --decode greedy
tokens, streaming off) and, when a llama.cpp build is given or found, one `llama-bench`
round on the same file with the same thread count (its prompt from an empty context, its
decode after --prompt tokens of context, `-d`, as swapmoe's; a long --prompt measures decode
at that context length).  Each llama-bench run allocates and frees
its own copy of the weights (it repacks them); on a VM that hands freed RAM back to its host
that costs the next few seconds, so the next swapmoe round waits --settle seconds (measured
here: swapmoe decode 24-33 tok/s right after a 4 GB allocation was freed, 40-47 five seconds
later).  Prints tok/s of every round, each
round's ratio, and the median ratio (the machine may be shared and noisy: a pair of
neighbouring rounds sees about the same noise). For a model with gated DeltaNet layers it also
prints the share of swapmoe's decode time spent in them (the whole mixer: projections, gates,
convolution and recurrence) and in the recurrence alone (convolution, L2 norms, delta rule).
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def swapmoe_rounds(path: Path, n_prompt: int, n_decode: int, threads: int):
    """Load the model once and warm it up; each next() runs one round and gives (prompt, decode) tok/s
    and the shares of the decode time spent in DeltaNet layers and in their recurrence (0 for a
    model without them)."""
    import swapmoe

    model = swapmoe.load(path, threads=threads, expert_streaming=False)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, model.net.n_vocab, n_prompt).tolist()
    deltanet_seconds = _time_decode_deltanet(model.net)
    list(model.generate_ids(prompt[:8], max_tokens=2, ignore_eos=True))  # compile and warm up
    while True:
        deltanet_seconds[:] = [0.0, 0.0]
        list(model.generate_ids(prompt, max_tokens=n_decode, ignore_eos=True))
        s = model.stats
        shares = [seconds / s.decode_seconds for seconds in deltanet_seconds]
        yield s.prompt_tokens / s.prompt_seconds, s.decode_tokens / s.decode_seconds, shares


def _time_decode_deltanet(net) -> list[float]:
    """Wrap the network's DeltaNet mixer (if it has one) to add up its time on single tokens:
    [the whole mixer, its recurrence alone (convolution, L2 norms, delta rule)]."""
    totals = [0.0, 0.0]
    if not hasattr(net, "delta_net"):
        return totals
    from swapmoe.runtime.models import qwen35moe

    decoding = [False]

    def timed(function, slot):
        def call(*args):
            start = time.perf_counter()
            out = function(*args)
            if decoding[0]:
                totals[slot] += time.perf_counter() - start
            return out

        return call

    for name in ("causal_conv", "gated_delta_rule", "_l2_norm"):
        setattr(qwen35moe, name, timed(getattr(qwen35moe, name), 1))
    mixer = timed(net.delta_net, 0)

    def delta_net(d, x, state):
        decoding[0] = len(x) == 1
        return mixer(d, x, state)

    net.delta_net = delta_net
    return totals


def llama_speed(
    llama_bin: Path, path: Path, n_prompt: int, n_decode: int, threads: int, extra: list[str]
) -> tuple[float, float]:
    """One llama-bench round on the same file: (prompt, decode) tok/s, the prompt from an empty
    context and the decode after n_prompt tokens of context (`-d`), as swapmoe's round runs."""
    cmd = [
        str(llama_bin / "llama-bench"),
        "-m",
        str(path),
        "-p",
        str(n_prompt),
        "-n",
        str(n_decode),
        "-d",
        f"0,{n_prompt}",
        "-t",
        str(threads),
        "-r",
        "1",
        "-o",
        "json",
        *extra,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    results = json.loads(out)
    pp = next(r["avg_ts"] for r in results if r["n_prompt"] > 0 and r["n_depth"] == 0)
    tg = next(r["avg_ts"] for r in results if r["n_gen"] > 0 and r["n_depth"] == n_prompt)
    return pp, tg


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="qwen3-30b-a3b", help="a real-shape preset of swapmoe synth")
    ap.add_argument("--size-gb", type=float, default=4.0)
    ap.add_argument("--type", default="Q4_K_M")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/swapmoe-bench"))
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    default_bin = os.environ.get("SWAPMOE_LLAMA_BIN", str(Path.home() / ".cache/swapmoe-ref/llama-build/bin"))
    ap.add_argument("--llama-bin", type=Path, default=Path(default_bin))
    ap.add_argument("--llama-args", default="", help="extra llama-bench arguments")
    ap.add_argument("--settle", type=float, default=10.0, help="seconds to wait after each llama-bench run")
    args = ap.parse_args()
    import swapmoe

    args.dir.mkdir(parents=True, exist_ok=True)
    path = args.dir / f"{args.preset}-{args.size_gb:g}gb-{args.type}.gguf"
    if not path.exists():
        swapmoe.synth(path, preset=args.preset, type=args.type, size_gb=args.size_gb)
    with open(path, "rb") as f:  # cache the file: this benchmark is about compute, not disk
        while f.read(64 << 20):
            pass
    rounds = swapmoe_rounds(path, args.prompt, args.decode, args.threads)
    have_llama = (args.llama_bin / "llama-bench").exists()
    print(
        f"model   {path.name} ({path.stat().st_size / 1e9:.2f} GB), {args.threads} threads, "
        f"prompt {args.prompt} tokens, decode {args.decode} tokens; rounds alternate swapmoe and llama.cpp"
    )
    ratios = []
    for r in range(args.rounds):
        pp, tg, (mixer_share, recurrence_share) = next(rounds)
        line = f"round {r + 1}  swapmoe prompt {pp:7.1f} decode {tg:6.2f} tok/s"
        if mixer_share:
            line += f" (DeltaNet layers {mixer_share:.0%} of decode, their recurrence {recurrence_share:.0%})"
        if have_llama:
            lpp, ltg = llama_speed(
                args.llama_bin, path, args.prompt, args.decode, args.threads, args.llama_args.split()
            )
            ratios.append((pp / lpp, tg / ltg))
            time.sleep(args.settle)
            line += f"   llama.cpp prompt {lpp:7.1f} decode {ltg:6.2f} tok/s   ratio {pp / lpp:.2f} {tg / ltg:.2f}"
        print(line, flush=True)
    if ratios:
        rp, rt = np.median(np.array(ratios), axis=0)
        print(f"median ratio  prompt {rp:.2f}  decode {rt:.2f}   (llama.cpp: {args.llama_bin})")
    else:
        print(f"llama.cpp not found at {args.llama_bin}; no ratio", file=sys.stderr)


if __name__ == "__main__":
    main()
