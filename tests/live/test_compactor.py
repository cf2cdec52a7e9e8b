"""The live layer's automatic compaction (:mod:`live.compactor`) on the real Postgres: when a compaction is due,
one compactor per datastore under the advisory lock (a second one and a held lock do nothing), a killed compaction
leaving the previous live build serving and nothing evicted, then retried; deltas between folds, a fold once the delta
is large, a killed delta compaction; lookups never wait for it; beside an engine that holds every core, compactions
only while it idles."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace

import numpy as np
import psutil
import pytest

from datastore import Datastore
from datastore.connection import connect
from datastore.errors import DatastoreError
from datastore.layers import delta_name, live_name
from datastore.registry import compactor_lock_key
from ingest.tokens import SEPARATOR
from live import CompactionPolicy, LiveCompactor, WhenEngineIdle
from live.policy import Layer
from live.store import encode_output
from support import REPO, alive_after

FAST = CompactionPolicy(outputs=1_000, after_s=0.0, gap_s=0.0, fold_tokens=0, check_s=0.2, top_t=500, retry_s=0.5)
"""Every compaction a fold, due as soon as one output waits (the tests' policy); the defaults are measured by
benchmarks/live_layer.py."""


def _documents(stream: np.ndarray, count: int) -> list[np.ndarray]:
    docs = np.split(stream, np.flatnonzero(stream == SEPARATOR))
    return [d[d != SEPARATOR] for d in docs if len(d[d != SEPARATOR]) > 1][:count]


def _append(url: str, name: str, docs) -> int:
    """Append ``docs`` as finished outputs of ``name``; returns the newest id."""
    with connect(url, autocommit=True) as conn:
        with conn.cursor().copy("COPY live_outputs (name, tokens, num_tokens, origin) FROM STDIN") as cp:
            for d in docs:
                cp.write_row((name, encode_output(d), len(d), "test"))
        row = conn.execute("SELECT max(id) FROM live_outputs WHERE name = %s", [name]).fetchone()
    assert row is not None
    return int(row[0])


def _layer(url: str, name: str, layer=live_name) -> tuple[int, int] | None:
    """``(build id, last output id folded in)`` of the serving live build of ``name`` (``layer=delta_name``: its
    delta's), or ``None``."""
    with connect(url) as conn:
        row = conn.execute("SELECT id, (corpus->>'last_output_id')::bigint FROM datastores "
                           "WHERE name = %s AND state = 'ready'", [layer(name)]).fetchone()
    return None if row is None else (int(row[0]), int(row[1]))


def _delta_base(url: str, name: str) -> int | None:
    with connect(url) as conn:
        row = conn.execute("SELECT (corpus->>'base_output_id')::bigint FROM datastores "
                           "WHERE name = %s AND state = 'ready'", [delta_name(name)]).fetchone()
    return None if row is None else int(row[0])


def _until(what, timeout: float = 120.0, every: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"not within {timeout} s")


@pytest.mark.parametrize(("waiting", "oldest_s", "since_s", "due"), [
    (0, None, None, False),     # nothing waits
    (1, 0.5, None, False),      # one output, not waited long enough, no layer yet
    (1, 2.0, None, True),       # waited after_s
    (64, 0.0, None, True),      # enough outputs at once
    (64, 0.0, 1.0, False),      # ... but the last compaction completed under gap_s ago
    (1, 5.0, 3.0, True),
])
def test_when_a_compaction_is_due(waiting, oldest_s, since_s, due):
    assert CompactionPolicy().due(waiting, oldest_s, since_s) is due


@pytest.mark.parametrize(("field", "value", "named"), [
    ("outputs", 0, "outputs=0"), ("after_s", -1.0, "after_s=-1.0"), ("gap_s", -1.0, "gap_s=-1.0"),
    ("top_t", 0, "top_t=0"), ("max_bytes", 10, "max_bytes=10"), ("check_s", 0.0, "check_s")])
def test_bad_settings_are_refused_by_name(field, value, named):
    with pytest.raises(ValueError, match=named):
        CompactionPolicy(**{field: value})


def test_one_compactor_at_a_time_keeps_the_layer_fresh(database_url, real_stream, live_ds):
    docs = _documents(real_stream, 24)
    compactors = [LiveCompactor(live_ds, database_url, FAST) for _ in range(2)]  # two processes' compactors
    try:
        newest = _append(database_url, live_ds, docs[:8])
        first = _until(lambda: (got := _layer(database_url, live_ds)) and got[1] == newest and got)
        assert first[1] == newest  # every output appended so far is in the layer, no cron job

        # someone else (a cron job, another host) holds the compactor lock: nobody compacts meanwhile
        with connect(database_url, autocommit=True) as holder:
            holder.execute("SELECT pg_advisory_lock(%s)", [compactor_lock_key(live_ds)])
            checks = sum(c.checks for c in compactors)
            newest = _append(database_url, live_ds, docs[8:16])
            _until(lambda: sum(c.checks for c in compactors) >= checks + 10)
            assert _layer(database_url, live_ds) == first
        second = _until(lambda: (got := _layer(database_url, live_ds)) and got[1] == newest and got)
        assert second[0] > first[0]
        _until(lambda: any(r.result and r.result["last_output_id"] == newest for c in compactors for r in c.runs))
    finally:
        for c in compactors:
            c.close()
    runs = [r for c in compactors for r in c.runs]
    assert all(r.exit_code == 0 for r in runs) and sum(c.failures for c in compactors) == 0
    assert len([r for r in runs if r.result and r.result["build_id"]]) >= 2
    with connect(database_url) as conn:  # each build of the layer, from its registry row to its swap: under the lock
        spans = conn.execute("SELECT created_at, completed_at FROM datastores WHERE name = %s "
                             "AND completed_at IS NOT NULL ORDER BY created_at", [live_name(live_ds)]).fetchall()
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))  # never two at once
    assert all(r.peak_rss_bytes > 10 << 20 for r in runs)


def test_a_killed_compaction_leaves_the_previous_build_and_is_retried(database_url, real_stream, live_ds, caplog):
    docs = _documents(real_stream, 16)
    compactor = LiveCompactor(live_ds, database_url, FAST)
    try:
        newest = _append(database_url, live_ds, docs[:8])
        first = _until(lambda: (got := _layer(database_url, live_ds)) and got[1] == newest and got)
        newest = _append(database_url, live_ds, docs[8:])

        def building() -> bool:
            with connect(database_url) as conn:
                return conn.execute("SELECT 1 FROM datastores WHERE name = %s AND state = 'building'",
                                    [live_name(live_ds)]).fetchone() is not None

        _until(building, every=0.01)  # the compaction is inside its build
        pid = compactor.running()["fold"]
        assert os.sched_getscheduler(pid) == os.SCHED_IDLE  # it never takes a core an engine wants
        assert compactor.in_flight_since()["fold"] <= time.time()  # in flight, and in no finished run
        assert all(run.kind != "fold" or run.exit_code == 0 for run in compactor.runs)
        os.kill(pid, signal.SIGKILL)
        _until(lambda: compactor.failures >= 1)
        assert _layer(database_url, live_ds) == first  # the previous live build serves
        with connect(database_url) as conn:
            row = conn.execute("SELECT count(*) FROM live_outputs WHERE name = %s", [live_ds]).fetchone()
        assert row is not None and row[0] == len(docs)  # nothing evicted
        again = _until(lambda: (got := _layer(database_url, live_ds)) and got[1] == newest and got)
        assert again[0] > first[0]  # retried, and it caught up
    finally:
        compactor.close()
    assert "compaction failed" in caplog.text and "previous live build keeps serving" in caplog.text


def test_the_engine_is_idle_after_idle_s_without_a_step_and_its_first_step_after_says_so():
    gate = WhenEngineIdle(0.2)
    busy: list[float] = []
    gate.on_busy(lambda: busy.append(time.monotonic()))
    time.sleep(0.25)
    assert gate.idle_in() <= 0  # no step, and a quiet window: idle
    gate.step()
    assert busy and 0.15 < gate.idle_in() <= 0.2  # the first step ends the idle spell ...
    for _ in range(5):
        gate.step()
    assert len(busy) == 1  # ... once: steady steps cost no callback
    time.sleep(0.25)
    assert gate.idle_in() <= 0
    gate.step()
    assert len(busy) == 2
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="idle_s="):
            WhenEngineIdle(bad)
    with pytest.raises(ValueError, match="busy_cores"):
        WhenEngineIdle(1.0, busy_cores=0.0)


def test_a_step_longer_than_idle_s_is_not_an_idle_spell():
    """No step for longer than ``idle_s`` while this process computes (a long prefill): busy, until a window of
    ``idle_s`` passes quiet."""
    gate = WhenEngineIdle(0.2, busy_cores=0.2)  # the pass below may share its core with another test worker
    gate.step()
    end = time.monotonic() + 0.8
    verdicts = []
    while time.monotonic() < end:  # a forward pass of 0.8 s, on this thread: a core busy
        verdicts.append(gate.idle_in() > 0)
    assert all(verdicts)
    _until(lambda: gate.idle_in() <= 0, timeout=2.0, every=0.05)  # quiet: a window after the pass says idle


@pytest.mark.slow
def test_beside_a_busy_engine_nothing_compacts_and_a_step_stops_a_compaction(database_url, real_stream, live_ds):
    """An engine stepping every 20 ms: no due check, no compaction. Once it idles, one starts; the engine's next step
    stops it (not a failure: the previous build serves, nothing is evicted, no retry wait), and the next idle spell
    compacts everything."""
    docs = _documents(real_stream, 16)
    gate = WhenEngineIdle(0.3)
    stepping = threading.Event()
    done = threading.Event()

    def engine() -> None:
        while not done.is_set():
            if stepping.is_set():
                gate.step()
            time.sleep(0.02)

    stepping.set()
    thread = threading.Thread(target=engine, daemon=True)
    thread.start()
    compactor = LiveCompactor(live_ds, database_url, FAST, gate)
    try:
        newest = _append(database_url, live_ds, docs[:8])
        time.sleep(2.0)  # ten checks' worth of time with an output due
        assert compactor.checks == 0 and not compactor.running() and not compactor.runs
        assert _layer(database_url, live_ds) is None

        stepping.clear()  # the engine idles: the due compaction runs, whole
        first = _until(lambda: (got := _layer(database_url, live_ds)) and got[1] == newest and got)
        _until(lambda: not compactor.running())
        newest = _append(database_url, live_ds, docs[8:])
        pid = _until(lambda: compactor.running().get("fold"), every=0.01)
        stepping.set()  # the engine steps again: the compaction in flight is stopped
        _until(lambda: compactor.yields >= 1 and not compactor.running())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        stopped = [r for r in compactor.runs if r.yielded]
        assert len(stopped) == 1 and stopped[0].exit_code != 0 and compactor.failures == 0
        assert _layer(database_url, live_ds) == first  # the previous live build serves
        with connect(database_url) as conn:
            row = conn.execute("SELECT count(*) FROM live_outputs WHERE name = %s", [live_ds]).fetchone()
        assert row is not None and row[0] == len(docs)  # nothing evicted
        time.sleep(1.0)
        assert not compactor.running() and _layer(database_url, live_ds) == first  # none restarted while it steps

        stepping.clear()
        again = _until(lambda: (got := _layer(database_url, live_ds)) and got[1] == newest and got)
        assert again[0] > first[0]
    finally:
        done.set()
        thread.join()
        compactor.close()
    assert compactor.failures == 0


@pytest.mark.parametrize(("layer", "due"), [
    # outputs beyond the builds served, the oldest's wait, since the serving build; a delta compaction running;
    # tokens not in the main build, outputs not in it, the oldest's wait, since the main build; a fold running
    ((3, 5.0, 9.0, False, 100, 3, 5.0, 9.0, False), {"delta"}),
    ((3, 5.0, 9.0, True, 100, 3, 5.0, 9.0, False), set()),               # a delta compaction runs already
    ((0, None, 9.0, False, 600, 9, 50.0, 60.0, False), {"fold"}),        # the delta holds enough: fold
    ((2, 5.0, 9.0, False, 600, 9, 50.0, 60.0, False), {"delta", "fold"}),  # ... and deltas go on beside it
    ((2, 5.0, 9.0, False, 600, 9, 50.0, 60.0, True), {"delta"}),         # a fold runs already
    ((2, 5.0, 9.0, False, 600, 9, 50.0, 1.0, False), {"delta"}),         # the main build is under gap_s old
])
def test_when_a_delta_or_a_fold_is_due(layer, due):
    policy = CompactionPolicy(fold_tokens=500)
    got = {k for k, f in (("delta", policy.delta_due), ("fold", policy.fold_due)) if f(Layer(*layer))}
    assert got == due
    no_delta = replace(policy, fold_tokens=0)  # every compaction a fold, due by the delta's rule on the main build
    assert not no_delta.delta_due(Layer(*layer))
    assert no_delta.fold_due(Layer(*layer)) == (not layer[8] and no_delta.due(layer[5], layer[6], layer[7]))


@pytest.mark.slow
def test_deltas_keep_the_layer_fresh_until_a_fold_catches_up(database_url, real_stream, live_ds):
    """With deltas on, new outputs reach the delta (built on no main build yet: base 0) and the main build is not
    rebuilt until the outputs outside it reach ``fold_tokens``; then a fold runs, and a delta on the new main build
    follows for what came after."""
    docs = _documents(real_stream, 24)
    policy = replace(FAST, fold_tokens=sum(map(len, docs[:16])) + 1)
    compactor = LiveCompactor(live_ds, database_url, policy)
    try:
        newest = _append(database_url, live_ds, docs[:8])
        _until(lambda: (got := _layer(database_url, live_ds, delta_name)) and got[1] == newest)
        newest = _append(database_url, live_ds, docs[8:16])
        _until(lambda: (got := _layer(database_url, live_ds, delta_name)) and got[1] == newest)
        assert _layer(database_url, live_ds) is None and _delta_base(database_url, live_ds) == 0  # no fold yet
        newest = _append(database_url, live_ds, docs[16:])
        main = _until(lambda: _layer(database_url, live_ds))  # past fold_tokens: folded

        def served() -> bool:  # every output is in the main build, or in a delta built on it
            main = _layer(database_url, live_ds)
            delta = _layer(database_url, live_ds, delta_name)
            return main is not None and (main[1] == newest or (
                delta is not None and delta[1] == newest and _delta_base(database_url, live_ds) == main[1]))

        _until(served)
        _until(lambda: any(r.kind == "fold" and r.result and r.result["build_id"] for r in compactor.runs))
        assert main[1] >= max(r.result["last_output_id"] for r in compactor.runs if r.kind == "delta" and r.result
                              and r.result["build_id"] and r.result["last_output_id"] < newest)
    finally:
        compactor.close()
    kinds = {r.kind for r in compactor.runs if r.result and r.result["build_id"]}
    assert kinds == {"delta", "fold"} and compactor.failures == 0
    with connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM live_outputs WHERE name = %s", [live_ds]).fetchone() == (24,)


def test_a_killed_delta_compaction_leaves_the_previous_delta_and_is_retried(database_url, real_stream, live_ds):
    docs = _documents(real_stream, 16)
    compactor = LiveCompactor(live_ds, database_url, replace(FAST, fold_tokens=1 << 30))
    try:
        newest = _append(database_url, live_ds, docs[:8])
        first = _until(lambda: (got := _layer(database_url, live_ds, delta_name)) and got[1] == newest and got)
        newest = _append(database_url, live_ds, docs[8:])

        def building() -> bool:
            with connect(database_url) as conn:
                return conn.execute("SELECT 1 FROM datastores WHERE name = %s AND state = 'building'",
                                    [delta_name(live_ds)]).fetchone() is not None

        _until(building, every=0.01)
        os.kill(compactor.running()["delta"], signal.SIGKILL)
        _until(lambda: compactor.failures >= 1)
        assert _layer(database_url, live_ds, delta_name) == first  # the previous delta serves
        again = _until(lambda: (got := _layer(database_url, live_ds, delta_name)) and got[1] == newest and got)
        assert again[0] > first[0] and _layer(database_url, live_ds) is None  # retried; no fold
    finally:
        compactor.close()
    with connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM live_outputs WHERE name = %s", [live_ds]).fetchone() == (16,)


@pytest.mark.slow
def test_lookups_never_wait_for_automatic_compaction(database_url, real_stream, live_ds):
    """New clients of the live layer open and look up in their usual time while compactions run back to back and an
    idle transaction holds the layer's previous table (the DDL rules: the swap never queues a lookup)."""
    docs = _documents(real_stream, 40)
    context = [int(t) for t in docs[0][:8]]
    compactor = LiveCompactor(live_ds, database_url, FAST)
    seconds: list[float] = []
    stop = threading.Event()

    def clients() -> None:
        while not stop.is_set():
            t = time.perf_counter()
            try:
                with Datastore.open(live_name(live_ds), fingerprint=fingerprint, database_url=database_url) as ds:
                    ds.lookup(context)
            except DatastoreError:
                pass  # swapped out meanwhile: a fast answer all the same
            seconds.append(time.perf_counter() - t)
            time.sleep(0.02)

    try:
        newest = _append(database_url, live_ds, docs[:10])
        _until(lambda: (got := _layer(database_url, live_ds)) and got[1] == newest)
        with connect(database_url) as conn:
            row = conn.execute("SELECT trees_table, tokenizer_fingerprint FROM datastores WHERE name = %s "
                               "AND state = 'ready'", [live_name(live_ds)]).fetchone()
        assert row is not None
        table, fingerprint = row
        usual = []
        for _ in range(5):
            t = time.perf_counter()
            with Datastore.open(live_name(live_ds), fingerprint=fingerprint, database_url=database_url) as ds:
                ds.lookup(context)
            usual.append(time.perf_counter() - t)
        holder = connect(database_url)
        holder.execute(f'SELECT count(*) FROM "{table}"')  # an idle reader in an open transaction
        thread = threading.Thread(target=clients, daemon=True)
        thread.start()
        try:
            for start in (10, 20, 30):
                want = _append(database_url, live_ds, docs[start:start + 10])
                _until(lambda want=want: (got := _layer(database_url, live_ds)) and got[1] == want)
            _until(lambda: any(r.result and r.result["last_output_id"] == want for r in compactor.runs))
        finally:
            stop.set()
            thread.join(30)
            holder.close()
    finally:
        compactor.close()
    assert len([r for r in compactor.runs if r.result and r.result["build_id"]]) >= 3 and compactor.failures == 0
    assert seconds and max(seconds) < max(10 * max(usual), 0.5), (max(usual), max(seconds))


def test_a_compaction_ends_within_seconds_of_a_parent_killed_with_sigkill(database_url, real_stream, live_ds):
    """A process whose compactor runs a compaction (``python -m live compact``, its child), killed with SIGKILL inside
    the compaction's build (no cleanup): the child is gone within 5 s, and no live build was made."""
    _append(database_url, live_ds, _documents(real_stream, 8))
    script = f"""
import time
from live import CompactionPolicy, LiveCompactor
compactor = LiveCompactor({live_ds!r}, {database_url!r}, CompactionPolicy(outputs=1_000, after_s=0.0, gap_s=0.0,
                          fold_tokens=0, check_s=0.2, top_t=500, retry_s=0.5))
time.sleep(120)
"""
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=REPO)
    try:
        def building() -> bool:
            with connect(database_url) as conn:
                return conn.execute("SELECT 1 FROM datastores WHERE name = %s AND state = 'building'",
                                    [live_name(live_ds)]).fetchone() is not None

        _until(building, every=0.01)  # the compaction is inside its build
        children = [c.pid for c in psutil.Process(parent.pid).children(recursive=True)]
        assert children and alive_after(children, 0) == children
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        assert not alive_after(children, 5), "a compaction outlived its parent by 5 s"
    finally:
        parent.kill()
        parent.wait()
    assert _layer(database_url, live_ds) is None
