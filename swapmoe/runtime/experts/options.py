"""Expert-streaming options (flags, environment variables, API keywords) and the defaults
that fit the machine.

Every option has the same name in three places: `--expert-cache-size` on the command line,
`SWAPMOE_EXPERT_CACHE_SIZE` in the environment, `expert_cache_size=` in `swapmoe.load`.
Anything left unset is chosen by `plan()` from the memory this process may use.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields

from swapmoe.errors import SwapmoeError
from swapmoe.runtime.experts.io import ENGINE_NAMES

PREFETCH_MODES = ("off", "previous", "lookahead", "both")
IO_ENGINES = ("auto", *ENGINE_NAMES)
WORKING_BYTES = 384 << 20  # interpreter, numba, activations and scratch: measured ~250 MB, with margin
SAFETY = 0.9  # use at most this share of the memory we may use


@dataclass
class StreamingOptions:
    io: str = "auto"  # auto | mmap | pread
    expert_streaming: bool | None = None  # None: on when the experts do not fit, or the file is repacked
    expert_cache_size: int | None = None  # MiB of resident experts; None: what fits
    expert_keep_recent: int | None = None  # per-layer LRU length; None: off
    expert_fixation: int = 0  # passes per fixation window; 0: off
    expert_prefetch: str = "off"  # off | previous | lookahead | both
    expert_hash_prefetch: bool = True  # hash-routed layers: read their experts as soon as the token is known

    @classmethod
    def from_env(cls, **given) -> "StreamingOptions":
        """Options from keywords, falling back to SWAPMOE_* environment variables."""
        values = {}
        for f in fields(cls):
            value = given.get(f.name)
            env = os.environ.get("SWAPMOE_" + f.name.upper())
            if value is None and env not in (None, ""):
                value = env
            if value is not None:
                values[f.name] = _parse(f.name, value)
        return cls(**values)

    def __post_init__(self):
        for name in ("expert_cache_size", "expert_keep_recent"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise SwapmoeError(f"{name.replace('_', '-')} must be at least 1")
        if self.expert_fixation < 0:
            raise SwapmoeError("expert-fixation must be 0 (off) or more")
        if self.io not in IO_ENGINES:
            raise SwapmoeError(f"io must be one of {', '.join(IO_ENGINES)}")
        if self.expert_prefetch not in PREFETCH_MODES:
            raise SwapmoeError(f"expert-prefetch must be one of {', '.join(PREFETCH_MODES)}")


def _parse(name: str, value):
    if name in ("expert_streaming", "expert_hash_prefetch"):
        if isinstance(value, bool):
            return value
        text = str(value).lower()
        if text in ("1", "true", "on", "yes"):
            return True
        if text in ("0", "false", "off", "no"):
            return False
        raise SwapmoeError(f"SWAPMOE_{name.upper()} must be on or off, not {value!r}")
    if name == "expert_prefetch":
        if value is True:
            return "both"
        if value is False:
            return "off"
        return str(value).lower()
    if name == "io":
        return str(value).lower()
    try:
        return int(value)
    except (TypeError, ValueError):
        raise SwapmoeError(f"{name.replace('_', '-')} must be a whole number, not {value!r}") from None


@dataclass
class StreamingPlan:
    """What the store will do, and why (printed by `swapmoe run --stats`)."""

    streaming: bool
    engine: str
    budget_bytes: int | None
    keep_recent: int | None
    fixation: int
    prefetch: str
    hash_prefetch: bool
    reasons: list[str] = field(default_factory=list)


def plan(
    options: StreamingOptions,
    expert_bytes: int,
    nonexpert_bytes: int,
    kv_bytes: int,
    min_cache_bytes: int,
    repacked: bool,
    available: tuple[int, str],
) -> StreamingPlan:
    """Turn options (set or unset) into a concrete configuration for this machine and model."""
    memory, source = available
    usable = int(memory * SAFETY) - nonexpert_bytes - kv_bytes - WORKING_BYTES
    fits = expert_bytes <= usable
    reasons = [
        f"memory: {memory / 2**30:.2f} GiB from {source}; after non-expert weights "
        f"({nonexpert_bytes / 2**30:.2f} GiB), KV cache ({kv_bytes / 2**20:.0f} MiB) and working memory, "
        f"{max(usable, 0) / 2**30:.2f} GiB is left for experts ({expert_bytes / 2**30:.2f} GiB in the file)"
    ]
    streaming = options.expert_streaming
    if streaming is None:
        streaming = repacked or not fits or options.expert_cache_size is not None
        reasons.append(
            f"streaming {'on' if streaming else 'off'}: "
            + (
                "the file is repacked"
                if repacked
                else "an expert cache size was given"
                if options.expert_cache_size is not None
                else "the experts fit in RAM"
                if fits
                else "the experts do not fit in RAM"
            )
        )
    budget = None
    if options.expert_cache_size is not None:
        budget = options.expert_cache_size << 20
        reasons.append(f"expert cache {options.expert_cache_size} MiB as asked")
    elif streaming and not fits:
        budget = max(usable, min_cache_bytes)
        reasons.append(f"expert cache {budget / 2**20:.0f} MiB: what is left")
    if budget is not None and budget < min_cache_bytes:
        reasons.append(
            f"expert cache raised from {budget / 2**20:.0f} to {min_cache_bytes / 2**20:.0f} MiB: "
            "one layer's chosen experts must fit"
        )
        budget = min_cache_bytes
    engine = options.io
    if engine == "auto":
        engine = "pread" if streaming and budget is not None and budget < expert_bytes else "mmap"
        reasons.append(
            f"io {engine}: "
            + (
                "explicit reads into owned buffers beat page faults when experts are evicted and re-read"
                if engine == "pread"
                else "everything that is read stays resident, so the page cache is enough"
            )
        )
    return StreamingPlan(
        streaming,
        engine,
        budget,
        options.expert_keep_recent,
        options.expert_fixation,
        options.expert_prefetch,
        options.expert_hash_prefetch,
        reasons,
    )
