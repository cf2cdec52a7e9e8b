"""Command-line options shared by every entry point (argparse parents and argument types), declared once.

Every option is checked by the parser, before any model, tokenizer or corpus is loaded: a bad value exits 2
with argparse's own message naming the option, the value and the fix.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from .settings import check_libpq

__all__ = ["checked", "database_options", "datastore_name", "existing_path", "existing_dir", "float_in", "int_in",
           "model_spec", "parse_count", "percent", "positive_float"]

T = TypeVar("T")

NAME_RULE = "1..200 letters, digits, '.', '_' or '-', starting with a letter or digit"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def check_name(name: str, what: str = "datastore name") -> str:
    """``name`` when it is a valid datastore name (:data:`NAME_RULE`).

    Raises:
        ValueError: naming the value and the rule.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"{what} {name!r} is not valid: use {NAME_RULE}")
    return name


def checked(check: Callable[[str], T], text: str, errors: tuple[type[Exception], ...] = (ValueError,)) -> T:
    """``check(text)``, its ``errors`` raised as argparse's error with the message unchanged: how a library's check
    becomes an argparse type (argparse then names the option and exits 2)."""
    try:
        return check(text)
    except errors as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def datastore_name(text: str) -> str:
    """argparse type: a valid datastore name."""
    return checked(check_name, text)


def database_url(text: str) -> str:
    """argparse type: a libpq connection string (its password is never echoed)."""
    return checked(check_libpq, text)


def existing_path(text: str) -> Path:
    """argparse type: a file or directory that exists."""
    path = Path(text).expanduser()
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text}: no such file or directory")
    return path


def existing_dir(text: str) -> Path:
    """argparse type: a directory that exists."""
    path = existing_path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: not a directory")
    return path


def int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """argparse type: an integer in ``low..high`` (no upper bound when ``high`` is ``None``)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if high is None and value < low:
            raise argparse.ArgumentTypeError(f"{value}: must be >= {low}")
        if high is not None and not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is outside {low}..{high}")
        return value

    parse.__name__ = "integer"
    return parse


def _number(text: str) -> float:
    """``text`` as a float; argparse's error when it is not a number."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def positive_float(text: str) -> float:
    """argparse type: a finite number above 0 (a rate, a scale, seconds)."""
    value = _number(text)
    if not 0.0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text}: must be a finite number > 0")
    return value


def percent(text: str) -> float:
    """argparse type: a share in percent, a number in (0, 100]."""
    value = _number(text)
    if not 0.0 < value <= 100.0:
        raise argparse.ArgumentTypeError(f"{text}: must be a percentage in (0, 100]")
    return value


def float_in(low: float, high: float | None = None) -> Callable[[str], float]:
    """argparse type: a finite number in ``[low, high]`` (no upper bound when ``high`` is ``None``), e.g.
    ``float_in(0, 1)`` for a probability, ``float_in(0)`` for a size where 0 turns a feature off."""
    def parse(text: str) -> float:
        value = _number(text)
        if high is None and not low <= value < float("inf"):
            raise argparse.ArgumentTypeError(f"{text}: must be a finite number >= {low:g}")
        if high is not None and not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} is outside [{low:g}, {high:g}]")
        return value

    parse.__name__ = "number"
    return parse


def model_spec(text: str) -> str:
    """argparse type: a model or tokenizer spec that resolves here (:func:`toolkit.tokenizer.check_model_spec`):
    a local folder, a ``.gguf`` file, the default model, or a hub id that is cached or reachable (a hub that
    cannot be reached is refused within seconds, with the offline options)."""
    from .tokenizer import check_model_spec

    return checked(check_model_spec, text, (ValueError, FileNotFoundError))


def database_options() -> argparse.ArgumentParser:
    """``--database-url``: where the datastores live (a parent parser for ``argparse``)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--database-url", type=database_url, default=None, metavar="URL",
                   help="libpq URL, e.g. postgresql://user@host:5432/db (default: $DATABASE_URL, else an embedded "
                        "PostgreSQL in a per-user data directory).")
    return p


def parse_count(text: str) -> int:
    """Parse ``2M``, ``500K``, ``1.5m``, ``2000000`` or ``2_000_000`` into an int.

    Raises:
        argparse.ArgumentTypeError: for anything else, or a value below 1.
    """
    m = re.fullmatch(r"\s*([0-9][0-9_]*(?:\.[0-9]+)?)\s*([kKmMgG]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count; write e.g. 2M, 500K or 2000000")
    value = float(m.group(1).replace("_", "")) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2).lower()]
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number >= 1")
    return int(value)
