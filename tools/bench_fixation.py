#!/usr/bin/env python3
"""What expert fixation costs in quality: KL divergence and top-1 agreement against unfixed
decoding, for N = 2, 4, 8.

    python tools/bench_fixation.py [MODEL] [--text FILE] [--prompt 32] [--steps 96]

Teacher-forced on real text (default: the source of Python's calendar.py, one of the files
held out of the embedded model's training): the first
--prompt tokens are one prompt pass (never fixed), then the next --steps tokens are fed one at
a time, once with fixation N and once without, and the next-token distributions are compared
at every step. MODEL defaults to the embedded tiny model.
"""

import argparse
import calendar
from pathlib import Path

import numpy as np

import swapmoe
from swapmoe.runtime.compare import log_softmax
from swapmoe.runtime.routing import Routing, RoutingPolicy


def decode_logits(model, tokens: list[int], n_prompt: int, fixation: int) -> np.ndarray:
    net = model.net
    routing = Routing(model.store, RoutingPolicy(fixation=fixation))
    cache = net.new_cache(len(tokens))
    net.forward(np.array(tokens[:n_prompt]), cache, routing)
    return np.stack([net.forward(np.array([t]), cache, routing)[-1] for t in tokens[n_prompt:]])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default=swapmoe.default_model_path())
    ap.add_argument("--text", type=Path, default=Path(calendar.__file__))
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--steps", type=int, default=96)
    args = ap.parse_args()
    model = swapmoe.load(args.model, expert_streaming=False)
    tokens = model.tokenize(args.text.read_text())[: args.prompt + args.steps]
    reference = log_softmax(decode_logits(model, tokens, args.prompt, 0))
    print(
        f"model {Path(args.model).name}, text {args.text.name}: {args.prompt}-token prompt, "
        f"{len(tokens) - args.prompt} teacher-forced decode steps"
    )
    print(f"{'fixation N':>10} {'mean KL':>10} {'max KL':>10} {'top-1 agree':>12}")
    for n in (2, 4, 8):
        fixed = log_softmax(decode_logits(model, tokens, args.prompt, n))
        kl = (np.exp(reference) * (reference - fixed)).sum(axis=-1)
        top1 = np.mean(fixed.argmax(-1) == reference.argmax(-1))
        print(f"{n:>10} {kl.mean():10.4f} {kl.max():10.4f} {top1:12.3f}")


if __name__ == "__main__":
    main()
