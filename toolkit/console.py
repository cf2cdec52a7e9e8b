"""What every command-line entry point shares: exit codes, the one-line error, a closed pipe.

Exit codes: ``0`` done; ``1`` the command could not be carried out (the server is down, the role may not,
a check failed); ``2`` bad input (argparse's own errors, a malformed database URL, a name that does not
exist). An error is one line on stderr, ``error: <what, naming the input, and the fix>``; never a traceback.
Output piped into a reader that stops early (``... --json | head``) ends quietly.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["EXIT_OK", "EXIT_FAILED", "EXIT_USAGE", "clause", "error", "run", "table_console"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def clause(exc: BaseException) -> str:
    """An exception's message as a clause to embed in another message: one line, no trailing punctuation (so
    that ``f"...: {clause(exc)}; ..."`` never doubles a full stop)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text.rstrip(".;:, ")


def error(message: object) -> None:
    """Print ``error: <message>`` on stderr (one line)."""
    print(f"error: {' '.join(str(message).split())}", file=sys.stderr)


def table_console() -> Console:
    """A rich console for a command's tables: the terminal's width, or 200 columns in logs and pipes (a table
    is never wrapped at rich's default of 80 there)."""
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 200)


def run(main: Callable[[], int], usage: tuple[type[BaseException], ...] = (),
        failures: tuple[type[BaseException], ...] = ()) -> int:
    """Run a command's ``main`` and return its exit code, mapping what it raises to one line on stderr.

    Args:
        main: the command; returns its exit code.
        usage: exception types that mean bad input: exit ``2``.
        failures: exception types that mean the command could not be carried out (a datastore's
            :class:`datastore.errors.DatastoreError`, say): exit ``1``.

    A closed stdout pipe ends it quietly (the BrokenPipeError recipe of the Python docs, ``signal`` module notes)
    and Ctrl-C exits 130 without a traceback.
    """
    try:
        code = main()
        sys.stdout.flush()
        return code
    except usage as exc:
        error(exc)
        return EXIT_USAGE
    except failures as exc:
        error(exc)
        return EXIT_FAILED
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)  # nothing more reaches the closed pipe, at exit either
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_FAILED
    except KeyboardInterrupt:
        error("interrupted")
        return 130
