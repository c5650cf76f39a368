#!/usr/bin/env python3
"""`swapmoe serve` on a model streamed under a RAM cap: the aggregate decode speed of 1, 2 and 4
concurrent clients side by side in one run, or (--turns) a chat's second-turn prompt time with
and without the kept caches.

    python tools/bench_serve.py                       # 12-layer Qwen3-30B-A3B shape, 1.5 GiB cap
    python tools/bench_serve.py --clients 1 4 --rounds 3 --cap-mib 2048
    python tools/bench_serve.py --turns --preset qwen3.5-35b-a3b --cap-mib 2048 --prompt 1024

The model is a synthetic file of --preset's shape with --layers layers at --type (made in --dir
if it is not there yet), repacked. One server runs inside a cgroup capped at --cap-mib (page
cache included; needs root), started after the page cache was dropped, with --parallel the
largest client count. After one warm-up request, each round sends, for each client count N, N
streaming completions at once (distinct random prompts of --prompt tokens, --decode tokens each,
sampled at temperature 1 with a seed per client, ignore_eos), and reads the server's /metrics
before and after: decode tok/s = tokens generated / seconds spent in decoding steps (prompts
excluded; several clients share a step), and the wall-clock tok/s of the whole round (prompts
included). Printed per client count: the median over rounds of each, and the ratio to one
client's.

--turns: per round, a first turn (--prompt random tokens as text, --decode tokens), then its
second turn (the first prompt + the reply + a new line) twice: once where the server kept the
first turn's caches, once with a different first character (nothing shared). Printed: the prompt
seconds of each (the server's /metrics) and the cached tokens the server reported.
"""

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics(base: str) -> dict[str, float]:
    with urllib.request.urlopen(base + "/metrics") as r:
        return {
            line.split()[0].removeprefix("swapmoe:"): float(line.split()[1])
            for line in r.read().decode().splitlines()
            if line.startswith("swapmoe:")
        }


def complete(base: str, prompt: list[int], tokens: int, seed: int, detokenize) -> int:
    """One streaming completion; the number of tokens it reported."""
    body = {
        "prompt": detokenize(prompt),
        "max_tokens": tokens,
        "stream": True,
        "temperature": 1.0,
        "top_k": 0,
        "top_p": 1.0,
        "min_p": 0.0,
        "seed": seed,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    request = urllib.request.Request(
        base + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    used = 0
    with urllib.request.urlopen(request, timeout=3600) as r:
        for line in r:
            if line.startswith(b"data: {"):
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise RuntimeError(chunk["error"]["message"])
                if chunk.get("usage"):
                    used = chunk["usage"]["completion_tokens"]
    return used


def round_of(base: str, prompts: list[list[int]], tokens: int, seed: int, detokenize) -> dict:
    before, start = metrics(base), time.perf_counter()
    counts = [0] * len(prompts)

    def client(i: int) -> None:
        counts[i] = complete(base, prompts[i], tokens, seed + i, detokenize)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    after = metrics(base)
    decoded = after["tokens_predicted_total"] - before["tokens_predicted_total"]
    seconds = after["tokens_predicted_seconds_total"] - before["tokens_predicted_seconds_total"]
    steps = after["decode_steps_total"] - before["decode_steps_total"]
    read = after["expert_bytes_read_total"] - before["expert_bytes_read_total"]
    return {
        "tokens": sum(counts),
        "decode": decoded / seconds,
        "wall": sum(counts) / wall,
        "steps": steps,
        "gb_per_step": read / 1e9 / max(steps, 1),
    }


def completion(base: str, text: str, tokens: int) -> dict:
    body = {"prompt": text, "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
    request = urllib.request.Request(
        base + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=3600) as r:
        return json.loads(r.read())


def second_turns(base: str, first: str, tokens: int) -> dict:
    """A first turn, then its second turn with and without the kept caches: prompt seconds of each."""
    reply = completion(base, first, tokens)["choices"][0]["text"]
    second = first + reply + "\nAnd then?"
    out = {}
    for name, text in (("kept", second), ("fresh", "#" + second)):
        before = metrics(base)
        usage = completion(base, text, 1)["usage"]
        out[name] = (
            metrics(base)["prompt_seconds_total"] - before["prompt_seconds_total"],
            usage["prompt_tokens_details"]["cached_tokens"],
            usage["prompt_tokens"],
        )
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="qwen3-30b-a3b", help="shape of the synthetic model (swapmoe synth --preset)")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--type", default="Q4_K_M")
    ap.add_argument("--cap-mib", type=int, default=1536)
    ap.add_argument("--clients", type=int, nargs="*", default=[1, 2, 4])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/swapmoe-bench"))
    ap.add_argument("--options", default="{}", help="JSON of swapmoe.load options for the server")
    ap.add_argument("--turns", action="store_true", help="second-turn prompt time with and without kept caches")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    import bench_stream
    import swapmoe
    from swapmoe.memcap import run_capped
    from swapmoe.runtime.tokenizer import Tokenizer
    from swapmoe.synthetic.presets import routing_note, routing_tag

    args.dir.mkdir(parents=True, exist_ok=True)
    original = args.dir / f"{args.preset}-{args.layers}L{routing_tag(args.preset)}-{args.type}.gguf"
    packed = original.with_suffix(".repacked.gguf")
    if not original.exists():
        swapmoe.synth(original, preset=args.preset, type=args.type, n_layer=args.layers)
    if not packed.exists():
        swapmoe.repack(original, packed)
    tokenizer = Tokenizer.from_gguf(swapmoe.open_gguf(packed))
    parallel = 1 if args.turns else max(args.clients)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    pid_file = args.dir / "bench_serve.pid"
    code = (
        "import json, os, sys, swapmoe; open(sys.argv[6], 'w').write(str(os.getpid())); "
        "swapmoe.serve(sys.argv[1], port=int(sys.argv[2]), parallel=int(sys.argv[3]), ctx=int(sys.argv[4]), "
        "**json.loads(sys.argv[5]))"
    )
    cmd = [
        sys.executable,
        "-c",
        code,
        str(packed),
        str(port),
        str(parallel),
        str(args.prompt * 3 + args.decode + 64),
        args.options,
        str(pid_file),
    ]
    bench_stream.drop_caches()
    log = open(args.dir / "bench_serve.log", "w")
    done = {}
    server = threading.Thread(
        target=lambda: done.update(result=run_capped(cmd, args.cap_mib << 20, stdout=log, stderr=subprocess.STDOUT))
    )
    server.start()
    try:
        for _ in range(1200):
            try:
                with urllib.request.urlopen(base + "/health") as r:
                    if r.status == 200:
                        break
            except OSError:
                if not server.is_alive():
                    raise SystemExit(f"the server exited; see {log.name}")
                time.sleep(0.5)
        disk = bench_stream.disk_bandwidth(packed)
        print(
            f"model {packed.name}: {packed.stat().st_size / 1e9:.2f} GB, cap {args.cap_mib} MiB, "
            f"--parallel {parallel}, prompt {args.prompt}, decode {args.decode} per client; "
            f"disk sequential read {disk:.2f} GB/s"
        )
        print(routing_note(args.preset))
        rng = np.random.default_rng(0)
        n_vocab = tokenizer.n_vocab

        def detokenize(ids):
            return tokenizer.decode(ids)

        def prompts(n):
            return [rng.integers(0, n_vocab, args.prompt).tolist() for _ in range(n)]

        round_of(base, prompts(1), 8, 0, detokenize)  # warm-up: compile, first reads
        if args.turns:
            rows = [second_turns(base, detokenize(prompts(1)[0]), args.decode) for _ in range(args.rounds)]
            print(
                f"{'second turn':>12} {'prompt s':>9} {'cached':>7} {'of tokens':>9}   "
                f"(medians of {args.rounds} rounds)"
            )
            for name in ("kept", "fresh"):
                print(
                    f"{name:>12} {statistics.median(r[name][0] for r in rows):>9.2f} "
                    f"{statistics.median(r[name][1] for r in rows):>7.0f} "
                    f"{statistics.median(r[name][2] for r in rows):>9.0f}"
                )
            return
        results = {n: [] for n in args.clients}
        for r in range(args.rounds):
            for n in args.clients:
                results[n].append(round_of(base, prompts(n), args.decode, 100 * r, detokenize))
        one = statistics.median(x["decode"] for x in results[args.clients[0]])
        print(
            f"{'clients':>7} {'decode tok/s':>12} {'x first':>7} {'wall tok/s':>10} {'steps':>6} "
            f"{'GB read/step':>12}   (medians of {args.rounds} rounds)"
        )
        for n, rows in results.items():
            decode = statistics.median(x["decode"] for x in rows)
            print(
                f"{n:>7} {decode:>12.2f} {decode / one:>7.2f} {statistics.median(x['wall'] for x in rows):>10.2f} "
                f"{statistics.median(x['steps'] for x in rows):>6.0f} "
                f"{statistics.median(x['gb_per_step'] for x in rows):>12.3f}"
            )
    finally:
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGINT)
            pid_file.unlink()
        server.join(60)
    if "result" in done:
        print(f"server peak {done['result'].peak / 2**20:.0f} MiB, OOM kills {done['result'].oom_kills}")


if __name__ == "__main__":
    main()
