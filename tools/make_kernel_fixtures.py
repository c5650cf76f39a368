"""Write tests/data/kernels/*.gguf: small tensors quantized by llama.cpp's own
llama-quantize, one file per ggml type, for tests/test_kernels_real.py.

Needs a llama.cpp build with llama-quantize (default: ~/.cache/swapmoe-ref); the tests
only read the committed fixtures.

    python tools/make_kernel_fixtures.py [--quantize PATH] [--out DIR]

Each fixture holds the quantized `blk.0.ffn_up.weight` (8 x 512) and
`blk.0.ffn_down.weight` (4 x 768), plus the float32 source values as the
tensors `source.ffn_up` / `source.ffn_down` in a sidecar .npz.  The model is a
one-layer "llama" header; llama-quantize runs with --pure so every 2-D weight
gets the target type, and with a flat importance matrix (all ones) because the
IQ1/IQ2 types refuse to quantize without one.
"""

from __future__ import annotations

import argparse
import os
import struct
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGUFWriter

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_QUANTIZE = Path.home() / ".cache/swapmoe-ref/llama-build/bin/llama-quantize"
# ggml type -> llama-quantize file type whose --pure base type it is
FTYPES = {
    "F16": "F16",
    "BF16": "BF16",
    "Q4_0": "Q4_0",
    "Q4_1": "Q4_1",
    "Q5_0": "Q5_0",
    "Q5_1": "Q5_1",
    "Q8_0": "Q8_0",
    "Q2_K": "Q2_K",
    "Q3_K": "Q3_K_M",
    "Q4_K": "Q4_K_M",
    "Q5_K": "Q5_K_M",
    "Q6_K": "Q6_K",
    "IQ1_S": "IQ1_S",
    "IQ1_M": "IQ1_M",
    "IQ2_XXS": "IQ2_XXS",
    "IQ2_XS": "IQ2_XS",
    "IQ2_S": "IQ2_M",
    "IQ3_XXS": "IQ3_XXS",
    "IQ3_S": "IQ3_S",
    "IQ4_NL": "IQ4_NL",
    "IQ4_XS": "IQ4_XS",
    "MXFP4": "MXFP4_MOE",
}
# (name, rows, cols): ne0 = cols is a multiple of 256 for the K/IQ types
TENSORS = [("blk.0.ffn_up.weight", 8, 512), ("blk.0.ffn_down.weight", 4, 768)]


def source_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, rows, cols in TENSORS:
        w = rng.standard_normal((rows, cols)).astype(np.float32) * 0.02
        w[0, :32] = 0.0  # a zero block
        w[1, :256] *= 50.0  # a large-magnitude super-block
        out[name] = w
    return out


def write_source_gguf(path: Path, tensors: dict[str, np.ndarray]) -> None:
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(512)
    writer.add_feed_forward_length(768)
    writer.add_head_count(4)
    writer.add_head_count_kv(4)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(0)
    for name, w in tensors.items():
        writer.add_tensor(name, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_flat_imatrix(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """Legacy binary imatrix (common/imatrix loader): all-ones importances."""
    with open(path, "wb") as f:
        f.write(struct.pack("<i", len(tensors)))
        for name, w in tensors.items():
            raw = name.encode()
            f.write(struct.pack("<i", len(raw)) + raw)
            f.write(struct.pack("<ii", 1, w.shape[1]))
            f.write(np.ones(w.shape[1], np.float32).tobytes())
        f.write(struct.pack("<i", 1))
        f.write(struct.pack("<i", 4) + b"flat")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quantize", type=Path, default=DEFAULT_QUANTIZE)
    ap.add_argument("--out", type=Path, default=ROOT / "tests/data/kernels")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tensors = source_tensors()
    np.savez_compressed(args.out / "source.npz", **{k.replace(".", "_"): v for k, v in tensors.items()})
    with tempfile.TemporaryDirectory() as tmp:
        src, imatrix = Path(tmp) / "f32.gguf", Path(tmp) / "flat.imatrix"
        write_source_gguf(src, tensors)
        write_flat_imatrix(imatrix, tensors)
        for name, ftype in FTYPES.items():
            dst = args.out / f"{name.lower()}.gguf"
            cmd = [str(args.quantize), "--pure", "--imatrix", str(imatrix), str(src), str(dst), ftype, "1"]
            res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "LLAMA_LOG_VERBOSITY": "0"})
            if res.returncode != 0:
                raise SystemExit(f"{' '.join(cmd)} failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
            print(f"{dst.relative_to(ROOT) if dst.is_relative_to(ROOT) else dst}: {dst.stat().st_size} bytes")


if __name__ == "__main__":
    main()
