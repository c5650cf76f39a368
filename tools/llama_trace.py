#!/usr/bin/env python3
"""Every float32 tensor llama.cpp computes for one prompt, saved by name: the tool for finding
where swapmoe's numbers first differ from llama.cpp's.

Run it with a Python that has the `llama_cpp` bindings of the reference build:

    REF/venv/bin/python tools/llama_trace.py MODEL.gguf --tokens 1,2,3 --out trace.npz
    REF/venv/bin/python tools/llama_trace.py MODEL.gguf --tokens 1,2,3 --then 7 --out step.npz

Settings as tools/llama_ref.py (F32 KV cache, flash attention off, 2 threads, the prompt in one
batch). `--then ID` feeds the prompt first and traces only the decode step of one more token
(llama.cpp takes other routes for one token than for a batch). Tensors keep llama.cpp's names
("attn_norm-0", "ffn_moe_logits-1", ...; a repeated name gets "#1", "#2" in order of
computation) and numpy's axis order (the reverse of ggml's ne). Feed them to swapmoe's
operations one at a time and compare bit for bit: docs/kernels.md (numerics) lists the routes
found this way.
"""

import argparse
import ctypes

import llama_cpp as L
import numpy as np

_quiet = L.llama_log_callback(lambda level, text, user: None)


class GgmlTensor(ctypes.Structure):
    """The head of ggml.h's struct ggml_tensor, up to its name (GGML_MAX_DIMS 4, GGML_MAX_SRC 10,
    GGML_MAX_OP_PARAMS 64, GGML_MAX_NAME 64)."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
    ]


def trace(path: str, tokens: list[int], then: int | None) -> dict[str, np.ndarray]:
    dump: dict[str, np.ndarray] = {}
    recording = [then is None]

    def on_tensor(pointer, ask, user):
        t = ctypes.cast(pointer, ctypes.POINTER(GgmlTensor)).contents
        if ask or not recording[0] or t.type != 0 or not t.data:  # 0: GGML_TYPE_F32
            return True
        ne, nb = list(t.ne), list(t.nb)
        extent = sum((n - 1) * b for n, b in zip(ne, nb)) + 4
        raw = np.frombuffer((ctypes.c_char * extent).from_address(t.data), np.float32)
        name = key = t.name.decode()
        k = 0
        while key in dump:
            k += 1
            key = f"{name}#{k}"
        dump[key] = np.lib.stride_tricks.as_strided(raw, shape=ne[::-1], strides=nb[::-1]).copy().squeeze()
        return True

    callback = L.ggml_backend_sched_eval_callback(on_tensor)
    L.llama_backend_init()
    L.llama_log_set(_quiet, ctypes.c_void_p(0))
    model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
    if not model:
        raise SystemExit(f"llama.cpp could not load {path}")
    cp = L.llama_context_default_params()
    cp.n_ctx = max(256, len(tokens) + 16)
    cp.n_batch = cp.n_ubatch = max(512, len(tokens))
    cp.n_threads = cp.n_threads_batch = 2
    cp.type_k = cp.type_v = 0  # F32
    cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cp.cb_eval = callback
    ctx = L.llama_init_from_model(model, cp)
    batch = L.llama_batch_init(len(tokens), 0, 1)
    try:
        steps = [(tokens, 0)] + ([([then], len(tokens))] if then is not None else [])
        for i, (ids, start) in enumerate(steps):
            recording[0] = i == len(steps) - 1
            for j, tok in enumerate(ids):
                batch.token[j], batch.pos[j], batch.n_seq_id[j] = tok, start + j, 1
                batch.seq_id[j][0], batch.logits[j] = 0, 1
            batch.n_tokens = len(ids)
            if L.llama_decode(ctx, batch) != 0:
                raise SystemExit("llama_decode failed")
    finally:
        L.llama_batch_free(batch)
        L.llama_free(ctx)
        L.llama_model_free(model)
    return dump


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--tokens", required=True, help="comma-separated token ids of the prompt")
    ap.add_argument("--then", type=int, help="trace the decode step of this token after the prompt")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dump = trace(args.model, [int(t) for t in args.tokens.split(",")], args.then)
    np.savez(args.out, **dump)
    print(f"{len(dump)} tensors -> {args.out}")


if __name__ == "__main__":
    main()
