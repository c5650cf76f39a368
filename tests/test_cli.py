import functools
import io
import math
import os
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import click
import pytest

import swapmoe
from swapmoe.cli import main
from swapmoe.runtime.experts.options import IO_ENGINES, PREFETCH_MODES
from swapmoe.synthetic.archs import ARCHS

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


@pytest.mark.parametrize(
    "content, message",
    [
        (b"not a model at all", "not a GGUF file"),
        (b"GGUF\x03\x00\x00\x00" + b"\xff" * 40, "corrupt or truncated GGUF header"),
    ],
)
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
    # the sentence before generating: the budget, its share of the experts' bytes and why
    sentence = r"Generating with (\d+) MiB for experts, (\d+)% of their ([\d.]+) MiB \(a quarter,"
    words = re.search(sentence, result.output)
    assert words, result.output
    mib, share, experts = int(words[1]), int(words[2]), float(words[3])
    assert mib == budget == math.ceil(experts / 4) and share == round(100 * mib / experts)


@pytest.mark.slow
def test_demo_says_when_it_compiles_the_kernels(tmp_path):
    """With an empty numba cache the demo says that it compiles first; the second run, cached, does not."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"), XDG_CACHE_HOME=str(tmp_path))
    runs = [
        subprocess.run(cli_command("demo", "-n", "2"), env=env, capture_output=True, text=True, timeout=900)
        for _ in range(2)
    ]
    assert all(run.returncode == 0 for run in runs), runs[0].stderr + runs[1].stderr
    assert "numba compiles the kernels" in runs[0].stdout and "numba compiles" not in runs[1].stdout


def test_run_default_model(tmp_path):
    result = run_cli("run", "-p", "def main():", "-n", "6")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("def main():") and "decode 6 tok" in result.output


def test_a_one_shot_run_reserves_kv_cache_for_its_tokens_only(monkeypatch):
    from swapmoe.runtime.experts import options

    m = swapmoe.load(swapmoe.default_model_path())
    reserved = []
    plan = options.plan
    monkeypatch.setattr(options, "plan", lambda *args, **kw: reserved.append(args[3]) or plan(*args, **kw))
    assert run_cli("run", "-p", "def main():", "-n", "6").exit_code == 0
    assert run_cli("run", "-p", "def main():", "-n", "6", "--chat").exit_code == 0  # a chat may go on
    kv_bytes = functools.partial(type(m.net).cache_bytes, m.gguf, m.hparams)
    assert reserved == [kv_bytes(len("def main():") + 4 + 6), kv_bytes(m.n_ctx)]
    assert reserved[0] < reserved[1]


def test_run_refuses_context_overflow():
    result = run_cli("run", "-p", "x", "-n", "100", "--ctx", "16")
    assert result.exit_code == 1 and "exceed the context of 16" in result.output


@pytest.mark.parametrize(
    "args, option",
    [
        (["run", "-p", "x", "-n", "-5"], "--max-tokens"),
        (["run", "-p", "x", "--temp", "nan"], "--temp"),
        (["run", "-p", "x", "--temp", "-1"], "--temp"),
        (["run", "-p", "x", "--seed", "-1"], "--seed"),
        (["run", "-p", "x", "--threads", "0"], "--threads"),
        (["run", "-p", "x", "--ctx", "0"], "--ctx"),
        (["run", "-p", "x", "--top-p", "2"], "--top-p"),
        (["run", "-p", "x", "--top-k", "-5"], "--top-k"),
        (["run", "-p", "x", "--min-p", "nan"], "--min-p"),
        (["run", "-p", "x", "--repeat-penalty", "0"], "--repeat-penalty"),
        (["run", "-p", "x", "--expert-cache-size", "0"], "--expert-cache-size"),
        (["inspect", "MODEL", "--page-size", "3"], "--page-size"),
        (["repack", "MODEL", "OUT", "--page-size", str(1 << 40)], "--page-size"),
        (["synth", "OUT", "--size-gb", "-1"], "--size-gb"),
        (["synth", "OUT", "--layers", "0"], "--layers"),
        (["serve", "--port", "0"], "--port"),
    ],
)
def test_options_are_checked_before_anything_runs(args, option, tmp_path):
    model = swapmoe.default_model_path()
    args = [model if a == "MODEL" else str(tmp_path / "out.gguf") if a == "OUT" else a for a in args]
    result = run_cli(*args)
    assert result.exit_code == 1 and option in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out.gguf").exists()


def test_a_prompt_file_that_is_not_utf8_is_named(tmp_path):
    bad = tmp_path / "prompt.txt"
    bad.write_bytes(b"\xff\xfe bad")
    result = run_cli("run", "-f", bad, "-n", "2")
    assert result.exit_code == 1 and str(bad) in result.output and "not UTF-8" in result.output


@pytest.mark.slow
def test_run_with_an_unwritable_cache_home(tmp_path):
    """A read-only home: the kernels' cache falls back to the temp dir, with one warning line."""
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(XDG_CACHE_HOME=str(blocked), TMPDIR=str(tmp_path))
    run = subprocess.run(
        cli_command("run", "-p", "def f():", "-n", "3"), env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr
    warnings = [line for line in run.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and str(tmp_path) in warnings[0]


def _read_only_mounts_work() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-m", "sh", "-c", "mount --bind -o ro / /"], capture_output=True).returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _read_only_mounts_work(), reason="needs root and a private mount namespace (unshare -m)")
def test_run_from_a_read_only_install_with_an_unwritable_home(tmp_path):
    """The package directory and the home mounted read-only (a `docker --read-only` image, a
    non-root user) and NUMBA_CACHE_DIR unset: the kernels are cached in the temp dir, with one
    warning line, and the run works."""
    home, temp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    temp.mkdir()
    package = Path(swapmoe.__file__).parent
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), TMPDIR=str(temp))
    script = (
        f"mount --bind -o ro {shlex.quote(str(package))} {shlex.quote(str(package))} && "
        f"mount --bind -o ro {shlex.quote(str(home))} {shlex.quote(str(home))} && "
        f"exec {shlex.join(cli_command('run', '-p', 'def f():', '-n', '3'))}"
    )
    run = subprocess.run(["unshare", "-m", "sh", "-c", script], env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("def f():")
    warnings = [line for line in run.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and str(temp) in warnings[0] and "Traceback" not in run.stderr


def test_a_prompt_longer_than_the_context_could_hold_is_refused_before_tokenizing(tmp_path, monkeypatch):
    from swapmoe.runtime.tokenizer import Tokenizer

    def never(*args, **kwargs):
        raise AssertionError("tokenized")

    prompt = tmp_path / "prompt.txt"
    prompt.write_text("word " * 2_500_000)  # 12.5 MB
    monkeypatch.setattr(Tokenizer, "encode", never)
    result = run_cli("run", "-f", prompt, "-n", "2")
    assert result.exit_code == 1 and "the prompt is 12,500,000 characters; a context of" in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "--temprature", "1"], "run: No such option '--temprature'. (Did you mean one of: '--temp'"),
        (["run", "-p", "x", "--io", "floppy"], "run: Invalid value for '--io': 'floppy' is not one of"),
        (["serve", "--expert-prefetch=soon"], "serve: Invalid value for '--expert-prefetch'"),
        (["inspect"], "inspect: Missing argument 'MODEL'"),
        (["verify", "m.gguf", "--against"], "verify: Option '--against' requires an argument"),
        (["repak", "m.gguf"], "No such command 'repak'. Did you mean 'repack'?"),
        (["--bogus"], "No such option '--bogus'"),
    ],
)
def test_a_usage_error_is_one_line_naming_the_command_and_exit_1(args, message):
    proc = subprocess.run(cli_command(*args), capture_output=True, text=True)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr.startswith("swapmoe: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert message in proc.stderr


def test_swapmoe_alone_prints_the_help():
    proc = subprocess.run(cli_command(), capture_output=True, text=True)
    assert proc.returncode == 0 and "Commands:" in proc.stdout and proc.stderr == ""


@pytest.mark.parametrize(
    "signum, code, said",
    [
        (signal.SIGTERM, 143, "swapmoe: stopped by SIGTERM"),
        (signal.SIGINT, 130, "swapmoe: interrupted"),
        (signal.SIGHUP, 129, "swapmoe: stopped by SIGHUP"),
    ],
)
def test_serve_stops_on_a_signal_with_its_exit_status(signum, code, said):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(  # Ctrl-C as a terminal gives it: a background job may start with SIGINT ignored
        cli_command("serve", "--port", port),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "serve did not start"
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
                break
            except urllib.error.HTTPError:  # 503 while the model loads: listening
                break
            except OSError:
                time.sleep(0.1)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == code and err.strip().splitlines()[-1] == said and "Traceback" not in err, err


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_chat_stopped_at_its_prompt_exits_as_stopped(signum, code):
    """click.prompt turns the stop into an Abort, which ends the chat: still the signal's status."""
    proc = subprocess.Popen(
        cli_command("run", "--chat"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        shown, deadline = b"", time.monotonic() + 120
        while not shown.endswith(b"you> "):
            assert time.monotonic() < deadline, shown
            if select.select([proc.stdout], [], [], 1)[0]:
                chunk = os.read(proc.stdout.fileno(), 100)
                assert chunk, f"run ended before its prompt: {shown}"
                shown += chunk
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    said = "interrupted" if signum == signal.SIGINT else "stopped by SIGTERM"
    assert proc.returncode == code and err.decode().strip().splitlines()[-1] == f"swapmoe: {said}", err


def test_a_stop_that_went_through_an_exec_of_source_text_keeps_its_exit_status(tmp_path):
    """CPython run with -m ends by SIGINT once a bare KeyboardInterrupt has passed through an exec
    of source text (as a dataclass being defined does), even if it was caught: the stop a signal
    raises must not be a bare one."""
    (tmp_path / "stopped_in_exec.py").write_text(
        "import os, signal\n"
        "from swapmoe.cli import user_errors\n"
        "user_errors(lambda: exec('os.kill(os.getpid(), signal.SIGTERM)\\nwhile True: pass'))()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(swapmoe.__file__).parents[1])}
    proc = subprocess.run(
        [sys.executable, "-m", "stopped_in_exec"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 143 and proc.stderr == "swapmoe: stopped by SIGTERM\n", proc.stderr


@pytest.mark.parametrize(
    "typed, meant",
    [
        (r"a\nb", "a\nb"),
        (r"\t\r\\\"\'", "\t\r\\\"'"),
        (r"\\n", r"\n"),  # an escaped backslash, then a plain n
        (r"\x41\xc3\xa9!", "Aé!"),  # bytes, so a UTF-8 sequence makes one character
        (r"\q \x4 \xzz end\ ", r"\q \x4 \xzz end\ "),  # not escapes: kept as typed
        ("trailing\\", "trailing\\"),
        ("é \\u00e9", "é \\u00e9"),
    ],
)
def test_prompt_escapes_as_llama_cpp(typed, meant):
    from swapmoe.cli import process_escapes

    assert process_escapes(typed) == meant


def test_run_turns_prompt_escapes_into_characters_unless_no_escape():
    result = run_cli("run", "-p", r"def f():\n\treturn", "-n", "1")
    assert result.exit_code == 0 and result.output.startswith("def f():\n\treturn"), result.output
    result = run_cli("run", "-p", r"def f():\n\treturn", "-n", "1", "--no-escape")
    assert result.exit_code == 0 and result.output.startswith(r"def f():\n\treturn"), result.output
    result = run_cli("run", "-p", r"caf\xe9", "-n", "1")
    assert result.exit_code == 1 and "swapmoe: error: -p: the prompt is not UTF-8" in result.output


def _help_texts(command):
    """The command's own help (up to its examples, which may show other programs' flags) and
    every option's help, as `COMMAND --help` shows them."""
    ctx = click.Context(command, info_name=command.name)
    yield command.help.split("Examples:")[0]
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is not None:
            yield record[1]


@pytest.mark.parametrize("name", sorted(main.commands))
def test_help_mentions_only_options_the_command_has(name):
    command = main.commands[name]
    ctx = click.Context(command, info_name=name)
    options = {opt for param in command.get_params(ctx) for opt in (*param.opts, *param.secondary_opts)}
    for text in _help_texts(command):
        for mentioned in re.findall(r"(?<![\w-])--?[a-zA-Z][\w-]*", text):
            assert mentioned in options, f"{name} --help mentions {mentioned}: {text}"


def test_choices_and_help_follow_the_registries():
    """A new I/O engine, prefetch mode or synthetic architecture shows up in the CLI unasked."""
    script = """
import click
import swapmoe.runtime.experts.options as options
import swapmoe.synthetic.archs as archs
options.IO_ENGINES += ("uring",)
options.PREFETCH_MODES += ("oracle",)
archs.ARCHS["newarch"] = archs.ARCHS["qwen3moe"]
from swapmoe.cli import main
run = {p.name: p for p in main.commands["run"].params}
print(list(run["io"].type.choices), list(run["expert_prefetch"].type.choices))
synth = main.commands["synth"]
print(synth.get_help(click.Context(synth, info_name="synth")))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    choices, help_text = proc.stdout.split("\n", 1)
    assert choices == str([*IO_ENGINES, "uring"]) + " " + str([*PREFETCH_MODES, "oracle"])
    assert ", ".join([*ARCHS, "newarch"]) in " ".join(help_text.split())


def test_progress_in_a_log_is_plain_lines_at_most_every_interval(monkeypatch):
    from swapmoe import progress

    log = io.StringIO()  # not a terminal
    monkeypatch.setattr(sys, "stderr", log)
    monkeypatch.setattr(progress, "LOG_INTERVAL", 3600)
    with progress.progress_bar(4 * 10**9, "repack m.gguf") as bar:
        bar.update(10**9)  # sooner than LOG_INTERVAL after the start: nothing
    assert log.getvalue() == ""
    monkeypatch.setattr(progress, "LOG_INTERVAL", 0)
    with progress.progress_bar(4 * 10**9, "repack m.gguf") as bar:
        bar.update(2 * 10**9)
    lines = log.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("swapmoe: repack m.gguf: 2.00 of 4.00 GB (50%), ")
    assert "\r" not in log.getvalue()


def test_repack_writes_no_redrawn_bar_into_a_log(tmp_path):
    proc = subprocess.run(
        cli_command("repack", swapmoe.default_model_path(), tmp_path / "out.gguf"), capture_output=True, text=True
    )
    assert proc.returncode == 0 and proc.stdout.startswith("wrote ") and proc.stderr == "", proc.stderr
