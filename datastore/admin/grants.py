"""Least-privilege readers: grant a role exactly what lookups need, and keep it granted across rebuilds.

A lookup client reads three things: the schema revision (``alembic_version``),
the registry (``datastores``), and the ready build's tree table. A reader role
gets ``SELECT`` on those (plus ``CONNECT`` on the database and ``USAGE`` on the
schema where it lacks them), nothing else: it can neither write rows nor create
tables. Every build makes a new tree table, so the grant is recorded in
``reader_grants`` and each later build of the name grants ``SELECT`` on its new
table in the same transaction that makes it ready (:func:`grant_to_readers`). Whoever may read a live layer
(``NAME.live``) may read its delta (``NAME.live.delta``, :func:`datastore.layers.delta_name`): the two are one
source to a reader. It may also read the finished outputs back (``SELECT`` on ``live_outputs``, every layer's rows:
:class:`live.LiveOutputs`, so its output index learns the fleet's).
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from ..connection import connect, one_row
from ..layers import DELTA_SUFFIX, LIVE_SUFFIX, delta_of
from ..schema import require_schema


class RoleNotFound(LookupError):
    """Raised when the role to grant does not exist."""


class UnknownDatastore(LookupError):
    """Raised when a grant names a datastore that was never built (a typo, most likely)."""


def grant_reader(url: str, role: str, name: str | None = None, *, create: bool = False,
                 future: bool = False) -> list[str]:
    """Let ``role`` read the datastore ``name`` (every datastore when ``None``), now and after rebuilds.

    Args:
        url: libpq URL of a role that owns the datastore tables (the one that builds them).
        role: the Postgres role to grant.
        name: a datastore name, or ``None`` for all datastores, present and future.
        create: create ``role`` (``LOGIN``, no password) when it does not exist.
        future: grant a name that has never been built yet (its first build grants its table).

    Returns:
        The tree tables granted now (the ready builds of ``name``; empty when none is built
        yet: the first build grants its own table).

    Raises:
        RoleNotFound: when ``role`` does not exist and ``create`` is false.
        UnknownDatastore: when ``name`` was never built and ``future`` is false.
        datastore.errors.SchemaMismatch: when the registry is not at the current revision.
        datastore.errors.DatabaseUnavailable: when the server cannot be reached.
        psycopg.errors.InsufficientPrivilege: when the caller may not grant (not the tables' owner).
    """
    ident = sql.Identifier(role)
    with connect(url, autocommit=True) as conn:
        require_schema(conn)
        if name is not None and not future and conn.execute(
                "SELECT 1 FROM datastores WHERE name = %s AND state <> 'dropped' LIMIT 1", [name]).fetchone() is None:
            raise UnknownDatastore(f"no datastore named {name!r} was ever built here (see `python -m datastore list "
                                   f"--all`); check the name, or pass --future to grant it before its first build")
        _ensure_role(conn, role, create)
        with conn.transaction():
            conn.execute("INSERT INTO reader_grants (role, name) VALUES (%s, %s) ON CONFLICT DO NOTHING", [role, name])
            _grant_access(conn, role)
            conn.execute(sql.SQL("GRANT SELECT ON alembic_version, datastores, calibration_fits TO {}").format(ident))
            tables = [t for (t,) in conn.execute(
                "SELECT trees_table FROM datastores WHERE state = 'ready' AND (%s::text IS NULL OR name = ANY(%s)) "
                "ORDER BY id", [name, _with_delta(name)])]
            for table in tables:
                conn.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(sql.Identifier(table), ident))
            if name is None or name.endswith(LIVE_SUFFIX):  # a live layer's reader reads its outputs back
                conn.execute(sql.SQL("GRANT SELECT ON live_outputs TO {}").format(ident))
    return tables


def _ensure_role(conn: psycopg.Connection, role: str, create: bool) -> None:
    """Check the schema and that ``role`` exists, creating it (``LOGIN``, no password) when ``create``.

    Raises:
        RoleNotFound: when ``role`` does not exist and ``create`` is false.
    """
    require_schema(conn)
    if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role]).fetchone() is None:
        if not create:
            quoted = sql.Identifier(role).as_string(conn)
            raise RoleNotFound(f"role {role!r} does not exist; create it (CREATE ROLE {quoted} LOGIN) or pass --create")
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))


def _grant_access(conn: psycopg.Connection, role: str) -> None:
    """``CONNECT`` on the database and ``USAGE`` on the current schema, where ``role`` lacks them."""
    ident = sql.Identifier(role)
    db, schema, can_connect, can_use = one_row(
        conn, "SELECT current_database(), current_schema(), has_database_privilege(%s, current_database(), "
        "'CONNECT'), has_schema_privilege(%s, current_schema(), 'USAGE')", [role, role])
    if not can_connect:
        conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(db), ident))
    if not can_use:
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(schema), ident))


def _with_delta(name: str | None) -> list[str | None]:
    """``name``, and its delta's name when ``name`` is a live layer's (:func:`datastore.layers.live_name`)."""
    return [name] + ([delta_of(name)] if name is not None and name.endswith(LIVE_SUFFIX) else [])


def grant_to_readers(conn: psycopg.Connection, table: str, name: str) -> list[str]:
    """Grant ``SELECT`` on a new build's ``table`` to every role recorded for ``name`` (or for all; for a live layer's
    delta, also to those recorded for its layer).

    Called by :class:`datastore.admin.writer.DatastoreWriter` inside the transaction that makes
    the build ready, so readers never see a ready build they may not read. Roles dropped
    since their grant was recorded are skipped.

    Returns:
        The roles granted.
    """
    roles = [r for (r,) in conn.execute(
        "SELECT DISTINCT g.role FROM reader_grants g JOIN pg_roles r ON r.rolname = g.role "
        "WHERE g.name IS NULL OR g.name = ANY(%s) ORDER BY g.role", [[name, name.removesuffix(DELTA_SUFFIX)]])]
    for role in roles:
        conn.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(sql.Identifier(table), sql.Identifier(role)))
    return roles


def grant_appender(url: str, role: str, *, create: bool = False) -> None:
    """Let ``role`` append finished outputs to the live layer (``live_outputs``) and fold its verdicts into the fleet's
    online calibration fits (``calibration_fits``), and nothing else: ``INSERT`` on ``live_outputs`` and ``USAGE`` on
    its id sequence, ``SELECT``, ``INSERT`` and ``UPDATE`` on ``calibration_fits`` (plus ``CONNECT`` / schema
    ``USAGE`` where it lacks them). No ``SELECT``, ``UPDATE`` or ``DELETE`` on outputs: a decoder can add outputs,
    never read or change any.

    Args:
        url: libpq URL of the role that owns the tables (the one that migrates and builds).
        role: the Postgres role to grant. create: create it (``LOGIN``, no password) when missing.

    Raises:
        RoleNotFound: when ``role`` does not exist and ``create`` is false.
        datastore.errors.SchemaMismatch: when the registry is not at the current revision.
        psycopg.errors.InsufficientPrivilege: when the caller may not grant.
    """
    ident = sql.Identifier(role)
    with connect(url, autocommit=True) as conn:
        _ensure_role(conn, role, create)
        with conn.transaction():
            _grant_access(conn, role)
            conn.execute(sql.SQL("GRANT INSERT ON live_outputs TO {}").format(ident))
            conn.execute(sql.SQL("GRANT USAGE ON SEQUENCE live_outputs_id_seq TO {}").format(ident))
            conn.execute(sql.SQL("GRANT SELECT, INSERT, UPDATE ON calibration_fits TO {}").format(ident))


def revoke_reader(url: str, role: str, name: str | None = None) -> list[str]:
    """Take back what :func:`grant_reader` gave ``role`` for ``name`` (every grant when ``None``): the recorded
    grant, so later builds no longer grant it, and ``SELECT`` on the tables of ``name``'s builds (every tree
    table, the registry and the schema revision when ``None``). ``CONNECT`` and schema ``USAGE`` stay.

    Returns:
        The tree tables revoked.

    Raises:
        RoleNotFound: when ``role`` does not exist.
        UnknownDatastore: when ``role`` holds no recorded grant for ``name``.
        datastore.errors.SchemaMismatch / DatabaseUnavailable: as :func:`grant_reader`.
    """
    ident = sql.Identifier(role)
    with connect(url, autocommit=True) as conn:
        _ensure_role(conn, role, create=False)
        with conn.transaction():
            removed = conn.execute("DELETE FROM reader_grants WHERE role = %s AND (%s::text IS NULL OR name = %s)",
                                   [role, name, name]).rowcount
            if not removed:
                what = f"datastore {name!r}" if name is not None else "any datastore"
                raise UnknownDatastore(f"role {role!r} holds no recorded grant for {what} (see reader_grants); "
                                       "nothing to revoke")
            tables = [t for (t,) in conn.execute(
                "SELECT trees_table FROM datastores WHERE (%s::text IS NULL OR name = %s) "
                "AND to_regclass(trees_table) IS NOT NULL ORDER BY id", [name, name])]
            for table in tables:
                conn.execute(sql.SQL("REVOKE SELECT ON {} FROM {}").format(sql.Identifier(table), ident))
            if name is None:
                conn.execute(sql.SQL("REVOKE SELECT ON alembic_version, datastores, calibration_fits FROM {}")
                             .format(ident))
            if conn.execute("SELECT 1 FROM reader_grants WHERE role = %s AND (name IS NULL OR name LIKE %s) LIMIT 1",
                            [role, "%" + LIVE_SUFFIX]).fetchone() is None:  # no live layer's grant left
                conn.execute(sql.SQL("REVOKE SELECT ON live_outputs FROM {}").format(ident))
    return tables
