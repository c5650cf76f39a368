#!/usr/bin/env python3
"""Write the golden fixtures the parity tests compare against: llama.cpp's logits and greedy
tokens for small models of every architecture the runtime supports, in every weight type of
the acceptance (F32, and Q8_0, Q4_K_M, Q2_K, IQ2_XXS made by llama.cpp's own llama-quantize;
gpt-oss also MXFP4_MOE, its published form: experts MXFP4, the rest Q8_0).

    python tools/make_golden.py [--ref ~/.cache/swapmoe-ref] [--out tests/data/golden] [--arch A ...]
    python tools/make_golden.py --variants     # only the F32 layout variants (variants.json)

Needs the llama.cpp reference build (REF/llama-build-noamx/bin if present, else
REF/llama-build/bin; the AMX build crashes on some quantized types on machines without AMX)
and its Python bindings (REF/venv), pointed at that build's libraries. For each
architecture: a synthetic F32 model is written with swapmoe.synth (the tests regenerate it
from the settings each case records and check its sha256), quantized with llama-quantize (an importance matrix from
llama-imatrix for IQ2_XXS), and run through tools/llama_ref.py with an F32 KV cache, flash
attention off, 2 threads. Quantized files are stored zstd-compressed. The
embedded tiny model is run as shipped. manifest.json lists every case; --arch redoes only
those architectures and keeps the other cases.

variants.json lists F32 files of the layouts an architecture's default synthetic file does not
show (DeepSeek's legacy attn_kv_b, lite, YaRN, V2 gating, fused gate_up; gpt-oss sliding
windows short enough for the prompt); tests/test_archs.py regenerates each with swapmoe.synth
and the recorded overrides.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import zstandard

import swapmoe
from swapmoe.synthetic.presets import PRESETS

ARCHS = (
    "qwen3moe",
    "qwen2moe",
    "olmoe",
    "llama",
    "deepseek2",
    "deepseek4",
    "minimax-m2",
    "gpt-oss",
    "qwen35moe",
    "qwen3next",
    "laguna",
)
QUANTS = ("Q8_0", "Q4_K_M", "Q2_K", "IQ2_XXS")
EXTRA_QUANTS = {
    "gpt-oss": ("MXFP4_MOE",),
    "qwen35moe": ("IQ1_M", "MXFP4_MOE"),
    "qwen3next": ("IQ1_M", "MXFP4_MOE"),
    "deepseek4": ("IQ1_M", "MXFP4_MOE"),
    "laguna": ("IQ1_M",),
}
SYNTH = {"type": "F32", "seed": 7, "n_layer": 2}
ARCH_SYNTH = {
    "qwen35moe": {"n_layer": 4},
    "qwen3next": {"n_layer": 4},  # three DeltaNet layers, one attention
    "deepseek4": {"n_layer": 4},  # a hash-routed layer, then compress ratios 0, 4, 128
    "laguna": {"n_layer": 4},
}  # a dense layer, then MoE; full and 32-token-window layers alternate
# the prompt repeated: DeepSeek-V4's needs to cross its 64-token window, fill a 128-block and give
# the indexer more compressed rows than its top-k
ARCH_PROMPT_REPEATS = {"deepseek4": 3}
# llama-imatrix gathers nothing for DeepSeek-V4's stream-mixing matrices (hc_*_fn) and compressor
# position biases (*_ape, read by row), and for its grouped attn_output_a one row of statistics per
# group, which llama-quantize refuses; the IQ types need statistics, so those stay Q8_0 (as
# community quants keep them)
IQ_ARGS = {
    "deepseek4": [
        "--tensor-type",
        "hc_=q8_0",
        "--tensor-type",
        "_ape=q8_0",
        "--tensor-type",
        "attn_output_a=q8_0",
        "--exclude-weights",
        "attn_output_a",
    ]
}
_DS2 = {
    "q_lora_rank": 128,
    "kv_lora_rank": 64,
    "rope_dim": 32,
    "nope_dim": 32,
    "v_dim": 32,
    "groups": 4,
    "groups_used": 2,
}  # the tiny-deepseek2 preset's extra
_Q35 = {"ssm_state": 64, "ssm_groups": 2, "ssm_heads": 4}  # the tiny-qwen35moe and tiny-qwen3next presets' extra
_LAG = dict(PRESETS["tiny-laguna"].extra)
VARIANTS = {  # name: (arch, swapmoe.synth overrides on top of SYNTH)
    "deepseek2-legacy-kv-b": ("deepseek2", {"n_layer": 3, "extra": {**_DS2, "mla": False}}),
    "deepseek2-lite": ("deepseek2", {"n_layer": 3, "extra": {**_DS2, "q_lora_rank": 0}}),
    "deepseek2-yarn-v3": (
        "deepseek2",
        {"n_layer": 3, "extra": {**_DS2, "yarn": {"factor": 40, "original_context_length": 256, "log_mul": 1.0}}},
    ),
    "deepseek2-v2-lite-yarn": (
        "deepseek2",
        {
            "n_layer": 3,
            "extra": {
                **_DS2,
                "q_lora_rank": 0,
                "mla": False,
                "gating": 1,
                "weights_norm": False,
                "weights_scale": 16.0,
                "groups": 1,
                "groups_used": 1,
                "yarn": {"factor": 40, "original_context_length": 256, "log_mul": 0.707},
            },
        },
    ),
    "deepseek2-fused-gate-up": ("deepseek2", {"n_layer": 3, "fused_gate_up": True}),
    "gpt-oss-swa": ("gpt-oss", {"n_layer": 3, "extra": {"sliding_window": 16, "rope_base_swa": 10000.0}}),
    "qwen35moe-split-gate-up": ("qwen35moe", {"n_layer": 4, "fused_gate_up": False}),
    "qwen3next-fused-gate-up": ("qwen3next", {"n_layer": 4, "fused_gate_up": True}),
    "qwen3next-ssm-in": ("qwen3next", {"n_layer": 4, "extra": {**_Q35, "legacy_qkvz": True}}),
    "qwen35moe-mtp": ("qwen35moe", {"n_layer": 4, "extra": {**_Q35, "mtp": True}}),
    "laguna-gate-element": ("laguna", {"n_layer": 4, "extra": {**_LAG, "gate": "element"}}),
    "laguna-default-pattern": ("laguna", {"n_layer": 5, "extra": {**_LAG, "swa_pattern": None}}),
}
GREEDY = 32
PROMPT = '''import os
import sys


def main(argv=None):
    """Parse the arguments and run."""
    parser = argparse.ArgumentParser()
    for name in sorted(os.listdir(path)):
        print(name)
'''


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def run(cmd, **kw):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=ENV, **kw)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(map(str, cmd))}\n{proc.stderr[-2000:]}")
    return proc.stdout


def reference(ref: Path, model: Path, tokens: list[int], out: Path) -> None:
    run(
        [
            ref / "venv/bin/python",
            Path(__file__).with_name("llama_ref.py"),
            model,
            "--tokens",
            ",".join(map(str, tokens)),
            "--greedy",
            GREEDY,
            "--out",
            out,
        ]
    )


ENV = dict(os.environ)


def tokenize(ref: Path, model: Path, text: str = PROMPT) -> list[int]:
    return json.loads(
        run([ref / "venv/bin/python", Path(__file__).with_name("llama_ref.py"), model, "--tokenize", text])
    )


def write_variants(ref: Path, out: Path, tmp: Path) -> None:
    cases = []
    for name, (arch, overrides) in VARIANTS.items():
        path = swapmoe.synth(tmp / f"{name}.gguf", arch=arch, progress=False, **(SYNTH | overrides))
        tokens = tokenize(ref, path)
        reference(ref, path, tokens, out / f"{name}.npz")
        cases.append(
            {
                "name": name,
                "arch": arch,
                "synth": SYNTH | overrides,
                "sha256": sha256(path),
                "reference": f"{name}.npz",
                "n_tokens": len(tokens),
            }
        )
        print(f"{name}: {len(tokens)} tokens")
    (out / "variants.json").write_text(json.dumps({"cases": cases}, indent=1) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", type=Path, default=Path.home() / ".cache/swapmoe-ref")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "tests/data/golden")
    ap.add_argument("--arch", nargs="*", default=list(ARCHS) + ["tiny-moe"])
    ap.add_argument("--variants", action="store_true", help="write only the layout variants")
    args = ap.parse_args()
    build = args.ref / "llama-build-noamx"
    if not (build / "bin/llama-quantize").exists():
        build = args.ref / "llama-build"
    bin_dir = build / "bin"
    ENV["LLAMA_CPP_LIB_PATH"] = str(bin_dir)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.variants:
        with tempfile.TemporaryDirectory() as tmp:
            write_variants(args.ref, args.out, Path(tmp))
        return
    manifest_path = args.out / "manifest.json"
    kept = json.loads(manifest_path.read_text())["cases"] if manifest_path.exists() else []
    manifest = {
        "settings": "llama.cpp via llama-cpp-python: F32 KV cache, flash attention off, prompt in one "
        "batch, 2 threads; greedy = argmax, one token per decode",
        "cases": [c for c in kept if c["arch"] not in args.arch],
    }
    zstd = zstandard.ZstdCompressor(level=19)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        text = tmp / "calibration.txt"
        text.write_text(PROMPT * 40)
        for arch in [a for a in args.arch if a != "tiny-moe"]:
            settings = SYNTH | ARCH_SYNTH.get(arch, {})
            f32 = swapmoe.synth(tmp / f"{arch}-F32.gguf", arch=arch, progress=False, **settings)
            tokens = tokenize(args.ref, f32, PROMPT * ARCH_PROMPT_REPEATS.get(arch, 1))
            imatrix = tmp / f"{arch}.imatrix.gguf"
            run(
                [
                    bin_dir / "llama-imatrix",
                    "-m",
                    f32,
                    "-f",
                    text,
                    "-o",
                    imatrix,
                    "-c",
                    "128",
                    "--chunks",
                    "8",
                    "-t",
                    "2",
                ]
            )
            cases = [("F32", f32, None)]
            for quant in QUANTS + EXTRA_QUANTS.get(arch, ()):
                q = tmp / f"{arch}-{quant}.gguf"
                extra = ["--imatrix", imatrix, *IQ_ARGS.get(arch, [])] if quant.startswith("IQ") else []
                run([bin_dir / "llama-quantize", *extra, f32, q, quant, "2"])
                stored = args.out / f"{arch}-{quant}.gguf.zst"
                stored.write_bytes(zstd.compress(q.read_bytes()))
                cases.append((quant, q, stored.name))
            for quant, path, stored in cases:
                npz = args.out / f"{arch}-{quant}.npz"
                reference(args.ref, path, tokens, npz)
                manifest["cases"].append(
                    {
                        "arch": arch,
                        "type": quant,
                        "gguf": stored,
                        "synth": settings,
                        "sha256": sha256(path),
                        "reference": npz.name,
                        "n_tokens": len(tokens),
                    }
                )
                print(f"{arch} {quant}: {len(tokens)} tokens, {path.stat().st_size / 1e6:.2f} MB")
    tiny = Path(swapmoe.default_model_path())
    if "tiny-moe" in args.arch and tiny.exists():
        tokens = tokenize(args.ref, tiny)
        reference(args.ref, tiny, tokens, args.out / "tiny-moe.npz")
        manifest["cases"].append(
            {
                "arch": "tiny-moe",
                "type": "Q8_0",
                "gguf": None,
                "sha256": sha256(tiny),
                "reference": "tiny-moe.npz",
                "n_tokens": len(tokens),
            }
        )
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
