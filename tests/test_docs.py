"""The docs name no path of one machine and no repository file, link or section that does not exist."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# an absolute path into a home, a temp dir or a checkout of one machine (system paths such as
# /proc/meminfo or /dev/zero name the same thing everywhere)
MACHINE_PATH = re.compile(r"(?<![\w.~$-])/(?:root|home|tmp|Users|work)/")
# a repository file named from the repository root, in backticks, a link or plain text
REPO_FILE = re.compile(r"(?<![\w./-])((?:swapmoe|tools|tests|docs)/[\w./-]*\w\.(?:py|md))\b")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(doc: Path) -> set[str]:
    """GitHub's ids of a Markdown file's headings: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#{1,6} (.+)$", doc.read_text(), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_no_absolute_path_of_a_machine(doc):
    lines = [f"{i}: {line}" for i, line in enumerate(doc.read_text().splitlines(), 1) if MACHINE_PATH.search(line)]
    assert not lines, f"{doc.name} names paths of one machine:\n" + "\n".join(lines)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_repository_file_named_exists(doc):
    missing = sorted({name for name in REPO_FILE.findall(doc.read_text()) if not (REPO / name).exists()})
    assert not missing, f"{doc.name} names files that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_relative_link_resolves(doc):
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path).resolve() if path else doc
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(target)
    assert not broken, f"{doc.name} links to files or sections that do not exist: {broken}"


def test_the_patterns_catch_what_they_are_for():
    assert MACHINE_PATH.search("python tools/bench_repack.py /tmp/big.gguf")
    assert MACHINE_PATH.search("see /work/shared/tools/llama_logits.py")
    assert not MACHINE_PATH.search("FileHugePages in /proc/meminfo, dd from /dev/zero, ~/.cache/swapmoe")
    assert REPO_FILE.findall("`tools/llama_logits.py` and [x](tests/test_cli.py), docs/kernels.md.") == [
        "tools/llama_logits.py",
        "tests/test_cli.py",
        "docs/kernels.md",
    ]
    assert anchors(REPO / "docs" / "benchmarks.md") >= {"numerical-parity-with-llamacpp", "synthetic-model-writer"}
