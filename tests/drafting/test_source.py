"""The fault-tolerant source (:mod:`drafting.source`): every datastore fault falls back to drafts from the other
sources: one warning, output identical to plain greedy, and the source drafts from the datastore again once it is back
(a new build included); a background reopen never makes a lookup wait. Against the real Postgres."""

from __future__ import annotations

import logging

import psycopg
import pytest
from psycopg import sql

from datastore import Datastore, SharedDatastore
from datastore.admin.catalog import datastore_stats, drop_datastore
from datastore.admin.grants import grant_reader
from datastore.admin.writer import DatastoreWriter
from decoder import greedy_generate, speculative_generate
from drafting import DatastoreSource, Drafter, DraftingService
from support import UNREACHABLE, build_small

MAX_NEW = 20


class _FaultAfter:
    """Wraps a drafter and injects a fault just before its ``after``-th proposal (a test harness, not a stand-in)."""

    def __init__(self, inner: DraftingService, fault, after: int = 3) -> None:
        self.inner, self.fault, self.after, self.calls = inner, fault, after, 0
        self.name = inner.name
        self.start_request, self.stop_request, self.config, self.close = (inner.start_request, inner.stop_request,
                                                                          inner.config, inner.close)

    def step(self, requests, budgets, **kw):
        self.calls += 1
        if self.calls == self.after:
            self.fault()
        return self.inner.step(requests, budgets, **kw)


@pytest.fixture(scope="module")
def prompt(eval_prompts):
    return eval_prompts[0]


@pytest.fixture(scope="module")
def reference(target, prompt):
    return greedy_generate(target, prompt.token_ids, max_new_tokens=MAX_NEW).output_ids


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and r.name == "drafting.source"]


def _decode(target, prompt, source, fault=None):
    vocab = len(target.tokenizer)
    service = DraftingService(source, vocab_size=vocab)
    drafter: Drafter = service if fault is None else _FaultAfter(service, fault)
    return speculative_generate(target, prompt.token_ids, drafter, max_new_tokens=MAX_NEW, budget=8).output_ids


def _recovers(source, prompt, build_id: int) -> None:
    """With retries allowed, the next lookup drafts from ``build_id`` again."""
    source.retry_s = 0.0
    assert source.lookup(list(prompt.token_ids)) is not None
    assert source.client is not None and source.client.identity()["build"] == build_id


def test_unreachable_server_at_start(target, prompt, reference, database_url, tokenizer, sharegpt_sample, ds_name,
                                     caplog):
    build = build_small(database_url, ds_name, sharegpt_sample)
    url = [UNREACHABLE]  # the server the source connects to: down, then up
    with caplog.at_level(logging.WARNING):
        source = DatastoreSource(lambda: Datastore.open(ds_name, tokenizer=tokenizer, database_url=url[0]),
                                 retry_s=3600.0)
        assert _decode(target, prompt, source) == reference
    assert source.client is None and source.faults == {"DatabaseUnavailable": 1}
    assert len(_warnings(caplog)) == 1 and "cannot connect" in _warnings(caplog)[0]
    url[0] = database_url
    _recovers(source, prompt, build)
    source.close()


def test_server_lost_mid_generation(target, prompt, reference, database_url, tokenizer, sharegpt_sample, ds_name,
                                    caplog):
    build = build_small(database_url, ds_name, sharegpt_sample)
    source = DatastoreSource(lambda: Datastore.open(ds_name, tokenizer=tokenizer, database_url=database_url),
                             retry_s=3600.0)

    def kill_backend():
        assert isinstance(source.client, Datastore)
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", [source.client._conn.info.backend_pid])

    with caplog.at_level(logging.WARNING):
        assert _decode(target, prompt, source, kill_backend) == reference
    assert source.client is None and source.faults == {"DatabaseUnavailable": 1}  # lost once, not retried yet
    assert len(_warnings(caplog)) == 1 and "unreachable" in _warnings(caplog)[0]
    _recovers(source, prompt, build)
    source.close()


def test_datastore_dropped_under_a_live_client(target, prompt, reference, database_url, tokenizer, sharegpt_sample,
                                               ds_name, caplog):
    build_small(database_url, ds_name, sharegpt_sample)
    source = DatastoreSource(lambda: Datastore.open(ds_name, tokenizer=tokenizer, database_url=database_url),
                             retry_s=3600.0)
    with caplog.at_level(logging.WARNING):
        assert _decode(target, prompt, source, lambda: drop_datastore(database_url, ds_name)) == reference
    assert source.client is None and source.faults == {"DatastoreNotFound": 1}
    assert len(_warnings(caplog)) == 1 and f"no ready datastore named {ds_name!r}" in _warnings(caplog)[0]
    _recovers(source, prompt, build_small(database_url, ds_name, sharegpt_sample))  # rebuilt: picked up
    source.close()


def test_rebuild_with_the_same_tokenizer_is_followed_silently(target, prompt, reference, database_url, tokenizer,
                                                             sharegpt_sample, ds_name, caplog):
    first = build_small(database_url, ds_name, sharegpt_sample)
    source = DatastoreSource(lambda: Datastore.open(ds_name, tokenizer=tokenizer, database_url=database_url))
    rebuilt = []
    with caplog.at_level(logging.WARNING):
        out = _decode(target, prompt, source,
                      lambda: rebuilt.append(build_small(database_url, ds_name, sharegpt_sample)))
    assert out == reference and not _warnings(caplog) and not source.faults
    assert rebuilt[0] != first and source.client is not None and source.client.identity()["build"] == rebuilt[0]
    source.close()


def test_rebuild_with_another_tokenizer(target, prompt, reference, database_url, tokenizer, sharegpt_sample, ds_name,
                                        caplog):
    build_small(database_url, ds_name, sharegpt_sample)
    source = DatastoreSource(lambda: Datastore.open(ds_name, tokenizer=tokenizer, database_url=database_url),
                             retry_s=3600.0)

    def rebuild_with_other_tokenizer():
        with DatastoreWriter.begin(database_url, ds_name, tokenizer="other-model", tokenizer_fingerprint="f" * 64,
                                   key_width=2, corpus={}, params={}) as w:
            w.finish(ngram_stats={}, num_tokens=0, timings={})

    with caplog.at_level(logging.WARNING):
        assert _decode(target, prompt, source, rebuild_with_other_tokenizer) == reference
    assert source.client is None and source.faults == {"TokenizerMismatch": 1}
    assert len(_warnings(caplog)) == 1 and "other-model" in _warnings(caplog)[0]
    _recovers(source, prompt, build_small(database_url, ds_name, sharegpt_sample))  # rebuilt with ours: picked up
    source.close()


def test_corrupt_tree_blobs(target, prompt, reference, database_url, tokenizer, sharegpt_sample, ds_name, caplog):
    build_small(database_url, ds_name, sharegpt_sample)
    table = datastore_stats(database_url, ds_name)["table"]
    source = DatastoreSource(lambda: Datastore.open(ds_name, tokenizer=tokenizer, database_url=database_url),
                             retry_s=3600.0)

    def corrupt_every_blob():
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("UPDATE {} SET tree = '\\xc701ff'::bytea || tree").format(sql.Identifier(table)))

    with caplog.at_level(logging.WARNING):
        assert _decode(target, prompt, source, corrupt_every_blob) == reference
    assert not source.faults and source.client is not None  # the connection is fine: only those trees are skipped
    assert isinstance(source.client, Datastore)
    assert source.client.stats()["corrupt"] >= 1
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == "datastore.lookup"]
    assert len(said) == 1 and "corrupt tree" in said[0] and not _warnings(caplog)  # once, by the client
    assert source.lookup(list(prompt.token_ids)) is None  # still corrupt: no draft, no exception
    _recovers(source, prompt, build_small(database_url, ds_name, sharegpt_sample))  # a rebuild replaces them
    source.close()


def test_grant_revoked_under_a_reader(target, prompt, reference, database_url, tokenizer, sharegpt_sample, ds_name,
                                     reader, caplog):
    """The reader still opens the datastore but every lookup is refused: with retries on every step it warns
    once, not once per retry, and drafts from the datastore again once the grant is back."""
    role, reader_url = reader
    build = build_small(database_url, ds_name, sharegpt_sample)
    table = grant_reader(database_url, role, ds_name, create=True)[0]
    source = DatastoreSource(lambda: Datastore.open(ds_name, tokenizer=tokenizer, database_url=reader_url),
                             retry_s=0.0)

    def revoke():
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("REVOKE SELECT ON {} FROM {}").format(sql.Identifier(table), sql.Identifier(role)))

    with caplog.at_level(logging.WARNING):
        assert _decode(target, prompt, source, revoke) == reference
    assert source.faults["LookupFailed"] >= 2  # reopened and refused again at every later step
    assert len(_warnings(caplog)) == 1 and "grant-reader" in _warnings(caplog)[0]
    grant_reader(database_url, role, ds_name)
    _recovers(source, prompt, build)
    source.close()


def test_background_reopen_never_blocks_a_lookup(chat_datastore, database_url, tokenizer, eval_prompts):
    """While the backend is reopened (here an opener that takes 1.5 s, as a slow server would), every lookup
    answers at once with no draft; once it is open, lookups draft from it."""
    import time

    url = [UNREACHABLE]  # down at first, then up

    def slow_open() -> SharedDatastore:
        if url[0] != UNREACHABLE:
            time.sleep(1.5)
        return SharedDatastore.open(chat_datastore, tokenizer=tokenizer, database_url=url[0])

    source = DatastoreSource(slow_open, retry_s=0.0, reopen_in_background=True)
    context = list(eval_prompts[0].token_ids)
    assert source.client is None and source.lookup(context) is None
    url[0] = database_url
    deadline = time.monotonic() + 20
    found, misses, slowest = None, 0, 0.0
    while found is None and time.monotonic() < deadline:
        t = time.perf_counter()
        found = source.lookup(context)
        if found is None:
            misses += 1
            slowest = max(slowest, time.perf_counter() - t)
        time.sleep(0.01)
    assert found is not None and source.faults["DatabaseUnavailable"] >= 1
    assert misses >= 10 and slowest < 0.5  # a miss never waited for the 1.5 s reopen
    source.close()
