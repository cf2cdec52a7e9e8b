"""The live layer on the real Postgres: INSERT-only appends from a background writer, compaction by the corpus
build's own rule (same rows as a build of the same tokens), eviction by bytes, provenance, the service
appending its outputs and drafting from the layer; and the back-off lookup's candidates."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import cast

import numpy as np
import psycopg
import pytest
from psycopg import sql

from conftest import with_params
from datastore import Datastore
from datastore.catalog import drop_datastore
from datastore.connection import connect
from datastore.errors import DatastoreNotFound
from datastore.grants import grant_appender
from datastore.live import LiveWriter, decode_output, encode_output, live_name
from datastore.shared import SharedDatastore
from decoder.drafters import DatastoreSource
from decoder.service import DraftingService
from ingest.build import BuildConfig, TokenizedCorpus, build_datastore
from ingest.live import compact_live
from ingest.tokens import SEPARATOR, TokenStreamWriter

UNREACHABLE = "postgresql://postgres@127.0.0.1:1/none"


@pytest.fixture
def live_ds(database_url):
    """A unique datastore name whose live outputs and layer are removed afterwards."""
    name = f"test-live-{uuid.uuid4().hex[:8]}"
    yield name
    with connect(database_url, autocommit=True) as conn:
        conn.execute("DELETE FROM live_outputs WHERE name = %s", [name])
    for n in (name, live_name(name)):
        try:
            drop_datastore(database_url, n)
        except DatastoreNotFound:
            pass


def _documents(stream: np.ndarray, count: int) -> list[np.ndarray]:
    cuts = np.flatnonzero(stream == SEPARATOR)
    docs = np.split(stream, cuts)
    return [d[d != SEPARATOR] for d in docs if len(d[d != SEPARATOR]) > 1][:count]


def _append(url: str, name: str, docs) -> None:
    with connect(url, autocommit=True) as conn, conn.cursor().copy(
            "COPY live_outputs (name, tokens, num_tokens, origin) FROM STDIN") as cp:
        for d in docs:
            cp.write_row((name, encode_output(d), len(d), "test"))


def _rows(url: str, name: str) -> dict[bytes, bytes]:
    with connect(url) as conn:
        row = conn.execute("SELECT trees_table FROM datastores WHERE name = %s AND state = 'ready'", [name]).fetchone()
        assert row is not None
        table = row[0]
        return {bytes(k): bytes(v)
                for k, v in conn.execute(sql.SQL("SELECT key, tree FROM {}").format(sql.Identifier(table)))}


def test_encode_decode_round_trip_and_errors():
    toks = [0, 1, 49151, 2**32 - 1]
    blob = encode_output(toks)
    assert len(blob) == 16 and blob[:4] == b"\x00\x00\x00\x00" and blob[4:8] == b"\x01\x00\x00\x00"  # little-endian
    assert decode_output(blob).tolist() == toks
    for bad in ([], [-1], [2**32]):
        with pytest.raises(ValueError):
            encode_output(bad)
    with pytest.raises(ValueError, match="multiple of 4"):
        decode_output(b"\x00\x01\x02")


def test_appender_role_may_only_insert(database_url, live_ds):
    role = f"crest_appender_{uuid.uuid4().hex[:8]}"
    grant_appender(database_url, role, create=True)
    try:
        url = with_params(database_url, user=role)
        writer = LiveWriter(live_ds, url, origin="pytest")
        # an int array is a token sequence to append (encode_output takes any 1-D array of ids)
        assert writer.append([5, 6, 7, 8]) and writer.append(cast(Sequence[int], np.arange(100, 164)))
        assert not writer.append([1])  # too short to learn from
        assert writer.flush(30)
        writer.close()
        assert (writer.appended, writer.written, writer.failed, writer.dropped) == (2, 2, 0, 1)
        with connect(database_url) as conn:
            got = conn.execute("SELECT tokens, origin FROM live_outputs WHERE name = %s ORDER BY id",
                               [live_ds]).fetchall()
        assert [decode_output(bytes(t)).tolist() for t, _ in got] == [[5, 6, 7, 8], list(range(100, 164))]
        assert {o for _, o in got} == {"pytest"}
        with psycopg.connect(url, autocommit=True) as conn:
            for stmt in ("SELECT * FROM live_outputs", "DELETE FROM live_outputs",
                         "UPDATE live_outputs SET origin = ''", "SELECT * FROM datastores"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(stmt)
    finally:
        with connect(database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_writer_is_bounded_and_a_down_server_loses_nothing_but_the_outputs():
    writer = LiveWriter("nowhere", UNREACHABLE, max_pending_bytes=64)
    kept = [writer.append(list(range(10))) for _ in range(50)]  # 40 bytes each: the queue holds one at a time
    assert writer.flush(30)
    writer.close()
    assert writer.appended == sum(kept) and writer.dropped == 50 - sum(kept) and writer.dropped > 0
    assert writer.written == 0 and writer.failed == writer.appended
    with pytest.raises(ValueError):
        LiveWriter("x", UNREACHABLE, max_pending_bytes=1)


def test_compaction_equals_a_build_of_the_same_outputs(database_url, real_stream, live_ds, ds_name, tmp_path):
    docs = _documents(real_stream, 30)
    _append(database_url, live_ds, docs)
    res = compact_live(live_ds, top_t=500, max_bytes=1 << 30, database_url=database_url)
    assert (res.outputs, res.tokens, res.evicted) == (len(docs), sum(map(len, docs)), 0)
    path = tmp_path / "s.u32"
    with TokenStreamWriter(path) as w:
        w.write(docs)
    build_datastore(BuildConfig(name=ds_name, top_t=500, database_url=database_url),
                    progress=False, corpus=TokenizedCorpus(path, len(docs), w.num_tokens, w.max_token,
                                                          {"path": str(path), "malformed": {}}))
    assert _rows(database_url, live_name(live_ds)) == _rows(database_url, ds_name)  # same rule, same trees
    with connect(database_url) as conn:
        row = conn.execute("SELECT corpus FROM datastores WHERE name = %s AND state = 'ready'",
                           [live_name(live_ds)]).fetchone()
        assert row is not None
        corpus = row[0]
    assert corpus["source"] == "outputs"  # provenance of every tree of the layer


def test_compaction_keeps_the_newest_outputs_within_the_byte_bound(database_url, real_stream, live_ds):
    docs = _documents(real_stream, 12)
    _append(database_url, live_ds, docs)
    budget_tokens = sum(map(len, docs[-4:]))  # room for exactly the 4 newest
    res = compact_live(live_ds, top_t=100, max_bytes=2 * 4 * budget_tokens + 1, database_url=database_url)
    assert res.outputs == 4 and res.evicted == len(docs) - 4
    with connect(database_url) as conn:
        left = [decode_output(bytes(t)).tolist() for (t,) in conn.execute(
            "SELECT tokens FROM live_outputs WHERE name = %s ORDER BY id", [live_ds])]
    assert left == [d.tolist() for d in docs[-4:]]


def test_service_appends_its_outputs_and_drafts_from_the_layer(database_url, tokenizer, live_ds):
    writer = LiveWriter(live_ds, database_url)
    service = DraftingService(None, live_writer=writer)
    output = [900, 901, 902, 903, 904, 905, 906, 907]
    service.start_request("a", [1, 2, 3])
    service.add_tokens("a", output[:3])
    service.add_tokens("a", output[3:])
    service.stop_request("a")
    assert writer.flush(30)
    writer.close()
    compact_live(live_ds, top_t=1000, database_url=database_url)
    layer = DatastoreSource(lambda: SharedDatastore.open(live_name(live_ds), tokenizer=tokenizer,
                                                         database_url=database_url))
    try:
        with_live = DraftingService(None, live=layer)
        without = DraftingService(None)
        for s in (with_live, without):
            s.start_request("b", [7, 8, 900, 901, 902])
        draft = with_live.propose([("b", 4)], chain=True)[0]
        assert draft.token_ids.tolist() == output[3:7]  # the model's earlier output continues the context
        assert len(without.propose([("b", 4)], chain=True)[0]) == 0  # nothing in the prompt predicts it
    finally:
        layer.close()


def test_candidates_are_every_stored_suffix_longest_first(chat_datastore, database_url, tokenizer, eval_prompts):
    plain = Datastore.open(chat_datastore, tokenizer=tokenizer, database_url=database_url)
    shared = SharedDatastore.open(chat_datastore, tokenizer=tokenizer, database_url=database_url)
    try:
        contexts = [list(p.token_ids[:k]) for p in eval_prompts for k in range(4, len(p.token_ids), 7)]
        want = []
        for ctx in contexts:  # oracle: the n-suffix is stored when the longest match of that suffix has length n
            hits = [plain.lookup(ctx[-n:]) for n in range(plain.info.max_n, 0, -1)]
            want.append([(m.ngram, m.tree) for n, m in zip(range(plain.info.max_n, 0, -1), hits)
                         if m is not None and len(m.ngram) == n])
        assert sum(map(len, want)) > len(contexts)  # several candidates per context, typically
        for client in (plain, shared, shared):  # the second shared call is answered by its cache
            got = client.candidates_batch(contexts)
            assert [[(m.ngram, m.tree) for m in c] for c in got] == want
        assert [c[0].ngram if c else None for c in shared.candidates_batch(contexts)] == [
            None if m is None else m.ngram for m in shared.lookup_batch(contexts)]
    finally:
        plain.close()
        shared.close()


def test_proposer_settings_from_the_environment(monkeypatch):
    from serving.vllm_proposer import ProposerConfig

    for var in ("CREST_LIVE", "CREST_LIVE_URL", "CREST_ADAPTIVE", "CREST_MIN_SCORE", "CREST_OUTPUTS_MB"):
        monkeypatch.delenv(var, raising=False)
    cfg = ProposerConfig.from_env()
    assert cfg.live and cfg.live_url is None and cfg.min_score == 0.1  # both output layers on by default
    assert cfg.outputs_mb == 64.0 and cfg.adaptive
    monkeypatch.setenv("CREST_LIVE", "0")
    monkeypatch.setenv("CREST_LIVE_URL", "postgresql://writer@127.0.0.1/test")
    monkeypatch.setenv("CREST_OUTPUTS_MB", "0")
    cfg = ProposerConfig.from_env()
    assert not cfg.live and cfg.live_url == "postgresql://writer@127.0.0.1/test" and cfg.outputs_mb == 0
    monkeypatch.setenv("CREST_OUTPUTS_MB", "-1")
    with pytest.raises(ValueError, match="CREST_OUTPUTS_MB=-1.0: must be >= 0"):
        ProposerConfig.from_env()
    monkeypatch.delenv("CREST_OUTPUTS_MB")
    monkeypatch.setenv("CREST_LIVE", "yes")
    with pytest.raises(ValueError, match="CREST_LIVE='yes': must be 0 or 1"):
        ProposerConfig.from_env()
    monkeypatch.setenv("CREST_LIVE", "0")
    monkeypatch.setenv("CREST_MIN_SCORE", "1.5")
    with pytest.raises(ValueError, match="CREST_MIN_SCORE=1.5: must be"):
        ProposerConfig.from_env()
