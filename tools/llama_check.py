#!/usr/bin/env python3
"""Show that llama.cpp loads and generates from swapmoe's models.

    python tools/llama_check.py [--llama-bin DIR] [--arch qwen3moe ...] [-n 24]

For each architecture asked for, writes a small synthetic GGUF and runs llama.cpp's
`llama-completion` on it; then does the same for the embedded tiny trained model.
Prints what llama.cpp generated and exits non-zero if any run failed. Needs a llama.cpp
build (DIR holds llama-completion; default: $SWAPMOE_LLAMA_BIN, else
~/.cache/swapmoe-ref/llama-build/bin). Not part of the test suite.
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import swapmoe

PROMPT = "def main():\n    "


def generate(llama_bin: Path, model: Path, n: int, extra: list[str]) -> tuple[bool, str]:
    cmd = [
        str(llama_bin / "llama-completion"),
        "-m",
        str(model),
        "-p",
        PROMPT,
        "-n",
        str(n),
        "--temp",
        "0",
        "--seed",
        "1",
        "-no-cnv",
        "--no-display-prompt",
        "-t",
        "2",
        *extra,
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, errors="replace", stdin=subprocess.DEVNULL, timeout=300
    )  # a random model may emit bytes that are not UTF-8
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-3:]
        return False, f"exit {proc.returncode}: " + " | ".join(tail)
    return True, proc.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_bin = os.environ.get("SWAPMOE_LLAMA_BIN", str(Path.home() / ".cache/swapmoe-ref/llama-build/bin"))
    ap.add_argument("--llama-bin", type=Path, default=Path(default_bin))
    ap.add_argument("--arch", nargs="*", default=["qwen3moe"])
    ap.add_argument("--type", default="Q8_0")
    ap.add_argument("-n", type=int, default=24)
    ap.add_argument("--llama-args", default="", help="extra llama-completion arguments, e.g. '-nr'")
    args = ap.parse_args()
    if not (args.llama_bin / "llama-completion").exists():
        sys.exit(f"{args.llama_bin}/llama-completion not found (set --llama-bin or SWAPMOE_LLAMA_BIN)")
    extra = args.llama_args.split()
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        models = [
            (
                f"synthetic {arch} {args.type}",
                swapmoe.synth(Path(tmp) / f"{arch}.gguf", arch=arch, type=args.type, progress=False),
            )
            for arch in args.arch
        ]
        models.append(("embedded tiny model", Path(swapmoe.default_model_path())))
        for label, path in models:
            ok, text = generate(args.llama_bin, path, args.n, extra)
            failed += not ok
            print(f"== {label}: {'ok' if ok else 'FAILED'}\n{PROMPT}{text}\n" if ok else f"== {label}: FAILED {text}\n")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
