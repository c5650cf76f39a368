"""The `swapmoe` command line."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import signal
import sys
from inspect import signature
from pathlib import Path
from typing import Callable, Iterable, NoReturn

import click

from swapmoe import __version__
from swapmoe.errors import SwapmoeError
from swapmoe.runtime.experts.options import IO_ENGINES, PREFETCH_MODES

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
stops: list[int] = []  # the stop signals the running command got, first first


def fail(message: str) -> NoReturn:
    click.echo(f"swapmoe: error: {message}", err=True)
    sys.exit(1)


class Stopped(KeyboardInterrupt):
    """A stop signal, raised where the main thread is so that it unwinds as Ctrl-C does: every
    `finally` runs, temp files go. Not a bare KeyboardInterrupt: once a bare one has passed
    through an exec of source text (a dataclass being defined), CPython run with -m ends the
    process by SIGINT, whatever exit status it was given, even if the exception was caught."""


def _stop(signum, frame):
    stops.append(signum)
    raise Stopped


def user_errors(fn):
    """Report SwapmoeError as one line, and a stop (Ctrl-C, SIGTERM, SIGHUP) as one line with exit
    status 128 + the signal's number (130 for Ctrl-C), never as a traceback.

    A stop is raised as Stopped, a KeyboardInterrupt, where the main thread is. A library may
    catch it and return (uvicorn shuts down on SIGTERM and Ctrl-C and returns; click.prompt
    turns it into Abort): the stop is recorded in `stops`, so the command still ends as
    stopped. A signal ignored when the command starts (nohup, a background job's Ctrl-C)
    stays ignored."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        stops.clear()
        taken = [signum for signum in STOP_SIGNALS if signal.getsignal(signum) != signal.SIG_IGN]
        previous = {signum: signal.signal(signum, _stop) for signum in taken}
        try:
            fn(*args, **kwargs)
        except SwapmoeError as e:
            fail(str(e))
        except KeyboardInterrupt:
            if not stops:  # raised by code, not by a signal: as Ctrl-C
                stops.append(signal.SIGINT)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        if stops:
            said = "interrupted" if stops[0] == signal.SIGINT else f"stopped by {signal.Signals(stops[0]).name}"
            click.echo(f"swapmoe: {said}", err=True)
            sys.exit(128 + stops[0])

    return wrapper


class Command(click.Command):
    """A command whose usage errors name it (`swapmoe: error: run: ...`), those click's parser
    raises without saying where included."""

    def parse_args(self, ctx, args):
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as e:
            e.ctx = e.ctx or ctx
            raise


class Commands(click.Group):
    """The `swapmoe` group. A usage error anywhere (misspelt option or command, bad value,
    missing argument; before or inside a command) is one line and exit status 1, as every other
    error; `swapmoe` alone prints the help, as `swapmoe --help` does."""

    command_class = Command

    def make_context(self, info_name, args, parent=None, **extra):
        with _usage_errors_in_one_line():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx):
        with _usage_errors_in_one_line():
            return super().invoke(ctx)


@contextlib.contextmanager
def _usage_errors_in_one_line():
    try:
        yield
    except click.exceptions.NoArgsIsHelpError as e:
        click.echo(e.ctx.get_help())
        e.ctx.exit()
    except click.UsageError as e:  # BadParameter, NoSuchOption (with its "Did you mean"), missing arguments
        command = f"{e.ctx.info_name}: " if e.ctx is not None and e.ctx.parent is not None else ""
        fail(command + e.format_message())


@click.group(
    "swapmoe", cls=Commands, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100}
)
@click.version_option(__version__, prog_name="swapmoe")
def main():
    """Run giant Mixture-of-Experts GGUF models from an SSD.

    Routed experts stay on disk and are read only when a token needs them.
    Start with `swapmoe demo`; see README.md and docs/ for the whole story.
    """


class Finite(click.FloatRange):
    """A finite float in a range (click's FloatRange lets nan through)."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


FINITE_POSITIVE = Finite(0, None, min_open=True)
SEED = click.IntRange(0, 2**63 - 1)
SPECIAL_TOKENS_MOST = 4  # tokens a tokenizer adds beyond the text's bytes: BOS, EOS, a prefix space


class NamesInHelp(click.Option):
    """An option whose help lists a registry's names, imported only when the help is shown."""

    def __init__(self, *args, names: Callable[[], Iterable[str]], help: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.names, self.help_template = names, help

    def get_help_record(self, ctx):
        self.help = self.help_template.format(names=", ".join(self.names()))
        return super().get_help_record(ctx)


def _synth_archs() -> Iterable[str]:
    from swapmoe.synthetic.archs import ARCHS  # with gguf and numpy: longer to import than the whole CLI

    return ARCHS


def _page_size(ctx, param, value):
    if value < 4096 or value > 1 << 30 or value & (value - 1):
        raise click.BadParameter("must be a power of two from 4096 to 1 GiB")
    return value


@main.command()
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--arch",
    cls=NamesInHelp,
    names=_synth_archs,
    help="Architecture (default: the preset's, else qwen3moe): {names}.",
)
@click.option("--preset", help="Shape of a real model, e.g. qwen3-30b-a3b, deepseek-v4-flash (default: tiny-ARCH).")
@click.option("--size-gb", type=FINITE_POSITIVE, help="Scale the layer count so the file is about this many GB.")
@click.option(
    "--type",
    "type_name",
    default="Q8_0",
    show_default=True,
    help="ggml type of every weight matrix (F32, F16, Q8_0, Q4_K, IQ2_XXS, MXFP4, ...), or the "
    "mix llama-quantize makes of that name: Q4_K_M, or Q2_K (Q2_K most places, Q3_K/Q4_K where "
    "it hurts).",
)
@click.option("--layers", type=click.IntRange(1, 10_000), help="Override the layer count.")
@click.option("--experts", type=click.IntRange(1, 65_536), help="Override the number of experts per layer.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Random seed for the weights.")
@click.option("--force", is_flag=True, help="Overwrite OUT if it exists.")
@user_errors
def synth(out, arch, preset, size_gb, type_name, layers, experts, seed, force):
    """Write a synthetic MoE GGUF with random weights, for tests and benchmarks.

    \b
    Examples:
      swapmoe synth tiny.gguf
      swapmoe synth big.gguf --preset qwen3-30b-a3b --type Q4_K_M --size-gb 10
    """
    from swapmoe.synthetic import PRESETS, synth as write_synth

    name = preset or f"tiny-{arch or 'qwen3moe'}"  # as synth picks it; it reports unknown names itself
    used = PRESETS[name].n_expert_used if name in PRESETS else 1
    if experts is not None and experts < used:  # the model would route each token to experts it lacks
        raise click.BadParameter(
            f"{name} routes each token to {used} experts; give at least {used}", param_hint="'--experts'"
        )
    overrides = {k: v for k, v in (("n_layer", layers), ("n_expert", experts)) if v is not None}
    path = write_synth(
        out, arch=arch, preset=preset, size_gb=size_gb, type=type_name, seed=seed, force=force, **overrides
    )
    click.echo(f"wrote {path} ({path.stat().st_size / 1e9:.3f} GB)")


@main.command()
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of text.")
@click.option(
    "--page-size",
    type=int,
    default=16384,
    show_default=True,
    callback=_page_size,
    help="Page size for the alignment summary: a power of two from 4096 to 1 GiB.",
)
@user_errors
def inspect(model, as_json, page_size):
    """Show experts, slice sizes, RAM needs and alignment of a GGUF."""
    from swapmoe.gguf_file import open_gguf
    from swapmoe.inspect import format_summary, summarize

    summary = summarize(open_gguf(model), page_size)
    click.echo(json.dumps(summary, indent=2) if as_json else format_summary(summary))


_ESCAPED = re.compile(rb"\\(x[0-9A-Fa-f]{2}|.)", re.DOTALL)
_ESCAPES = {b"n": b"\n", b"r": b"\r", b"t": b"\t", b"'": b"'", b'"': b'"', b"\\": b"\\"}


def process_escapes(text: str) -> str:
    """What llama.cpp's -p makes of the text (its string_process_escapes): \\n \\r \\t \\' \\" \\\\
    become the character, \\xHH the byte HH; any other backslash stays, with what follows it.
    Bytes, as in llama.cpp: \\xc3\\xa9 is é; a result that is not UTF-8 is refused."""

    def unescape(match: re.Match) -> bytes:
        code = match[1]
        if len(code) == 3:  # xHH
            return bytes([int(code[1:], 16)])
        return _ESCAPES.get(code, match[0])

    escaped = _ESCAPED.sub(unescape, text.encode("utf-8", "surrogateescape"))
    try:
        return escaped.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SwapmoeError(
            f"-p: the prompt is not UTF-8 text once its escapes are processed ({e.reason} at byte {e.start}); "
            "--no-escape takes it as it is"
        ) from None


def _model_options(ctx_help: str) -> list:
    return [
        click.option("--ctx", type=click.IntRange(1, 1 << 24), help=ctx_help),
        click.option(
            "--threads",
            type=click.IntRange(1, 4096),
            help="Compute threads (default: all cores). On a machine busy with other work, use fewer, or set "
            "OMP_WAIT_POLICY=passive.",
        ),
        click.option(
            "--expert-streaming/--no-expert-streaming",
            default=None,
            help="Read routed experts only when needed (default: on for repacked files or when the experts "
            "do not fit in RAM). Env SWAPMOE_EXPERT_STREAMING.",
        ),
        click.option(
            "--expert-cache-size",
            type=click.IntRange(1),
            metavar="MiB",
            help="RAM budget for resident experts, enforced (default: what is left after the rest of the "
            "model). Env SWAPMOE_EXPERT_CACHE_SIZE.",
        ),
        click.option(
            "--expert-keep-recent",
            type=click.IntRange(1),
            metavar="N",
            help="Keep only the N most recently used experts of each layer after every forward pass. "
            "Env SWAPMOE_EXPERT_KEEP_RECENT.",
        ),
        click.option(
            "--expert-fixation",
            type=click.IntRange(0),
            metavar="N",
            help="While decoding, reuse each layer's experts for N tokens (faster from disk, slightly "
            "different output). Env SWAPMOE_EXPERT_FIXATION.",
        ),
        click.option(
            "--expert-prefetch",
            type=click.Choice(PREFETCH_MODES),
            is_flag=False,
            flag_value="both",
            help="Start reading experts before they are needed: the previous token's, and/or the next "
            "layer's predicted by its router (alone: both). Env SWAPMOE_EXPERT_PREFETCH.",
        ),
        click.option(
            "--expert-hash-prefetch/--no-expert-hash-prefetch",
            default=None,
            help="Hash-routed layers (DeepSeek-V4): start reading the experts a token's table row names as "
            "soon as the token is known; exact, so on by default. Env SWAPMOE_EXPERT_HASH_PREFETCH.",
        ),
        click.option(
            "--io",
            type=click.Choice(IO_ENGINES),
            help="How experts are read: the file mapped (mmap), or explicit reads into buffers swapmoe owns "
            "(pread); auto: pread when experts are evicted and read again, else mmap. Env SWAPMOE_IO.",
        ),
        click.option(
            "--trace",
            type=click.Path(dir_okay=False, path_type=Path),
            metavar="FILE",
            help="Write every layer's expert choice to FILE as JSON lines, for tools/replay_trace.py.",
        ),
        click.option(
            "--override-kv",
            multiple=True,
            metavar="KEY=TYPE:VALUE",
            help="Use this metadata value instead of the file's (TYPE int, float, bool, str; repeatable), as "
            "llama.cpp's flag: e.g. qwen3moe.expert_used_count=int:10 routes each token to 10 experts.",
        ),
    ]


def model_options(ctx_help: str):
    """The options of `swapmoe.load` (context, threads, expert streaming) as flags, with `ctx_help`
    saying what --ctx means for the command. The command receives them together as `options`, a
    dict for swapmoe.load: every keyword click passes that the command does not take itself."""

    def decorate(command):
        own = signature(command).parameters

        @functools.wraps(command)
        def wrapper(*args, **kwargs):
            options = {key: kwargs.pop(key) for key in list(kwargs) if key not in own}
            return command(*args, options=options, **kwargs)

        for option in reversed(_model_options(ctx_help)):
            wrapper = option(wrapper)
        return wrapper

    return decorate


@main.command()
@click.argument("model", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("-p", "--prompt", help="Prompt text, with escapes such as \\n processed (see --escape).")
@click.option(
    "-f",
    "--file",
    "prompt_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Read the prompt from a file.",
)
@click.option(
    "--escape/--no-escape",
    default=True,
    show_default=True,
    help="Turn the escapes in -p's text into what they stand for, as llama.cpp does: \\n \\r \\t \\' \\\" \\\\ "
    "and \\xHH (the byte HH); any other backslash stays as it is. A -f file is taken as it is.",
)
@click.option("--chat", is_flag=True, help="Apply the model's chat template; without -p/-f, chat interactively.")
@click.option("-n", "--max-tokens", type=click.IntRange(1), default=128, show_default=True, help="Tokens to generate.")
@click.option("--temp", type=Finite(0, 100), default=0.0, show_default=True, help="Temperature; 0 is greedy.")
@click.option(
    "--top-k", type=click.IntRange(0), default=40, show_default=True, help="Keep the k most likely tokens (0: off)."
)
@click.option("--top-p", type=Finite(0, 1), default=0.95, show_default=True, help="Nucleus sampling mass (1: off).")
@click.option(
    "--min-p", type=Finite(0, 1), default=0.05, show_default=True, help="Drop tokens below min-p × the best (0: off)."
)
@click.option(
    "--repeat-penalty",
    type=Finite(0, 100, min_open=True),
    default=1.0,
    show_default=True,
    help="Penalty for recent tokens (1: off).",
)
@click.option("--seed", type=SEED, help="Random seed for sampling.")
@click.option("--ignore-eos", is_flag=True, help="Keep generating past end-of-text tokens.")
@model_options(
    "Context length (default: the model's, at most 4096). Without --chat, RAM is reserved for the KV cache "
    "of the prompt and -n tokens only; the rest goes to experts."
)
@click.option(
    "--stats", "show_stats", is_flag=True, help="Print what the expert store chose and why, and its counters."
)
@user_errors
def run(
    model,
    prompt,
    prompt_file,
    escape,
    chat,
    max_tokens,
    temp,
    top_k,
    top_p,
    min_p,
    repeat_penalty,
    seed,
    ignore_eos,
    options,
    show_stats,
):
    """Generate text with a GGUF MoE model (default: the embedded tiny model).

    \b
    Examples:
      swapmoe run -p "def fibonacci(n):"
      swapmoe run model.gguf -p "Why is the sky blue?" --chat -n 256 --temp 0.7
    Tokens stream to stdout; a line of statistics goes to stderr at the end.
    """
    import swapmoe

    if prompt is not None and prompt_file is not None:
        raise SwapmoeError("give either -p or -f, not both")
    if prompt is not None and escape:
        prompt = process_escapes(prompt)
    if prompt_file is not None:
        try:
            prompt = prompt_file.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise SwapmoeError(f"{prompt_file}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if prompt is None and not chat:
        raise SwapmoeError("give a prompt with -p TEXT or -f FILE (or --chat to chat)")
    trace = options["trace"]
    if trace is not None and not (trace.parent.is_dir() and os.access(trace.parent, os.W_OK)):
        raise click.BadParameter(f"{trace.parent} is not a directory this user can write to", param_hint="'--trace'")
    if not chat:  # a token of the text holds at least one of its bytes: about this many tokens at most
        options["kv_tokens"] = len(prompt.encode("utf-8")) + SPECIAL_TOKENS_MOST + max_tokens
    m = swapmoe.load(model or swapmoe.default_model_path(), **options)
    if show_stats:
        for reason in m.plan.reasons:
            click.echo(f"swapmoe: {reason}", err=True)
    sampling = dict(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat_penalty, seed=seed)

    def reply(text: str, add_special: bool) -> str:
        m.check_prompt_length(text)  # before tokenizing: a huge text costs no memory
        pieces = []
        for piece in m.generate(m.tokenize(text, add_special=add_special), max_tokens, ignore_eos, **sampling):
            click.echo(piece, nl=False)
            pieces.append(piece)
        click.echo()
        s = m.stats
        click.echo(
            f"prompt {s.prompt_tokens} tok at {s.prompt_tokens / max(s.prompt_seconds, 1e-9):.1f} tok/s, "
            f"decode {s.decode_tokens} tok at {s.decode_tokens / max(s.decode_seconds, 1e-9):.1f} tok/s, "
            f"expert hits {s.hits}/{s.requests}, experts read {s.bytes_read / 2**20:.1f} MiB",
            err=True,
        )
        if show_stats:
            click.echo(
                "swapmoe: "
                + ", ".join(
                    f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                    for k, v in s.as_dict().items()
                    if k != "decode_layers"
                ),
                err=True,
            )
            hashed = [layer for layer in m.index.hash_layers() if layer in s.decode_layers]
            if hashed:
                click.echo(
                    "swapmoe: hash-routed layers while decoding, experts resident or in flight when asked: "
                    + ", ".join(
                        f"layer {layer} {s.decode_layers[layer][0]}/{s.decode_layers[layer][1]}" for layer in hashed
                    ),
                    err=True,
                )
        return "".join(pieces)

    if not chat:
        click.echo(prompt, nl=False)
        reply(prompt, add_special=True)
        return
    from swapmoe.runtime.chat import ChatTemplate

    template = ChatTemplate(m.tokenizer)
    messages = []
    turns = [prompt] if prompt is not None else None
    while True:
        if turns is not None:
            if not turns:
                return
            user = turns.pop()
        else:
            try:
                user = click.prompt("you", prompt_suffix="> ")
            except (EOFError, click.Abort):
                return
        messages.append({"role": "user", "content": user})
        answer = reply(template.render(messages, add_generation_prompt=True), add_special=False)
        messages.append({"role": "assistant", "content": answer})


@main.command()
@click.argument("model", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on (0.0.0.0: every interface; then set --api-key).",
)
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True, help="Port to listen on.")
@click.option(
    "--api-key",
    envvar="SWAPMOE_API_KEY",
    help="Require `Authorization: Bearer KEY` on every route but /health. Env SWAPMOE_API_KEY.",
)
@click.option(
    "--parallel",
    "-np",
    type=click.IntRange(1, 64),
    default=4,
    show_default=True,
    help="Requests decoded together (each with its own context's caches); each step reads an "
    "expert once for all of them. More requests wait in order.",
)
@model_options(
    "Context length of each --parallel slot (default: the model's, at most 4096); RAM is reserved for the "
    "KV cache of every slot."
)
@user_errors
def serve(model, host, port, api_key, parallel, options):
    """Serve a GGUF MoE model over OpenAI's HTTP API (default: the embedded tiny model).

    \b
    Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health,
    POST /tokenize, POST /detokenize, GET /metrics. Up to --parallel requests decode
    together; the rest wait in order.
    \b
    Examples:
      swapmoe serve model.gguf --port 8080
      curl http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \\
           -d '{"messages": [{"role": "user", "content": "Hello"}]}'
    Any OpenAI client works with base_url http://127.0.0.1:8080/v1 (docs/server.md).
    """
    from swapmoe.server import serve as run_server

    if signal.getsignal(signal.SIGHUP) == _stop:  # not ignored (nohup)
        signal.signal(signal.SIGHUP, _hang_up_as_sigterm)
    run_server(model, host=host, port=port, api_key=api_key, parallel=parallel, **options)


def _hang_up_as_sigterm(signum, frame):
    """uvicorn shuts down in order on SIGINT and SIGTERM only; SIGHUP raised inside its event loop
    would land in whatever request is running. Record it, and stop as SIGTERM does."""
    stops.append(signum)
    os.kill(os.getpid(), signal.SIGTERM)


@main.command()
@click.argument("in_path", metavar="IN", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--layout",
    type=click.Choice(["bundled", "compat"]),
    default="bundled",
    show_default=True,
    help="bundled: each expert one page-aligned run (swapmoe runtime); compat: standard 3-D expert "
    "tensors, page-aligned, still loads in llama.cpp.",
)
@click.option(
    "--page-size",
    type=int,
    default=16384,
    show_default=True,
    callback=_page_size,
    help="Alignment of expert slices: a power of two >= 4096 (16 KiB suits 4 KiB and 16 KiB page systems).",
)
@click.option("--force", is_flag=True, help="Overwrite OUT if it exists.")
@user_errors
def repack(in_path, out, layout, page_size, force):
    """Copy the GGUF IN to OUT with every expert slice page-aligned, and write OUT.swapidx.

    IN may be the first shard of a split GGUF (NAME-00001-of-0000N.gguf); OUT is one file.
    Nothing is left at OUT if the copy fails or is interrupted; IN is only read.
    `swapmoe unpack OUT ORIG` gives IN back bit for bit.
    """
    from swapmoe.repack.index import sidecar_path
    from swapmoe.repack.write import repack as run_repack

    path = run_repack(in_path, out, layout=layout, page_size=page_size, force=force, progress=True)
    click.echo(
        f"wrote {path} ({path.stat().st_size / 1e9:.3f} GB, {layout} layout, {page_size // 1024} KiB pages) "
        f"and {sidecar_path(path).name}"
    )


@main.command("index")
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--page-size",
    type=int,
    default=16384,
    show_default=True,
    callback=_page_size,
    help="Page size to judge alignment by (a repacked file uses its own).",
)
@click.option(
    "--no-digests",
    is_flag=True,
    help="Skip the sha256 of every tensor (no full read of the file; verify then cannot check bytes).",
)
@user_errors
def index_cmd(model, page_size, no_digests):
    """Write MODEL.swapidx, the sidecar index, for a GGUF as it is (no copy).

    Lets the runtime stream experts from an original, un-repacked file; slices that are not
    page-aligned or share a page are marked. Rewrites an existing sidecar.
    """
    from swapmoe.repack.index import FLAG_PAGE_ALIGNED, FLAG_SHARES_PAGE
    from swapmoe.repack.write import index_gguf

    side, index = index_gguf(model, page_size, digests=not no_digests, progress=True)
    present = index.part_length.any(axis=2)
    flags = index.slice_flags[present]
    click.echo(
        f"wrote {side}: {len(index.moe_layers())} MoE layers x {index.n_expert} experts, "
        f"{int((flags & FLAG_PAGE_ALIGNED).astype(bool).sum())} of {int(present.sum())} slices page-aligned, "
        f"{int((flags & FLAG_SHARES_PAGE).astype(bool).sum())} share a page with a neighbour"
    )


@main.command()
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--against",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The original GGUF: also compare every tensor byte for byte.",
)
@user_errors
def verify(model, against):
    """Check MODEL against its sidecar index: digests, layout, and (with --against) the original."""
    from swapmoe.repack.verify import verify as run_verify

    report = run_verify(model, against, progress=True)
    for problem in report.problems:
        click.echo(f"problem: {problem}", err=True)
    checked = f"{report.tensors} tensors, {report.expert_slices} expert slices, {report.bytes_checked / 1e9:.3f} GB"
    if not report.ok:
        raise SwapmoeError(f"{model}: {len(report.problems)} problem(s) ({checked} checked)")
    against_text = f", byte-identical to {report.against}" if report.against else ""
    click.echo(f"OK: {model} ({report.layout} layout): {checked} checked{against_text}")


@main.command()
@click.argument("packed", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("orig", type=click.Path(path_type=Path))
@click.option("--force", is_flag=True, help="Overwrite ORIG if it exists.")
@user_errors
def unpack(packed, orig, force):
    """Rebuild the original GGUF from the repacked PACKED, bit for bit.

    A split original comes back as its shards: give ORIG as NAME-00001-of-0000N.gguf, or a
    directory to get the original file names. The result is checked against the original's
    digest stored in PACKED before it is put in place.
    """
    from swapmoe.repack.unpack import unpack as run_unpack

    paths = run_unpack(packed, orig, force=force, progress=True)
    click.echo(f"wrote {', '.join(str(p) for p in paths)} (matches the original's digest)")


DEMO_PROMPT = "class Parser:\n    def __init__(self"


def _demo_cache() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    cache = base / "swapmoe"
    cache.mkdir(parents=True, exist_ok=True)
    return cache


def _print_stream_stats(m) -> None:
    s = m.stats
    budget = m.plan.budget_bytes
    click.echo(f"\n--- expert streaming ({m.plan.engine}) ---")
    click.echo(
        f"prompt  {s.prompt_tokens} tokens at {s.prompt_tokens / max(s.prompt_seconds, 1e-9):.1f} tok/s; "
        f"decode {s.decode_tokens} tokens at {s.decode_tokens / max(s.decode_seconds, 1e-9):.1f} tok/s"
    )
    click.echo(
        f"experts asked for {s.requests}, found in RAM {s.hits}, read {s.misses} "
        f"({s.bytes_read / 2**20:.1f} MiB), evicted {s.evictions}"
    )
    if budget is not None:
        click.echo(
            f"resident experts at most {s.peak_resident_expert_bytes / 2**20:.2f} MiB "
            f"of a {budget / 2**20:.2f} MiB budget"
        )


@main.command()
@click.option(
    "--big",
    is_flag=True,
    help="Also run a synthetic model 4x larger than a memory cap the demo sets "
    "(needs root for the cgroup, and ~5 GB of disk).",
)
@click.option("-n", "--max-tokens", type=int, default=64, show_default=True, help="Tokens to generate.")
@user_errors
def demo(big, max_tokens):
    """Run swapmoe on the tiny MoE model shipped inside the package.

    The model is repacked into ~/.cache/swapmoe on first use, then generates text with an
    expert cache of a quarter of its experts' bytes (rounded up to whole MiB), and shows what
    the streaming did.
    """
    import swapmoe
    import swapmoe.runtime.kernels  # noqa: F401  (sets NUMBA_CACHE_DIR, read below)
    from swapmoe.gguf_file import open_gguf
    from swapmoe.inspect import format_summary, summarize
    from swapmoe.repack.index import load as load_index, sidecar_path

    # numba writes an index file per compiled function; look before the summary below compiles a few
    cache_dir = os.environ.get("NUMBA_CACHE_DIR")
    cold_cache = cache_dir and next(Path(cache_dir).rglob("*.nbi"), None) is None
    path = Path(swapmoe.default_model_path())
    if not path.exists():
        raise SwapmoeError(f"{path}: the embedded model is missing from this installation")
    packed = _demo_cache() / "tiny-moe.repacked.gguf"
    if not packed.exists() or not sidecar_path(packed).exists():
        click.echo(f"repacking the embedded model into {packed} ...")
        swapmoe.repack(path, packed, force=True)
    click.echo("The embedded tiny model, a qwen3moe trained on Python sources, repacked:\n")
    click.echo(format_summary(summarize(open_gguf(packed))))
    expert_bytes = int(load_index(packed).part_length.sum())
    cache_mib = -(-expert_bytes // (4 << 20))  # a quarter, rounded up: the cache size is whole MiB
    if cold_cache:
        click.echo(
            f"\nFirst run: numba compiles the kernels before the first token (once; cached in {cache_dir}), "
            "so the speeds below include the compile."
        )
    m = swapmoe.load(packed, io="pread", expert_cache_size=cache_mib)
    budget = m.plan.budget_bytes
    click.echo(
        f"\nGenerating with {budget / 2**20:.0f} MiB for experts, {budget / expert_bytes:.0%} of their "
        f"{expert_bytes / 2**20:.1f} MiB (a quarter, rounded up to whole MiB):\n"
    )
    click.echo(DEMO_PROMPT, nl=False)
    for piece in m.generate(DEMO_PROMPT, max_tokens=max_tokens):
        click.echo(piece, nl=False)
    _print_stream_stats(m)
    if big:
        _big_demo()


def _big_demo() -> None:
    """A synthetic Qwen3-30B-A3B-shaped model of ~4.5 GB, run under a 1.2 GiB memory cap."""
    import swapmoe
    from swapmoe.memcap import run_capped
    from swapmoe.repack.index import sidecar_path

    cache = _demo_cache()
    original, packed = cache / "big-demo.gguf", cache / "big-demo.repacked.gguf"
    if not packed.exists() or not sidecar_path(packed).exists():
        click.echo("\nwriting a 12-layer Qwen3-30B-A3B-shaped model (Q4_K_M) and repacking it ...")
        swapmoe.synth(original, preset="qwen3-30b-a3b", type="Q4_K_M", n_layer=12, force=True)
        swapmoe.repack(original, packed, force=True, progress=True)
        original.unlink()
    cap = 1200 << 20
    click.echo(
        f"\n{packed.name}: {packed.stat().st_size / 2**30:.2f} GiB, run under a {cap >> 20} MiB cap "
        "(page cache included):"
    )
    result = run_capped(
        [sys.executable, "-m", "swapmoe.cli", "run", str(packed), "-p", "hello", "-n", "16", "--ignore-eos", "--stats"],
        cap,
    )
    click.echo(
        f"peak memory {result.peak / 2**20:.0f} MiB of {cap >> 20} MiB, OOM kills {result.oom_kills}, "
        f"exit {result.returncode}"
    )
    if result.returncode != 0:
        raise SwapmoeError("the capped run failed")


if __name__ == "__main__":
    main(prog_name="swapmoe")
