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
