"""`swapmoe serve`: an OpenAI-compatible HTTP server (chat and text completions, streaming,
tokenize, metrics) on Starlette and uvicorn.

    swapmoe.serve(path, host="127.0.0.1", port=8080, api_key=None, parallel=4, **load_options)
    create_app(load, name, api_key) -> the ASGI app, for embedding in another server

Up to `parallel` requests decode together on a worker thread that owns the model, one token
each per step, every expert they need read once for all; later ones wait in arrival order
(docs/server.md)."""

from __future__ import annotations

import os
from pathlib import Path

from swapmoe.server.app import create_app

__all__ = ["create_app", "serve"]


def serve(
    model: str | os.PathLike | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    api_key: str | None = None,
    parallel: int = 4,
    **load_options,
) -> None:
    """Serve the GGUF at `model` (default: the embedded tiny model) until interrupted. The
    header is read first, so a file that is not a GGUF fails here; the rest loads while the
    server already answers /health with 503. parallel: requests decoded together;
    load_options: swapmoe.load's keywords (but parallel), checked here: a name load does not
    take is a SwapmoeError naming the closest one."""
    import uvicorn

    import swapmoe
    from swapmoe.errors import check_options

    check_options(load_options, [name for name in swapmoe.load.options if name != "parallel"], "swapmoe.serve")
    path = Path(model or swapmoe.default_model_path())
    swapmoe.open_gguf(path)  # a missing or damaged file: one clear error before anything listens
    app = create_app(
        lambda: swapmoe.load(path, parallel=parallel, **load_options),
        name=path.stem,
        api_key=api_key,
        parallel=parallel,
    )
    uvicorn.run(app, host=host, port=port, log_level="info")
