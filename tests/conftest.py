"""Helpers and fixtures several test files share.

Plain helpers are imported by the test files (`from conftest import DATA, run_cli`): pytest puts
tests/ on sys.path, as it does for `from test_kernels import ...`. Fixtures need no import.

    DATA                       tests/data (golden/, kernels/, tokenizer/)
    read_zst(packed)           the decompressed bytes of a committed .zst fixture
    unzstd(packed, out)        decompress a .zst fixture (a .gguf.zst golden model) to the file out
    sha256_file(path)          hex sha256 of a file's bytes
    run_cli(*args)             the click CLI in-process (CliRunner), arguments passed through str()
    cli_command(*args)         argv that runs the CLI in a fresh Python process (subprocess)
    open_model(path, cls)      a model class built directly on a GGUF (no repack, no swapmoe.load)
    load_tool(name)            tools/NAME.py imported as module NAME (tools/ is not a package)
    synth_model(**settings)    fixture: a synthetic GGUF made once per session for these settings
    vocab_dir                  fixture: the committed vocab-only GGUFs, decompressed
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path

import pytest
import zstandard

DATA = Path(__file__).parent / "data"


def read_zst(packed: Path) -> bytes:
    return zstandard.ZstdDecompressor().decompress(Path(packed).read_bytes())


def unzstd(packed: Path, out: Path) -> Path:
    out = Path(out)
    out.write_bytes(read_zst(packed))
    return out


def sha256_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def run_cli(*args):
    from click.testing import CliRunner

    from swapmoe.cli import main

    return CliRunner().invoke(main, [str(a) for a in args])


def cli_command(*args) -> list[str]:
    return [sys.executable, "-m", "swapmoe.cli", *(str(a) for a in args)]


def load_tool(name: str):
    """tools/<name>.py as a module, registered as `name` (its dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def open_model(path, cls=None):
    """The model of the GGUF at path, through its architecture class (or cls) directly."""
    from swapmoe.gguf_file import GGUFFile
    from swapmoe.repack import index
    from swapmoe.runtime.experts.io import MmapEngine
    from swapmoe.runtime.experts.store import ExpertStore
    from swapmoe.runtime.models import ARCHITECTURES

    g = GGUFFile(path)
    store = ExpertStore(index.build(g), MmapEngine([s.path for s in g.shards], None))
    return (cls or ARCHITECTURES[g.arch])(g, store)


@pytest.fixture(scope="session")
def synth_model(tmp_path_factory):
    """synth_model(**settings) -> path of swapmoe.synth(path, progress=False, **settings), made on
    first use and shared by every test of the session: read it, copy it before changing it."""
    import swapmoe

    made: dict[tuple, Path] = {}

    def get(**settings) -> Path:
        key = tuple(sorted(settings.items()))
        if key not in made:  # a folder of its own: nothing else lands beside it
            name = "-".join(str(v) for v in settings.values()) or "default"
            made[key] = swapmoe.synth(tmp_path_factory.mktemp("synth") / f"{name}.gguf", progress=False, **settings)
        return made[key]

    return get


@pytest.fixture(scope="session")
def vocab_dir(tmp_path_factory) -> Path:
    """The committed vocab-only GGUFs (tests/data/tokenizer/vocab/*.gguf.zst), decompressed."""
    folder = tmp_path_factory.mktemp("vocab")
    for packed in (DATA / "tokenizer" / "vocab").glob("*.gguf.zst"):
        unzstd(packed, folder / packed.name[:-4])
    return folder
