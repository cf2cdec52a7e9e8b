"""Reader grants (:mod:`datastore.admin.grants`): a least-privilege role opens a datastore, looks up and decodes
losslessly, keeps reading across rebuilds and is refused every write, and may read only what it was granted."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest
from psycopg import sql

from datastore import Datastore
from datastore.admin.catalog import datastore_stats, drop_datastore
from datastore.admin.writer import DatastoreWriter
from datastore.errors import LookupFailed
from decoder import greedy_generate, speculative_generate
from drafting import DatastoreSource, DraftingService
from support import build_small, run_module


def test_read_only_role_decodes_losslessly_and_cannot_write(database_url, reader, ds_name, sharegpt_sample, tokenizer,
                                                            target, eval_prompts):
    role, reader_url = reader
    build_small(database_url, ds_name, sharegpt_sample)
    granted = run_module("datastore", "grant-reader", role, "--name", ds_name, "--create", "--database-url",
                         database_url)
    assert granted.returncode == 0, granted.stderr
    assert datastore_stats(database_url, ds_name)["table"] in granted.stdout

    prompt = eval_prompts[0]
    source = DatastoreSource(lambda: Datastore.open(ds_name, tokenizer=tokenizer, database_url=reader_url))
    assert source.lookup(list(prompt.token_ids)) is not None
    drafter = DraftingService(source, vocab_size=len(tokenizer))
    out = speculative_generate(target, prompt.token_ids, drafter, max_new_tokens=24, budget=8)
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
    dropped = run_module("datastore", "drop", ds_name, "--database-url", reader_url)
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
        granted = run_module("datastore", "grant-reader", role, "--name", ds_name, "--create", "--database-url",
                             database_url)
        assert granted.returncode == 0
        with (Datastore.open(other, tokenizer=tokenizer, database_url=reader_url) as ds,
              pytest.raises(LookupFailed, match=f"grant-reader ROLE --name {other}")):
            ds.lookup([1, 2])
        missing_role = run_module("datastore", "grant-reader", f"{role}_missing", "--database-url", database_url)
        assert missing_role.returncode == 2 and "does not exist" in missing_role.stderr
    finally:
        drop_datastore(database_url, other)




def test_a_reader_of_a_live_layer_reads_its_delta(database_url, reader, live_ds, real_stream, tokenizer):
    """Granting ``NAME.live`` grants its delta's build now and every later one: a reader takes the two as one."""
    from datastore.connection import connect
    from datastore.layers import delta_name, live_name
    from ingest.tokens import SEPARATOR
    from live.compaction import compact_delta, compact_live
    from live.store import encode_output

    role, reader_url = reader
    docs = [d for d in np.split(real_stream, np.flatnonzero(real_stream == SEPARATOR)) if len(d) > 8][:12]

    def append(batch) -> None:
        with connect(database_url, autocommit=True) as conn, conn.cursor().copy(
                "COPY live_outputs (name, tokens, num_tokens, origin) FROM STDIN") as cp:
            for d in batch:
                d = d[d != SEPARATOR]
                cp.write_row((live_ds, encode_output(d), len(d), "test"))

    append(docs[:4])
    compact_live(live_ds, top_t=100, database_url=database_url)
    append(docs[4:8])
    compact_delta(live_ds, top_t=100_000, database_url=database_url)  # built before the grant
    granted = run_module("datastore", "grant-reader", role, "--name", live_name(live_ds), "--create",
                         "--database-url", database_url)
    assert granted.returncode == 0, granted.stderr
    for batch in (None, docs[8:12]):  # the delta built before the grant, then one built after it
        if batch is not None:
            append(batch)
            compact_delta(live_ds, top_t=100_000, database_url=database_url)
        with Datastore.open(live_name(live_ds), tokenizer=tokenizer, database_url=reader_url,
                            live=live_name(live_ds)) as ds:
            assert ds.delta is not None and ds.delta.name == delta_name(live_ds)
            context = [int(t) for t in docs[5][1:7] if t != SEPARATOR]
            assert ds.retrieve_batch([context], [False])[0].delta is not None
