"""The one exception type for problems a user can fix (bad file, bad option).

The CLI prints such errors as a single line and exits non-zero; anything else is a bug
and keeps its traceback.
"""


class SwapmoeError(Exception):
    """A user-facing error: the message names the file and the problem."""
