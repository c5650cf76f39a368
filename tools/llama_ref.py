#!/usr/bin/env python3
"""llama.cpp's logits and greedy continuation for given token ids, through llama-cpp-python.

Run it with a Python that has the `llama_cpp` bindings of the reference build:

    REF/venv/bin/python tools/llama_ref.py MODEL.gguf --tokens 1,2,3 --greedy 32 --out ref.npz

Settings are the tight reference configuration: F32 KV cache, flash attention off, the
prompt in one batch, 2 threads. The .npz holds `tokens`, `logits` [n, n_vocab] (after each
prompt position) and `greedy` (the next --greedy tokens, argmax each step, one token per
decode call). `--tokenize TEXT` instead prints llama.cpp's token ids for TEXT as JSON.
"""

import argparse
import ctypes
import json

import llama_cpp as L
import numpy as np

_quiet = L.llama_log_callback(lambda level, text, user: None)


def load(path: str):
    L.llama_backend_init()
    L.llama_log_set(_quiet, ctypes.c_void_p(0))
    params = L.llama_model_default_params()
    model = L.llama_model_load_from_file(path.encode(), params)
    if not model:
        raise SystemExit(f"llama.cpp could not load {path}")
    return model


def tokenize(model, text: str, add_special: bool) -> list[int]:
    vocab = L.llama_model_get_vocab(model)
    data = text.encode()
    buf = (L.llama_token * (len(data) + 16))()
    n = L.llama_tokenize(vocab, data, len(data), buf, len(buf), add_special, True)
    return list(buf[:n])


def run(model, tokens: list[int], greedy: int, threads: int) -> tuple[np.ndarray, list[int]]:
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    cp = L.llama_context_default_params()
    cp.n_ctx = max(256, len(tokens) + greedy + 16)
    cp.n_batch = cp.n_ubatch = max(512, len(tokens))
    cp.n_threads = cp.n_threads_batch = threads
    cp.type_k = cp.type_v = 0  # F32
    cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = L.llama_init_from_model(model, cp)
    batch = L.llama_batch_init(len(tokens), 0, 1)
    logits = np.empty((len(tokens), n_vocab), np.float32)
    out = []
    try:

        def decode(ids, start, want_all):
            for j, t in enumerate(ids):
                batch.token[j], batch.pos[j], batch.n_seq_id[j] = t, start + j, 1
                batch.seq_id[j][0], batch.logits[j] = 0, int(want_all or j == len(ids) - 1)
            batch.n_tokens = len(ids)
            if L.llama_decode(ctx, batch) != 0:
                raise SystemExit("llama_decode failed")

        decode(tokens, 0, True)
        for j in range(len(tokens)):
            logits[j] = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, j), shape=(n_vocab,))
        last = logits[-1]
        for step in range(greedy):
            token = int(np.argmax(last))
            out.append(token)
            decode([token], len(tokens) + step, False)
            last = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, 0), shape=(n_vocab,)).copy()
    finally:
        L.llama_batch_free(batch)
        L.llama_free(ctx)
    return logits, out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--tokens", help="comma-separated token ids")
    ap.add_argument("--tokenize", help="print llama.cpp's ids for this text (parse_special on)")
    ap.add_argument("--add-special", action="store_true", help="with --tokenize: add BOS/EOS as the model says")
    ap.add_argument("--greedy", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args()
    model = load(args.model)
    if args.tokenize is not None:
        print(json.dumps(tokenize(model, args.tokenize, args.add_special)))
        return
    tokens = [int(t) for t in args.tokens.split(",")]
    logits, greedy = run(model, tokens, args.greedy, args.threads)
    np.savez_compressed(args.out, tokens=np.array(tokens, np.int32), logits=logits, greedy=np.array(greedy, np.int32))
    L.llama_model_free(model)


if __name__ == "__main__":
    main()
