"""Dropping a build's table without ever queueing a lookup behind it.

Postgres queues lock requests: a ``DROP TABLE`` waiting for its ACCESS EXCLUSIVE lock (behind any session
that holds the table, an idle transaction included) makes every later ACCESS SHARE request wait behind it,
so one idle reader and one ``DROP`` would freeze every lookup of that table. So a table leaves the registry
first (its build is ``retired`` or ``dropped``: clients stop reading it), and is then dropped only when free:

- a session that holds any lock on it is reported, and the table is left for later;
- otherwise ``DROP TABLE`` runs under a short ``lock_timeout`` (a lookup that slipped in between waits at
  most that long), and a timeout is reported the same way.

A table left for later is dropped by ``python -m datastore vacuum``, the next build (of any name) or
``python -m datastore drop`` (:func:`vacuum`). Every report names the blocking session: its pid, its
``application_name`` and how long its transaction has been open.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import psycopg
from psycopg import sql

DDL_LOCK_TIMEOUT_S = 1.0
"""How long a ``DROP TABLE`` may wait for its lock before it gives up (and reports what it waited on)."""


@dataclass(frozen=True)
class Blocker:
    """A session holding a lock on a table.

    Attributes:
        pid: its backend pid. application_name: as it set it. state: ``active``, ``idle in transaction`` ...
        age_s: seconds since its transaction (else its query) began. query: its last query (first 120 chars).
    """

    pid: int
    application_name: str
    state: str
    age_s: float
    query: str

    def describe(self) -> str:
        """``pid 4242 (psql, idle in transaction for 35 s: SELECT ...)``."""
        app = self.application_name or "no application_name"
        return f"pid {self.pid} ({app}, {self.state or 'unknown state'} for {self.age_s:.0f} s: {self.query!r})"


@dataclass(frozen=True)
class PendingDrop:
    """A table that left the registry and could not be dropped yet, and the sessions that hold it."""

    table: str
    blockers: tuple[Blocker, ...]

    def describe(self) -> str:
        """What waits on what, and when it will be dropped."""
        held = "; ".join(b.describe() for b in self.blockers) or "a session that let go meanwhile"
        return (f"table {self.table} is in use by {held}: it no longer serves, and is dropped when free "
                "(python -m datastore vacuum, the next build or drop)")


def blockers(conn: psycopg.Connection, table: str) -> tuple[Blocker, ...]:
    """The other sessions holding (or waiting for) a lock on ``table`` (none when it does not exist)."""
    rows = conn.execute(
        "SELECT DISTINCT a.pid, coalesce(a.application_name, ''), coalesce(a.state, ''), "
        "extract(epoch FROM now() - coalesce(a.xact_start, a.query_start, a.backend_start))::float8, "
        "left(coalesce(a.query, ''), 120) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.locktype = 'relation' AND l.relation = to_regclass(%s) AND l.pid <> pg_backend_pid() "
        "ORDER BY 1", [table]).fetchall()
    return tuple(Blocker(int(p), app, state, float(age or 0.0), query) for p, app, state, age, query in rows)


def drop_when_free(conn: psycopg.Connection, tables: Iterable[str],
                   lock_timeout_s: float = DDL_LOCK_TIMEOUT_S) -> list[PendingDrop]:
    """Drop each table that exists and no other session holds; never wait longer than ``lock_timeout_s``.

    Args:
        conn: an autocommit connection of a role that owns the tables.
        tables: tree tables that already left the registry (no ready build names them).
        lock_timeout_s: the ``lock_timeout`` of each ``DROP TABLE``, > 0.

    Returns:
        The tables left for later, with the sessions that hold them.

    Raises:
        ValueError: when ``lock_timeout_s <= 0``.
    """
    if lock_timeout_s <= 0:
        raise ValueError(f"lock_timeout_s={lock_timeout_s}: must be > 0")
    pending: list[PendingDrop] = []
    for table in tables:
        held = blockers(conn, table)
        if held:
            pending.append(PendingDrop(table, held))
            continue
        try:
            with conn.transaction():
                timeout = sql.Literal(f"{lock_timeout_s * 1000:.0f}ms")
                conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(timeout))
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
        except psycopg.errors.LockNotAvailable:
            pending.append(PendingDrop(table, blockers(conn, table)))
    return pending


def vacuum(conn: psycopg.Connection, lock_timeout_s: float = DDL_LOCK_TIMEOUT_S) -> tuple[list[str], list[PendingDrop]]:
    """Drop the tables of every build that no longer serves (``retired``, ``failed``, ``dropped``) and still has
    one, when free; forget ``dropped`` builds whose tables are gone.

    Args:
        conn: an autocommit connection of the role that builds the datastores.
        lock_timeout_s: as for :func:`drop_when_free`.

    Returns:
        ``(dropped tables, tables still held)``.
    """
    leftovers = [t for (t,) in conn.execute(
        "SELECT trees_table FROM datastores WHERE state IN ('retired', 'failed', 'dropped') "
        "AND to_regclass(trees_table) IS NOT NULL ORDER BY id")]
    pending = drop_when_free(conn, leftovers, lock_timeout_s)
    held = {p.table for p in pending}
    conn.execute("DELETE FROM datastores WHERE state = 'dropped' AND to_regclass(trees_table) IS NULL")
    return [t for t in leftovers if t not in held], pending
