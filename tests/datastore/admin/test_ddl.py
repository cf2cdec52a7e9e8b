"""DDL never blocks lookups: with a session holding a datastore's table in an open transaction, a rebuild-and-swap,
``compact-live`` and ``datastore drop`` each finish (or report what holds them) within their lock timeout, a new
client's lookups meanwhile answer in their usual time, and ``vacuum`` drops the leftovers once the session lets
go. Against the real Postgres."""

from __future__ import annotations

import contextlib
import io
import threading
import time

import psycopg
import pytest
from psycopg import sql

from datastore import Datastore
from datastore.admin.catalog import datastore_stats, drop_datastore, vacuum_datastores
from datastore.admin.ddl import DDL_LOCK_TIMEOUT_S
from datastore.connection import connect
from datastore.errors import DatastoreError
from datastore.layers import live_name
from live.store import encode_output
from support import build_small


class _NewClients:
    """A thread that opens a new client and looks up, again and again; records each round's seconds."""

    def __init__(self, name: str, url: str, tokenizer, context: list[int]) -> None:
        self.name, self.url, self.tokenizer, self.context = name, url, tokenizer, context
        self.seconds: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.perf_counter()
            try:
                with Datastore.open(self.name, tokenizer=self.tokenizer, database_url=self.url) as ds:
                    ds.lookup(self.context)
            except DatastoreError:
                pass  # dropped meanwhile: a fast answer all the same
            self.seconds.append(time.perf_counter() - t)
            time.sleep(0.02)

    def rounds(self, n: int, timeout: float = 30.0) -> list[float]:
        """The seconds of every round so far, once at least ``n`` rounds have ended (a loaded host's first open can
        take longer than the step it is meant to overlap); fails past ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while len(self.seconds) < n:
            assert time.monotonic() < deadline, f"the clients ended {len(self.seconds)} rounds in {timeout} s"
            time.sleep(0.05)
        return list(self.seconds)

    def __enter__(self) -> _NewClients:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)


def _scalar(conn, query: str, params: list):
    """The first column of the query's one row."""
    row = conn.execute(query, params).fetchone()
    assert row is not None, query
    return row[0]


def _hold(url: str, table: str) -> psycopg.Connection:
    """A session that read ``table`` in a transaction it keeps open (an idle reader)."""
    conn = psycopg.connect(url, application_name="idle-reader")
    conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))  # BEGIN is implicit: still open
    return conn


def _usual(url: str, name: str, tokenizer, context: list[int]) -> float:
    """A new client's usual open-and-lookup time (the slowest of five, nothing in the way)."""
    times = []
    for _ in range(5):
        t = time.perf_counter()
        with Datastore.open(name, tokenizer=tokenizer, database_url=url) as ds:
            ds.lookup(context)
        times.append(time.perf_counter() - t)
    return max(times)


def test_ddl_under_an_idle_transaction_never_blocks_lookups(database_url, sharegpt_sample, tokenizer, ds_name,
                                                           eval_prompts):
    from live.compaction import compact_live

    context = list(eval_prompts[0].token_ids)
    first = build_small(database_url, ds_name, sharegpt_sample)
    table = datastore_stats(database_url, ds_name)["table"]
    usual = _usual(database_url, ds_name, tokenizer, context)
    holder = _hold(database_url, table)
    try:
        with _NewClients(ds_name, database_url, tokenizer, context) as clients:
            t0 = time.perf_counter()
            second = build_small(database_url, ds_name, sharegpt_sample)  # the swap retires the held table
            rebuild_s = time.perf_counter() - t0
            with connect(database_url) as conn:
                assert _scalar(conn, "SELECT to_regclass(%s)", [table]) is not None  # left for later
                assert _scalar(conn, "SELECT state FROM datastores WHERE id = %s", [first]) == "retired"
            assert datastore_stats(database_url, ds_name)["id"] == second  # the new build serves meanwhile
            during_swap = list(clients.seconds)
        assert rebuild_s < 60 and during_swap
        assert max(during_swap) < max(10 * usual, 0.5), (usual, max(during_swap))

        # compact-live: hold the layer's table, compact again
        layer = live_name(ds_name)
        with connect(database_url, autocommit=True) as conn:
            conn.execute("INSERT INTO live_outputs (name, tokens, num_tokens) VALUES (%s, %s, %s)",
                         [ds_name, encode_output(context), len(context)])
        compact_live(ds_name, top_t=100, database_url=database_url)
        layer_holder = _hold(database_url, datastore_stats(database_url, layer)["table"])
        try:
            t0 = time.perf_counter()
            res = compact_live(ds_name, top_t=100, database_url=database_url)
            assert time.perf_counter() - t0 < 60
            assert res.build is not None and any("idle-reader" in p for p in res.build.pending_drops)
        finally:
            layer_holder.close()

        # drop: the datastore leaves the registry at once; the held table is reported, not waited for
        with _NewClients(ds_name, database_url, tokenizer, context) as clients:
            t0 = time.perf_counter()
            dropped = drop_datastore(database_url, ds_name)
            drop_s = time.perf_counter() - t0
            time.sleep(0.5)
            during_drop = clients.rounds(3)
        assert drop_s < DDL_LOCK_TIMEOUT_S + 5, drop_s
        assert [p.table for p in dropped.pending] == [table]
        blocker = dropped.pending[0].blockers[0]
        assert blocker.application_name == "idle-reader" and blocker.pid == holder.info.backend_pid
        assert "idle in transaction" in dropped.pending[0].describe()
        assert max(during_drop) < max(10 * usual, 0.5), (usual, max(during_drop))
        with pytest.raises(DatastoreError):
            Datastore.open(ds_name, tokenizer=tokenizer, database_url=database_url)  # gone from the registry
    finally:
        holder.close()  # the reader lets go
    dropped_now, pending = vacuum_datastores(database_url)
    assert table in dropped_now and not [p for p in pending if p.table == table]
    with connect(database_url) as conn:
        assert _scalar(conn, "SELECT to_regclass(%s)", [table]) is None
        assert _scalar(conn, "SELECT count(*) FROM datastores WHERE name = %s", [ds_name]) == 0
    drop_datastore(database_url, layer)


def test_drop_from_the_command_line_reports_what_holds_a_table(database_url, sharegpt_sample, ds_name):
    from datastore.admin.cli import main

    build_small(database_url, ds_name, sharegpt_sample)
    table = datastore_stats(database_url, ds_name)["table"]
    holder = _hold(database_url, table)
    try:
        t0 = time.perf_counter()
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["drop", ds_name, "--database-url", database_url]) == 0
        assert time.perf_counter() - t0 < DDL_LOCK_TIMEOUT_S + 5
        text = out.getvalue()
        assert f"not dropped yet: table {table} is in use by pid {holder.info.backend_pid} (idle-reader" in text
        assert "python -m datastore vacuum" in text
    finally:
        holder.close()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["vacuum", "--database-url", database_url]) == 0
    assert table in out.getvalue()
