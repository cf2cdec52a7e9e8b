"""Administration of stored builds: list and stats (read-only), drop (a writer's command)."""

from __future__ import annotations

from psycopg import sql

from .connection import connect, one_row
from .errors import BuildConflict, DatastoreNotFound
from .registry import SWAP_CHANNEL
from .schema import require_schema
from .writer import name_lock_key

__all__ = ["list_datastores", "datastore_stats", "drop_datastore"]


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


def drop_datastore(url: str, name: str) -> int:
    """Drop every build of ``name`` (ready, failed, retired) and its tables; returns builds dropped.

    Reader grants recorded for ``name`` stay, so a later build of the name is readable again.

    Raises:
        datastore.errors.DatastoreNotFound: when no build has that name.
        datastore.errors.BuildConflict: when a build of ``name`` is running.
        datastore.errors.SchemaMismatch: when the registry is not at the current revision.
    """
    with connect(url, autocommit=True) as conn:
        require_schema(conn)
        if not one_row(conn, "SELECT pg_try_advisory_lock(%s)", [name_lock_key(name)])[0]:
            raise BuildConflict(f"a build of {name!r} is running; drop it after the build ends")
        with conn.transaction():
            tables = conn.execute("DELETE FROM datastores WHERE name = %s RETURNING trees_table", [name]).fetchall()
            conn.execute("SELECT pg_notify(%s, %s)", [SWAP_CHANNEL, name])  # live clients stop at once
            for (table,) in tables:
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
    if not tables:
        raise DatastoreNotFound(f"no datastore named {name!r}")
    return len(tables)
