"""`swapmoe.index`: the sidecar index, the public name of `swapmoe.repack.index`.

    import swapmoe.index
    idx = swapmoe.index.load("model.gguf")       # reads model.gguf.swapidx, refuses a stale one
    from swapmoe.index import load, sidecar_path

The code lives in swapmoe/repack/index.py (it is written and read with the repacked file);
this module re-exports its public names, the very same objects, so `import swapmoe.index` and
`from swapmoe.index import load` work as well as the attribute `swapmoe.index`. The byte format
is in docs/index-format.md.
"""

from __future__ import annotations

from swapmoe.repack.index import (
    FLAG_CONTIGUOUS,
    FLAG_PAGE_ALIGNED,
    FLAG_SHARES_PAGE,
    FORMAT_VERSION,
    MAGIC,
    SIDECAR_SUFFIX,
    ExpertIndex,
    Projection,
    Range,
    build,
    load,
    owned_ranges,
    sidecar_path,
)

__all__ = [
    "load",
    "sidecar_path",
    "build",
    "owned_ranges",
    "ExpertIndex",
    "Range",
    "Projection",
    "SIDECAR_SUFFIX",
    "MAGIC",
    "FORMAT_VERSION",
    "FLAG_PAGE_ALIGNED",
    "FLAG_SHARES_PAGE",
    "FLAG_CONTIGUOUS",
]
