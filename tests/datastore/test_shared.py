"""The shared datastore client on the real Postgres: the same answers as the plain client, one round trip per
batch, a byte-bounded cache, build swaps followed as they are notified, and many threads at once."""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import psycopg
import pytest
from psycopg import sql

from datastore import Datastore
from datastore.admin.catalog import drop_datastore
from datastore.cache import TreeCache
from datastore.errors import DatastoreNotFound, LookupFailed
from datastore.shared import SharedDatastore
from drafting import DatastoreSource
from support import build_small


def _contexts(prompts, width: int = 5, step: int = 3) -> list[list[int]]:
    """Every ``step``-th window of ``width`` tokens of the prompts: real contexts, some stored, some not."""
    out = []
    for p in prompts:
        ids = list(p.token_ids)
        out += [ids[i:i + width] for i in range(0, len(ids) - width, step)]
    return out


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return (a.ngram == b.ngram and np.array_equal(a.tree.token_ids, b.tree.token_ids)
            and np.array_equal(a.tree.parents, b.tree.parents) and np.array_equal(a.tree.counts, b.tree.counts))


@pytest.fixture
def shared(chat_datastore, database_url, tokenizer):
    with SharedDatastore.open(chat_datastore, tokenizer=tokenizer, database_url=database_url) as client:
        yield client


def test_answers_equal_the_plain_client_in_one_round_trip(shared, chat_datastore, database_url, tokenizer,
                                                          eval_prompts):
    contexts = _contexts(eval_prompts)
    with Datastore.open(chat_datastore, tokenizer=tokenizer, database_url=database_url) as plain:
        expected = [plain.lookup(c) for c in contexts]
    assert sum(m is not None for m in expected) > len(contexts) // 2  # the check means something
    assert {len(m.ngram) for m in expected if m is not None} > {1}

    got = shared.lookup_batch(contexts)  # cold: one round trip for the whole batch
    assert shared.round_trips == 1
    assert all(_same(a, b) for a, b in zip(got, expected))

    again = shared.lookup_batch(contexts)  # warm: answered from the cache, the same tree objects
    assert shared.round_trips == 1
    assert all(a is None and b is None or a.tree is b.tree for a, b in zip(again, got))
    stats = shared.stats()
    assert stats["lookups"] == 2 * len(contexts) and stats["cache_hit_rate"] == pytest.approx(0.5)
    assert [shared.lookup(c) is None for c in contexts[:5]] == [m is None for m in expected[:5]]


def test_cache_bound_and_disabled_cache(chat_datastore, database_url, tokenizer, eval_prompts):
    contexts = _contexts(eval_prompts)
    with SharedDatastore.open(chat_datastore, tokenizer=tokenizer, database_url=database_url,
                              cache_bytes=0) as uncached:
        first = uncached.lookup_batch(contexts)
        uncached.lookup_batch(contexts)
        assert uncached.round_trips == 2 and len(uncached.cache) == 0
    bound = 20_000
    with SharedDatastore.open(chat_datastore, tokenizer=tokenizer, database_url=database_url,
                              cache_bytes=bound) as small:
        second = small.lookup_batch(contexts)
        assert 0 < small.cache.bytes <= bound and small.cache.evictions > 0
    assert all(_same(a, b) for a, b in zip(first, second))
    with pytest.raises(ValueError, match="max_bytes"):
        TreeCache(-1)


def test_threads_share_one_client(shared, eval_prompts):
    contexts = _contexts(eval_prompts)
    expected = shared.lookup_batch(contexts)
    shared.cache.drop_build(shared.info.id)  # make the threads go to the server too
    results, errors = {}, []

    def work(t: int) -> None:
        try:
            part = contexts[t % 4::4]
            results[t] = [shared.lookup_batch(part[i:i + 7]) for i in range(0, len(part), 7)]
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    for t in range(8):
        got = [m for batch in results[t] for m in batch]
        assert all(_same(a, b) for a, b in zip(got, expected[t % 4::4]))


def test_swap_is_followed_when_notified_and_a_drop_faults(database_url, tokenizer, sharegpt_sample, ds_name,
                                                          eval_prompts):
    first = build_small(database_url, ds_name, sharegpt_sample)
    contexts = _contexts(eval_prompts, width=2, step=1)
    with SharedDatastore.open(ds_name, tokenizer=tokenizer, database_url=database_url) as client:
        assert client.wait_listening()
        before = client.lookup_batch(contexts)
        assert client.info.id == first and len(client.cache) > 0
        second = build_small(database_url, ds_name, sharegpt_sample)  # the same name, rebuilt and swapped in
        deadline = time.monotonic() + 5
        while client.info.id != second and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client.info.id == second and client.swaps == 1
        assert len(client.cache) == 0  # the old build's entries are gone
        trips = client.round_trips
        after = client.lookup_batch(contexts)
        assert client.round_trips == trips + 1  # nothing stale answered from the cache
        assert all(_same(a, b) for a, b in zip(after, before))  # same corpus, same parameters

        drop_datastore(database_url, ds_name)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                client.lookup_batch(contexts[:3])
            except DatastoreNotFound:
                break
            time.sleep(0.01)
        else:
            pytest.fail("lookups kept answering from a dropped datastore")

        source = DatastoreSource(lambda: client, retry_s=3600)  # the fault becomes "no draft"
        assert source.lookup_batch(contexts[:3]) == [None] * 3
        assert source.faults["DatastoreNotFound"] == 1


def test_open_refuses_bad_arguments(chat_datastore, database_url, tokenizer):
    with pytest.raises(ValueError, match="tokenizer"):
        SharedDatastore.open(chat_datastore, database_url=database_url)
    with pytest.raises(ValueError, match="pool_size"):
        SharedDatastore.open(chat_datastore, tokenizer=tokenizer, database_url=database_url, pool_size=0)
    with pytest.raises(DatastoreNotFound):
        SharedDatastore.open("no-such-datastore", tokenizer=tokenizer, database_url=database_url)


def test_a_swap_followed_by_another_thread_mid_lookup_is_no_fault(database_url, tokenizer, sharegpt_sample, ds_name):
    """A lookup whose table vanished in a swap that another thread (the swap listener, another lookup) followed
    before this lookup re-read the registry answers from the new build instead of failing (benchmarks/load.py at 64
    clients during a rebuild: 39 ``LookupFailed`` of about 500K lookups, "a tree table ... is missing although its
    build ... is ready"). The race made deterministic: the lookup's first try finds the old build gone, and follows
    the swap itself before reporting the table missing, as the listener would have."""
    build_small(database_url, ds_name, sharegpt_sample)
    with SharedDatastore.open(ds_name, tokenizer=tokenizer, database_url=database_url, listen=False,
                              replicas=False) as client:
        old = client.info
        second = build_small(database_url, ds_name, sharegpt_sample)  # swapped in; the old table is dropped

        def op(info):
            if info.id == old.id:
                client.refresh()  # another thread follows the swap meanwhile
                return None  # this try's table is gone
            return info.id

        assert client._retrying(op) == second


def test_a_delta_swap_followed_by_another_thread_mid_lookup_is_no_fault(database_url, tokenizer, real_stream,
                                                                       live_ds):
    """The same race on the live layer's delta, which each process of a fleet compacts every few seconds
    (benchmarks/fleet.py at K = 4: "a tree table ... is missing although its build ... is ready" as each process
    started, then drafting without the datastore a while): the lookup's first try finds the old delta gone and follows
    the new one before reporting a table missing."""
    from datastore.layers import live_name
    from ingest.tokens import SEPARATOR
    from live.compaction import compact_delta, compact_live
    from live.writer import LiveWriter

    docs = [d[d != SEPARATOR].tolist() for d in np.split(real_stream, np.flatnonzero(real_stream == SEPARATOR))]
    docs = [d for d in docs if len(d) > 8][:18]

    def appended(part) -> None:
        writer = LiveWriter(live_ds, database_url, origin="test")
        assert all(writer.append(d) for d in part)
        writer.close(timeout=60)

    appended(docs[:10])
    compact_live(live_ds, top_t=500, database_url=database_url)
    appended(docs[10:14])
    compact_delta(live_ds, top_t=500, database_url=database_url)
    layer = live_name(live_ds)
    with SharedDatastore.open(layer, tokenizer=tokenizer, database_url=database_url, live=layer, listen=False,
                              replicas=False) as client:
        old = client.delta
        assert old is not None
        appended(docs[14:18])
        new = compact_delta(live_ds, top_t=500, database_url=database_url).build
        assert new is not None

        def op(info):
            assert client.delta is not None
            if client.delta.id == old.id:
                client.refresh()  # another thread follows the new delta meanwhile
                return None  # this try's delta table is gone
            return client.delta.id

        assert client._retrying(op) == new.build_id


def test_a_table_missing_outside_a_swap_names_the_builds_read(database_url, tokenizer, sharegpt_sample, ds_name):
    """A tree table dropped by hand while its build stays ready (no swap to follow) fails the lookup with an error
    naming each build the lookup reads and its table, not the main build alone."""
    build_small(database_url, ds_name, sharegpt_sample)
    with SharedDatastore.open(ds_name, tokenizer=tokenizer, database_url=database_url, listen=False,
                              replicas=False) as client:
        info = client.info
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(info.table)))
        named = re.escape(f"{ds_name!r} (build {info.id}, table {info.table}); rebuild")
        with pytest.raises(LookupFailed, match=named):
            client.lookup([1, 2, 3])
