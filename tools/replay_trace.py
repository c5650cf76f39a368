"""Replay recorded routing traces through expert-cache policies, against Belady's MIN.

    python tools/replay_trace.py TRACE... [--budgets MiB,MiB,... | --budget-fractions 0.1,0.25,...]
        [--policies expected,lru,lfu,min] [--keep-recent N|off] [--io mmap|pread]
        [--sizes auto|header|model] [--model GGUF] [--wide]

A trace (`swapmoe run MODEL --trace FILE`, `swapmoe.load(path, trace=FILE)`, `swapmoe serve
--trace`; RoutingTrace in swapmoe/runtime/model.py) holds every MoE layer's expert choice of
every forward pass.  The expert store sees, per pass and layer (a "visit"), start_reads(layer,
each token's ids), then expert(layer, e) for each unique id in ascending order (a "request"), and
end_pass() after each pass.  This replays exactly that demand sequence, without computing or
reading anything, through each policy at several byte budgets, and prints per policy and budget
the misses, the bytes read, and those bytes divided by MIN's.

Every policy runs in the real ExpertStore (swapmoe/runtime/experts/store.py), driven by an engine
that reads nothing (zero-filled views), with the trace's keep_recent (or --keep-recent; MIN,
the yardstick, always without); its stats.misses and bytes_loaded are reported. The policies are those the store ships
(swapmoe/runtime/experts/policy.py, by name):
  expected  the store's default: the expert whose next use is expected farthest ahead first
            (ExpectedUse). A replay of a trace with it gives the recorded run's counters.
  lru       least recently used expert first, over all layers.
  lfu       fewest uses so far first (counted over the whole replay, also while evicted),
            least recently used first among equals.
  min       Belady's offline MIN: the resident expert whose next visit that uses it is farthest in
            the future (or never comes) first. Optimal (fewest misses, so fewest bytes) when all
            experts have the same size; with unequal sizes (e.g. Q4_K_M's Q6_K ffn_down on some
            layers) it is the usual farthest-next-use heuristic, not a proven optimum, and another
            policy may read fewer bytes.

All of them keep the store's rules: a visit's experts are started together and none of them is
evicted for another, unless they do not fit together (a prompt's layer may choose more than the
budget holds): then the rest are read one by one as they are asked for. A budget too small for
one layer's experts is reported as such.

Sizes: the bytes the store charges for each expert: the sum of its slice's ranges (the mmap engine)
or its pread slot need (--io pread: ranges widened to 4 KiB for O_DIRECT; the store's pread
capacity is in slots of each slot need, the budget split between them as io.slot_plan does).
They come from the model's index when the header's model file exists and matches the header
(--sizes model), else from the header's expert_bytes (--sizes header: one part per expert; for
pread, slices assumed page-aligned).  A real run with --io auto and a budget smaller than the
model's experts uses pread: replay it with --io pread to get its counters.

Not replayed: the store's prefetches (--expert-prefetch previous/lookahead, the pinned experts that
--expert-fixation prefetches, hash-routed layers' experts read as soon as a token is known): a
trace recorded with any of them gives counters that differ from the replay (the tool warns).  The
replay's demand sequence is still the one the model made.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from swapmoe.errors import SwapmoeError
from swapmoe.repack.index import Range
from swapmoe.runtime.experts.io import DIRECT_ALIGN, SlotPlacement, SlotPool, slot_need, slot_plan
from swapmoe.runtime.experts.policy import MIN, POLICIES
from swapmoe.runtime.experts.store import ExpertStore

MiB = 1 << 20
FRACTIONS = (0.1, 0.25, 0.5)


# --- the trace --------------------------------------------------------------------------------
@dataclass
class Trace:
    path: Path
    header: dict
    visits: list[tuple[int, int, tuple[int, ...]]]  # (pass, layer, unique ids ascending)
    choices: list[np.ndarray]  # per visit: each token's ids as recorded (what start_reads takes)
    phases: dict[int, str]  # pass -> prompt | decode

    @property
    def requests(self) -> int:
        return sum(len(ids) for _, _, ids in self.visits)

    @property
    def layers(self) -> list[int]:
        return sorted({layer for _, layer, _ in self.visits})


def read_trace(path: str | Path) -> Trace:
    path = Path(path)
    with open(path, encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    if not lines:
        raise SwapmoeError(f"{path}: empty")
    header = json.loads(lines[0])
    if header.get("format") != "swapmoe-trace":
        raise SwapmoeError(f"{path}: not a swapmoe routing trace (no swapmoe-trace header)")
    if header.get("version") != 1:
        raise SwapmoeError(f"{path}: trace version {header.get('version')}; this tool reads version 1")
    visits, choices, phases = [], [], {}
    for n, line in enumerate(lines[1:], 2):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if n == len(lines):  # a run killed while writing its last line
                break
            raise SwapmoeError(f"{path}:{n}: not JSON") from None
        choice = np.asarray(rec["ids"], dtype=np.int64)
        visits.append((int(rec["pass"]), int(rec["layer"]), tuple(np.unique(choice).tolist())))
        choices.append(choice)
        phases[int(rec["pass"])] = rec.get("phase", "?")
    return Trace(path, header, visits, choices, phases)


# --- what the store needs in place of an index and an engine -----------------------------------
class HeaderIndex:
    """The least of an ExpertIndex that ExpertStore reads: one "down" part per expert, of the
    header's byte length, in one file, each starting on a 4 KiB boundary."""

    parts = ["down"]

    def __init__(self, expert_bytes):
        lengths = np.asarray(expert_bytes, dtype=np.int64)  # [n_layer, n_expert]
        self.n_layer, self.n_expert = lengths.shape
        padded = -(-lengths // DIRECT_ALIGN) * DIRECT_ALIGN
        self.part_length = lengths[:, :, None]
        self.part_offset = (np.cumsum(padded) - padded.ravel()).reshape(lengths.shape)[:, :, None]
        self.part_file = np.zeros(self.part_length.shape, np.uint16)
        self.part_type = np.full((self.n_layer, 1), int(GGMLQuantizationType.I8), np.int32)
        self.part_ne = np.zeros((self.n_layer, 1, 4), np.int64)
        self.part_ne[:, 0, :2] = (1, 1)  # nothing computes with these weights
        self.tables = {}

    def slice(self, layer: int, expert: int) -> list[Range]:
        return [Range(int(self.part_offset[layer, expert, 0]), int(self.part_length[layer, expert, 0]), 0)]

    def moe_layers(self) -> list[int]:
        return [int(layer) for layer in np.flatnonzero(self.part_length.any(axis=(1, 2)))]


class NullEngine:
    """The mmap engine's charges and room (only the store's budget) without the files: nothing is
    read, the views are zeros."""

    name = "replay-mmap"
    sized_rooms = False

    def __init__(self, largest: int):
        self._zeros = np.zeros(largest, np.uint8)

    def charge(self, ranges) -> int:
        return sum(n for _, _, n in ranges)

    def has_room(self, nbytes: int) -> bool:
        return True

    def start(self, ranges, nbytes: int):
        return ranges

    def finish(self, ranges) -> list[np.ndarray]:
        return [self._zeros[:n] for _, _, n in ranges]

    def release(self, placement) -> None:
        pass

    def close(self) -> None:
        pass


class NullSlotEngine(NullEngine):
    """The pread engine's charges and slots (io.SlotPool, as slot_plan sizes it) without files,
    memory or threads."""

    name = "replay-pread"
    sized_rooms = True

    def __init__(self, slots: dict[int, int], largest: int):
        super().__init__(largest)
        self.pool = SlotPool(slots)

    def charge(self, ranges) -> int:
        return slot_need(ranges)

    def has_room(self, nbytes: int) -> bool:
        return self.pool.has_room(nbytes)

    def start(self, ranges, nbytes: int) -> SlotPlacement:
        return SlotPlacement(self.pool.take(nbytes), nbytes, ranges, None)

    def finish(self, placement: SlotPlacement) -> list[np.ndarray]:
        return super().finish(placement.ranges)

    def release(self, placement: SlotPlacement) -> None:
        self.pool.give(placement.slot, placement.need)


def model_path(trace: Trace) -> Path | None:
    """The header's model file: as written (absolute, or relative to here), else beside the trace."""
    written = Path(trace.header.get("model", ""))
    for path in (written, trace.path.parent / written.name):
        if path.name and path.is_file():
            return path
    return None


def model_index(trace: Trace, path: Path | None = None):
    """The model's own expert index (of `path`, else of the header's model file) if it agrees
    with the header's expert sizes, else None."""
    path = path or model_path(trace)
    if path is None:
        return None
    from swapmoe.gguf_file import open_gguf
    from swapmoe.repack import index as expert_index

    try:
        if expert_index.sidecar_path(path).exists():
            idx = expert_index.load(path)
        else:
            idx = expert_index.build(open_gguf(path))
    except SwapmoeError:
        return None
    n_layer = len(trace.header["expert_bytes"])
    same = idx.part_length[:n_layer].sum(axis=2).tolist() == trace.header["expert_bytes"]
    return idx if same else None


@dataclass
class Setup:
    """How a trace is replayed: the index the store gets, the bytes each expert costs, the engine."""

    index: object
    io: str
    source: str  # "header" or "model"
    sizes: dict[tuple[int, int], int]  # (layer, expert) -> bytes charged
    keep_recent: int | None
    n_expert_used: int  # the pread engine keeps room for one token's experts of a layer in every slot size

    def engine(self, budget: int):
        largest = max(self.sizes.values())
        if self.io == "mmap":
            return NullEngine(largest)
        # as Model._store sizes the pread pool
        return NullSlotEngine(slot_plan(list(self.sizes.values()), budget, self.n_expert_used), largest)


def setup(
    trace: Trace,
    io: str = "mmap",
    sizes: str = "auto",
    keep_recent: int | str | None = "trace",
    model: Path | None = None,
) -> Setup:
    """keep_recent: "trace" for the header's, None for off, or a number; model: the model file
    (default: the header's)."""
    idx, source = None, "header"
    if sizes in ("auto", "model"):
        idx = model_index(trace, model)
        if idx is None and sizes == "model":
            raise SwapmoeError(
                f"{trace.path}: the model {trace.header.get('model')} is missing or does not match "
                "the trace's expert sizes"
            )
        source = "model" if idx is not None else "header"
    if idx is None:
        idx = HeaderIndex(trace.header["expert_bytes"])
    n_layer = len(trace.header["expert_bytes"])
    charged = {}
    for layer in idx.moe_layers():
        if layer >= n_layer:
            continue
        for e in range(idx.n_expert):
            if idx.part_length[layer, e].any():
                ranges = [(r.file, r.offset, r.length) for r in idx.slice(layer, e)]
                charged[(layer, e)] = slot_need(ranges) if io == "pread" else sum(n for _, _, n in ranges)
    keep = trace.header.get("keep_recent") if keep_recent == "trace" else keep_recent
    return Setup(idx, io, source, charged, keep, max(1, int(trace.header.get("n_expert_used") or 1)))


# --- replays ------------------------------------------------------------------------------------
@dataclass
class Result:
    policy: str
    budget: int
    misses: int | None = None  # None: too small
    bytes_read: int | None = None
    requests: int = 0
    note: str = ""
    decode_bytes: int | None = None  # of bytes_read, those read while decoding (a bound on decode speed)


def new_policy(trace: Trace, s: Setup, name: str):
    """The store's policy of that name, told the trace's future where it needs it (MIN)."""
    cls = POLICIES[name]
    shape = (s.index.n_layer, s.index.n_expert, s.index.moe_layers())
    return cls(*shape, [(layer, ids) for _, layer, ids in trace.visits]) if cls is MIN else cls(*shape)


def replay(trace: Trace, s: Setup, budget: int, policy: str) -> Result:
    """The real ExpertStore with the named policy, fed the calls Transformer.routed_experts and
    Routing.end_pass make."""
    keep_recent = None if policy == MIN.name else s.keep_recent  # the yardstick: the fewest reads at the budget
    store = ExpertStore(s.index, s.engine(budget), budget, keep_recent, new_policy(trace, s, policy))
    previous, before_decode = None, None
    try:
        for (n, layer, ids), choice in zip(trace.visits, trace.choices):
            if previous is not None and n != previous:
                store.end_pass()
            previous = n
            if before_decode is None and trace.phases.get(n) == "decode":
                before_decode = store.stats.bytes_loaded
            store.start_reads(layer, choice)
            for e in store.ready_first(layer, ids)[0]:
                store.expert(layer, e)
        store.end_pass()
    except SwapmoeError as e:
        return Result(policy, budget, requests=store.stats.requests, note=f"too small: {e}")
    finally:
        store.close()
    loaded = store.stats.bytes_loaded
    return Result(
        policy,
        budget,
        store.stats.misses,
        loaded,
        store.stats.requests,
        decode_bytes=loaded - (loaded if before_decode is None else before_decode),
    )


def largest_visit(trace: Trace, sizes: dict) -> int:
    """Bytes of the largest set of experts one layer visit chose."""
    return max((sum(sizes[(layer, e)] for e in ids) for _, layer, ids in trace.visits), default=0)


# --- budgets and the report -------------------------------------------------------------------
def default_budgets(trace: Trace, s: Setup, fractions=FRACTIONS, mib=None) -> list[int]:
    total = sum(s.sizes.values())
    if mib:
        budgets = [int(round(m * MiB)) for m in mib]
    else:
        budgets = [int(f * total) for f in fractions]
    recorded = trace.header.get("budget_bytes")
    if recorded is not None:
        budgets.append(int(recorded))
    return sorted(set(budgets))


def caveats(trace: Trace, s: Setup) -> list[str]:
    h, out = trace.header, []
    if h.get("prefetch") not in (None, "off"):
        out.append(f"recorded with --expert-prefetch {h['prefetch']}: its prefetches are not replayed")
    if h.get("fixation"):
        out.append(
            f"recorded with --expert-fixation {h['fixation']}: its prefetches of pinned experts are not "
            "replayed (the pinned choices are)"
        )
    if h.get("hash_layers"):
        out.append("hash-routed layers: the store's hash prefetch (on by default) is not replayed")
    return out


def _fmt_budget(budget: int, total: int, recorded: int | None) -> str:
    mark = " *" if budget == recorded else ""
    return f"{budget / MiB:.2f} MiB ({100 * budget / total:.1f} %){mark}"


def report(
    trace: Trace, s: Setup, budgets: list[int], policies: list[str], wide: bool = False, out=None
) -> dict[int, dict[str, Result]]:
    out = out or sys.stdout
    h = trace.header
    total = sum(s.sizes.values())
    recorded = h.get("budget_bytes")
    passes = sorted(trace.phases)
    n_prompt = sum(trace.phases[p] == "prompt" for p in passes)
    results = {b: {p: replay(trace, s, b, p) for p in policies} for b in budgets}
    # MIN's bytes even if not asked for: the ratio needs them
    mins = {b: results[b]["min"] if "min" in policies else replay(trace, s, b, "min") for b in budgets}
    print(f"## {Path(h.get('model', '?')).name} ({h.get('arch')}): {trace.path}", file=out)
    print(
        f"{len(passes)} passes ({n_prompt} prompt, {len(passes) - n_prompt} decode), {len(trace.visits)} layer "
        f"visits, {trace.requests} requests; {len(trace.layers)} MoE layers x {h['n_expert']} experts (top-"
        f"{h['n_expert_used']}), {total / MiB:.2f} MiB of experts; largest layer visit "
        f"{largest_visit(trace, s.sizes) / MiB:.2f} MiB",
        file=out,
    )
    rec = "none" if recorded is None else f"{recorded / MiB:.2f} MiB (marked *)"
    print(
        f"recorded: budget {rec}, keep_recent {h.get('keep_recent') or 'off'}, prefetch {h.get('prefetch')}, "
        f"fixation {h.get('fixation') or 'off'}; replayed: io {s.io}, sizes from the {s.source}, store keep_recent "
        f"{s.keep_recent or 'off'}",
        file=out,
    )
    for w in caveats(trace, s):
        print(f"warning: {w}", file=out)
    print(file=out)

    def ratio(r: Result, b: int) -> str:
        m = mins[b]
        if r.bytes_read is None or m.bytes_read is None:
            return ""
        return f"{r.bytes_read / m.bytes_read:.2f}" if m.bytes_read else "1.00"

    if wide:
        print("| budget | " + " | ".join(p for p in policies if p != "min") + " | min: misses, MiB |", file=out)
        print("|---" + "|---:" * (len([p for p in policies if p != "min"]) + 1) + "|", file=out)
        for b in budgets:
            cells = []
            for p in policies:
                r = results[b][p]
                if p == "min":
                    continue
                cells.append(f"{ratio(r, b) or 'n/a'} ({r.misses})" if r.misses is not None else "too small")
            m = mins[b]
            cells.append(f"{m.misses}, {m.bytes_read / MiB:.1f}" if m.misses is not None else "too small")
            print(f"| {_fmt_budget(b, total, recorded)} | " + " | ".join(cells) + " |", file=out)
        print("\ncells: bytes read ÷ MIN's (misses)", file=out)
    else:
        print("| budget | policy | misses | miss rate | MiB read | ÷ MIN |", file=out)
        print("|---|---|---:|---:|---:|---:|", file=out)
        for b in budgets:
            for p in policies:
                r = results[b][p]
                if r.misses is None:
                    print(f"| {_fmt_budget(b, total, recorded)} | {p} | {r.note} | | | |", file=out)
                    continue
                rate = f"{100 * r.misses / r.requests:.1f} %" if r.requests else ""
                print(
                    f"| {_fmt_budget(b, total, recorded)} | {p} | {r.misses} | {rate} | "
                    f"{r.bytes_read / MiB:.1f} | {ratio(r, b)} |",
                    file=out,
                )
    print(file=out)
    return results


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, not {text!r}") from None


def _keep(text: str):
    if text == "trace":
        return "trace"
    if text in ("off", "none", "0"):
        return None
    return int(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    ap.add_argument("traces", nargs="+", metavar="TRACE")
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--budgets", type=_floats, metavar="MiB,...", help="budgets in MiB (plus the recorded one)")
    group.add_argument(
        "--budget-fractions",
        type=_floats,
        metavar="F,...",
        help=f"budgets as shares of all expert bytes (plus the recorded one); default {','.join(map(str, FRACTIONS))}",
    )
    ap.add_argument("--policies", default=",".join(POLICIES), help=f"some of {','.join(POLICIES)}")
    ap.add_argument(
        "--keep-recent",
        type=_keep,
        default="trace",
        metavar="N|off",
        help="the store's keep-recent (default: the trace's)",
    )
    ap.add_argument("--io", choices=("mmap", "pread"), default="mmap", help="the engine the store is replayed with")
    ap.add_argument(
        "--sizes",
        choices=("auto", "header", "model"),
        default="auto",
        help="expert sizes from the model's index (auto: when the file exists and matches) or the header",
    )
    ap.add_argument(
        "--model", type=Path, metavar="GGUF", help="the model file, if not where the header says (or beside the trace)"
    )
    ap.add_argument("--wide", action="store_true", help="one row per budget, ratios to MIN per policy")
    args = ap.parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        ap.error(f"unknown policies {', '.join(unknown)}; choose from {', '.join(POLICIES)}")
    try:
        for path in args.traces:
            trace = read_trace(path)
            s = setup(trace, args.io, args.sizes, args.keep_recent, args.model)
            budgets = default_budgets(trace, s, args.budget_fractions or FRACTIONS, args.budgets)
            report(trace, s, budgets, policies, args.wide)
    except SwapmoeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
