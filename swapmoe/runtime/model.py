"""`swapmoe.load(path)`: a GGUF MoE model ready to score and generate text."""

from __future__ import annotations

import dataclasses
import json
import mmap
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numba
import numpy as np
from gguf import Keys

from swapmoe.errors import SwapmoeError, keyword_options
from swapmoe.gguf_file import GGUFFile, open_gguf
from swapmoe.memcap import available_memory
from swapmoe.repack import index as expert_index
from swapmoe.runtime import kernels
from swapmoe.runtime.experts import options as streaming_options
from swapmoe.runtime.experts.io import MmapEngine, PreadEngine, slot_need, slot_plan
from swapmoe.runtime.experts.store import ExpertStore, StoreSummary
from swapmoe.runtime.models import ARCHITECTURES
from swapmoe.runtime.routing import Routing, RoutingPolicy
from swapmoe.runtime.sampling import Sampler, Sampling
from swapmoe.runtime.together import forward_together
from swapmoe.runtime.tokenizer import Tokenizer

BATCH = 256  # prompt tokens per forward pass: each expert is read once per batch


@dataclass
class Stats:
    """What the last logits() or generate() call did: tokens and seconds of each phase, and the
    expert store's counters over the call (`as_dict()` for the dict form)."""

    prompt_tokens: int = 0  # prompt tokens processed (not those a Conversation already held)
    cached_tokens: int = 0  # prompt tokens a Conversation's cache already held
    prompt_seconds: float = 0.0
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    requests: int = 0  # experts asked of the store
    hits: int = 0  # ... found resident
    misses: int = 0  # ... read from storage
    prefetch_issued: int = 0
    prefetch_used: int = 0
    bytes_read: int = 0  # expert bytes the store read
    evictions: int = 0
    wait_seconds: float = 0.0  # time spent waiting for expert reads
    major_faults: int = 0
    storage_read_bytes: int = 0  # bytes this process read from storage (/proc/self/io), experts or not
    resident_expert_bytes: int = 0
    peak_resident_expert_bytes: int = 0
    engine: str = ""
    decode_layers: dict = dataclasses.field(default_factory=dict)  # layer -> (hits, requests) while decoding

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class Conversation:
    """Caches kept between generate_ids calls: the tokens they hold and the per-layer caches. A
    call given the same Conversation processes only the tokens after the longest prefix its
    prompt shares with `tokens`. Attention caches are cut back to that prefix; recurrent states
    cannot be, so they are copied at the end of each prompt (`checkpoint`: the token count and
    the copies) and a prompt that leaves the held tokens after that point restarts from there.
    A cache that can do neither (DeepSeek-V4's compressed rows) is rebuilt from the start."""

    tokens: list[int] = dataclasses.field(default_factory=list)
    cache: list | None = None
    checkpoint: tuple[int, list] | None = None


@dataclass
class Sequence:
    """One generation in progress (Model.start, then Model.advance until `finished`): `token` is
    its newest token, sampled from `logits` and not yet fed back; None when the sample was an
    end-of-generation token. `finished`: "stop" (such a token) or "length" (max_tokens reached,
    `token` being the last); None while more may come."""

    conversation: Conversation
    routing: Routing  # its own routing state
    sampler: Sampler
    stop: set
    max_tokens: int
    history: list[int]  # prompt and generated tokens, for the repetition penalties
    token: int | None = None
    logits: np.ndarray | None = None
    finished: str | None = None
    generated: int = 0
    prompt_tokens: int = 0  # prompt tokens processed (not those the conversation already held)
    cached_tokens: int = 0  # prompt tokens the conversation already held
    prompt_seconds: float = 0.0


class Model:
    """A loaded model. `stats` (a Stats) describes the last call of logits() or generate();
    `step_logits` holds the logits the token generate_ids yielded last was sampled from."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        ctx: int | None = None,
        threads: int | None = None,
        override_kv: dict[str, Any] | list[str] | None = None,
        trace: str | os.PathLike | None = None,
        parallel: int = 1,
        kv_tokens: int | None = None,
        streaming: streaming_options.StreamingOptions,
    ):
        """The options of load(), the expert-streaming ones gathered in `streaming`."""
        self.options = streaming
        self.path = Path(path)
        self.gguf = open_gguf(self.path)
        if override_kv:
            self.gguf.override(override_kv if isinstance(override_kv, dict) else parse_overrides(override_kv))
        arch = self.gguf.arch
        if arch not in ARCHITECTURES:
            raise SwapmoeError(
                f"{self.path}: architecture {arch} is not supported yet (supported: {', '.join(sorted(ARCHITECTURES))})"
            )
        if threads:
            numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        self.index = _index_for(self.gguf)
        _require_expert_kernels(self.index, self.path)
        self.hparams = ARCHITECTURES[arch].hparams(self.gguf)
        self._resident = self.index.resident_tensors(self.hparams.n_layer)  # what stays in RAM
        self.n_ctx = ctx or min(int(self.gguf.arch_get(Keys.LLM.CONTEXT_LENGTH) or 4096), 4096)
        self.parallel = parallel
        # a one-shot run knows it holds at most prompt + generated tokens: the memory plan reserves
        # KV cache for those only (the caches fill pages as positions are written), and the RAM
        # the rest of the context would have taken goes to experts
        self.kv_tokens = min(self.n_ctx, kv_tokens) if kv_tokens else self.n_ctx
        self.plan = self._plan()
        if self.plan.streaming:
            self._load_nonexpert()
        self.store = self._store()
        self.net = ARCHITECTURES[arch](self.gguf, self.store, self.hparams)
        self.routing_policy = RoutingPolicy(  # what the plan asks for; every sequence has its own Routing
            fixation=self.plan.fixation,
            prefetch_previous=self.plan.prefetch in ("previous", "both"),
            lookahead=self.plan.prefetch in ("lookahead", "both"),
            hash_prefetch=self.plan.hash_prefetch,
        )
        if not self.plan.streaming:
            self.store.preload()
        self.trace = RoutingTrace(trace, self) if trace is not None else None
        self.tokenizer = Tokenizer.from_gguf(self.gguf)
        self.stats = Stats()

    def _plan(self) -> streaming_options.StreamingPlan:
        """What the forward pass reads, fitted to the memory: the experts of layers past n_layer (a
        multi-token-prediction block) and that block's other tensors are not counted."""
        idx, n_layer = self.index, self.hparams.n_layer
        per_expert = idx.part_length[:n_layer].sum(axis=2)  # [layer, expert]
        nonexpert_bytes = sum(t.length for t in self._resident)
        kv = ARCHITECTURES[self.gguf.arch].cache_bytes(self.gguf, self.hparams, self.kv_tokens) * self.parallel
        min_cache = int(per_expert.max(initial=0)) * max(idx.n_expert_used, self.hparams.n_expert_used, 1) * 2
        return streaming_options.plan(
            self.options,
            int(per_expert.sum()),
            nonexpert_bytes,
            kv,
            min_cache,
            repacked=idx.layout != "original",
            available=available_memory(),
        )

    def _load_nonexpert(self) -> None:
        """Read the non-expert tensors the forward pass uses by exact ranges, once, and turn
        readahead off for the rest of the map, so that touching them never drags expert bytes (or a
        multi-token-prediction block's tensors) into the page cache."""
        for shard in range(len(self.gguf.shards)):
            self.gguf.advise(mmap.MADV_RANDOM, shard)
        for t in self._resident:
            self.gguf.advise(mmap.MADV_WILLNEED, t.file, t.offset, t.length)

    def _store(self) -> ExpertStore:
        idx, plan = self.index, self.plan
        paths = idx.paths or [shard.path for shard in self.gguf.shards]
        if plan.engine == "pread":
            needs = [
                slot_need([(r.file, r.offset, r.length) for r in idx.slice(layer, e)])
                for layer in idx.moe_layers()
                if layer < self.hparams.n_layer
                for e in range(idx.n_expert)
            ]
            least = max(idx.n_expert_used, self.hparams.n_expert_used, 1)  # one token's experts of a layer
            engine = PreadEngine(paths, slot_plan(needs, plan.budget_bytes, least))
        else:
            engine = MmapEngine(paths, expert_regions(idx) if plan.streaming else None)
        return ExpertStore(idx, engine, plan.budget_bytes, plan.keep_recent)

    def close(self) -> None:
        """Stop the expert reads, unmap and close the files, finish the routing trace. The model
        cannot be used after; `with swapmoe.load(...) as model:` closes it at the end."""
        self.store.close()
        if self.trace is not None:
            self.trace.close()

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- text <-> tokens -------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_special=add_special)

    def detokenize(self, ids) -> str:
        return self.tokenizer.decode(list(ids))

    def check_prompt_length(self, text: str) -> None:
        """Refuse, before tokenizing it, a text too long for the context: no token stands for more
        characters than the longest token's text, so n_ctx tokens hold at most n_ctx times that."""
        most = self.n_ctx * max(map(len, self.tokenizer.tokens))
        if len(text) > most:
            raise SwapmoeError(
                f"the prompt is {len(text):,} characters; a context of {self.n_ctx} tokens holds at "
                f"most {most:,} characters of text for this model (use a larger --ctx or a shorter "
                "prompt)"
            )

    # --- scoring and generation -------------------------------------------------------------
    def _check_ids(self, ids: np.ndarray) -> None:
        if ids.size and (ids.min() < 0 or ids.max() >= self.net.n_vocab):
            raise SwapmoeError(f"token id out of range 0..{self.net.n_vocab - 1}")

    def new_routing(self) -> Routing:
        """A sequence's own routing state under the model's policies."""
        return Routing(self.store, self.routing_policy, self.trace)

    def _prefill(self, ids: np.ndarray, cache, all_logits: bool, routing: Routing) -> np.ndarray:
        routing.expect(ids)  # every hash-routed layer's experts for the whole prompt are known now
        outs = [self.net.forward(ids[i : i + BATCH], cache, routing, all_logits) for i in range(0, len(ids), BATCH)]
        return np.concatenate(outs) if all_logits else outs[-1]

    def _start_stats(self) -> None:
        self.stats = Stats()
        self._store_before = self.store.summary()
        self._io_before = _proc_read_bytes()

    def _finish_stats(self) -> None:
        now, before, s = self.store.summary(), self._store_before, self.stats
        for key in (
            "requests",
            "hits",
            "misses",
            "prefetch_issued",
            "prefetch_used",
            "evictions",
            "wait_seconds",
            "major_faults",
        ):
            setattr(s, key, getattr(now, key) - getattr(before, key))
        s.bytes_read = now.bytes_loaded - before.bytes_loaded
        s.storage_read_bytes = _proc_read_bytes() - self._io_before
        s.resident_expert_bytes = now.resident_bytes
        s.peak_resident_expert_bytes = now.peak_resident_bytes
        s.engine = now.engine

    def logits(self, token_ids) -> np.ndarray:
        """float32 [n_tokens, n_vocab]: the logits after every position, in a fresh context."""
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        self._check_ids(ids)
        if len(ids) > self.n_ctx:
            raise SwapmoeError(f"{len(ids)} tokens exceed the context of {self.n_ctx}")
        self._start_stats()
        start = time.perf_counter()
        out = self._prefill(ids, self.net.new_cache(len(ids)), True, self.new_routing())
        self.stats.prompt_tokens, self.stats.prompt_seconds = len(ids), time.perf_counter() - start
        self._finish_stats()
        return out

    def start(
        self,
        prompt_ids: list[int],
        max_tokens: int = 128,
        ignore_eos: bool = False,
        conversation: Conversation | None = None,
        **sampling,
    ) -> Sequence:
        """Process a prompt and sample the first token of its continuation: a Sequence that
        `advance` takes further, alone or with others. Sampling options: see Sampling (default
        greedy). conversation: reuse (and keep) its caches for the prompt's prefix it already holds."""
        ids = np.asarray(prompt_ids, dtype=np.int64).reshape(-1)
        self._check_ids(ids)
        if not ids.size:
            raise SwapmoeError("empty prompt")
        if len(ids) + max_tokens > self.n_ctx:
            raise SwapmoeError(
                f"prompt ({len(ids)} tokens) + {max_tokens} new tokens exceed the context of "
                f"{self.n_ctx}; use a larger --ctx or fewer tokens"
            )
        kept = conversation is not None
        if kept:
            reused = self._reuse(conversation, ids)
        else:
            conversation, reused = Conversation(cache=self.net.new_cache(len(ids) + max_tokens)), 0
        seq = Sequence(
            conversation,
            self.new_routing(),
            Sampler(Sampling(**sampling)),
            set() if ignore_eos else set(self.tokenizer.eot_ids),
            max_tokens,
            ids.tolist(),
            prompt_tokens=len(ids) - reused,
            cached_tokens=reused,
        )
        started = time.perf_counter()
        logits = self._prefill(ids[reused:], conversation.cache, False, seq.routing)[-1]
        conversation.tokens.extend(ids[reused:].tolist())
        if kept:
            self._checkpoint(conversation)
        seq.prompt_seconds = time.perf_counter() - started
        if max_tokens:
            self._sample(seq, logits)
        else:
            seq.finished = "length"
        return seq

    def advance(self, sequences: list[Sequence]) -> None:
        """Feed each unfinished sequence its newest token and sample the next: one decoding pass
        for all of them together (together.forward_together: one product per weight, each
        expert read once)."""
        live = [s for s in sequences if s.token is not None and s.finished is None]
        if not live:
            return
        logits = forward_together(
            self.net, [s.token for s in live], [s.conversation.cache for s in live], [s.routing for s in live]
        )
        for seq, row in zip(live, logits):
            seq.conversation.tokens.append(seq.token)
            self._sample(seq, row)

    def _sample(self, seq: Sequence, logits: np.ndarray) -> None:
        seq.logits = logits
        token = seq.sampler(logits, seq.history)
        if token in seq.stop:
            seq.token, seq.finished = None, "stop"
            return
        seq.token = token
        seq.history.append(token)
        seq.generated += 1
        if seq.generated == seq.max_tokens:
            seq.finished = "length"
        else:
            seq.routing.expect(np.array([token]))  # its hash-routed layers' experts: read now

    def generate_ids(
        self,
        prompt_ids: list[int],
        max_tokens: int = 128,
        ignore_eos: bool = False,
        conversation: Conversation | None = None,
        **sampling,
    ) -> Iterator[int]:
        """Yield the ids of the continuation of `prompt_ids`: one batched prompt pass, then one
        forward pass per new token. Sampling options: see Sampling (default greedy).
        conversation: reuse (and keep) its caches for the prompt's prefix it already holds."""
        self._start_stats()
        seq = self.start(prompt_ids, max_tokens, ignore_eos, conversation, **sampling)
        self.stats.prompt_tokens, self.stats.cached_tokens = seq.prompt_tokens, seq.cached_tokens
        self.stats.prompt_seconds = seq.prompt_seconds
        started = time.perf_counter()
        decode_before = self.store.summary()
        try:
            while seq.token is not None:
                self.step_logits = seq.logits
                self.stats.decode_tokens += 1
                yield seq.token
                if seq.finished:
                    break
                self.advance([seq])
        finally:
            self.stats.decode_seconds = time.perf_counter() - started
            self._finish_stats()
            self.stats.decode_layers = _layer_counts(decode_before, self.store.summary())

    def _reuse(self, conversation: Conversation, ids: np.ndarray) -> int:
        """How many of the prompt's tokens the conversation's caches already hold (cut back to the
        shared prefix, leaving at least one token to process), after making them ready for the rest."""
        held, prompt = conversation.tokens, ids.tolist()
        shared = min(shared_prefix(held, prompt), len(prompt) - 1)
        cache, checkpoint = conversation.cache, conversation.checkpoint
        if cache is not None and not all(c.trim(shared) for c in cache):
            if checkpoint is not None and checkpoint[0] <= shared:  # back to the end of the last prompt
                shared = checkpoint[0]
                for c, saved in zip(cache, checkpoint[1]):
                    c.restore(saved)
            if checkpoint is None or not all(c.trim(shared) for c in cache):
                cache = None
        if cache is None:
            conversation.cache, conversation.checkpoint = self.net.new_cache(self.n_ctx), None
            held.clear()
            return 0
        del held[shared:]
        return shared

    @staticmethod
    def _checkpoint(conversation: Conversation) -> None:
        """At the end of a prompt (a turn boundary), copy what the caches could not trim back to
        (recurrent states), for _reuse; nothing where trimming reaches every earlier point."""
        saved = [c.checkpoint() for c in conversation.cache]
        if any(snapshot is not None for snapshot in saved):
            conversation.checkpoint = (len(conversation.tokens), saved)

    def generate(
        self, prompt: str | list[int], max_tokens: int = 128, ignore_eos: bool = False, **sampling
    ) -> Iterator[str]:
        """Yield text pieces of the continuation of `prompt` (text, or token ids); pieces are
        always whole UTF-8 characters."""
        ids = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        decoder = self.tokenizer.decoder()
        for token in self.generate_ids(ids, max_tokens, ignore_eos, **sampling):
            piece = decoder.push(token)
            if piece:
                yield piece
        tail = decoder.flush()
        if tail:
            yield tail


def _layer_counts(before: StoreSummary, now: StoreSummary) -> dict[int, tuple[int, int]]:
    """layer -> (hits, requests) between two store summaries."""
    counts = {}
    for layer in set(now.hits_per_layer) | set(now.misses_per_layer):
        hits = now.hits_per_layer.get(layer, 0) - before.hits_per_layer.get(layer, 0)
        misses = now.misses_per_layer.get(layer, 0) - before.misses_per_layer.get(layer, 0)
        if hits + misses:
            counts[int(layer)] = (hits, hits + misses)
    return dict(sorted(counts.items()))


class RoutingTrace:
    """Every layer's expert choice, as JSON lines: a header (the model, expert sizes, the plan),
    then one line per forward pass and MoE layer: {"pass", "phase" ("prompt"/"decode"), "layer",
    "ids": [[k ids] per token], "hash": chosen by the hash table}. tools/replay_trace.py replays
    them through the expert store's policies without computing anything."""

    VERSION = 1

    def __init__(self, path: str | os.PathLike, model: "Model"):
        idx, plan = model.index, model.plan
        self.file = open(path, "w", encoding="utf-8")
        self.passes = 0
        header = {
            "format": "swapmoe-trace",
            "version": self.VERSION,
            "model": str(model.path),
            "arch": model.gguf.arch,
            "n_layer": model.hparams.n_layer,
            "n_expert": idx.n_expert,
            "n_expert_used": model.hparams.n_expert_used,
            "expert_bytes": idx.part_length[: model.hparams.n_layer].sum(axis=2).tolist(),
            "budget_bytes": plan.budget_bytes,
            "keep_recent": plan.keep_recent,
            "fixation": plan.fixation,
            "prefetch": plan.prefetch,
            "hash_layers": idx.hash_layers(),
        }
        self.file.write(json.dumps(header) + "\n")

    def new_pass(self) -> int:
        """The number of a forward pass that begins (1, 2, ...)."""
        self.passes += 1
        return self.passes

    def __call__(self, pass_: int, decoding: bool, layer: int, ids: np.ndarray, hashed: bool) -> None:
        line = {
            "pass": pass_,
            "phase": "decode" if decoding else "prompt",
            "layer": layer,
            "ids": ids.tolist(),
            "hash": hashed,
        }
        self.file.write(json.dumps(line) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def shared_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens a and b have in common."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def parse_overrides(specs: list[str]) -> dict[str, Any]:
    """llama.cpp's --override-kv KEY=TYPE:VALUE strings (TYPE int, float, bool or str) as a dict."""
    out = {}
    for spec in specs:
        key, _, typed = spec.partition("=")
        kind, _, value = typed.partition(":")
        try:
            if not key or not _ or kind not in ("int", "float", "bool", "str"):
                raise ValueError
            if kind == "bool":
                if value not in ("true", "false"):
                    raise ValueError
                out[key] = value == "true"
            else:
                out[key] = {"int": int, "float": float, "str": str}[kind](value)
        except ValueError:
            raise SwapmoeError(
                f"--override-kv {spec!r}: expected KEY=TYPE:VALUE with TYPE int, float, bool "
                "(true/false) or str, e.g. qwen3moe.expert_used_count=int:10"
            ) from None
    return out


def _proc_read_bytes() -> int:
    """Bytes this process caused to be read from storage (/proc/self/io), or 0 where unavailable."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _index_for(g: GGUFFile):
    """The sidecar index beside the file, or one built in memory for a plain GGUF."""
    if expert_index.sidecar_path(g.path).exists():
        return expert_index.load(g.path)
    if g.get("swapmoe.layout") == "bundled":
        raise SwapmoeError(
            f"{g.path}: repacked file without its index {expert_index.sidecar_path(g.path).name}; "
            "copy the sidecar next to it"
        )
    idx = expert_index.build(g)
    idx.paths = [shard.path for shard in g.shards]
    return idx


def _require_expert_kernels(idx, path: Path) -> None:
    """Every routed part's type has a kernel (the other tensors are checked as the network is
    built): a SwapmoeError naming the tensor otherwise."""
    for layer in idx.moe_layers():
        for p, part in enumerate(idx.parts):
            if idx.part_type[layer, p] >= 0:
                projection, _, kind = part.partition(".")
                tensor = f"blk.{layer}.ffn_{projection}_exps.{kind or 'weight'}"
                kernels.require_kernel(idx.part_type[layer, p], f"{path}: tensor {tensor}")


def expert_regions(idx) -> list[tuple[int, int, int]]:
    """(file, offset, length) of each routed tensor's whole extent: where readahead must be off."""
    lengths = idx.part_length
    regions = []
    for layer, p in zip(*np.nonzero(lengths.any(axis=1))):
        present = lengths[layer, :, p] > 0
        starts = idx.part_offset[layer, present, p]
        ends = starts + lengths[layer, present, p]
        regions.append((int(idx.part_file[layer, present, p][0]), int(starts.min()), int(ends.max() - starts.min())))
    return regions


@keyword_options
def load(
    path: str | os.PathLike,
    *,
    ctx: int | None = None,
    threads: int | None = None,
    override_kv: dict[str, Any] | list[str] | None = None,
    trace: str | os.PathLike | None = None,
    parallel: int = 1,
    kv_tokens: int | None = None,
    io: str | None = None,
    expert_streaming: bool | None = None,
    expert_cache_size: int | None = None,
    expert_keep_recent: int | None = None,
    expert_fixation: int | None = None,
    expert_prefetch: str | None = None,
    expert_hash_prefetch: bool | None = None,
) -> Model:
    """Open a GGUF MoE model for inference.

    ctx: context length (default: the model's, at most 4096). threads: numba threads.
    override_kv: metadata values to use instead of the file's (a dict, or llama.cpp's
    "KEY=TYPE:VALUE" strings). trace: a file for every layer's expert choice as JSON lines
    (RoutingTrace). parallel: sequences that will decode together, each with a context's caches
    (the memory plan reserves them). kv_tokens: the most tokens a sequence will hold, when fewer
    than the context: the plan reserves KV cache for these only and gives the rest to experts
    (`swapmoe run` without --chat passes its prompt's bytes plus -n).

    Expert streaming (docs/cli.md; unset ones come from SWAPMOE_* environment variables, else
    from what fits this machine): io ("auto", "mmap", "pread"), expert_streaming,
    expert_cache_size (MiB), expert_keep_recent, expert_fixation, expert_prefetch ("off",
    "previous", "lookahead", "both"), expert_hash_prefetch (read hash-routed layers' experts as
    soon as a token is known; on).

    A keyword it does not take is a SwapmoeError naming the closest one it does."""
    streaming = streaming_options.StreamingOptions.from_env(
        io=io,
        expert_streaming=expert_streaming,
        expert_cache_size=expert_cache_size,
        expert_keep_recent=expert_keep_recent,
        expert_fixation=expert_fixation,
        expert_prefetch=expert_prefetch,
        expert_hash_prefetch=expert_hash_prefetch,
    )
    return Model(
        path,
        ctx=ctx,
        threads=threads,
        override_kv=override_kv,
        trace=trace,
        parallel=parallel,
        kv_tokens=kv_tokens,
        streaming=streaming,
    )
