"""Readers never write: a least-privilege role opens a datastore, looks up and decodes losslessly, keeps reading
across rebuilds and is refused every write; a registry at another revision is refused with the fix named;
``python -m datastore migrate`` brings it up (backfilling each build's n-gram lengths)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import psycopg
import pytest
from psycopg import sql

from conftest import REPO, build_small, with_params
from datastore import Datastore
from datastore.catalog import datastore_stats, drop_datastore
from datastore.connection import connect
from datastore.errors import LookupFailed, SchemaMismatch
from datastore.schema import REVISIONS, SCHEMA_REVISION, alembic_config, upgrade
from datastore.writer import DatastoreWriter
from decoder import DraftingService, greedy_generate, speculative_generate
from decoder.drafters import DatastoreSource


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "datastore", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def test_read_only_role_decodes_losslessly_and_cannot_write(database_url, reader, ds_name, sharegpt_sample, tokenizer,
                                                            target, eval_prompts):
    role, reader_url = reader
    build_small(database_url, ds_name, sharegpt_sample)
    granted = _cli("grant-reader", role, "--name", ds_name, "--create", "--database-url", database_url)
    assert granted.returncode == 0, granted.stderr
    assert datastore_stats(database_url, ds_name)["table"] in granted.stdout

    prompt = eval_prompts[0]
    source = DatastoreSource(lambda: Datastore.open(ds_name, tokenizer=tokenizer, database_url=reader_url))
    assert source.lookup(list(prompt.token_ids)) is not None
    out = speculative_generate(target, prompt.token_ids, DraftingService(source), max_new_tokens=24, budget=8)
    assert out.output_ids == greedy_generate(target, prompt.token_ids, max_new_tokens=24).output_ids
    assert not source.faults  # every lookup went through as the reader
    source.close()

    table = datastore_stats(database_url, ds_name)["table"]
    writes: list[str | sql.Composed] = [
        "INSERT INTO datastores (name, trees_table, tokenizer, tokenizer_fingerprint, key_width) "
        "VALUES ('x', 'token_trees_0', 'x', 'x', 2)",
        "UPDATE datastores SET state = 'failed'",
        sql.SQL("UPDATE {} SET tree = tree").format(sql.Identifier(table)),
        sql.SQL("DELETE FROM {}").format(sql.Identifier(table)),
        sql.SQL("DROP TABLE {}").format(sql.Identifier(table)),
        "CREATE TABLE crest_reader_probe (a int)",
        "INSERT INTO reader_grants (role) VALUES ('x')",
        "UPDATE alembic_version SET version_num = '0001'",
    ]
    with psycopg.connect(reader_url, autocommit=True) as conn:
        for statement in writes:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        DatastoreWriter.begin(reader_url, ds_name, tokenizer="x", tokenizer_fingerprint="0" * 64, key_width=2,
                              corpus={}, params={})
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        drop_datastore(reader_url, ds_name)
    dropped = _cli("drop", ds_name, "--database-url", reader_url)
    assert dropped.returncode == 1 and "may not drop" in dropped.stderr

    rebuilt = build_small(database_url, ds_name, sharegpt_sample)  # the grant follows the name to the new build
    with Datastore.open(ds_name, tokenizer=tokenizer, database_url=reader_url) as ds:
        assert ds.info.id == rebuilt and ds.lookup(list(prompt.token_ids)) is not None


def test_reader_of_one_datastore_is_refused_another(database_url, reader, ds_name, sharegpt_sample, tokenizer):
    role, reader_url = reader
    other = f"{ds_name}-other"
    build_small(database_url, ds_name, sharegpt_sample)
    build_small(database_url, other, sharegpt_sample)
    try:
        assert _cli("grant-reader", role, "--name", ds_name, "--create", "--database-url", database_url).returncode == 0
        with (Datastore.open(other, tokenizer=tokenizer, database_url=reader_url) as ds,
              pytest.raises(LookupFailed, match=f"grant-reader ROLE --name {other}")):
            ds.lookup([1, 2])
        missing_role = _cli("grant-reader", f"{role}_missing", "--database-url", database_url)
        assert missing_role.returncode == 2 and "does not exist" in missing_role.stderr
    finally:
        drop_datastore(database_url, other)


@pytest.fixture
def fresh_database(database_url):
    """A new, empty database on the same server (dropped afterwards) and its URL."""
    name = f"crest_schema_{uuid.uuid4().hex[:8]}"
    with connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield with_params(database_url, dbname=name)
    with connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


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
    check = _cli("migrate", "--check", "--database-url", url)
    assert check.returncode == 1 and "python -m datastore migrate" in check.stderr
    migrated = _cli("migrate", "--database-url", url)
    assert migrated.returncode == 0 and f"0001 -> {SCHEMA_REVISION}" in migrated.stdout, migrated.stderr
    assert _cli("migrate", "--check", "--database-url", url).returncode == 0
    with connect(url) as conn:
        row = conn.execute("SELECT params FROM datastores WHERE name = 'old'").fetchone()
        assert row is not None
        params = row[0]
    assert params["ns"] == [1, 3] and params["max_n"] == 3  # n=2 kept nothing: never probed
    with connect(url, autocommit=True) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '9999'")
    with pytest.raises(SchemaMismatch, match="revision 9999.*upgrade this package"):
        Datastore.open("old", fingerprint="0" * 64, database_url=url)


def test_the_migrations_folder_is_the_one_place_a_revision_is_named():
    """Adding a migration touches ``datastore/migrations/versions`` only: the revision the package reads is the
    folder's newest file, and Alembic's own view of the scripts (ids, order, head) is the same."""
    from alembic.script import ScriptDirectory

    scripts = ScriptDirectory.from_config(alembic_config())
    chain = [s.revision for s in scripts.walk_revisions()][::-1]  # base first
    assert tuple(chain) == REVISIONS and scripts.get_current_head() == SCHEMA_REVISION
