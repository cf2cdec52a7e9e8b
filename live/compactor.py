"""Automatic compaction of the live layer: each drafting service keeps the layer fresh on its own, with no cron job.

A :class:`LiveCompactor`, a thread of the drafting process, asks the server one question every ``check_s``
(:data:`DUE_QUERY`) and starts what :class:`CompactionPolicy` says is due: a *delta*
(``python -m live compact --delta``, :func:`live.compaction.compact_delta`: the outputs since the main build), or a
*fold* (``python -m live compact``, :func:`live.compaction.compact_live`: the main build rebuilt) once the delta reaches
``fold_tokens``. Each runs as that command in a child process at ``SCHED_IDLE`` (:func:`toolkit.children.spawn_idle`),
its result recorded; the command line is the contract, and a refusal (exit 2) is reported once, not retried.

:class:`WhenEngineIdle` starts one only once the engine has not stepped for ``idle_s`` seconds, and the engine's next
step stops it (retried in the next idle spell); :class:`Anytime` (the default) compacts whenever due. One compaction of
each kind per datastore across the fleet (:func:`datastore.registry.compactor_lock_key`); one that fails is retried
after ``retry_s``, doubling to ten minutes. Output never depends on it. A role that cannot read ``live_outputs`` turns
the compactor off with one warning naming the setting.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import IO

import psycopg

from datastore.connection import APPLICATION_NAME, connect, resolve_database_url
from datastore.errors import DatastoreError
from datastore.layers import delta_name, live_name
from datastore.registry import compactor_lock_key
from toolkit.children import spawn_idle
from toolkit.forks import at_fork

from .gates import Anytime, EngineGate
from .policy import CompactionPolicy, Layer

__all__ = ["CompactionRun", "LiveCompactor"]

log = logging.getLogger(__name__)

MAX_RETRY_S = 600.0
"""The longest wait before retrying after failed compactions (the wait doubles from ``retry_s`` up to this)."""

DUE_QUERY = """
WITH main AS (
    SELECT coalesce((corpus->>'last_output_id')::bigint, 0) AS last,
           extract(epoch FROM now() - completed_at)::float8 AS since
    FROM datastores WHERE name = %(layer)s AND state = 'ready'
), delta AS (
    SELECT (corpus->>'last_output_id')::bigint AS last, extract(epoch FROM now() - completed_at)::float8 AS since
    FROM datastores WHERE name = %(delta)s AND state = 'ready'
      AND coalesce((corpus->>'base_output_id')::bigint, 0) = coalesce((SELECT last FROM main), 0)
), unfolded AS (
    SELECT id, created_at, octet_length(tokens) AS bytes FROM live_outputs
    WHERE name = %(name)s AND id > coalesce((SELECT last FROM main), 0)
), waiting AS (
    SELECT id, created_at FROM unfolded WHERE id > coalesce((SELECT last FROM delta), (SELECT last FROM main), 0)
    ORDER BY id LIMIT %(cap)s
), locks AS (
    SELECT classid::bigint AS hi, objid::bigint AS lo FROM pg_locks
    WHERE locktype = 'advisory' AND objsubid = 1 AND granted
)
SELECT (SELECT count(*) FROM waiting),
       (SELECT extract(epoch FROM now() - min(created_at))::float8 FROM waiting),
       coalesce((SELECT since FROM delta), (SELECT since FROM main)),
       EXISTS (SELECT 1 FROM locks WHERE hi = %(delta_hi)s AND lo = %(delta_lo)s),
       (SELECT coalesce(sum(bytes), 0) / 4 FROM unfolded)::bigint,
       (SELECT count(*) FROM (SELECT 1 FROM unfolded LIMIT %(cap)s) AS u),
       (SELECT extract(epoch FROM now() - min(created_at))::float8 FROM unfolded),
       (SELECT since FROM main),
       EXISTS (SELECT 1 FROM locks WHERE hi = %(hi)s AND lo = %(lo)s)
"""
"""One round trip: ``(outputs waiting beyond the builds served (at most cap), seconds the oldest of them has waited or
NULL, seconds since the build that serves them completed (the delta's, else the main build's) or NULL, whether a delta
compactor holds its lock, tokens not in the main build, outputs not in it (at most cap), seconds the oldest of them has
waited or NULL, seconds since the main build completed or NULL, whether a fold holds its lock)``."""


@dataclass(frozen=True)
class CompactionRun:
    """One compaction this process ran.

    Attributes:
        kind: ``"delta"`` or ``"fold"``. started: ``time.time()`` at its start. seconds: its wall time, process start
        included. peak_rss_bytes: the child's peak resident set size with its tree worker's, as it reported it (0 when
        it failed). exit_code: its exit code (0: done or busy).
        result: ``python -m live compact --json``'s object (``None`` when it failed). error: the last lines of its
        standard error when it failed. yielded: stopped because the engine stepped (:class:`WhenEngineIdle`; not a
        failure: retried in the next idle spell, with no wait).
    """

    kind: str
    started: float
    seconds: float
    peak_rss_bytes: int
    exit_code: int
    result: dict | None
    error: str = ""
    yielded: bool = False


@dataclass
class _Lane:
    """One kind of compaction: its command's extra flags, the child in flight, and its failures in a row."""

    kind: str
    flags: tuple[str, ...]
    child: subprocess.Popen | None = None
    started: float = 0.0
    t0: float = 0.0
    out: IO[bytes] | None = None
    err: IO[bytes] | None = None
    killed_at: float | None = None
    yielded: bool = False
    failing: int = 0
    retry_at: float = 0.0


class LiveCompactor:
    """Compacts the live layer of datastore ``name`` when it is due, from a background thread (see the module
    docstring): at most one delta compaction and one fold in flight from this process, each in its own child.
    Thread-safe; :meth:`close` stops it (and kills the compactions in flight: the previous builds serve).

    Args:
        name: the datastore whose appended outputs are compacted into ``name.live`` and its delta.
        database_url: a role that may build datastores (``None``: ``DATABASE_URL`` or the embedded server).
        policy: when and how (default :class:`CompactionPolicy`).
        gate: whether the engine beside it leaves it the cores (default :class:`Anytime`; :class:`WhenEngineIdle`:
            only while the engine idles, the engine calling its ``step()`` once a step).

    Attributes:
        runs: the last 100 compactions this process ran (:class:`CompactionRun`), oldest first.
        checks: due checks made. failures: compactions that failed (exit code not 0). yields: compactions stopped
            because the engine stepped.
        stopped: why the compactor stopped on its own (``None`` while it runs).

    Raises:
        ValueError: for an empty name.
    """

    def __init__(self, name: str, database_url: str | None = None, policy: CompactionPolicy | None = None,
                 gate: EngineGate | None = None) -> None:
        if not name:
            raise ValueError("LiveCompactor needs the datastore's name")
        self.name = name
        self.url = resolve_database_url(database_url)
        self.policy = policy or CompactionPolicy()
        self.gate: EngineGate = gate or Anytime()
        self.runs: deque[CompactionRun] = deque(maxlen=100)
        self.checks = self.failures = self.yields = 0
        self.stopped: str | None = None
        fold, delta = (compactor_lock_key(n) & 0xFFFFFFFFFFFFFFFF for n in (name, delta_name(name)))
        self._params = {"layer": live_name(name), "delta": delta_name(name), "name": name,
                        "cap": self.policy.outputs, "hi": fold >> 32, "lo": fold & 0xFFFFFFFF,
                        "delta_hi": delta >> 32, "delta_lo": delta & 0xFFFFFFFF}
        self._lanes = {"delta": _Lane("delta", ("--delta",)), "fold": _Lane("fold", ())}
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self.gate.on_busy(self._yield)
        self._thread = threading.Thread(target=self._run, name="crest-live-compactor", daemon=True)
        self._thread.start()
        at_fork(self, after_in_child=LiveCompactor._forked)

    def _forked(self) -> None:
        """In a forked child: stopped (the parent compacts; its compactions in flight are the parent's)."""
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._closing.set()
        self._lanes = {kind: _Lane(kind, lane.flags) for kind, lane in self._lanes.items()}
        self.stopped = "forked: the parent process compacts"

    def running(self) -> dict[str, int]:
        """The process id of each compaction in flight from this process, by kind (``"delta"``, ``"fold"``)."""
        with self._lock:
            return {kind: lane.child.pid for kind, lane in self._lanes.items() if lane.child is not None}

    def in_flight_since(self) -> dict[str, float]:
        """The start (``time.time()``, seconds) of each compaction in flight from this process, by kind (``"delta"``,
        ``"fold"``): a compaction that never ends under a full engine is in no :attr:`runs`."""
        with self._lock:
            return {kind: lane.started for kind, lane in self._lanes.items() if lane.child is not None}

    def close(self, timeout: float = 10.0) -> None:
        """Stop checking; the compactions in flight are terminated (the previous builds keep serving)."""
        self._closing.set()
        with self._lock:  # not Popen.poll(): reaping is _reap's, under the lock
            for lane in self._lanes.values():
                if lane.child is not None and lane.child.returncode is None:
                    os.kill(lane.child.pid, signal.SIGTERM)
        self._thread.join(timeout)

    # -- the background thread ----------------------------------------------------------------------------------

    def _warn(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning(message)

    def _run(self) -> None:
        conn: psycopg.Connection | None = None
        next_check = 0.0
        try:
            while not self._closing.is_set() and self.stopped is None:
                self._reap()
                busy = any(lane.child is not None for lane in self._lanes.values())
                engine = self.gate.idle_in()
                if engine > 0:  # the engine steps: no check (its query is work on the engine's cores either)
                    self._closing.wait(0.05 if busy else max(engine, next_check - time.monotonic()))
                    continue
                now = time.monotonic()
                if now >= next_check and self.stopped is None:
                    next_check = now + self.policy.check_s
                    conn, pause = self._check(conn)
                    next_check = now + pause
                busy = any(lane.child is not None for lane in self._lanes.values())
                self._closing.wait(0.05 if busy else max(0.0, next_check - time.monotonic()))
        finally:
            self._stop_children()
            if conn is not None:
                conn.close()

    def _check(self, conn: psycopg.Connection | None) -> tuple[psycopg.Connection | None, float]:
        """One due check, and the compactions it finds due started; returns the connection and the seconds to the
        next check."""
        try:
            if conn is None or conn.closed:
                conn = connect(self.url, autocommit=True, application_name=f"{APPLICATION_NAME} live compactor")
            row = conn.execute(DUE_QUERY, self._params).fetchone()
        except psycopg.errors.InsufficientPrivilege as exc:
            self.stopped = f"the role cannot read live_outputs ({exc})"
            log.warning("live layer of %r: automatic compaction is off: its role cannot read live_outputs (%s); "
                        "give the compactor the datastores' owner (CREST_COMPACT_URL) or turn it off "
                        "(CREST_COMPACT=0); drafting is unaffected", self.name, str(exc).strip())
            return conn, self.policy.check_s
        except (psycopg.Error, DatastoreError) as exc:
            self._warn("check", f"live layer of {self.name!r}: cannot check whether a compaction is due ({exc}); "
                                "retrying (drafting is unaffected)")
            if conn is not None:
                conn.close()
            return None, self.policy.retry_s
        self.checks += 1
        if row is None:
            return conn, self.policy.check_s
        layer = Layer(int(row[0]), row[1], row[2], bool(row[3]), int(row[4]), int(row[5]), row[6], row[7],
                      bool(row[8]))
        now = time.monotonic()
        for kind, due in (("fold", self.policy.fold_due(layer)), ("delta", self.policy.delta_due(layer))):
            lane = self._lanes[kind]
            if due and lane.child is None and now >= lane.retry_at:
                self._spawn(lane)
        return conn, self.policy.check_s

    def _spawn(self, lane: _Lane) -> None:
        """Start ``python -m live compact`` (with the lane's flags) in a child process at idle priority."""
        p = self.policy
        args = ["compact", "--name", self.name, *lane.flags, "--top-t", str(p.top_t), "--max-bytes", str(p.max_bytes),
                "--json", "--quiet"]
        env = dict(os.environ, DATABASE_URL=self.url)
        # the child's output files live with the lane until it is reaped (closed in _finished)
        out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # noqa: SIM115
        with self._lock:  # the engine's step (_yield) takes it too: a child starts only while the engine idles
            if self._closing.is_set() or self.gate.idle_in() > 0:
                out.close()
                err.close()
                return
            lane.out, lane.err, lane.started, lane.t0, lane.killed_at = out, err, time.time(), time.perf_counter(), None
            lane.yielded = False
            lane.child = spawn_idle("live", args, env, out, err)

    def _yield(self) -> None:
        """The engine stepped after an idle spell (from its thread): the compactions in flight are stopped, to be
        retried in the next idle spell (the previous builds keep serving; reaped by the compactor's thread)."""
        with self._lock:
            if self._closing.is_set():  # close() stops them (and reaps them in _stop_children)
                return
            for lane in self._lanes.values():
                # not Popen.send_signal: its poll() would reap the child behind _reap's back
                if lane.child is not None and lane.child.returncode is None and lane.killed_at is None:
                    os.kill(lane.child.pid, signal.SIGTERM)  # not reaped yet (_reap reaps under the lock)
                    lane.killed_at, lane.yielded = time.perf_counter(), True

    def _reap(self) -> None:
        """Record each finished compaction; stop one past the timeout (or every one, when closing)."""
        for lane in self._lanes.values():
            child = lane.child
            if child is None:
                continue
            with self._lock:  # _yield signals a child only while it is not reaped
                pid, status = os.waitpid(child.pid, os.WNOHANG)
                if pid == child.pid:
                    child.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
            if pid == child.pid:
                self._finished(lane, child.returncode)
                continue
            late = time.perf_counter() - lane.t0 > self.policy.timeout_s
            if (self._closing.is_set() or late) and lane.killed_at is None:
                child.send_signal(signal.SIGTERM)
                lane.killed_at = time.perf_counter()
                if late:
                    self._warn("timeout", f"live layer of {self.name!r}: a compaction ran past "
                                          f"{self.policy.timeout_s:.0f} s and was stopped; the previous build keeps "
                                          "serving")
            elif lane.killed_at is not None and time.perf_counter() - lane.killed_at > 5:
                child.kill()

    def _finished(self, lane: _Lane, code: int) -> None:
        """A lane's child exited with ``code``: its run recorded, its failures counted and its retry set."""
        assert lane.out is not None and lane.err is not None  # set with the child
        lane.out.seek(0)
        lane.err.seek(0)
        text = lane.out.read().decode("utf-8", "replace")
        error = "" if code == 0 else " | ".join(lane.err.read().decode("utf-8", "replace").strip().splitlines()[-3:])
        lane.out.close()
        lane.err.close()
        with self._lock:
            lane.child, lane.out, lane.err = None, None, None
            yielded, lane.yielded = lane.yielded and code != 0, False
        if self._closing.is_set() and code != 0:  # stopped by close()
            return
        if yielded:  # stopped for the engine's step: retried in the next idle spell
            self.yields += 1
            self.runs.append(CompactionRun(lane.kind, lane.started, time.perf_counter() - lane.t0, 0, code, None,
                                           "stopped: the engine stepped", yielded=True))
            return
        try:
            result = json.loads(text) if code == 0 else None
        except json.JSONDecodeError:
            result, error = None, f"unreadable result: {text[:200]!r}"
        # the child's own report (wait4's figure would count the pages of this process it was forked from)
        peak = int(result.get("peak_rss_bytes", 0)) if result else 0
        run = CompactionRun(lane.kind, lane.started, time.perf_counter() - lane.t0, peak, code, result, error)
        self.runs.append(run)
        if code == 2:  # refused as a usage error (the ingest extra missing, a bad setting): not retried
            self.stopped = error or "python -m live compact refused its arguments"
            log.warning("live layer of %r: automatic compaction is off: %s; fix it, or turn the compactor off "
                        "(CREST_COMPACT=0); drafting is unaffected", self.name, self.stopped)
            return
        if code == 0:
            lane.failing = 0
            return
        self.failures += 1
        lane.failing += 1
        wait = min(self.policy.retry_s * 2 ** (lane.failing - 1), MAX_RETRY_S)
        lane.retry_at = time.monotonic() + wait
        log.warning("live layer of %r: %s compaction failed (exit %d, %.1f s): %s; the previous live build keeps "
                    "serving; retrying in %.0f s", self.name, lane.kind, code, run.seconds, error or "no message", wait)

    def _stop_children(self) -> None:
        """Terminate the compactions in flight and reap them (SIGKILL after 5 s)."""
        deadline = time.perf_counter() + 5
        for lane in self._lanes.values():
            if lane.child is not None and lane.child.poll() is None:
                lane.child.send_signal(signal.SIGTERM)
        for lane in self._lanes.values():
            child = lane.child
            if child is None:
                continue
            try:
                child.wait(max(0.0, deadline - time.perf_counter()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            self._finished(lane, child.returncode)
