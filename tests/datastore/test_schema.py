"""The registry's revision as a reader checks it (:mod:`datastore.schema`): a registry never migrated, or at another
revision, is refused with the fix named; ``python -m datastore migrate`` brings it up (backfilling each build's
n-gram lengths)."""

from __future__ import annotations

import json

import pytest

from datastore import Datastore
from datastore.admin.migrate import upgrade
from datastore.connection import connect
from datastore.errors import SchemaMismatch
from datastore.registry import SCHEMA_REVISION
from support import run_module


def test_registry_at_another_revision_is_refused_and_migrated(fresh_database):
    url = fresh_database
    with pytest.raises(SchemaMismatch, match="never migrated.*python -m datastore migrate"):
        Datastore.open("any", fingerprint="0" * 64, database_url=url)
    upgrade(url, "0001")
    with connect(url, autocommit=True) as conn:  # a build made before revision 0002: lengths only in ngram_stats
        conn.execute("INSERT INTO datastores (name, state, trees_table, tokenizer, tokenizer_fingerprint, key_width, "
                     "params, ngram_stats) VALUES ('old', 'ready', 'token_trees_999', 't', %s, 2, %s, %s)",
                     ["0" * 64, json.dumps({"max_n": 5}),
                      json.dumps({"1": {"kept": 3}, "2": {"kept": 0}, "3": {"kept": 7}})])
    with pytest.raises(SchemaMismatch, match=f"revision 0001; this client reads revision {SCHEMA_REVISION}.*"
                                             "python -m datastore migrate"):
        Datastore.open("old", fingerprint="0" * 64, database_url=url)
    check = run_module("datastore", "migrate", "--check", "--database-url", url)
    assert check.returncode == 1 and "python -m datastore migrate" in check.stderr
    migrated = run_module("datastore", "migrate", "--database-url", url)
    assert migrated.returncode == 0 and f"0001 -> {SCHEMA_REVISION}" in migrated.stdout, migrated.stderr
    assert run_module("datastore", "migrate", "--check", "--database-url", url).returncode == 0
    with connect(url) as conn:
        row = conn.execute("SELECT params FROM datastores WHERE name = 'old'").fetchone()
        assert row is not None
        params = row[0]
    assert params["ns"] == [1, 3] and params["max_n"] == 3  # n=2 kept nothing: never probed
    with connect(url, autocommit=True) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '9999'")
    with pytest.raises(SchemaMismatch, match="revision 9999.*upgrade this package"):
        Datastore.open("old", fingerprint="0" * 64, database_url=url)
