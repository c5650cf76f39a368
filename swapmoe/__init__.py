"""swapmoe: run giant Mixture-of-Experts GGUF models from an SSD.

Public API (each name is imported lazily so `import swapmoe` stays cheap):
    swapmoe.synth(path, arch=..., ...)        write a synthetic MoE GGUF
    swapmoe.default_model_path()              path of the embedded tiny trained MoE
    swapmoe.open_gguf(path)                   metadata and tensor table of a GGUF (and its shards)
    swapmoe.repack(in_path, out_path, ...)    page-aligned copy of a GGUF plus its sidecar index
    swapmoe.index.load(gguf_path)             the sidecar index: where every expert slice lives
    swapmoe.load(path, *, ctx=, io=, ...)     a model ready to score and generate text (Model)
    swapmoe.serve(path, host=, port=, ...)    an OpenAI-compatible HTTP server (swapmoe.server)
    swapmoe.Tokenizer.from_gguf(path)         llama.cpp-exact tokenizer of a GGUF
Each name also imports as `from swapmoe import load, repack, synth, ...`; `swapmoe.index` and
`swapmoe.repack` are submodules too (`import swapmoe.index`, `from swapmoe.index import load`).
"""

from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "synth": ("swapmoe.synthetic", "synth"),
    "open_gguf": ("swapmoe.gguf_file", "open_gguf"),
    "SwapmoeError": ("swapmoe.errors", "SwapmoeError"),
    "repack": ("swapmoe.repack", None),  # the package itself, callable
    "index": ("swapmoe.index", None),  # the submodule swapmoe/index.py (re-exports swapmoe.repack.index)
    "load": ("swapmoe.runtime.model", "load"),
    "Model": ("swapmoe.runtime.model", "Model"),
    "Tokenizer": ("swapmoe.runtime.tokenizer", "Tokenizer"),
    "serve": ("swapmoe.server", "serve"),
}

__all__ = ["default_model_path", *_LAZY]


def default_model_path() -> str:
    """Path of the tiny trained qwen3moe model shipped inside the package."""
    from importlib.resources import files

    return str(files("swapmoe") / "data" / "tiny-moe.gguf")


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        module = importlib.import_module(module)
        return module if attr is None else getattr(module, attr)
    raise AttributeError(f"module 'swapmoe' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
