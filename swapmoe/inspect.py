"""What a GGUF holds, from swapmoe's point of view: how much is routed experts, how big one
expert slice is, how much RAM the rest needs, and whether slices are page-aligned."""
from __future__ import annotations

from collections import defaultdict
from typing import Any

from swapmoe.gguf_file import GGUFFile, TensorKind


def summarize(g: GGUFFile, page_size: int = 16384) -> dict[str, Any]:
    routed = g.tensors_of_kind(TensorKind.ROUTED_EXPERT)
    slice_bytes: dict[int, int] = defaultdict(int)
    n_experts: dict[int, int] = {}
    aligned = total = 0
    for t in routed:
        slice_bytes[t.layer] += t.expert_nbytes
        n_experts[t.layer] = t.n_experts
        for e in range(t.n_experts):
            total += 1
            aligned += (t.offset + e * t.expert_nbytes) % page_size == 0
    routed_bytes = sum(t.nbytes for t in routed)
    tensor_bytes = sum(t.nbytes for t in g.tensors.values())
    hash_layers = sorted(t.layer for t in g.tensors_of_kind(TensorKind.HASH_TABLE))
    return {
        "file": str(g.path),
        "shards": len(g.shards),
        "file_bytes": g.total_size,
        "arch": g.arch,
        "layers": g.arch_get("block_count"),
        "moe_layers": len(slice_bytes),
        "experts": g.arch_get("expert_count"),
        "experts_used": g.arch_get("expert_used_count"),
        "expert_slice_bytes": {str(layer): slice_bytes[layer] for layer in sorted(slice_bytes)},
        "routed_expert_bytes": routed_bytes,
        "routed_expert_share": routed_bytes / tensor_bytes if tensor_bytes else 0.0,
        "nonexpert_bytes": tensor_bytes - routed_bytes,
        "tensor_types": sorted({t.ggml_type.name for t in g.tensors.values()}),
        "page_size": page_size,
        "expert_slices": total,
        "expert_slice_parts_page_aligned": aligned,
        "hash_layers": hash_layers,
        "swapmoe_layout": g.get("swapmoe.layout"),
    }


def _mb(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB" if n < 2**30 else f"{n / 2**30:,.2f} GiB"


def format_summary(s: dict[str, Any]) -> str:
    slices = s["expert_slice_bytes"]
    sizes = sorted(set(slices.values()))
    slice_text = ", ".join(_mb(v) for v in sizes) if sizes else "none"
    lines = [
        f"file            {s['file']} ({s['shards']} shard{'s' if s['shards'] > 1 else ''}, {_mb(s['file_bytes'])})",
        f"architecture    {s['arch']}, {s['layers']} layers ({s['moe_layers']} with routed experts)",
        f"experts         {s['experts']} per layer, {s['experts_used']} used per token",
        f"expert slice    {slice_text} (one expert of one layer, all projections)",
        f"routed experts  {_mb(s['routed_expert_bytes'])} = {s['routed_expert_share']:.1%} of tensor data",
        f"non-expert RAM  {_mb(s['nonexpert_bytes'])} (loaded at start)",
        f"per token       {_mb(sum(slices.values()) * (s['experts_used'] or 0))} of experts read if none is cached",
        f"tensor types    {', '.join(s['tensor_types'])}",
        f"alignment       {s['expert_slice_parts_page_aligned']} of {s['expert_slices']} expert slice parts start on a "
        f"{s['page_size'] // 1024} KiB page",
        f"hash layers     {', '.join(map(str, s['hash_layers'])) or 'none'}",
        f"layout          {s['swapmoe_layout'] or 'original (not repacked)'}",
    ]
    return "\n".join(lines)
