"""The registry schema's revision as a reader checks it: a reader never migrates.

Only commands that build or administer datastores change the schema (``python -m ingest build``,
``python -m datastore migrate``: :mod:`datastore.admin.migrate`); a reader only checks that the database is at
:data:`datastore.registry.SCHEMA_REVISION` and refuses to read any other revision, so a least-privilege role can read.
"""

from __future__ import annotations

import psycopg

from toolkit.console import clause

from .connection import one_row
from .errors import LookupFailed, SchemaMismatch
from .registry import REVISIONS, SCHEMA_REVISION

__all__ = ["require_schema"]

_OLDER = REVISIONS[:-1]  # revisions `migrate` brings up to SCHEMA_REVISION
_MIGRATE = "python -m datastore migrate"


def schema_revision(conn: psycopg.Connection) -> str | None:
    """The database's registry revision, or ``None`` when it was never migrated (a read-only query)."""
    if one_row(conn, "SELECT to_regclass('alembic_version') IS NULL")[0]:
        return None
    row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    return None if row is None else row[0]


def require_schema(conn: psycopg.Connection) -> None:
    """Check that the database is at :data:`SCHEMA_REVISION`; change nothing.

    Raises:
        datastore.errors.SchemaMismatch: naming the revision found, the one needed, and the
            command that migrates.
        datastore.errors.LookupFailed: when the role may not read the registry.
    """
    try:
        found = schema_revision(conn)
    except psycopg.errors.InsufficientPrivilege as exc:
        raise LookupFailed(f"this role may not read the datastore registry ({clause(exc)}); grant it with "
                           "`python -m datastore grant-reader ROLE`") from exc
    if found == SCHEMA_REVISION:
        return
    if found is not None and found not in _OLDER:
        raise SchemaMismatch(f"the datastore registry is at revision {found}, which this version of crest-spec "
                             f"does not know (it reads revision {SCHEMA_REVISION}): a newer release migrated it; "
                             "upgrade this package")
    where = "was never migrated (no datastore was built here yet)" if found is None else f"is at revision {found}"
    raise SchemaMismatch(f"the datastore registry {where}; this client reads revision {SCHEMA_REVISION}. "
                         f"Run `{_MIGRATE}` (as a role that may change the schema), or build a datastore "
                         "with `python -m ingest build`")
