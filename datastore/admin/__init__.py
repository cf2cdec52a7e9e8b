"""Administration of the datastores: everything that writes (a reader needs none of it).

The build writer (:mod:`datastore.admin.writer`), DDL that never blocks lookups (:mod:`datastore.admin.ddl`), the
catalog (list, stats, drop, vacuum: :mod:`datastore.admin.catalog`), reader and appender grants
(:mod:`datastore.admin.grants`), the registry's SQLAlchemy models and Alembic migrations
(:mod:`datastore.admin.models`, :mod:`datastore.admin.migrate`), the live layer's writer
(:mod:`live.writer`) and the command line (``python -m datastore``, :mod:`datastore.admin.cli`).
Each module is imported by its own name; most need the ``admin`` extra (SQLAlchemy, Alembic).
"""
