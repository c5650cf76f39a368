"""The expert store: the one way every architecture reaches its routed experts.

`experts(layer, ids)` returns the weights of those experts of that layer, as views of the
file's bytes. This baseline maps the file and lets the kernel page experts in on demand;
the streaming engines replace how the bytes get into RAM, not this interface.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from swapmoe.errors import SwapmoeError
from swapmoe.gguf_file import GGUFFile, TensorInfo, TensorKind
from swapmoe.runtime.linear import Weight


@dataclass(frozen=True)
class Expert:
    """One expert of one layer: its projections (gate/up or fused gate_up, down) and optional biases."""
    down: Weight
    gate: Weight | None = None
    up: Weight | None = None
    gate_up: Weight | None = None
    biases: dict[str, np.ndarray] = field(default_factory=dict)  # projection -> f32 [rows]


@dataclass
class StoreStats:
    experts_requested: int = 0
    bytes_requested: int = 0


class MappedExpertStore:
    """Experts as slices of the mapped 3-D expert tensors of a GGUF."""

    def __init__(self, gguf: GGUFFile):
        self.gguf = gguf
        self.stats = StoreStats()
        self._tensors: dict[tuple[int, str, str], TensorInfo] = {}
        for t in gguf.tensors_of_kind(TensorKind.ROUTED_EXPERT):
            self._tensors[(t.layer, t.cls.projection, t.cls.part)] = t
        self.layers = sorted({layer for layer, _, _ in self._tensors})
        self._cache: dict[tuple[int, int], Expert] = {}

    def _slice(self, t: TensorInfo, expert: int) -> np.ndarray:
        return self.gguf.raw(t.name)[expert * t.expert_nbytes:(expert + 1) * t.expert_nbytes]

    def _expert(self, layer: int, expert: int) -> Expert:
        weights, biases = {}, {}
        for projection in ("gate", "up", "down", "gate_up"):
            t = self._tensors.get((layer, projection, "weight"))
            if t is not None:
                if not 0 <= expert < t.n_experts:
                    raise SwapmoeError(f"{self.gguf.path}: expert {expert} out of range for {t.name}")
                weights[projection] = Weight(self._slice(t, expert), t.ggml_type, t.ne[1], t.ne[0])
            b = self._tensors.get((layer, projection, "bias"))
            if b is not None:
                biases[projection] = self._slice(b, expert).view(np.float32)
        if "down" not in weights:
            raise SwapmoeError(f"{self.gguf.path}: layer {layer} has no ffn_down_exps tensor")
        return Expert(biases=biases, **weights)

    def experts(self, layer: int, ids) -> list[Expert]:
        out = []
        for e in ids:
            key = (layer, int(e))
            if key not in self._cache:
                self._cache[key] = self._expert(layer, int(e))
            expert = self._cache[key]
            self.stats.experts_requested += 1
            self.stats.bytes_requested += sum(w.raw.nbytes for w in (expert.gate, expert.up, expert.down,
                                                                      expert.gate_up) if w is not None)
            out.append(expert)
        return out
