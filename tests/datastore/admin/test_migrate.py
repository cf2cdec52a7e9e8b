"""Migrations (:mod:`datastore.admin.migrate`): the models and the migrations agree (tree tables are data, not schema),
and the revisions the readers know are the migration files, in Alembic's own order."""

from __future__ import annotations

from datastore.admin.migrate import MIGRATION_REVISIONS, alembic_config, check_models
from datastore.registry import REVISIONS, SCHEMA_REVISION
from support import build_small


def test_models_match_migrations_with_tree_tables_present(database_url, ds_name, sharegpt_sample):
    build_small(database_url, ds_name, sharegpt_sample)
    check_models(database_url)  # raises when models and migrations disagree; tree tables are ignored


def test_the_migrations_folder_is_the_one_place_a_revision_is_named():
    """A migration is a file of ``datastore/admin/migrations/versions``; the readers' list of revisions
    (:data:`datastore.registry.REVISIONS`) is those files', newest last, and Alembic's own view of the scripts (ids,
    order, head) is the same."""
    from alembic.script import ScriptDirectory

    scripts = ScriptDirectory.from_config(alembic_config())
    chain = [s.revision for s in scripts.walk_revisions()][::-1]  # base first
    assert tuple(chain) == REVISIONS == MIGRATION_REVISIONS and scripts.get_current_head() == SCHEMA_REVISION
