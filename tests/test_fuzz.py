"""tools/fuzz.py, the hostile-input corpus: a fixed sample of it with every test run (cases that
found defects once, of each kind), the whole of it under `-m slow` (or `python tools/fuzz.py`)."""

from __future__ import annotations

import pytest

from conftest import load_tool

SEED = 0
SAMPLE = [
    12,
    14,
    25,
    35,
    47,
    55,
    56,
    66,
    90,
    110,  # gguf: contradicting metadata, misaligned tensors, none
    4,
    15,
    38,
    39,
    61,
    94,
    104,
    127,  # sidecar: types, file numbers, damaged frames, hash tables, ranges
    8,
    51,
    52,
    84,
    96,
    117,
    128,  # template: not text, doubling strings and lists, formats, a valid one
    9,
    53,
    75,
    76,
    87,
    119,
    130,
    252,
]  # option: ranges, paths, page sizes, overrides, a 12 MB prompt


@pytest.fixture(scope="module")
def fuzz():
    return load_tool("fuzz")


def _failures(outcomes) -> str:
    return "\n".join(f"case {o.case.number} ({o.case.what[:100]}): {p}" for o in outcomes for p in o.problems)


def test_a_sample_of_the_corpus(fuzz, tmp_path):
    outcomes = fuzz.run_cases(SEED, SAMPLE, tmp_path, jobs=2)
    assert {o.case.kind for o in outcomes} == set(fuzz.KINDS)
    assert not _failures(outcomes), _failures(outcomes)


@pytest.mark.slow
def test_the_whole_corpus(fuzz, tmp_path):
    outcomes = fuzz.run_cases(SEED, list(range(fuzz.DEFAULT_CASES)), tmp_path, jobs=2)
    assert not _failures(outcomes), _failures(outcomes)


def test_the_checks_see_each_kind_of_failure(fuzz):
    """The oracle itself: what each command's result must not be."""
    Result, Command = fuzz.Result, fuzz.Command
    traceback = 'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: boom\n'
    cases = [
        (Command(["inspect", "M.gguf"]), Result(1, "", traceback, 1 << 20, 1.0), "traceback"),
        (Command(["inspect", "M.gguf"]), Result(None, "", "", 1 << 20, 60.0), "hang"),
        (Command(["inspect", "M.gguf"]), Result(-9, "", "", 1 << 20, 1.0), "crash"),
        (Command(["inspect", "M.gguf"], must_fail=True), Result(0, "", "", 1 << 20, 1.0), "accepted"),
        (Command(["inspect", "M.gguf"]), Result(0, "", "", 400 << 20, 1.0), "memory"),
        (
            Command(["inspect", "M.gguf"]),
            Result(1, "", "swapmoe: error: a\nswapmoe: error: b\n", 1 << 20, 1.0),
            "error not one line",
        ),
        (
            Command(["inspect", "M.gguf"], names="M.gguf"),
            Result(1, "", "swapmoe: error: bad\n", 1 << 20, 1.0),
            "error does not name M.gguf",
        ),
        (Command(["run", "x", "--ctx", "0"]), Result(2, "", "Usage: swapmoe run\n", 1 << 20, 1.0), "exit 2"),
    ]
    for cmd, result, problem in cases:
        found = fuzz.check(cmd, result)
        assert any(p.startswith(problem) for p in found), (problem, found)
    progress_then_error = "r 1%|#| 1/2 [00:01<00:01, 1B/s]\rswapmoe: error: M.gguf: bad\n"
    named = Command(["inspect", "M.gguf"], names="M.gguf")
    assert fuzz.check(named, Result(1, "", progress_then_error, 1 << 20, 1.0)) == []
