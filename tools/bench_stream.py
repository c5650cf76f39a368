#!/usr/bin/env python3
"""A model larger than the RAM it may use: decode speed of every streaming configuration,
and of llama.cpp, each under the same memory cgroup cap, each starting with a cold file.

    python tools/bench_stream.py --quick            # 12 layers (~4.5 GB) under 1.5 GiB
    python tools/bench_stream.py                    # 48 layers (~17 GB) under 6 GiB
    python tools/bench_stream.py --configs default pread mmap --llama-bin DIR
    python tools/bench_stream.py --quick --cached --configs default streaming-off streaming-off default
    python tools/bench_stream.py --quick --preset deepseek-v3 --experts 64 --size-gb 8 --cap-mib 3072
    python tools/bench_stream.py --preset deepseek-v4-flash --type IQ1_M --layers 6 --cap-mib 2560 \
        --configs default no-hash-prefetch

The model is a synthetic qwen3moe of the Qwen3-30B-A3B shape at Q4_K_M (or --preset at
--type, its layer count scaled to --size-gb), repacked with `swapmoe repack` (both kept in
--dir and reused). A short uncapped run first compiles and caches the kernels. Each
configuration runs in a child process inside a cgroup capped at
--cap-mib (page cache included; needs root), after the page cache was dropped: a
--prompt-token prompt, then --decode sampled tokens. Printed per configuration: decode and
prompt tok/s, GB read from storage per token, the expert read bandwidth over the run as a
share of the disk's sequential read bandwidth (measured right before and right after that
configuration and averaged: a shared disk's speed drifts), that disk bandwidth, the share of
the run spent waiting for reads, peak memory of the cgroup, and OOM kills; the run's bound
(unless --no-bound): MIN's bytes read while decoding (the configuration's routing trace replayed
at its budget by tools/replay_trace.py), the decode tok/s of max(the compute-only time of the
same tokens with every expert in RAM, without a cap; MIN's bytes at the disk's sequential
speed), the configuration's share of it, and whether it decoded the same tokens as the in-RAM
run (every lossless configuration must; fixation need not); for models with
hash-routed layers, how many of those layers' expert requests while decoding found the expert
resident or already in flight. A compute-only run comes before the first configuration and
after each one, and a configuration's compute time is the faster of the two beside it: a shared
machine's speed drifts over minutes, so the bound is measured in the same minutes as the run it
bounds (both speeds are printed under the configuration's row, and beside them the median time
between decoded tokens of the three runs: the steady pace, which a few tokens' stall of a shared
machine does not move, and the faster in-RAM median as a share of this one). Decoding samples
(temperature 1, seed 0) so that the routing keeps moving. llama.cpp runs on the original file with --no-repack (its CPU
repacking copies weights into anonymous memory, which a cap kills), greedy.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

CONFIGS = {
    "default": {},
    "mmap": {"io": "mmap"},
    "pread": {"io": "pread"},
    "keep-recent-16": {"expert_keep_recent": 16},
    "fixation-4": {"expert_fixation": 4},
    "prefetch-previous": {"expert_prefetch": "previous"},
    "prefetch-lookahead": {"expert_prefetch": "lookahead"},
    "mmap+lookahead": {"io": "mmap", "expert_prefetch": "lookahead"},
    "pread+lookahead": {"io": "pread", "expert_prefetch": "lookahead"},
    "pread+lookahead+fixation-4": {"io": "pread", "expert_prefetch": "lookahead", "expert_fixation": 4},
    "streaming-off": {"expert_streaming": False},
    # hash-routed layers (DeepSeek-V4) read only when asked, not as soon as the token is known
    "no-hash-prefetch": {"expert_hash_prefetch": False},
    # a cache far smaller than the model's working set: decoding waits on the disk
    "pread-cache-256": {"io": "pread", "expert_cache_size": 256},
    "mmap-cache-256": {"io": "mmap", "expert_cache_size": 256},
}


def child(args) -> None:
    """Runs inside the cap: load, prompt, decode, print one JSON line of measurements."""
    import swapmoe

    options = json.loads(args.options)
    start = time.perf_counter()
    model = swapmoe.load(args.model, ctx=args.prompt + args.decode + 8, **options)
    load_seconds = time.perf_counter() - start
    prompt = np.random.default_rng(0).integers(0, model.net.n_vocab, args.prompt).tolist()
    # sampled, not greedy: a random network's greedy output soon repeats one token, whose experts
    # then never miss; sampling keeps the routing moving as real text does
    ids, token_times = [], []  # perf_counter when each token came out: steady-state speed (bench_seed.py)
    for token in model.generate_ids(
        prompt, max_tokens=args.decode, ignore_eos=True, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0
    ):
        ids.append(token)
        token_times.append(time.perf_counter())
    s = model.stats.as_dict()
    s.update(
        load_seconds=load_seconds,
        plan=model.plan.reasons,
        engine=model.plan.engine,
        budget=model.plan.budget_bytes,
        tokens=ids,
        token_times=token_times,
        hash_layers=model.index.hash_layers(),
    )
    print("RESULT " + json.dumps(s))


def drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def disk_bandwidth(path: Path, nbytes: int = 2 << 30) -> float:
    """Sequential read GB/s of `path` with 16 MiB O_DIRECT reads (no page cache involved)."""
    import mmap

    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, 16 << 20)
    done, start = 0, time.perf_counter()
    try:
        while done < nbytes:
            n = os.preadv(fd, [buf], done)
            if n <= 0:
                break
            done += n
    finally:
        os.close(fd)
    return done / (time.perf_counter() - start) / 1e9


def capped(cmd: list[str], cap_mib: int):
    from swapmoe.memcap import run_capped

    out_path = Path(f"/tmp/swapmoe-bench-child-{os.getpid()}.txt")
    with open(out_path, "w") as out:
        result = run_capped(cmd, cap_mib << 20, stdout=out, stderr=subprocess.STDOUT)
    text = out_path.read_text(errors="replace")  # a random model may print invalid UTF-8
    out_path.unlink()
    return result, text


def run_swapmoe(model: Path, options: dict, args) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        str(model),
        "--options",
        json.dumps(options),
        "--prompt",
        str(args.prompt),
        "--decode",
        str(args.decode),
    ]
    if args.cached:  # no cap, file in the page cache: what the streaming machinery itself costs
        with open(model, "rb") as f:
            while f.read(64 << 20):
                pass
        proc = subprocess.run(cmd, capture_output=True, text=True)
        text, row = proc.stdout + proc.stderr, {"peak": 0, "oom": 0, "rc": proc.returncode}
    else:
        drop_caches()
        result, text = capped(cmd, args.cap_mib)
        row = {"peak": result.peak, "oom": result.oom_kills, "rc": result.returncode}
    found = re.search(r"^RESULT (.*)$", text, re.M)
    if found:
        row.update(json.loads(found.group(1)))
    else:
        row["error"] = text.strip().splitlines()[-1] if text.strip() else f"exit {result.returncode}"
    return row


def bound_of(trace: Path, row: dict, compute: dict, disk_gbps: float) -> tuple[int, float]:
    """The run's physical limit: MIN's bytes read while decoding (its routing trace replayed at
    its budget, tools/replay_trace.py) and the decode tok/s of max(compute time, those bytes at
    the disk's sequential speed)."""
    import replay_trace

    recorded = replay_trace.read_trace(trace)
    setup = replay_trace.setup(recorded, io=row["engine"])
    budget = row["budget"] if row["budget"] is not None else sum(setup.sizes.values())
    result = replay_trace.replay(recorded, setup, budget, "min")
    min_bytes = result.decode_bytes if result.decode_bytes is not None else row["bytes_read"]
    seconds = max(compute["decode_seconds"], min_bytes / (disk_gbps * 1e9))
    return min_bytes, row["decode_tokens"] / seconds


def run_compute_only(model: Path, args) -> dict | None:
    """The same tokens with every expert in RAM, no cap, the file cached: compute alone (None,
    and the reason printed, if it failed)."""
    row = run_swapmoe(model, {"expert_streaming": False}, argparse.Namespace(**{**vars(args), "cached": True}))
    if "error" in row:
        print(f"compute-only run failed: {row['error']}; no bound")
        return None
    return row


def decode_speed(row: dict) -> float:
    return row["decode_tokens"] / row["decode_seconds"]


def median_token_ms(row: dict) -> float:
    """The median time between decoded tokens: the steady pace, which a stall of the shared
    machine during a few tokens does not move."""
    return float(np.median(np.diff(row["token_times"]))) * 1e3


def run_llama(llama_bin: Path, model: Path, args) -> dict:
    drop_caches()
    prompt = " ".join(["hello"] * args.prompt)
    cmd = [
        str(llama_bin / "llama-completion"),
        "-m",
        str(model),
        "-p",
        prompt,
        "-n",
        str(args.decode),
        "-t",
        "2",
        "--temp",
        "0",
        "-no-cnv",
        "--no-repack",
        "--ignore-eos",
        "-c",
        str(args.prompt * 2 + args.decode),
    ]
    result, text = capped(cmd, args.cap_mib)
    row = {"peak": result.peak, "oom": result.oom_kills, "rc": result.returncode}
    decode = re.search(r"eval time =\s*([\d.]+) ms /\s*(\d+) runs.*?([\d.]+) tokens per second", text)
    prompt_eval = re.search(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens.*?([\d.]+) tokens per second", text)
    if decode and prompt_eval and result.returncode == 0:
        row.update(decode_tps=float(decode.group(3)), prompt_tps=float(prompt_eval.group(3)))
    else:
        row["error"] = f"exit {result.returncode}"
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--options", default="{}", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="12 layers under 1.5 GiB instead of 48 under 6 GiB")
    ap.add_argument("--preset", default="qwen3-30b-a3b", help="shape of the synthetic model (swapmoe synth --preset)")
    ap.add_argument("--type", default="Q4_K_M", help="its weight type or mix")
    ap.add_argument("--layers", type=int, help="layer count (qwen3-30b-a3b default: 12 with --quick, else 48)")
    ap.add_argument(
        "--size-gb",
        type=float,
        help="scale the layer count to this size instead (other presets: 4.5 with --quick, else 17)",
    )
    ap.add_argument("--experts", type=int, help="override the preset's expert count (to fit big presets)")
    ap.add_argument("--cap-mib", type=int)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/swapmoe-bench"))
    ap.add_argument("--configs", nargs="*", default=[c for c in CONFIGS if c != "streaming-off" and "256" not in c])
    ap.add_argument(
        "--no-bound",
        action="store_true",
        help="skip the compute-only run and the MIN replay that give each configuration's bound",
    )
    ap.add_argument(
        "--cached",
        action="store_true",
        help="no cap and a warm page cache: compare e.g. --configs default streaming-off",
    )
    default_bin = os.environ.get("SWAPMOE_LLAMA_BIN", str(Path.home() / ".cache/swapmoe-ref/llama-build/bin"))
    ap.add_argument("--llama-bin", type=Path, default=Path(default_bin))
    ap.add_argument("--no-llama", action="store_true", help="leave llama.cpp out (minutes per run on big files)")
    args = ap.parse_args()
    if args.child:
        args.model = args.child
        return child(args)
    import swapmoe
    from swapmoe.synthetic.presets import routing_note, routing_tag

    args.cap_mib = args.cap_mib or (1536 if args.quick else 6144)
    args.dir.mkdir(parents=True, exist_ok=True)
    overrides = {"n_expert": args.experts} if args.experts else {}
    if args.layers or (args.preset == "qwen3-30b-a3b" and not args.size_gb):
        overrides["n_layer"] = args.layers or (12 if args.quick else 48)
        size_gb, shape = None, f"{overrides['n_layer']}L"
    else:
        size_gb = args.size_gb or (4.5 if args.quick else 17.0)
        shape = f"{size_gb:g}gb"
    shape += f"-{args.experts}E" if args.experts else ""
    shape += routing_tag(args.preset)
    original = args.dir / f"{args.preset}-{shape}-{args.type}.gguf"
    packed = args.dir / f"{args.preset}-{shape}-{args.type}.repacked.gguf"
    if not original.exists():
        swapmoe.synth(original, preset=args.preset, type=args.type, size_gb=size_gb, **overrides)
    if not packed.exists():
        swapmoe.repack(original, packed)
    disk_before = disk_bandwidth(packed)
    size = packed.stat().st_size
    print(
        f"model {packed.name}: {size / 1e9:.2f} GB, "
        f"{'no cap, file cached' if args.cached else f'cap {args.cap_mib} MiB'}, prompt {args.prompt}, "
        f"decode {args.decode}; disk sequential read {disk_before:.2f} GB/s (O_DIRECT, 16 MiB reads)"
    )
    print(routing_note(args.preset))
    # kernels compiled and cached first, so that no measured run compiles them in its decode
    # (on a cold numba cache that took the compute-only bound from 40 to 5 tok/s)
    run_swapmoe(packed, {"expert_cache_size": 256}, argparse.Namespace(**{**vars(args), "decode": 2, "cached": True}))
    compute_before = None
    if not args.cached and not args.no_bound:
        compute_before = run_compute_only(packed, args)
    print(
        f"{'configuration':30} {'decode tok/s':>12} {'prompt tok/s':>12} {'GB read/tok':>11} {'read BW/disk':>12} "
        f"{'disk GB/s':>9} {'I/O wait':>8} {'peak MiB':>9} {'OOM':>4}"
        + (f" {'MIN GB':>7} {'bound tok/s':>11} {'of bound':>8} {'= in RAM':>8}" if compute_before else "")
    )
    rows = {}
    for name in args.configs:
        trace = args.dir / f"trace-{name}.jsonl"
        row = run_swapmoe(packed, {**CONFIGS[name], "trace": str(trace)}, args)
        disk_after = disk_bandwidth(packed)
        row["disk_gbps"] = disk = (disk_before + disk_after) / 2
        disk_before = disk_after
        rows[name] = row
        compute = None
        if compute_before:  # the bound from the compute-only runs just before and just after this one
            compute_after = run_compute_only(packed, args)
            if compute_after:
                neighbours = (compute_before, compute_after)
                compute = max(neighbours, key=decode_speed)
            compute_before = compute_after
        if "error" in row:
            print(f"{name:30} failed: {row['error']}  (peak {row['peak'] / 2**20:.0f} MiB, OOM {row['oom']})")
            continue
        tg = decode_speed(row)
        pp = row["prompt_tokens"] / row["prompt_seconds"]
        per_token = row["storage_read_bytes"] / max(1, row["prompt_tokens"] + row["decode_tokens"])
        seconds = row["prompt_seconds"] + row["decode_seconds"]
        bandwidth = row["bytes_read"] / seconds / 1e9
        bound = ""
        if compute:
            row["min_decode_bytes"], row["bound_tps"] = bound_of(trace, row, compute, disk)
            same = "yes" if row["tokens"] == compute["tokens"] else "NO"
            bound = (
                f" {row['min_decode_bytes'] / 1e9:7.2f} {row['bound_tps']:11.2f} {tg / row['bound_tps']:8.2f} {same:>8}"
            )
        print(
            f"{name:30} {tg:12.2f} {pp:12.1f} {per_token / 1e9:11.3f} {bandwidth / disk:12.2f} {disk:9.2f} "
            f"{row['wait_seconds'] / seconds:8.0%} {row['peak'] / 2**20:9.0f} {row['oom']:4d}" + bound
        )
        if compute:
            row["compute_tps"] = [decode_speed(r) for r in neighbours]
            row["median_token_ms"] = median_token_ms(row)
            row["compute_median_token_ms"] = [median_token_ms(r) for r in neighbours]
            print(
                f"{'':30} compute only (in RAM) just before and after: "
                + " and ".join(f"{v:.2f}" for v in row["compute_tps"])
                + " tok/s decode",
                flush=True,
            )
            share = min(row["compute_median_token_ms"]) / row["median_token_ms"]
            print(
                f"{'':30} median token {row['median_token_ms']:.1f} ms, in RAM "
                + " and ".join(f"{v:.1f}" for v in row["compute_median_token_ms"])
                + f" ms: {share:.2f} of the faster",
                flush=True,
            )
        if row["hash_layers"]:
            print(
                f"{'':30} hash-routed layers while decoding, resident or in flight when asked: "
                + ", ".join(
                    f"layer {layer} {row['decode_layers'][str(layer)][0]}/{row['decode_layers'][str(layer)][1]}"
                    for layer in row["hash_layers"]
                    if str(layer) in row["decode_layers"]
                )
            )
    if (args.llama_bin / "llama-completion").exists() and not args.cached and not args.no_llama:
        row = run_llama(args.llama_bin, original, args)
        rows["llama.cpp"] = row
        if "error" in row:
            print(
                f"{'llama.cpp --no-repack':30} failed: {row['error']} (peak {row['peak'] / 2**20:.0f} MiB, "
                f"OOM {row['oom']})"
            )
        else:
            print(
                f"{'llama.cpp --no-repack':30} {row['decode_tps']:12.2f} {row['prompt_tps']:12.1f} {'':>11} "
                f"{'':>12} {'':>9} {'':>8} {row['peak'] / 2**20:9.0f} {row['oom']:4d}"
            )
            if "default" in rows and "error" not in rows["default"]:
                d = rows["default"]
                ratio = decode_speed(d) / row["decode_tps"]
                print(f"swapmoe default / llama.cpp decode: {ratio:.2f} (target >= 5)")
    (args.dir / "bench_stream.json").write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
