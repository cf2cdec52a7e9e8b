"""Administration of stored builds: list and stats (read-only), drop and vacuum (a writer's commands)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from psycopg import sql

from ..connection import APPLICATION_NAME, connect, one_row
from ..errors import BuildConflict, DatastoreNotFound
from ..layers import delta_name, live_name
from ..registry import SWAP_CHANNEL, name_lock_key
from ..schema import require_schema
from .ddl import DDL_LOCK_TIMEOUT_S, PendingDrop, vacuum

__all__ = ["datastore_stats", "drop_datastore", "empty_live_layer", "vacuum_datastores"]


def list_datastores(url: str, include_all: bool = False) -> list[dict]:
    """Builds with their state and size; only ready ones unless ``include_all``.

    Raises:
        datastore.errors.SchemaMismatch: when the registry is not at the current revision.
        datastore.errors.DatabaseUnavailable: when the server cannot be reached.
    """
    with connect(url) as conn:
        require_schema(conn)
        rows = conn.execute(
            "SELECT id, name, state, tokenizer, num_trees, num_tokens, bytes_on_disk, created_at, completed_at, error "
            "FROM datastores " + ("" if include_all else "WHERE state = 'ready' ") + "ORDER BY name, id").fetchall()
    keys = ("id", "name", "state", "tokenizer", "ngrams", "tokens", "bytes_on_disk", "created_at", "completed_at",
            "error")
    return [dict(zip(keys, r)) for r in rows]


def datastore_stats(url: str, name: str) -> dict:
    """Per-n counts, rows, bytes on disk (table, index, total), bytes per n-gram, mean tree size.

    Raises:
        datastore.errors.DatastoreNotFound: when ``name`` has no ready build.
        datastore.errors.SchemaMismatch: when the registry is not at the current revision.
        psycopg.errors.InsufficientPrivilege: when the role may not read that build.
    """
    with connect(url) as conn:
        require_schema(conn)
        row = conn.execute(
            "SELECT id, trees_table, key_width, params, ngram_stats, corpus, num_tokens, timings, tokenizer, "
            "tokenizer_fingerprint, completed_at FROM datastores WHERE name = %s AND state = 'ready'",
            [name]).fetchone()
        if row is None:
            raise DatastoreNotFound(f"no ready datastore named {name!r}; see `python -m datastore list --all`")
        ds_id, table, width, params, ngram_stats, corpus, num_tokens, timings, tok, fp, completed = row
        per_n = conn.execute(sql.SQL(
            "SELECT length(key) / %s AS n, count(*), avg(length(tree))::float8 FROM {} GROUP BY 1 ORDER BY 1").format(
            sql.Identifier(table)), [width]).fetchall()
        heap, total = one_row(conn, "SELECT pg_table_size(%s::regclass), pg_total_relation_size(%s::regclass)",
                              [table, table])
    rows = sum(c for _, c, _ in per_n)
    by_n = {}
    for n, count, mean_blob in per_n:
        s = ngram_stats.get(str(n), {})
        by_n[str(n)] = {"rows": count, "distinct_in_corpus": s.get("distinct"), "occurrences": s.get("occurrences"),
                        "min_kept_count": s.get("min_kept_count"), "mean_tree_nodes": s.get("nodes", 0) / max(count, 1),
                        "mean_blob_bytes": round(mean_blob, 1)}
    nodes = sum(s.get("nodes", 0) for s in ngram_stats.values())
    return {"name": name, "id": ds_id, "table": table, "tokenizer": tok, "tokenizer_fingerprint": fp,
            "params": params, "corpus": corpus, "tokens": num_tokens, "rows": rows, "bytes_table": heap,
            "bytes_index": total - heap, "bytes_total": total, "bytes_per_ngram": total / max(rows, 1),
            "mean_tree_nodes": nodes / max(rows, 1), "per_n": by_n, "timings": timings,
            "completed_at": completed.isoformat() if completed else None}


@dataclass(frozen=True)
class DropResult:
    """What :func:`drop_datastore` did.

    Attributes:
        name: the datastore. builds: its builds taken out of the registry now (lookups stop at once).
        dropped: tables dropped. pending: tables still in use, dropped later when free (what holds them).
    """

    name: str
    builds: int
    dropped: list[str]
    pending: list[PendingDrop]


def drop_datastore(url: str, name: str, lock_timeout_s: float = DDL_LOCK_TIMEOUT_S) -> DropResult:
    """Drop every build of ``name`` (ready, failed, retired): at once out of the registry (live clients are
    notified and stop reading it), and each table as soon as no session holds it (:mod:`datastore.admin.ddl`: a
    session holding one never makes lookups queue behind the ``DROP``; such a table is reported and dropped
    later by ``python -m datastore vacuum``, the next build or drop).

    Reader grants recorded for ``name`` stay, so a later build of the name is readable again.

    Args:
        url: the builder's URL. name: the datastore. lock_timeout_s: the longest a ``DROP TABLE`` waits.

    Raises:
        datastore.errors.DatastoreNotFound: when no build has that name.
        datastore.errors.BuildConflict: when a build of ``name`` is running.
        datastore.errors.SchemaMismatch: when the registry is not at the current revision.
    """
    with connect(url, autocommit=True, application_name=f"{APPLICATION_NAME} drop") as conn:
        require_schema(conn)
        if not one_row(conn, "SELECT pg_try_advisory_lock(%s)", [name_lock_key(name)])[0]:
            raise BuildConflict(f"a build of {name!r} is running; drop it after the build ends")
        with conn.transaction():
            builds = conn.execute("UPDATE datastores SET state = 'dropped' WHERE name = %s AND state <> 'dropped'",
                                  [name]).rowcount
            tables = {t for (t,) in conn.execute("SELECT trees_table FROM datastores WHERE name = %s", [name])}
            conn.execute("SELECT pg_notify(%s, %s)", [SWAP_CHANNEL, name])  # live clients stop at once
        if not tables:
            raise DatastoreNotFound(f"no datastore named {name!r} (see `python -m datastore list --all`)")
        dropped, pending = vacuum(conn, lock_timeout_s)  # its tables (a drop left pending earlier included)
    return DropResult(name, builds, [t for t in dropped if t in tables], [p for p in pending if p.table in tables])


def empty_live_layer(url: str, name: str, wait_s: float = 0.0) -> tuple[int, int]:
    """Empty the live layer of datastore ``name`` (:mod:`live`): delete its appended outputs and drop its
    builds (``name.live`` and its delta ``name.live.delta``), so drafting starts again from the corpus alone (what a
    benchmark run needs, so it never drafts from outputs an earlier run left of the prompts it scores).

    Args:
        url: the builder's URL. name: the datastore (not its layer's name).
        wait_s: seconds to wait for a compaction of the layer that is running to end (a serving process that has just
            stopped may leave one for a moment: its child exits once it sees its parent gone); 0: do not wait.

    Returns:
        ``(outputs deleted, live builds dropped, the delta's included)``.

    Raises:
        datastore.errors.BuildConflict: when a compaction of the layer is still running after ``wait_s`` (stop the
            serving processes that compact it, or wait).
        datastore.errors.SchemaMismatch: when the registry is not at the current revision.
    """
    deadline = time.monotonic() + wait_s
    with connect(url, autocommit=True, application_name=f"{APPLICATION_NAME} empty live layer") as conn:
        require_schema(conn)
        deleted = conn.execute("DELETE FROM live_outputs WHERE name = %s", [name]).rowcount
        layers = [n for (n,) in conn.execute("SELECT DISTINCT name FROM datastores WHERE name = ANY(%s) "
                                              "AND state <> 'dropped'", [[live_name(name), delta_name(name)]])]
    dropped = 0
    for layer in sorted(layers):
        while True:
            try:
                dropped += drop_datastore(url, layer).builds
                break
            except BuildConflict:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.5)
    return deleted, dropped


def vacuum_datastores(url: str, lock_timeout_s: float = DDL_LOCK_TIMEOUT_S) -> tuple[list[str], list[PendingDrop]]:
    """Drop the tables of every build that no longer serves and still has one, when free
    (:func:`datastore.admin.ddl.vacuum`); returns ``(dropped, still held)``.

    Raises:
        datastore.errors.SchemaMismatch: when the registry is not at the current revision.
        datastore.errors.DatabaseUnavailable: when the server cannot be reached.
    """
    with connect(url, autocommit=True, application_name=f"{APPLICATION_NAME} vacuum") as conn:
        require_schema(conn)
        return vacuum(conn, lock_timeout_s)
