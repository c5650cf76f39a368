"""The documented Python API (README.md "From Python", docs/*.md) imports the ordinary ways:
attribute access after `import swapmoe`, `from swapmoe import ...`, and `import swapmoe.index`."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import swapmoe

from conftest import cli_command

DOCS = [Path(__file__).parent.parent / "README.md", *sorted((Path(__file__).parent.parent / "docs").glob("*.md"))]
TEXTS = [doc.read_text("utf-8") for doc in DOCS]
PYTHON_BLOCKS = [block for text in TEXTS for block in re.findall(r"```python\n(.*?)```", text, re.S)]
NAME = r"(?<![\w.])(swapmoe(?:\.\w+)+)"
# called: every swapmoe.a.b(...) of an example or of the prose; documented: those and every other
# swapmoe.a.b an example uses (the prose also names GGUF keys such as `swapmoe.page_size`)
CALLED = {name for text in TEXTS for name in re.findall(NAME + r"\(", text)}
DOCUMENTED = sorted(CALLED | {name for block in PYTHON_BLOCKS for name in re.findall(NAME, block)})
IMPORT_LINES = sorted(
    {
        line.strip()
        for block in PYTHON_BLOCKS
        for line in block.splitlines()
        if re.match(r"\s*(from|import) swapmoe\b", line)
    }
)


def resolve(dotted: str):
    """swapmoe.a.b as written: attribute by attribute, importing a submodule only where no attribute is."""
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], 2):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = importlib.import_module(".".join(parts[:i]))
    return obj


def test_the_docs_name_the_api():
    assert {"swapmoe.synth", "swapmoe.repack", "swapmoe.index.load", "swapmoe.load"} <= set(DOCUMENTED)
    assert "import swapmoe" in IMPORT_LINES


@pytest.mark.parametrize("name", DOCUMENTED)
def test_documented_name_resolves(name):
    obj = resolve(name)
    assert obj is not None
    if name in CALLED:
        assert callable(obj), f"{name}(...) is in the docs"


@pytest.mark.parametrize("line", IMPORT_LINES)
def test_documented_import_line_runs(line):
    exec(line, {})


def test_top_level_names_import_from_the_package():
    from swapmoe import Model, SwapmoeError, Tokenizer, default_model_path, index, load, open_gguf, repack, synth

    assert index is importlib.import_module("swapmoe.index") and index is swapmoe.index
    assert repack is importlib.import_module("swapmoe.repack") and callable(repack)
    assert synth is importlib.import_module("swapmoe.synthetic").synth
    assert load is importlib.import_module("swapmoe.runtime.model").load
    assert Model is importlib.import_module("swapmoe.runtime.model").Model
    assert Tokenizer is importlib.import_module("swapmoe.runtime.tokenizer").Tokenizer
    assert callable(Tokenizer.from_gguf)
    assert open_gguf is importlib.import_module("swapmoe.gguf_file").open_gguf
    assert issubclass(SwapmoeError, Exception)
    assert Path(default_model_path()).is_file()
    assert set(swapmoe.__all__) <= set(dir(swapmoe))


def test_index_is_a_submodule_of_the_sidecar_code():
    import swapmoe.index
    import swapmoe.repack.index as implementation
    from swapmoe.index import ExpertIndex, build, load, sidecar_path

    assert swapmoe.index.load is load is implementation.load
    assert (build, sidecar_path, ExpertIndex) == (
        implementation.build,
        implementation.sidecar_path,
        implementation.ExpertIndex,
    )
    for name in swapmoe.index.__all__:
        assert getattr(swapmoe.index, name) is getattr(implementation, name), name
    with pytest.raises(AttributeError, match="'swapmoe.index' has no attribute 'nope'"):
        swapmoe.index.nope
    with pytest.raises(ImportError):
        from swapmoe.index import nope  # noqa: F401  (the import is the test)


@pytest.mark.parametrize(
    "code",
    [
        "import swapmoe.index; swapmoe.index.load",
        "from swapmoe.index import load, sidecar_path",
        "import swapmoe, sys; assert 'numpy' not in sys.modules, 'import swapmoe is no longer lazy'; "
        "swapmoe.index.load",
    ],
)
def test_import_forms_in_a_fresh_interpreter(code):
    """Nothing imported before: each form on its own, as a user's first line would be."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_a_misspelt_load_keyword_names_the_closest_option():
    with pytest.raises(
        swapmoe.SwapmoeError,
        match=r"swapmoe.load: unknown option 'expert_cache_sise' \(did you mean 'expert_cache_size'\?\)",
    ):
        swapmoe.load(swapmoe.default_model_path(), expert_cache_sise=64)
    with pytest.raises(swapmoe.SwapmoeError, match=r"unknown option 'colour' \(options: ctx, threads, "):
        swapmoe.load(swapmoe.default_model_path(), colour="red")


def test_a_misspelt_serve_keyword_fails_before_anything_listens(monkeypatch):
    """serve passes load's keywords on: a name load does not take fails at once, with load's names."""
    import uvicorn

    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: pytest.fail("serve started listening"))
    with pytest.raises(
        swapmoe.SwapmoeError,
        match=r"swapmoe.serve: unknown option 'expert_prefech' \(did you mean 'expert_prefetch'\?\)",
    ):
        swapmoe.serve(swapmoe.default_model_path(), port=1, expert_prefech="both")
    with pytest.raises(TypeError):  # serve's own options are keyword-only: a port is not a load option
        swapmoe.serve(swapmoe.default_model_path(), "127.0.0.1")


def test_load_takes_every_streaming_option_by_name():
    """load's keywords are the model's options and every StreamingOptions field (no field unreachable)."""
    import dataclasses

    from swapmoe.runtime.experts.options import StreamingOptions

    streaming = [f.name for f in dataclasses.fields(StreamingOptions)]
    assert swapmoe.load.options == ["ctx", "threads", "override_kv", "trace", "parallel", "kv_tokens", *streaming]


def _retype(path: Path, tensor: str, ggml_type: int) -> None:
    """Rewrite the type of `tensor` in the GGUF header at `path` (the data stays as it is)."""
    import struct

    with open(path, "r+b") as f:
        head = f.read(1 << 20)
        name = tensor.encode()
        at = head.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
        n_dims = struct.unpack_from("<I", head, at)[0]
        f.seek(at + 4 + 8 * n_dims)
        f.write(struct.pack("<I", ggml_type))


@pytest.mark.parametrize("tensor", ["blk.0.attn_q.weight", "blk.1.ffn_up_exps.weight"])
def test_a_tensor_type_without_a_kernel_fails_at_load(synth_model, tmp_path, tensor):
    """I16 has F16's size, so the file stays whole: the error is the missing kernel, raised by load
    (not at the first product) and naming the file, the tensor and the type."""
    import shutil

    from gguf import GGMLQuantizationType as T

    path = tmp_path / "model.gguf"
    shutil.copy(synth_model(type="F16"), path)
    _retype(path, tensor, T.I16)
    with pytest.raises(
        swapmoe.SwapmoeError,
        match=rf"^{re.escape(str(path))}: tensor {re.escape(tensor)}: ggml type I16 has no kernel in swapmoe "
        r"\(supported: F32, F16,",
    ):
        swapmoe.load(path)
    # the command line prints the same as one line, no traceback
    proc = subprocess.run(cli_command("run", str(path), "-p", "x", "-n", "1"), capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "ggml type I16" in proc.stderr, proc.stderr
