"""What a GGUF holds, from swapmoe's point of view: how much is routed experts, how big one
expert slice is, how much RAM the rest needs, and whether slices are page-aligned.

Expert facts come from the sidecar index when one is beside the file and matches it, and
otherwise from an index built in memory from the tensor table (no tensor bytes are read),
so repacked files, whose expert tensors are renamed per expert, are described alike.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, Keys

from swapmoe.errors import SwapmoeError
from swapmoe.gguf_file import GGUFFile, TensorKind


def _index(g: GGUFFile, page_size: int):
    """(index, where it came from) or (None, reason) for a file without routed experts."""
    from swapmoe.repack.index import build, load, sidecar_path

    note = "built from the tensor table (no sidecar)"
    if sidecar_path(g.path).exists():
        try:
            return load(g.path), str(sidecar_path(g.path))
        except SwapmoeError as e:
            note = f"built from the tensor table (sidecar not used: {e})"
    if not g.tensors_of_kind(TensorKind.ROUTED_EXPERT) and g.get("swapmoe.layout") is None:
        return None, "no routed experts"
    return build(g, page_size=page_size), note


def summarize(g: GGUFFile, page_size: int = 16384) -> dict[str, Any]:
    from swapmoe.repack.index import FLAG_CONTIGUOUS, FLAG_PAGE_ALIGNED, FLAG_SHARES_PAGE

    index, source = _index(g, page_size)
    tensor_bytes = sum(t.nbytes for t in g.tensors.values())
    n_mtp = int(g.arch_get(Keys.LLM.NEXTN_PREDICT_LAYERS, 0) or 0)
    n_layer = (g.arch_get(Keys.LLM.BLOCK_COUNT) or 0) - n_mtp
    summary: dict[str, Any] = {
        "file": str(g.path),
        "shards": len(g.shards),
        "file_bytes": g.total_size,
        "arch": g.arch,
        "layers": n_layer,
        "mtp_layers": list(range(n_layer, n_layer + n_mtp)),
        "experts": g.arch_get(Keys.LLM.EXPERT_COUNT),
        "experts_used": g.arch_get(Keys.LLM.EXPERT_USED_COUNT),
        "index": source,
        "swapmoe_layout": g.get("swapmoe.layout"),
    }
    if index is None:
        return summary | {
            "moe_layers": 0,
            "expert_slice_bytes": {},
            "routed_expert_bytes": 0,
            "mtp_expert_bytes": 0,
            "routed_expert_share": 0.0,
            "nonexpert_bytes": tensor_bytes,
            "nonexpert_ranges": 0,
            "tensor_types": sorted({t.ggml_type.name for t in g.tensors.values()}),
            "page_size": page_size,
            "expert_slices": 0,
            "expert_slice_parts_page_aligned": 0,
            "slices_page_aligned": 0,
            "slices_sharing_a_page": 0,
            "slices_contiguous": 0,
            "hash_layers": [],
            "hash_table_shape": None,
            "hash_table_bytes": 0,
            "cache_bytes": _cache_bytes(g),
        }
    lengths = index.part_length
    present = lengths.any(axis=2)
    flags = index.slice_flags[present]
    routed_bytes = int(lengths.sum())
    parts = lengths > 0
    forward = [layer for layer in index.moe_layers() if layer < n_layer]
    return summary | {
        "moe_layers": len(forward),
        "expert_slice_bytes": {str(layer): int(lengths[layer, 0].sum()) for layer in forward},
        "routed_expert_bytes": routed_bytes,
        "mtp_expert_bytes": int(lengths[n_layer:].sum()),
        "routed_expert_share": routed_bytes / g.total_size if g.total_size else 0.0,
        "nonexpert_bytes": sum(t.length for t in index.resident_tensors(n_layer)),
        "nonexpert_ranges": len(index.nonexpert),
        "tensor_types": sorted({GGMLQuantizationType(int(t)).name for t in np.unique(index.tensor_type)}),
        "page_size": index.page_size,
        "expert_slices": int(present.sum()),
        "expert_slice_parts_page_aligned": int((index.part_offset[parts] % index.page_size == 0).sum()),
        "slices_page_aligned": int((flags & FLAG_PAGE_ALIGNED).astype(bool).sum()),
        "slices_sharing_a_page": int((flags & FLAG_SHARES_PAGE).astype(bool).sum()),
        "slices_contiguous": int((flags & FLAG_CONTIGUOUS).astype(bool).sum()),
        "hash_layers": index.hash_layers(),
        "hash_table_shape": list(index.hash_table(index.hash_layers()[0]).shape) if index.tables else None,
        "hash_table_bytes": sum(t.nbytes for t in index.tables.values()),
        "cache_bytes": _cache_bytes(g),
    }


def _cache_bytes(g: GGUFFile) -> dict[str, int] | None:
    """What the runtime's per-layer caches (KV cache, compressor states) take at its default
    context; None for an architecture it does not run."""
    from swapmoe.runtime.models import ARCHITECTURES

    if g.arch not in ARCHITECTURES:
        return None
    cls = ARCHITECTURES[g.arch]
    try:
        hp = cls.hparams(g)
        n_ctx = min(int(g.arch_get(Keys.LLM.CONTEXT_LENGTH) or 4096), 4096)
        return {"n_ctx": n_ctx, "bytes": int(cls.cache_bytes(g, hp, n_ctx))}
    except (SwapmoeError, TypeError, KeyError):
        return None


def _hash_text(s: dict[str, Any]) -> str:
    if not s["hash_layers"]:
        return "none"
    vocab, k = s["hash_table_shape"]
    return (
        f"{', '.join(map(str, s['hash_layers']))}: experts chosen by token id, tables of {vocab} tokens x {k} "
        f"experts ({_mb(s['hash_table_bytes'])} in the index)"
    )


def _mb(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB" if n < 2**30 else f"{n / 2**30:,.2f} GiB"


def format_summary(s: dict[str, Any]) -> str:
    slices = s["expert_slice_bytes"]
    sizes = sorted(set(slices.values()))
    slice_text = ", ".join(_mb(v) for v in sizes) if sizes else "none"
    n = s["expert_slices"]
    lines = [
        f"file            {s['file']} ({s['shards']} shard{'s' if s['shards'] > 1 else ''}, {_mb(s['file_bytes'])})",
        f"architecture    {s['arch']}, {s['layers']} layers ({s['moe_layers']} with routed experts)",
        *(
            [
                f"MTP block       layer {', '.join(map(str, s['mtp_layers']))}: multi-token prediction, not used for "
                f"decoding; never loaded, its experts ({_mb(s['mtp_expert_bytes'])}) never read"
            ]
            if s["mtp_layers"]
            else []
        ),
        f"experts         {s['experts']} per layer, {s['experts_used']} used per token",
        f"expert slice    {slice_text} (one expert of one layer, all projections)",
        f"routed experts  {_mb(s['routed_expert_bytes'])} = {s['routed_expert_share']:.1%} of the file",
        f"non-expert RAM  {_mb(s['nonexpert_bytes'])} (loaded at start, in {s['nonexpert_ranges']} "
        f"run{'s' if s['nonexpert_ranges'] != 1 else ''})",
        f"per token       {_mb(sum(slices.values()) * (s['experts_used'] or 0))} of experts read if none is cached",
        f"tensor types    {', '.join(s['tensor_types'])}",
        f"alignment       {s['slices_page_aligned']} of {n} expert slices start on a {s['page_size'] // 1024} KiB "
        f"page, {s['slices_contiguous']} are one run, {s['slices_sharing_a_page']} share a page with a neighbour",
        f"hash layers     {_hash_text(s)}",
        *(
            [
                f"caches          {_mb(s['cache_bytes']['bytes'])} at {s['cache_bytes']['n_ctx']} tokens of context "
                "(KV cache and the like, float32)"
            ]
            if s["cache_bytes"]
            else []
        ),
        f"layout          {s['swapmoe_layout'] or 'original (not repacked)'}",
        f"index           {s['index']}",
    ]
    return "\n".join(lines)
