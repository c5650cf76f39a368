"""swapmoe: run giant Mixture-of-Experts GGUF models from an SSD.

Public API (each name is imported lazily so `import swapmoe` stays cheap):
    swapmoe.synth(path, arch=..., ...)        write a synthetic MoE GGUF
    swapmoe.default_model_path()              path of the embedded tiny trained MoE
    swapmoe.open_gguf(path)                   metadata and tensor table of a GGUF (and its shards)
"""
from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "synth": ("swapmoe.synthetic", "synth"),
    "open_gguf": ("swapmoe.gguf_file", "open_gguf"),
    "SwapmoeError": ("swapmoe.errors", "SwapmoeError"),
}


def default_model_path() -> str:
    """Path of the tiny trained qwen3moe model shipped inside the package."""
    from importlib.resources import files

    return str(files("swapmoe") / "data" / "tiny-moe.gguf")


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'swapmoe' has no attribute {name!r}")
