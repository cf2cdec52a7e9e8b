"""What every benchmark shares: its command line's common options, the saved references it replays (checked against
the prompts this install reads), the screen that refuses a datastore holding what it scores, and the ``--out`` /
``--table`` tail (the figures written as JSON, or an earlier run's reprinted).

A benchmark is a module run as ``python -m benchmarks.<name>``: it builds its parser with :func:`parser`, measures,
and ends with :func:`finish`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from evaluation.references import REFERENCES, Reference

__all__ = ["RESULTS", "finish", "parser", "references", "require_clean", "saved"]

RESULTS = Path("results")
"""Where the benchmarks write their figures by default (relative to the working directory)."""


def parser(doc: str | None, *, out: str | None = None, refs: bool = True) -> argparse.ArgumentParser:
    """A benchmark's parser, described by the first paragraph of its docstring ``doc``, with ``--references DIR``
    (``refs``) and, given ``out`` (a file name under :data:`RESULTS`), ``--out FILE`` and ``--table``."""
    ap = argparse.ArgumentParser(description=" ".join((doc or "").split("\n\n")[0].split()))
    if refs:
        ap.add_argument("--references", type=Path, default=REFERENCES, metavar="DIR",
                        help="the saved greedy references (default: %(default)s; python -m evaluation references).")
    if out is not None:
        ap.add_argument("--out", type=Path, default=RESULTS / out,
                        help="the figures' JSON file (default: %(default)s).")
        ap.add_argument("--table", action="store_true", help="only print the tables of an earlier run's --out.")
    return ap


def references(name: str, folder: Path, which: str = "report") -> list[Reference]:
    """One half of a set's saved references (:func:`evaluation.references.half`), file order kept.

    Raises:
        SystemExit: when the file is missing or was made from anything else (the message gives the command that makes
            it).
    """
    from evaluation.references import ReferenceMismatch, half, load_references

    try:
        return half(load_references(name, folder), which)
    except (FileNotFoundError, ReferenceMismatch) as exc:
        raise SystemExit(f"error: {exc}") from None


def require_clean(datastore: str, set_name: str, ids: list[str]) -> None:
    """Refuse to score the items ``ids`` of ``set_name`` on ``datastore`` when its corpus holds any of them
    (:func:`evaluation.require_clean`, on ``$DATABASE_URL`` or the embedded server).

    Raises:
        SystemExit: naming the contaminated items and documents, a datastore that records no screen, or one that is not
            built.
    """
    from datastore.connection import resolve_database_url
    from datastore.errors import DatastoreNotFound
    from evaluation.contamination import Contaminated, NotScreened
    from evaluation.contamination import require_clean as gate

    try:
        gate(resolve_database_url(None), datastore, set_name, ids)
    except (Contaminated, NotScreened, DatastoreNotFound) as exc:
        raise SystemExit(f"error: {exc}") from None


def saved(path: Path, *keys: str, fix: str) -> dict:
    """An earlier run's JSON figures, holding ``keys``.

    Raises:
        SystemExit: naming the file and ``fix`` when it is missing, cut short or holds no such keys.
    """
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise SystemExit(f"error: {path} not found: {fix}") from None
    except json.JSONDecodeError as exc:
        raise SystemExit(f"error: {path} is not JSON ({exc}; cut short?): {fix}") from None
    if not isinstance(doc, dict) or any(k not in doc for k in keys):
        raise SystemExit(f"error: {path} holds no {', '.join(keys)}: {fix}")
    return doc


def finish(args: argparse.Namespace, measure: Callable[[], dict], report: Callable[[dict], None], *keys: str) -> None:
    """The tail: with ``--table``, :func:`report` an earlier run's ``--out``; else ``measure()``, write it to
    ``--out`` and report it."""
    if getattr(args, "table", False):
        return report(saved(args.out, *keys, fix="run the benchmark first (or name its --out)"))
    doc = measure()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    report(doc)
    print(f"wrote {args.out}")
