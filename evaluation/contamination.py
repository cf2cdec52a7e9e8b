"""The gate before scoring: a datastore whose corpus holds the prompts about to be scored is refused.

Every build records its contamination screen (:mod:`ingest.contamination`: per evaluation item, the share of its
token 13-grams found in the corpus). Before a benchmark scores a set on a datastore, :func:`require_clean` reads that
record and refuses when any scored item is contaminated (share at or above the recorded threshold, one half): for
Spec-Bench the question itself, for HumanEval the prompt or its canonical solution. The error names the items and
the corpus documents that hold them.

The live layer is screened too: it learns from the outputs drafted for, so a run scored on prompts whose outputs an
earlier run left there drafts from the answers. :func:`live_mark` is read before a run, and :func:`require_fresh_live`
after it refuses to score when an output appended before the mark shares a :data:`LIVE_WINDOW`-token window with an
output scored (what the run itself appends is its own traffic, as a serving process learns from its own).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import psycopg

from datastore.connection import connect
from datastore.errors import DatastoreNotFound
from datastore.registry import server_error
from datastore.schema import require_schema
from toolkit.eval_sets import item_digests

__all__ = ["Contaminated", "LIVE_WINDOW", "NotScreened", "PARTS", "live_mark", "require_clean", "require_fresh_live",
           "screen_record"]

LIVE_WINDOW = 16
"""Tokens in a row an earlier live output must share with a scored output to contaminate it."""

PARTS = {"spec_bench": ("spec_bench",), "humaneval": ("humaneval", "humaneval_solutions"), "bfcl": ("bfcl",),
         "bfcl_heldout": ("bfcl",)}
"""The screened parts that decide for each evaluation set (a conversation's later turns, ``<item>/t<n>``, are their
item's)."""


class Contaminated(ValueError):
    """Raised when a datastore's corpus holds evaluation items about to be scored on it."""


class NotScreened(ValueError):
    """Raised when a datastore's build records no contamination screen."""


def screen_record(url: str, name: str) -> dict | None:
    """The contamination screen recorded with the ready build of datastore ``name`` (``None``: not screened).

    Raises:
        datastore.errors.DatastoreNotFound: when ``name`` has no ready build.
        datastore.errors.DatastoreError: when the registry cannot be read.
    """
    try:
        with connect(url) as conn:
            require_schema(conn)
            row = conn.execute("SELECT corpus -> 'contamination' FROM datastores WHERE name = %s AND state = 'ready'",
                               [name]).fetchone()
    except psycopg.Error as exc:
        raise server_error(name, exc) from exc
    if row is None:
        raise DatastoreNotFound(f"no ready datastore named {name!r}; see `python -m datastore list`")
    return row[0]


def require_clean(url: str, name: str, eval_set: str, item_ids: Sequence[str],
                  data_dir: str | os.PathLike | None = None) -> dict:
    """Refuse to score ``item_ids`` of ``eval_set`` on datastore ``name`` when its corpus holds any of them, or when
    its screen did not cover one of them: each scored item's text (read from ``data_dir``, as the prompts were) must
    be the text the build screened under that id (the digests the screen recorded,
    :func:`toolkit.eval_sets.item_digests`).

    Args:
        url: the database. name: the datastore. eval_set: ``spec_bench`` or ``humaneval``.
        item_ids: the ids of the prompts about to be scored (:attr:`evaluation.prompts.Prompt.id`).
        data_dir: where the scored prompts were read (default: ``CREST_EVAL_DATA`` or the packaged sets).

    Returns:
        Per screened part of the set, ``{"scored", "shared_any", "contaminated", "max_share"}`` over the scored
        items: the figures a report gives.

    Raises:
        ValueError: for an unknown set.
        NotScreened: when the build records no screen (built before screens were recorded, or with
            ``--engine spark``): rebuild it with ``--engine duckdb``; or when its screen did not cover a scored
            item (another text under its id, or an id it never saw; the message names them).
        Contaminated: when a scored item is contaminated; the message names the items and the documents.
        datastore.errors.DatastoreNotFound: when ``name`` has no ready build.
    """
    if eval_set not in PARTS:
        raise ValueError(f"unknown evaluation set {eval_set!r}: choose one of {', '.join(PARTS)}")
    record = screen_record(url, name)
    if not record:
        raise NotScreened(f"datastore {name!r} records no contamination screen (it was built before screens were "
                          "recorded, or with --engine spark), so it cannot be scored on an evaluation set; rebuild it "
                          "with `python -m ingest build --engine duckdb`")
    item_ids = list(dict.fromkeys(item.split("/t")[0] for item in item_ids))  # a conversation's turns: its item
    _require_screened(name, record, eval_set, item_ids, data_dir)
    threshold = float(record["threshold"])
    wanted = set(item_ids)
    bad: list[str] = []
    dirty_items: set[str] = set()
    summary = {}
    for part in PARTS[eval_set]:
        overlaps = {k: v for k, v in record["parts"][part]["overlaps"].items() if k in wanted}
        dirty = {k: v for k, v in overlaps.items() if v["share"] >= threshold}
        summary[part] = {"scored": len(wanted), "shared_any": len(overlaps), "contaminated": len(dirty),
                         "max_share": max((v["share"] for v in overlaps.values()), default=0.0)}
        dirty_items.update(dirty)
        bad += [f"{k} ({part}: {v['share']:.0%} of its {record['n']}-grams, in {', '.join(v['documents'])})"
                for k, v in sorted(dirty.items())]
    if bad:
        shown = "; ".join(bad[:10]) + (f"; and {len(bad) - 10} more" if len(bad) > 10 else "")
        raise Contaminated(f"datastore {name!r} holds {len(dirty_items)} of the {eval_set} items scored here (at least "
                           f"{threshold:.0%} of their {record['n']}-grams occur in its corpus): {shown}. Rebuild it "
                           "without those documents, or score it on another set")
    return summary


def _require_screened(name: str, record: dict, eval_set: str, item_ids: Sequence[str],
                      data_dir: str | os.PathLike | None) -> None:
    """Refuse (:class:`NotScreened`) when a scored item is not, text for text, one the build's screen covered."""
    screened = record.get("screened")
    if screened is None:
        raise NotScreened(f"datastore {name!r} records which evaluation items its screen covered by id only (it was "
                          "built before screens recorded the items' digests), so items of another copy of the sets "
                          "would pass unscreened; rebuild it (`python -m ingest build`)")
    here = item_digests(data_dir)
    missed: list[str] = []
    for part in PARTS[eval_set]:
        covered = screened.get(part, {})
        missed += [f"{item} ({part})" for item in item_ids if covered.get(item) is None
                   or covered[item] != here[part].get(item)]
    if missed:
        shown = ", ".join(missed[:10]) + (f" and {len(missed) - 10} more" if len(missed) > 10 else "")
        raise NotScreened(f"the build of datastore {name!r} did not screen {len(missed)} of the {eval_set} items "
                          f"scored here, as they read now (another text under the id, or an id it never saw): "
                          f"{shown}. Rebuild the datastore with CREST_EVAL_DATA pointing at these sets, so that its "
                          "screen covers them, or score the sets it screened")


def live_mark(url: str, name: str) -> int:
    """The newest output id appended to the live layer of datastore ``name`` (0: none): read before a run, for
    :func:`require_fresh_live`.

    Raises:
        datastore.errors.DatastoreError: when the registry cannot be read.
    """
    try:
        with connect(url) as conn:
            require_schema(conn)
            row = conn.execute("SELECT coalesce(max(id), 0) FROM live_outputs WHERE name = %s", [name]).fetchone()
    except psycopg.Error as exc:
        raise server_error(name, exc) from exc
    return int(row[0]) if row else 0


def require_fresh_live(url: str, name: str, mark: int, outputs: Sequence[Sequence[int]]) -> int:
    """Refuse to score ``outputs`` drafted against datastore ``name`` when its live layer held, before the run (outputs
    appended up to ``mark``, :func:`live_mark`), an output sharing a :data:`LIVE_WINDOW`-token window with one of them.

    Args:
        url: the database. name: the datastore (its live layer: the outputs appended under ``name``).
        mark: :func:`live_mark` read before the run. outputs: the scored outputs' token ids.

    Returns:
        The outputs the layer held before the run (all of them screened).

    Raises:
        Contaminated: naming how many scored outputs an earlier output holds, and the fix (empty the layer first:
            :func:`datastore.admin.catalog.empty_live_layer`).
        datastore.errors.DatastoreError: when the layer cannot be read.
    """
    import numpy as np

    from live.store import decode_output

    w = LIVE_WINDOW
    scored: dict[tuple[int, ...], int] = {}
    for i, out in enumerate(outputs):
        ids = [int(t) for t in out]
        for j in range(len(ids) - w + 1):
            scored.setdefault(tuple(ids[j:j + w]), i)
    hit: set[int] = set()
    held = 0
    try:
        with connect(url) as conn:
            cursor = conn.cursor(name="live_screen")  # server-side: a big layer is streamed, not held
            cursor.execute("SELECT tokens FROM live_outputs WHERE name = %s AND id <= %s", [name, mark])
            for (blob,) in cursor:
                held += 1
                ids = decode_output(bytes(blob)).astype(np.int64).tolist()
                hit.update(scored[g] for j in range(len(ids) - w + 1) if (g := tuple(ids[j:j + w])) in scored)
    except psycopg.Error as exc:
        raise server_error(name, exc) from exc
    if hit:
        raise Contaminated(f"the live layer of {name!r} held, before this run, outputs sharing {w} tokens in a row "
                           f"with {len(hit)} of the {len(outputs)} outputs scored: an earlier run's answers to these "
                           "prompts. Empty it before each run (datastore.admin.catalog.empty_live_layer; "
                           "python -m benchmarks.vllm_serving does unless --keep-live), or score on other prompts")
    return held
