#!/usr/bin/env python3
"""Check the tiny model exported by tools/train_tiny_moe.py against the llama.cpp reference build.

    python tools/llama_check_tiny.py [--gguf swapmoe/data/tiny-moe.gguf] [--f32-gguf WORK/tiny-moe-f32.gguf]
                                     [--work-dir /tmp/tiny-moe-work] [--ref ~/.cache/swapmoe-ref]

Runs in swapmoe's venv (needs `tokenizers`); llama.cpp is reached through its binaries and, for
per-position logits, through the reference venv's llama-cpp-python (a subprocess).  Checks:
  1. tokenization: llama-tokenize == the trained tokenizer, on probe strings and the held-out text;
  2. logits: llama.cpp (F32 KV cache, flash attention off) vs the torch model's logits saved by the
     training script, for the F32 export and for the Q8_0 export (torch on dequantized weights);
  3. llama-perplexity on the held-out text (n_ctx = the model's context length);
  4. a greedy continuation with llama-completion.
All llama.cpp runs pass --no-repack / use_extra_bufts=false: with this reference build
(GGML_NATIVE on an AMX-capable Xeon) the AMX path for Q8_0 matrices crashes (SIGSEGV/SIGILL in
ggml_backend_amx_mul_mat) on this machine.  Results go to WORK_DIR/llama_check.json.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent

PROBE_STRINGS = [
    'def main():\n    x = 1  # héllo\n\n\tif x:\n        return "don\'t"',
    "import os, sys\nfrom typing import List\n\nclass Foo(Bar):\n    pass\n",
    '    for i in range(10):\n        print(f"{i:03d} {i**2}")\r\n',
    "x = [1, 2, 3.14e-10]; y = {'a': None} if True else ()  \n\n\n",
    "I'M HERE and they'll see it's 12345 \u00e9\u00e8 \u4e2d\u6587 \U0001f600 tabs\t\tend",
    "   leading spaces and trailing   ",
]

# Per-position logits through llama-cpp-python (tools/llama_ref.py: F32 KV, flash attention off).
LOGITS_HELPER = r"""
import sys, numpy as np
sys.path.insert(0, sys.argv[4])
import llama_ref
ids = np.load(sys.argv[2]).tolist()
logits, _ = llama_ref.run(llama_ref.load(sys.argv[1]), ids, 0, 2)
np.save(sys.argv[3], logits)
"""


def llama_tokenize(bin_dir: Path, gguf: Path, text: str | None = None, file: Path | None = None) -> list[int]:
    cmd = [str(bin_dir / "llama-tokenize"), "-m", str(gguf), "--ids", "--log-disable", "--no-escape"]
    cmd += ["-f", str(file)] if file else ["-p", text]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    return json.loads(out)


def compare_logits(ref_python: Path, gguf: Path, ids_file: Path, torch_logits_file: Path, out_file: Path) -> dict:
    subprocess.run(
        [
            str(ref_python),
            "-c",
            LOGITS_HELPER,
            str(gguf),
            str(ids_file),
            str(out_file),
            str(Path(__file__).resolve().parent),
        ],
        check=True,
    )
    llama = np.load(out_file)
    torch_logits = np.load(torch_logits_file)
    diff = np.abs(llama - torch_logits)
    return {
        "positions": int(llama.shape[0]),
        "max_abs_diff": float(diff.max()),
        "mean_abs_diff": float(diff.mean()),
        "top1_agreement": float((llama.argmax(-1) == torch_logits.argmax(-1)).mean()),
        "torch_logit_std": float(torch_logits.std()),
    }


def llama_perplexity(bin_dir: Path, gguf: Path, text_file: Path, n_ctx: int, extra: list[str]) -> dict:
    cmd = [
        str(bin_dir / "llama-perplexity"),
        "-m",
        str(gguf),
        "-f",
        str(text_file),
        "-c",
        str(n_ctx),
        "-b",
        str(n_ctx),
        "-t",
        "2",
        "--no-repack",
        *extra,
    ]
    res = subprocess.run(cmd, capture_output=True, text=True)
    log = res.stdout + res.stderr
    m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", log)
    chunks = re.search(r"calculating perplexity over (\d+) chunks", log)
    return {
        "command": " ".join(cmd),
        "ppl": float(m.group(1)) if m else None,
        "ppl_stderr": float(m.group(2)) if m else None,
        "chunks": int(chunks.group(1)) if chunks else None,
        "returncode": res.returncode,
    }


def llama_complete(bin_dir: Path, gguf: Path, prompt: str, n: int) -> dict:
    cmd = [
        str(bin_dir / "llama-completion"),
        "-m",
        str(gguf),
        "-p",
        prompt,
        "-n",
        str(n),
        "--temp",
        "0",
        "-no-cnv",
        "--no-repack",
        "-t",
        "2",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True)
    return {"command": " ".join(cmd), "output": res.stdout, "returncode": res.returncode}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", type=Path, default=REPO / "swapmoe/data/tiny-moe.gguf")
    ap.add_argument("--f32-gguf", type=Path, default=None, help="default: WORK_DIR/tiny-moe-f32.gguf if present")
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/tiny-moe-work"))
    ap.add_argument("--ref", type=Path, default=Path.home() / ".cache/swapmoe-ref")
    ap.add_argument("--context", type=int, default=256)
    args = ap.parse_args(argv)
    from tokenizers import Tokenizer

    bin_dir, work = args.ref / "llama-build/bin", args.work_dir
    ref_python = args.ref / "venv/bin/python"
    f32_gguf = args.f32_gguf or (work / "tiny-moe-f32.gguf")
    tokenizer = Tokenizer.from_file(str(work / "tokenizer.json"))
    results: dict = {"gguf": str(args.gguf), "gguf_bytes": args.gguf.stat().st_size}

    probes = []
    for text in PROBE_STRINGS:
        ours = tokenizer.encode(text, add_special_tokens=False).ids
        theirs = llama_tokenize(bin_dir, args.gguf, text=text)
        probes.append({"text": text, "equal": ours == theirs, "n_tokens": len(ours)})
    held_out_ids = np.load(work / "held_out_ids.npy").tolist()
    theirs = llama_tokenize(bin_dir, args.gguf, file=work / "held_out.txt")
    results["tokenize_probes"] = probes
    results["tokenize_held_out_equal"] = theirs == held_out_ids
    results["tokenize_held_out_tokens"] = [len(held_out_ids), len(theirs)]
    print("tokenization:", all(p["equal"] for p in probes), results["tokenize_held_out_equal"], flush=True)

    if f32_gguf.exists():
        results["logits_f32_gguf_vs_torch_f32"] = compare_logits(
            ref_python, f32_gguf, work / "sample_ids.npy", work / "sample_logits_f32.npy", work / "llama_logits_f32.npy"
        )
        print("F32 logits:", results["logits_f32_gguf_vs_torch_f32"], flush=True)
    results["logits_q8_gguf_vs_torch_dequant_q8"] = compare_logits(
        ref_python, args.gguf, work / "sample_ids.npy", work / "sample_logits_q8.npy", work / "llama_logits_q8.npy"
    )
    results["logits_q8_gguf_vs_torch_f32"] = compare_logits(
        ref_python, args.gguf, work / "sample_ids.npy", work / "sample_logits_f32.npy", work / "llama_logits_q8.npy"
    )
    print("Q8_0 logits:", results["logits_q8_gguf_vs_torch_dequant_q8"], flush=True)

    results["perplexity_default_kv"] = llama_perplexity(bin_dir, args.gguf, work / "held_out.txt", args.context, [])
    results["perplexity_f32_kv_fa_off"] = llama_perplexity(
        bin_dir, args.gguf, work / "held_out.txt", args.context, ["-ctk", "f32", "-ctv", "f32", "-fa", "off"]
    )
    print(
        "llama-perplexity:",
        results["perplexity_default_kv"]["ppl"],
        results["perplexity_f32_kv_fa_off"]["ppl"],
        flush=True,
    )

    results["completion"] = llama_complete(bin_dir, args.gguf, "def main():\\n    ", 64)
    print(results["completion"]["command"])
    print(results["completion"]["output"])
    (work / "llama_check.json").write_text(json.dumps(results, indent=2))
    print("wrote", work / "llama_check.json")


if __name__ == "__main__":
    sys.exit(main())
