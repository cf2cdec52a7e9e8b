"""``python -m live compact`` (:mod:`live.compaction`) on the real Postgres: compaction by the corpus build's own
rule (the same rows as a build of the same tokens), eviction by bytes, newest outputs kept, the delta of the outputs
since the main build (read with it only while built on it; its own lock; deleting nothing), and emptying a layer while
a compaction runs."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from psycopg import sql

from datastore import Datastore
from datastore.admin.catalog import empty_live_layer
from datastore.connection import connect
from datastore.errors import BuildConflict
from datastore.layers import delta_name, live_name
from datastore.registry import compactor_lock_key, name_lock_key
from ingest.build import BuildConfig, TokenizedCorpus, build_datastore
from ingest.tokens import SEPARATOR, TokenStreamWriter
from live.compaction import compact_delta, compact_live
from live.store import decode_output, encode_output


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


def _build(url: str, name: str, docs, path) -> None:
    """Build ``docs`` as a corpus into ``name`` (top-t 500)."""
    with TokenStreamWriter(path) as w:
        w.write(docs)
    build_datastore(BuildConfig(name=name, top_t=500, database_url=url),
                    progress=False, corpus=TokenizedCorpus(path, len(docs), w.num_tokens, w.max_token,
                                                          {"path": str(path), "malformed": {}}))


def _newest(url: str, name: str) -> int:
    with connect(url) as conn:
        row = conn.execute("SELECT max(id) FROM live_outputs WHERE name = %s", [name]).fetchone()
    assert row is not None
    return int(row[0])


def test_compaction_equals_a_build_of_the_same_outputs(database_url, real_stream, live_ds, ds_name, tmp_path):
    docs = _documents(real_stream, 30)
    _append(database_url, live_ds, docs)
    res = compact_live(live_ds, top_t=500, max_bytes=1 << 30, database_url=database_url)
    assert (res.outputs, res.tokens, res.evicted) == (len(docs), sum(map(len, docs)), 0)
    _build(database_url, ds_name, docs, tmp_path / "s.u32")
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




def test_a_layer_at_its_bound_builds_once_a_fold(database_url, real_stream, live_ds):
    """A fold whose trees overflow half of ``max_bytes`` scales top-t down and builds again; the next fold under the
    same bound starts from that top-t once it has fitted, and builds once (here the same outputs: the same bytes)."""
    docs = _documents(real_stream, 30)
    _append(database_url, live_ds, docs)

    def builds() -> int:
        with connect(database_url) as conn:
            row = conn.execute("SELECT count(*) FROM datastores WHERE name = %s", [live_name(live_ds)]).fetchone()
        assert row is not None
        return int(row[0])

    first = compact_live(live_ds, top_t=100_000, max_bytes=4_000_000, database_url=database_url)
    made = builds()
    assert first.build is not None and first.top_t < 100_000 and made >= 2  # scaled down to fit, built again
    assert first.build.bytes_on_disk <= 2_000_000  # the trees' half of the bound
    second = compact_live(live_ds, top_t=100_000, max_bytes=4_000_000, database_url=database_url)
    assert second.build is not None and second.top_t == first.top_t and builds() == made + 1  # built once
    third = compact_live(live_ds, top_t=100_000, max_bytes=8_000_000, database_url=database_url)
    assert third.top_t > first.top_t  # another bound: from the top-t asked for again


def test_a_delta_holds_the_outputs_since_the_main_build(database_url, real_stream, live_ds, ds_name, tmp_path,
                                                        tokenizer):
    """The delta builds exactly the outputs appended after the main build's newest (the same rows as a corpus build of
    them), deletes nothing, and readers take it with the main build only while it was built on that build: a fold
    passes it over until the next delta compaction."""
    docs = _documents(real_stream, 24)
    _append(database_url, live_ds, docs[:10])
    main = compact_live(live_ds, top_t=500, max_bytes=1 << 30, database_url=database_url)
    _append(database_url, live_ds, docs[10:16])
    delta = compact_delta(live_ds, top_t=500, max_bytes=1 << 30, database_url=database_url)
    assert delta.build is not None and (delta.outputs, delta.evicted) == (6, 0)
    assert (delta.base_output_id, delta.last_output_id) == (main.last_output_id, _newest(database_url, live_ds))
    _build(database_url, ds_name, docs[10:16], tmp_path / "s.u32")
    assert _rows(database_url, delta_name(live_ds)) == _rows(database_url, ds_name)  # the new outputs alone
    context = [int(t) for t in docs[12][:6]]
    with Datastore.open(live_name(live_ds), tokenizer=tokenizer, database_url=database_url,
                        live=live_name(live_ds)) as client:
        assert client.delta is not None and client.delta.id == delta.build.build_id
        got = client.retrieve_batch([context], [False])[0]
        with Datastore.open(delta_name(live_ds), tokenizer=tokenizer, database_url=database_url) as alone:
            assert got.delta == alone.lookup(context) and got.delta is not None  # the delta's own longest match
        _append(database_url, live_ds, docs[16:18])
        fold = compact_live(live_ds, top_t=500, max_bytes=1 << 30, database_url=database_url)
        client.refresh()
        assert fold.build is not None and client.live is not None and client.live.id == fold.build.build_id
        assert client.delta is None  # built on the earlier main build: passed over
        assert compact_delta(live_ds, top_t=500, max_bytes=1 << 30, database_url=database_url).build is None
        _append(database_url, live_ds, docs[18:24])
        again = compact_delta(live_ds, top_t=500, max_bytes=1 << 30, database_url=database_url)
        client.refresh()
        assert again.base_output_id == fold.last_output_id and again.outputs == 6 and again.build is not None
        assert client.delta is not None and client.delta.id == again.build.build_id
    with connect(database_url) as conn:  # only the folds' budget evicts: here nothing
        assert conn.execute("SELECT count(*) FROM live_outputs WHERE name = %s", [live_ds]).fetchone() == (24,)


def test_a_delta_compaction_holds_its_own_lock(database_url, real_stream, live_ds):
    """One delta compaction of a datastore at a time, and a fold (the other lock) does not stop it."""
    _append(database_url, live_ds, _documents(real_stream, 4))
    with connect(database_url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", [compactor_lock_key(delta_name(live_ds))])
        assert compact_delta(live_ds, top_t=100, database_url=database_url).busy
        holder.execute("SELECT pg_advisory_unlock_all()")
        holder.execute("SELECT pg_advisory_lock(%s)", [compactor_lock_key(live_ds)])  # a fold runs
        assert compact_live(live_ds, top_t=100, database_url=database_url).busy
        res = compact_delta(live_ds, top_t=100, database_url=database_url)
        assert not res.busy and res.outputs == 4 and res.base_output_id == 0


def test_emptying_the_layer_waits_for_a_running_compaction_or_names_it(database_url, real_stream, live_ds):
    """``empty_live_layer`` while a compaction holds the layer's build lock: refused at once (``wait_s=0``), naming the
    running build; with ``wait_s``, done once the compaction lets go, and the layer is empty."""
    docs = _documents(real_stream, 5)
    _append(database_url, live_ds, docs)
    compact_live(live_ds, top_t=100, max_bytes=1 << 30, database_url=database_url)
    with connect(database_url, autocommit=True) as holder:  # what a running compaction holds
        holder.execute("SELECT pg_advisory_lock(%s)", [name_lock_key(live_name(live_ds))])
        with pytest.raises(BuildConflict, match="is running"):
            empty_live_layer(database_url, live_ds)
        threading.Timer(1.0, lambda: holder.execute("SELECT pg_advisory_unlock_all()")).start()
        assert empty_live_layer(database_url, live_ds, wait_s=30) == (0, 1)  # outputs went on the first try
    with connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM live_outputs WHERE name = %s", [live_ds]).fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM datastores WHERE name = %s AND state = 'ready'",
                            [live_name(live_ds)]).fetchone() == (0,)
