"""Chat templates from strangers' files: each way to run long or build much is stopped with one
ChatTemplateError, and ordinary templates are not slowed or changed by the checks."""

from __future__ import annotations

import time

import pytest

from swapmoe.runtime.chat import ChatTemplateError, render_template

HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "template, message",
    [
        ("{% set s = 'x' %}" + "{% set s = s ~ s %}" * 48, "joined string"),
        (
            "{% macro d(s, k) %}{% if k %}{{ d(s ~ s, k - 1) }}{% endif %}{% endmacro %}{{ d('x', 64) }}",
            "joined string",
        ),
        (
            "{% set ns = namespace(a=[1]) %}{% for i in range(64) %}{% set ns.a = ns.a + ns.a %}{% endfor %}",
            "concatenated string or list",
        ),
        ("{{ '%0*d' % (10**9, 1) }}", "formatted string"),
        ("{{ '{:>1000000000}'.format(1) }}", "formatted string"),
        ("{{ 'x'.ljust(10**9) }}", "ljust"),
        ("{{ 'a\tb'.expandtabs(10**9) }}", "expandtabs"),
        ("{{ ('x' * 4000000).replace('', 'y' * 40) }}", "replace"),
        ("{{ ('x' * 4000000) | replace('x', 'y' * 40) }}", "replaced string"),
        ("{{ range(65536) | join('x' * 100000) }}", "joined string"),
        ("{{ ('x' * 10000) | indent(10**9) }}", "indented string"),
        ("{{ ('a ' * 5000000) | wordwrap(1) }}", "lines"),
        ("{{ range(10) | slice(10**9) | list }}", "slices"),
        ("{{ 2 ** 4096 ** 4096 }}", r"computes a huge number \*\* 4096"),
        ("{{ lipsum(10**9) }}", "lipsum"),
    ],
)
def test_what_a_template_builds_is_bounded(template, message):
    with pytest.raises(ChatTemplateError, match=message):
        render_template(template, HI)


@pytest.mark.parametrize(
    "template",
    [
        "{% for i in range(30000) %}{% for j in range(30000) %}{% endfor %}{% endfor %}",  # no output, no call
        "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}",
    ],
)
def test_a_template_that_runs_long_is_stopped(template, monkeypatch):
    from swapmoe.runtime import chat

    monkeypatch.setattr(chat, "MAX_SECONDS", 0.5)
    started = time.monotonic()
    with pytest.raises(ChatTemplateError, match="ran for over"):
        render_template(template, HI)
    assert time.monotonic() - started < 5


def test_the_guards_cannot_be_rebound_and_change_nothing_else():
    """Loops and `~` keep their meaning (loop variables, filters in loops, nested loops)."""
    template = (
        "{% set loop_steps = 1 %}{% set joined = 2 %}{% for m in messages if m.role == 'user' %}"
        "{{ loop.index }}/{{ loop.length }} {{ m.role ~ ':' ~ m.content }}{% endfor %}"
        "{% for i in range(3) %}{% for j in range(i) %}{{ i ~ j }}{% endfor %}{% endfor %}"
    )
    assert render_template(template, HI + [{"role": "assistant", "content": "yo"}]) == "1/1 user:hi102021"
