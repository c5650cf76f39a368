#!/usr/bin/env python3
"""How a model's routing re-uses experts from token to token: the quantity expert caching,
prefetch and fixation live on. For any GGUF, synthetic or real.

    python tools/route_stats.py model.gguf
    python tools/route_stats.py model.gguf --decode 64 --greedy --json

Feeds a fixed ordinary prompt (an English paragraph; --prompt-file to choose another), then
decodes --decode tokens sampled at temperature 1 (seed 0, as tools/bench_stream.py decodes;
--greedy for greedy), and prints per MoE layer and overall, over the decoded tokens:

  prev      share of a token's experts that the previous token also used (same layer)
  within 8  share of a token's experts used by at least one of the previous 8 tokens
  distinct  experts the layer used over the decoded tokens
  top 10%   share of the decoded tokens' expert requests that went to the layer's most-used
            tenth of its experts (popularity skew; uniform routing gives about 0.1)

The prompt's tokens count as history for the first decoded tokens. Hash-routed layers
(DeepSeek-V4) are listed but left out of the overall line: their experts follow the token ids.

    python tools/route_stats.py --check                      # every profiled preset
    python tools/route_stats.py --check qwen3-30b-a3b --layers 4 --type Q4_K_M

--check writes each named preset's synthetic file (--layers layers, --type, in a temporary
directory) and compares its overall statistics with the preset's routing profile
(swapmoe/synthetic/presets.py ROUTING_PROFILES): previous-token and within-8 reuse within 5
percentage points, distinct experts within 20 %.
"""

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

PROMPT = (
    "The history of the river towns is mostly a history of trade. Boats came up from the coast "
    "with salt, cloth and news, and went back down with grain, timber and wool."
)
WINDOW = 8


class Recorder:
    """The routing trace interface (Routing.trace): every pass's expert ids per layer."""

    def __init__(self):
        self.passes = 0
        self.rows: dict[int, list[tuple[bool, np.ndarray]]] = {}  # layer -> [(decoding, ids [T, k])]
        self.hashed: set[int] = set()

    def new_pass(self) -> int:
        self.passes += 1
        return self.passes

    def __call__(self, pass_: int, decoding: bool, layer: int, ids: np.ndarray, hashed: bool) -> None:
        self.rows.setdefault(layer, []).append((decoding, np.array(ids)))
        if hashed:
            self.hashed.add(layer)


def layer_stats(passes: list[tuple[bool, np.ndarray]], n_expert: int) -> dict[str, float]:
    """The statistics of one layer from its passes in order (prompt rows are history only)."""
    history = [set(row.tolist()) for decoding, ids in passes if not decoding for row in ids]
    decoded = [set(row.tolist()) for decoding, ids in passes if decoding for row in ids]
    prev, within, counts = [], [], np.zeros(n_expert, np.int64)
    for chosen in decoded:
        if history:
            prev.append(len(chosen & history[-1]) / len(chosen))
            recent = set().union(*history[-WINDOW:])
            within.append(len(chosen & recent) / len(chosen))
        for e in chosen:
            counts[e] += 1
        history.append(chosen)
    top = np.sort(counts)[::-1][: math.ceil(n_expert / 10)]
    return {
        "prev": float(np.mean(prev)),
        "within8": float(np.mean(within)),
        "distinct": int(np.count_nonzero(counts)),
        "top10": float(top.sum() / max(counts.sum(), 1)),
    }


def route_stats(model_path, decode: int = 32, greedy: bool = False, prompt: str = PROMPT, **load) -> dict:
    """{"layers": {layer: stats}, "overall": stats averaged over routed layers, "hash_layers": [...]}."""
    import swapmoe

    model = swapmoe.load(model_path, **load)
    recorder = Recorder()
    model.trace = recorder  # every sequence's routing reports to it
    sampling = (
        {"temperature": 0.0} if greedy else {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 0}
    )
    ids = model.tokenize(prompt)
    list(model.generate_ids(ids, decode, ignore_eos=True, **sampling))
    n_expert = model.hparams.n_expert
    layers = {layer: layer_stats(passes, n_expert) for layer, passes in sorted(recorder.rows.items())}
    routed = [s for layer, s in layers.items() if layer not in recorder.hashed]
    overall = {key: float(np.mean([s[key] for s in routed])) for key in ("prev", "within8", "distinct", "top10")}
    return {
        "model": str(model_path),
        "arch": model.gguf.arch,
        "n_expert": n_expert,
        "n_expert_used": model.hparams.n_expert_used,
        "prompt_tokens": len(ids),
        "decode_tokens": decode,
        "sampling": "greedy" if greedy else "temperature 1",
        "layers": layers,
        "overall": overall,
        "hash_layers": sorted(recorder.hashed),
    }


def check(presets: list[str], layers: int, type_name: str) -> bool:
    """Each preset's synthetic file against its routing profile; True if all are within bounds."""
    import tempfile

    import swapmoe
    from swapmoe.synthetic.presets import PRESETS, ROUTING_PROFILES

    print(
        f"{'preset':20} {'prev':>13} {'within 8':>13} {'distinct':>13} {'top 10%':>7}  (measured / profile; "
        f"{layers} layers, {type_name})"
    )
    passed = True
    for name in presets:
        profile, config = ROUTING_PROFILES[name], PRESETS[name]
        with tempfile.TemporaryDirectory() as folder:
            path = swapmoe.synth(
                Path(folder) / f"{name}.gguf", preset=name, type=type_name, n_layer=layers, progress=False
            )
            o = route_stats(path, expert_streaming=False)["overall"]
        ok = (
            abs(o["prev"] - profile.prev) <= 0.05,
            abs(o["within8"] - profile.within8) <= 0.05,
            abs(o["distinct"] - profile.distinct) <= 0.2 * profile.distinct,
        )
        passed &= all(ok)
        marks = ["" if good else " !" for good in ok]
        print(
            f"{name:20} {o['prev']:>5.1%} / {profile.prev:>4.0%}{marks[0]:2} {o['within8']:>5.1%} / "
            f"{profile.within8:>4.0%}{marks[1]:2} {o['distinct']:>5.1f} / {profile.distinct:>5.1f}{marks[2]:2} "
            f"{o['top10']:>7.1%}  (context gain {config.context_gain:g}, focus {config.attention_focus:g}, "
            f"recurrent gain {config.recurrent_gain:g}, router spread {config.router_spread:g}, "
            f"hot experts {config.hot_experts})",
            flush=True,
        )
    return passed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", type=Path)
    ap.add_argument("--check", nargs="*", metavar="PRESET", help="check presets against their routing profiles")
    ap.add_argument("--layers", type=int, default=4, help="--check: layers of each file (default 4)")
    ap.add_argument("--type", default="Q4_K_M", help="--check: weight type or mix (default Q4_K_M)")
    ap.add_argument("--decode", type=int, default=32, help="tokens to decode (default 32)")
    ap.add_argument("--greedy", action="store_true", help="greedy decoding instead of temperature 1")
    ap.add_argument("--prompt-file", type=Path, help="a text file to use as the prompt")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args()
    if args.check is not None:
        from swapmoe.synthetic.presets import ROUTING_PROFILES

        sys.exit(0 if check(args.check or list(ROUTING_PROFILES), args.layers, args.type) else 1)
    if args.model is None:
        ap.error("give a model, or --check")
    prompt = args.prompt_file.read_text(encoding="utf-8") if args.prompt_file else PROMPT
    result = route_stats(args.model, args.decode, args.greedy, prompt)
    if args.json:
        json.dump(result, sys.stdout, indent=1)
        print()
        return
    print(
        f"{result['model']}: {result['arch']}, {result['n_expert_used']} of {result['n_expert']} experts; "
        f"prompt {result['prompt_tokens']} tokens, {result['decode_tokens']} decoded ({result['sampling']})"
    )
    print(f"{'layer':>6} {'prev':>6} {'within 8':>8} {'distinct':>8} {'top 10%':>7}")
    for layer, s in result["layers"].items():
        note = "  hash-routed" if layer in result["hash_layers"] else ""
        print(f"{layer:>6} {s['prev']:>6.1%} {s['within8']:>8.1%} {s['distinct']:>8} {s['top10']:>7.1%}{note}")
    o = result["overall"]
    print(f"{'all':>6} {o['prev']:>6.1%} {o['within8']:>8.1%} {o['distinct']:>8.1f} {o['top10']:>7.1%}")


if __name__ == "__main__":
    main()
