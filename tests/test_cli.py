import subprocess

import pytest

import swapmoe
from swapmoe.cli import main

from conftest import cli_command, run_cli


def test_help_lists_every_command():
    result = run_cli("--help")
    assert result.exit_code == 0
    for command in main.commands:
        assert command in result.output


def test_version():
    result = run_cli("--version")
    assert result.exit_code == 0 and swapmoe.__version__ in result.output


def test_synth_then_inspect(tmp_path):
    out = tmp_path / "m.gguf"
    assert run_cli("synth", out, "--arch", "deepseek4", "--type", "Q4_K").exit_code == 0
    result = run_cli("inspect", out)
    assert result.exit_code == 0
    assert "deepseek4" in result.output and "hash layers     0" in result.output
    result = run_cli("inspect", out, "--json")
    assert '"routed_expert_share"' in result.output


@pytest.mark.parametrize("content, message", [
    (b"not a model at all", "not a GGUF file"),
    (b"GGUF\x03\x00\x00\x00" + b"\xff" * 40, "corrupt or truncated GGUF header"),
])
def test_bad_input_is_one_line_and_nonzero(tmp_path, content, message):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(content)
    # a real process: the message must reach stderr as one line, with no traceback
    proc = subprocess.run(cli_command("inspect", bad), capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and message in proc.stderr and str(bad) in proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_shard_cli(tmp_path):
    first = swapmoe.synth(tmp_path / "m.gguf", shards=2, progress=False)
    (tmp_path / "m-00002-of-00002.gguf").unlink()
    result = run_cli("inspect", first)
    assert result.exit_code == 1 and "missing shard 2 of 2" in result.output


def test_demo_streams_the_embedded_model(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    result = run_cli("demo", "-n", "8")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "swapmoe" / "tiny-moe.repacked.gguf").exists()
    assert "layout          bundled" in result.output and "--- expert streaming (pread) ---" in result.output
    budget = float(result.output.split("of a ")[1].split(" MiB")[0])
    peak = float(result.output.split("resident experts at most ")[1].split(" MiB")[0])
    assert 0 < peak <= budget


def test_run_default_model(tmp_path):
    result = run_cli("run", "-p", "def main():", "-n", "6")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("def main():") and "decode 6 tok" in result.output


def test_run_refuses_context_overflow():
    result = run_cli("run", "-p", "x", "-n", "100", "--ctx", "16")
    assert result.exit_code == 1 and "exceed the context of 16" in result.output
