"""Offline repacking of MoE GGUF files and the sidecar index.

    swapmoe.repack("in.gguf", "out.gguf", layout="bundled", page_size=16384)
    idx = swapmoe.index.load("out.gguf")

`swapmoe.repack` is this package, made callable: Python rebinds the attribute
`swapmoe.repack` to the package as soon as any submodule is imported, so a plain function
of that name would be shadowed. Making the module object itself callable keeps
`swapmoe.repack(...)` working whatever was imported before.

Modules: tensors (the original tensors in any file), plan (where bytes go), stream
(copy/hash engine), write (repack, index), index (the sidecar), verify, unpack.
"""

from __future__ import annotations

import sys
import types


class _CallablePackage(types.ModuleType):
    def __call__(self, in_path, out_path, **opts):
        """repack(in_path, out_path, layout="bundled", page_size=16384, force=False, progress=False) -> Path"""
        from swapmoe.repack.write import repack

        return repack(in_path, out_path, **opts)


sys.modules[__name__].__class__ = _CallablePackage
