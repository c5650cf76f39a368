"""The one exception type for problems a user can fix (bad file, bad option).

The CLI prints such errors as a single line and exits non-zero; anything else is a bug
and keeps its traceback.
"""

import difflib
import functools
import inspect


class SwapmoeError(Exception):
    """A user-facing error: the message names the file and the problem."""


def keyword_options(function):
    """Decorate a public function whose options are keyword-only parameters: a keyword it does
    not have is a SwapmoeError naming it and the closest one it has (Python's own TypeError
    names no alternative)."""
    known = [name for name, p in inspect.signature(function).parameters.items() if p.kind is p.KEYWORD_ONLY]

    @functools.wraps(function)
    def checked(*args, **options):
        check_options(options, known, f"swapmoe.{function.__name__}")
        return function(*args, **options)

    checked.options = known  # the keywords it takes, for callers that pass options on
    return checked


def check_options(options: dict, known: list[str], where: str) -> None:
    """Raise a SwapmoeError for the first name of `options` not in `known`."""
    for name in options:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (options: {', '.join(known)})"
            raise SwapmoeError(f"{where}: unknown option {name!r}{hint}")
