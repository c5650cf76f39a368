#!/usr/bin/env python3
"""Print swapmoe's agreement with llama.cpp on every golden fixture (tests/data/golden).

    python tools/parity_report.py [--arch qwen3moe ...]

Per case: mean and max KL(llama.cpp || swapmoe) over the prompt positions, top-1 agreement,
and how many of llama.cpp's greedy tokens swapmoe reproduces before the first difference.
The fixtures and the acceptance thresholds are those of tests/test_parity.py.
"""

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import zstandard

import swapmoe
from swapmoe.runtime.compare import kl_divergence

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "data" / "golden"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", nargs="*")
    args = ap.parse_args()
    manifest = json.loads((GOLDEN / "manifest.json").read_text())
    print(f"{'case':24} {'mean KL':>9} {'max KL':>9} {'top-1':>7} {'greedy':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for case in manifest["cases"]:
            if args.arch and case["arch"] not in args.arch:
                continue
            if case["arch"] == "tiny-moe":
                path = Path(swapmoe.default_model_path())
            elif case["gguf"] is None:
                path = swapmoe.synth(
                    Path(tmp) / f"{case['arch']}.gguf", arch=case["arch"], progress=False, force=True, **case["synth"]
                )
            else:
                path = Path(tmp) / case["gguf"].removesuffix(".zst")
                path.write_bytes(zstandard.ZstdDecompressor().decompress((GOLDEN / case["gguf"]).read_bytes()))
            if hashlib.sha256(path.read_bytes()).hexdigest() != case["sha256"]:
                sys.exit(f"{path.name}: not the file the fixture was made from")
            ref = np.load(GOLDEN / case["reference"])
            model = swapmoe.load(path)
            kl = kl_divergence(ref["logits"], model.logits(ref["tokens"]))
            top1 = np.mean(model.logits(ref["tokens"]).argmax(-1) == ref["logits"].argmax(-1))
            greedy = list(model.generate_ids(ref["tokens"].tolist(), max_tokens=len(ref["greedy"]), ignore_eos=True))
            same = next((i for i, (a, b) in enumerate(zip(greedy, ref["greedy"].tolist())) if a != b), len(greedy))
            print(
                f"{case['arch'] + '-' + case['type']:24} {kl.mean():9.2e} {kl.max():9.2e} {top1:7.3f} "
                f"{same:3d}/{len(greedy):<3d}"
            )


if __name__ == "__main__":
    main()
