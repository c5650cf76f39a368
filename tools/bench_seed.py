#!/usr/bin/env python3
"""The table of the llama.cpp patch swapmoe grew from, measured on this machine: its four
models at their real shapes under the RAM a 16 GB machine leaves free (12 GiB), in its
configurations, next to llama.cpp under the same cap, in one run.

    python tools/bench_seed.py                                  # all four models
    python tools/bench_seed.py --models qwen3.5-35b-a3b --max-gb 25
    python tools/bench_seed.py --models minimax-m2 --configs default fixation-4 --no-llama

Each model is a synthetic file of its preset at the seed's weight type (routing shaped to the
preset's profile, docs/models.md), repacked. It is written at full size when both files fit in
--max-gb each and on the disk; otherwise with fewer layers, and the cap shrinks with them so
that each layer keeps the RAM it has at full size:

    cap = WORKING + fixed + (12 GiB - WORKING - fixed) x layers / full layers

(fixed: the bytes of the tensors outside the layers, such as embeddings and output; WORKING:
the interpreter and scratch, which do not shrink). Every configuration runs cold (page cache
dropped) in a cgroup capped there (page cache included; needs root): a --prompt-token prompt,
then --warm + --decode sampled tokens; the steady-state speed is that of the last --decode.
llama.cpp runs the original file with --no-repack under the same cap (its repacking copies
weights into anonymous memory, which a cap kills), greedy, --llama-decode tokens; its number is
its own eval speed over all of them. The disk's sequential read bandwidth (O_DIRECT)
is measured before each model, so readers can scale the numbers to their disk.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_stream  # noqa: E402  (tools/ is not a package)
from swapmoe.synthetic import _size_of  # noqa: E402
from swapmoe.synthetic.presets import PRESETS  # noqa: E402

GIB = 1 << 30
CAP = 12 * GIB  # what a 16 GB machine leaves free
WORKING = GIB // 2  # interpreter, numba, activations: not scaled with the layers

# preset, weight type, the seed's file (GB) and its decode tok/s on a 16 GB Core i7 + NVMe
SEED = {
    "qwen3.5-35b-a3b": ("Q4_K_M", 19.7, "7.01 (7.28 with fixation 2)"),
    "qwen3.5-122b-a10b": ("Q2_K", 42.6, "2.00"),
    "minimax-m2": ("IQ1_M", 60.7, "0.75"),
    "deepseek-v4-flash": ("IQ1_M", 80.9, "0.39 (0.55 with prefetch)"),
}
# the seed's configurations, as swapmoe.load options
CONFIGS = {
    "default": {},
    "prefetch": {"expert_prefetch": "both"},
    "keep-recent-12": {"expert_keep_recent": 12},
    "fixation-2": {"expert_fixation": 2},
    "fixation-4": {"expert_fixation": 4},
}
# layers a reduced file keeps at least, and the step its count moves in: the Qwen3.5 hybrids
# have an attention layer every 4th, DeepSeek-V4-Flash's first 3 layers are hash-routed
LAYER_STEP = {"qwen3.5-35b-a3b": 4, "qwen3.5-122b-a10b": 4, "deepseek-v4-flash": 1, "minimax-m2": 1}
MIN_LAYERS = {"qwen3.5-35b-a3b": 8, "qwen3.5-122b-a10b": 8, "deepseek-v4-flash": 6, "minimax-m2": 4}


def layers_for(preset: str, type_name: str, max_bytes: int) -> tuple[int, int]:
    """(layers, full layers): all of them if the file is at most max_bytes, else the most that fit."""
    config = PRESETS[preset]
    full = config.n_layer
    step = LAYER_STEP[preset]
    layers = full
    while layers > MIN_LAYERS[preset] and _size_of(replace(config, n_layer=layers), type_name) > max_bytes:
        layers -= step if layers % step == 0 else layers % step
    return max(layers, MIN_LAYERS[preset]), full


def fixed_bytes(path: Path) -> int:
    """Bytes of the tensors outside the layers (embeddings, output, their norms)."""
    from swapmoe.gguf_file import open_gguf

    return sum(t.nbytes for t in open_gguf(path).tensors.values() if t.layer is None)


def steady(row: dict, warm: int) -> float | None:
    times = row.get("token_times") or []
    if len(times) <= warm + 1:
        return None
    return (len(times) - 1 - warm) / (times[-1] - times[warm])


def bench_model(preset: str, args) -> None:
    import swapmoe
    from swapmoe.synthetic.presets import routing_note

    type_name, seed_gb, seed_tps = SEED[preset]
    layers, full = layers_for(preset, type_name, int(args.max_gb * 1e9))
    stem = f"{preset}-{layers}L-{type_name}"
    original, packed = args.dir / f"{stem}.gguf", args.dir / f"{stem}.repacked.gguf"
    if not original.exists():
        need = 2.1 * _size_of(replace(PRESETS[preset], n_layer=layers), type_name)
        if shutil.disk_usage(args.dir).free < need:
            print(f"\n## {preset}: skipped, {need / 1e9:.0f} GB of free disk needed in {args.dir}")
            return
        swapmoe.synth(original, preset=preset, type=type_name, n_layer=layers)
    if not packed.exists():
        swapmoe.repack(original, packed)
    fixed = fixed_bytes(packed)
    cap = CAP if layers == full else int(WORKING + fixed + (CAP - WORKING - fixed) * layers / full)
    disk = bench_stream.disk_bandwidth(packed)
    size = packed.stat().st_size
    print(
        f"\n## {preset} {type_name}: {layers} of {full} layers, {size / 1e9:.2f} GB (the seed's file: {seed_gb} GB,"
        f" {seed_tps} tok/s); cap {cap / GIB:.2f} GiB; disk {disk:.2f} GB/s"
    )
    print(routing_note(preset))
    run_args = argparse.Namespace(prompt=args.prompt, decode=args.warm + args.decode, cap_mib=cap >> 20, cached=False)
    # compile and cache the kernels outside the measured runs
    bench_stream.run_swapmoe(packed, {}, argparse.Namespace(**{**vars(run_args), "decode": 2}))
    print(
        f"{'configuration':26} {'steady tok/s':>12} {'all decode':>10} {'prompt tok/s':>12} {'GB read/tok':>11} "
        f"{'peak MiB':>9} {'OOM':>4}"
    )
    for name in args.configs:
        row = bench_stream.run_swapmoe(packed, CONFIGS[name], run_args)
        if "error" in row:
            print(f"{name:26} failed: {row['error']} (peak {row['peak'] >> 20} MiB, OOM {row['oom']})")
            continue
        rate = steady(row, args.warm)
        per_token = row["storage_read_bytes"] / max(1, row["prompt_tokens"] + row["decode_tokens"])
        print(
            f"{name:26} {rate or float('nan'):12.2f} {row['decode_tokens'] / row['decode_seconds']:10.2f} "
            f"{row['prompt_tokens'] / row['prompt_seconds']:12.1f} {per_token / 1e9:11.3f} "
            f"{row['peak'] >> 20:9d} {row['oom']:4d}",
            flush=True,
        )
    if not args.no_llama and (args.llama_bin / "llama-completion").exists():
        row = bench_stream.run_llama(
            args.llama_bin,
            original,
            argparse.Namespace(prompt=args.prompt, decode=args.llama_decode, cap_mib=cap >> 20),
        )
        label = "llama.cpp --no-repack"
        if "error" in row:
            print(f"{label:26} failed: {row['error']} (peak {row['peak'] >> 20} MiB, OOM {row['oom']})")
        else:
            print(
                f"{label:26} {'':>12} {row['decode_tps']:10.2f} {row['prompt_tps']:12.1f} {'':>11} "
                f"{row['peak'] >> 20:9d} {row['oom']:4d}"
            )
    if not args.keep:
        original.unlink()
        packed.unlink()
        Path(str(packed) + ".swapidx").unlink(missing_ok=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=list(SEED), choices=list(SEED))
    ap.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--max-gb", type=float, default=12.0, help="largest file to write (default 12 GB)")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--warm", type=int, default=32, help="decode tokens before the steady state (default 32)")
    ap.add_argument("--decode", type=int, default=32, help="steady-state decode tokens measured (default 32)")
    ap.add_argument("--llama-decode", type=int, default=16)
    ap.add_argument("--llama-bin", type=Path, default=Path.home() / ".cache/swapmoe-ref/llama-build/bin")
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/swapmoe-seed"))
    ap.add_argument("--keep", action="store_true", help="keep the files (default: removed after each model)")
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    for preset in args.models:
        bench_model(preset, args)


if __name__ == "__main__":
    main()
