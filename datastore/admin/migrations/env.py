"""Alembic environment for the datastore registry.

The URL is, in order: a connection handed over by :mod:`datastore.admin.migrate`
(``config.attributes["connection"]``), the ``sqlalchemy.url`` option, or
:func:`datastore.connection.resolve_database_url` (``DATABASE_URL`` or the
embedded server). Per-build tree tables (``token_trees_<id>``) are data, not
schema: autogenerate and ``alembic check`` ignore them.
"""

from alembic import context
from sqlalchemy import text

from datastore.admin.migrate import engine_for
from datastore.admin.models import TREE_TABLE_PREFIX, Base
from datastore.connection import resolve_database_url

config = context.config
target_metadata = Base.metadata
_LOCK_KEY = 0x43524553  # advisory lock serializing concurrent upgrades ("CRES")


def include_name(name, type_, parent_names):
    """Skip the per-build tree tables and their indexes."""
    if type_ == "table":
        return not (name or "").startswith(TREE_TABLE_PREFIX)
    if type_ == "index":
        return not (parent_names.get("table_name") or "").startswith(TREE_TABLE_PREFIX)
    return True


def _run(connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata, include_name=include_name,
                      compare_type=True)
    connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK_KEY})
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url") or resolve_database_url()
    engine = engine_for(url)
    with engine.connect() as conn:
        _run(conn)
        conn.commit()
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline migrations are not supported; run against a database")
run_migrations_online()
