"""Saved greedy references (``benchmarks/references.py``, :mod:`evaluation.references`) checked against the prompts
this checkout replays, and the fit / report halves of each set."""

from __future__ import annotations

import argparse
from functools import cache
from pathlib import Path

from evaluation.prompts import in_half
from evaluation.references import Reference, expected, read_references

REPO = Path(__file__).resolve().parents[1]
REFERENCES = REPO / "results" / "references"


@cache
def _tokenizer():
    from toolkit import load_tokenizer

    return load_tokenizer()


def references_option(parser: argparse.ArgumentParser) -> None:
    """``--references DIR``: where the saved references are (every script that replays them takes it)."""
    parser.add_argument("--references", type=Path, default=REFERENCES, metavar="DIR",
                        help=f"the saved greedy references (default: {REFERENCES.relative_to(REPO)}).")


def load_references(name: str, folder: Path = REFERENCES, max_new_tokens: int = 128) -> list[Reference]:
    """A set's references in file order, checked against the set's prompts as this checkout reads them
    (``CREST_EVAL_DATA`` or the packaged sets), the default model in fp32 and ``max_new_tokens``.

    Raises:
        SystemExit: when the file is missing or was made from anything else (the message gives the command that
            makes it).
    """
    try:
        return read_references(Path(folder) / f"{name}.jsonl",
                               expected(name, _tokenizer(), max_new_tokens=max_new_tokens))
    except (FileNotFoundError, ValueError) as exc:
        raise SystemExit(f"error: {exc}") from None


def half(refs: list[Reference], which: str) -> list[Reference]:
    """The references of one half (:func:`evaluation.prompts.in_half`: ``fit``, ``report`` or ``all``), file order
    kept."""
    seen: dict[str, int] = {}
    out = []
    for r in refs:
        position = seen[r.category] = seen.get(r.category, -1) + 1
        if in_half(position, which):
            out.append(r)
    return out


def require_clean_datastore(datastore: str, set_name: str, ids: list[str]) -> None:
    """Refuse to score the items ``ids`` of ``set_name`` on ``datastore`` when its corpus holds any of them
    (:func:`evaluation.require_clean`, on ``$DATABASE_URL`` or the embedded server).

    Raises:
        SystemExit: naming the contaminated items and documents, a datastore that records no screen, or one that
            is not built.
    """
    from datastore.connection import resolve_database_url
    from datastore.errors import DatastoreNotFound
    from evaluation.contamination import Contaminated, NotScreened, require_clean

    try:
        require_clean(resolve_database_url(None), datastore, set_name, ids)
    except (Contaminated, NotScreened, DatastoreNotFound) as exc:
        raise SystemExit(f"error: {exc}") from None
