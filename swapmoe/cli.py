"""The `swapmoe` command line."""
from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import click

from swapmoe import __version__
from swapmoe.errors import SwapmoeError


def user_errors(fn):
    """Report SwapmoeError as one line and Ctrl-C as 'interrupted', never as a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except SwapmoeError as e:
            click.echo(f"swapmoe: error: {e}", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("swapmoe: interrupted", err=True)
            sys.exit(130)

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="swapmoe")
def main():
    """Run giant Mixture-of-Experts GGUF models from an SSD.

    Routed experts stay on disk and are read only when a token needs them.
    Start with `swapmoe demo`; see README.md and docs/ for the whole story.
    """


@main.command()
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--arch", help="Architecture (default: the preset's, else qwen3moe): qwen3moe, qwen2moe, olmoe, llama, deepseek2, deepseek4, minimax-m2, gpt-oss, qwen35moe.")
@click.option("--preset", help="Shape of a real model, e.g. qwen3-30b-a3b, deepseek-v4-flash (default: tiny-ARCH).")
@click.option("--size-gb", type=float, help="Scale the layer count so the file is about this many GB.")
@click.option("--type", "type_name", default="Q8_0", show_default=True,
              help="ggml type of every weight matrix (F32, F16, Q8_0, Q4_K, Q2_K, IQ2_XXS, MXFP4, ...) or the mix Q4_K_M.")
@click.option("--layers", type=int, help="Override the layer count.")
@click.option("--experts", type=int, help="Override the number of experts per layer.")
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed for the weights.")
@click.option("--force", is_flag=True, help="Overwrite OUT if it exists.")
@user_errors
def synth(out, arch, preset, size_gb, type_name, layers, experts, seed, force):
    """Write a synthetic MoE GGUF with random weights, for tests and benchmarks.

    \b
    Examples:
      swapmoe synth tiny.gguf
      swapmoe synth big.gguf --preset qwen3-30b-a3b --type Q4_K_M --size-gb 10
    """
    from swapmoe.synthetic import synth as write_synth

    overrides = {k: v for k, v in (("n_layer", layers), ("n_expert", experts)) if v is not None}
    path = write_synth(out, arch=arch, preset=preset, size_gb=size_gb, type=type_name, seed=seed, force=force,
                       **overrides)
    click.echo(f"wrote {path} ({path.stat().st_size / 1e9:.3f} GB)")


@main.command()
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object instead of text.")
@click.option("--page-size", type=int, default=16384, show_default=True, help="Page size for the alignment summary.")
@user_errors
def inspect(model, as_json, page_size):
    """Show experts, slice sizes, RAM needs and alignment of a GGUF."""
    from swapmoe.gguf_file import open_gguf
    from swapmoe.inspect import format_summary, summarize

    summary = summarize(open_gguf(model), page_size)
    click.echo(json.dumps(summary, indent=2) if as_json else format_summary(summary))


@main.command()
@user_errors
def demo():
    """Run swapmoe on the tiny MoE model shipped inside the package."""
    from swapmoe import default_model_path
    from swapmoe.gguf_file import open_gguf
    from swapmoe.inspect import format_summary, summarize

    path = Path(default_model_path())
    if not path.exists():
        raise SwapmoeError(f"{path}: the embedded model is missing from this installation")
    click.echo(f"The embedded tiny model: a qwen3moe trained on Python sources.\n")
    click.echo(format_summary(summarize(open_gguf(path))))
    click.echo("\nRepacking and running come with the next releases; this demo grows with them.")


if __name__ == "__main__":
    main()
