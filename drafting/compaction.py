"""Automatic compaction of the live layer: a drafting service that appends its finished outputs keeps the live layer
fresh on its own, with no cron job.

A :class:`LiveCompactor` is a background thread of the drafting process. Every ``check_s`` it asks the server one
question (:data:`DUE_QUERY`: how many outputs wait beyond the newest one the serving live build folded in, how long
the oldest of them has waited, how long ago that build completed, and whether a compactor holds the datastore's
compactor lock). When a compaction is due (:meth:`CompactionPolicy.due`) and nobody holds the lock, it runs ``python
-m ingest compact-live`` (:func:`ingest.live.compact_live`, a command: drafting does not import ingest) in a child
process at the lowest CPU priority (``SCHED_IDLE``, :func:`spawn_idle`), and records its wall time, peak RSS and
result. An engine's threads often hold every core (vLLM-CPU's OpenMP threads, one per core, wait at a barrier for the
slowest each layer): a compaction at normal priority took a core from them and slowed every forward pass by up to 60%;
at ``SCHED_IDLE`` it runs only while a core idles (between the engine's parallel regions), and yields the moment the
engine wants it back.

One compactor per datastore, across every process and host: the child takes the compactor lock (a session advisory
lock, :func:`datastore.registry.compactor_lock_key`) and does nothing when another holds it. A compaction that fails or
is killed leaves the previous live build serving (a build is swapped in atomically, and nothing is evicted before) and
is retried after ``retry_s``, doubling to ten minutes while it keeps failing. Lookups never wait for it: readers
follow the new build by the swap's ``NOTIFY`` as they follow any rebuild, and the build's DDL never queues a lookup
(:mod:`datastore.admin.ddl`). Output never depends on it.

The role needs what ``compact-live`` needs (the datastores' owner); a role that cannot read ``live_outputs`` turns the
compactor off with one warning naming the setting.

Why the compactor runs ``ingest``'s command rather than importing it: ``ingest`` requires the build stack (DuckDB,
PyArrow; the ``ingest`` extra), which an engine's process should neither need nor load (hundreds of MB and seconds of
import in every serving process, for work it never does itself), and a compaction must not share the engine's process
(its memory peak, a crash or a kill stays the child's, and ``SCHED_IDLE`` applies to the child alone). So the command
line is the contract between the two packages: its flags are the ones :class:`CompactionPolicy` names, it runs end
to end under this class in ``tests/drafting/test_compaction.py`` and inside vLLM in
``tests/serving/test_vllm_proposer.py``, and a refusal (exit 2: the extra missing, a bad setting) is reported once
and not retried.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass

import psycopg

from datastore.connection import APPLICATION_NAME, connect, resolve_database_url
from datastore.errors import DatastoreError
from datastore.live import LIVE_MAX_BYTES, LIVE_TOP_T, live_name
from datastore.registry import compactor_lock_key
from toolkit.forks import at_fork

__all__ = ["CompactionPolicy", "CompactionRun", "LiveCompactor"]

log = logging.getLogger(__name__)

MAX_RETRY_S = 600.0
"""The longest wait before retrying after failed compactions (the wait doubles from ``retry_s`` up to this)."""

DUE_QUERY = """
WITH layer AS (
    SELECT coalesce((corpus->>'last_output_id')::bigint, 0) AS last,
           extract(epoch FROM now() - completed_at)::float8 AS since
    FROM datastores WHERE name = %(layer)s AND state = 'ready'
), waiting AS (
    SELECT id, created_at FROM live_outputs
    WHERE name = %(name)s AND id > coalesce((SELECT last FROM layer), 0)
    ORDER BY id LIMIT %(cap)s
)
SELECT (SELECT count(*) FROM waiting),
       (SELECT extract(epoch FROM now() - min(created_at))::float8 FROM waiting),
       (SELECT since FROM layer),
       EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND classid::bigint = %(hi)s
               AND objid::bigint = %(lo)s AND objsubid = 1 AND granted)
"""
"""One round trip: ``(outputs waiting (at most cap), seconds the oldest has waited or NULL, seconds since the serving
live build completed or NULL, whether a compactor holds the lock)``."""


@dataclass(frozen=True)
class CompactionPolicy:
    """When a drafting service compacts its live layer, and how (the proposer's ``CREST_COMPACT_*`` settings).

    A compaction is due when outputs wait (appended after the newest one the serving live build folded in) and either
    ``outputs`` of them wait or the oldest has waited ``after_s`` seconds; and the serving live build completed at
    least ``gap_s`` seconds ago (so back-to-back compactions leave the cores to decoding at least that long).

    Attributes:
        outputs: outputs waiting that make a compaction due at once (>= 1; default 64).
        after_s: seconds the oldest waiting output may wait (>= 0; default 2).
        gap_s: seconds after the last compaction completed before the next may start (>= 0; default 2).
        check_s: seconds between two checks, one query each (> 0; default 1).
        top_t / max_bytes: as ``python -m ingest compact-live`` (n-grams per n; the layer's byte bound).
        retry_s: seconds before retrying after a failed compaction, doubling to :data:`MAX_RETRY_S` (> 0; default 30).
        timeout_s: a compaction still running after this many seconds is killed (> 0; default 1800).

    Raises:
        ValueError: naming the setting, when one is out of range.
    """

    outputs: int = 64
    after_s: float = 2.0
    gap_s: float = 2.0
    check_s: float = 1.0
    top_t: int = LIVE_TOP_T
    max_bytes: int = LIVE_MAX_BYTES
    retry_s: float = 30.0
    timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        checks = [(self.outputs >= 1, f"CREST_COMPACT_OUTPUTS={self.outputs}: must be >= 1"),
                  (self.after_s >= 0, f"CREST_COMPACT_AFTER_S={self.after_s}: must be >= 0"),
                  (self.gap_s >= 0, f"CREST_COMPACT_GAP_S={self.gap_s}: must be >= 0"),
                  (self.check_s > 0, f"check_s={self.check_s}: must be > 0"),
                  (self.top_t >= 1, f"CREST_LIVE_TOP_T={self.top_t}: must be >= 1"),
                  (self.max_bytes >= 1024, f"CREST_LIVE_MAX_BYTES={self.max_bytes}: must be >= 1024"),
                  (self.retry_s > 0, f"retry_s={self.retry_s}: must be > 0"),
                  (self.timeout_s > 0, f"timeout_s={self.timeout_s}: must be > 0")]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    def due(self, waiting: int, oldest_s: float | None, since_s: float | None) -> bool:
        """Whether a compaction is due: ``waiting`` outputs, the oldest ``oldest_s`` seconds old, the serving live
        build completed ``since_s`` seconds ago (``None``: there is none)."""
        if waiting == 0 or (since_s is not None and since_s < self.gap_s):
            return False
        return waiting >= self.outputs or (oldest_s is not None and oldest_s >= self.after_s)


@dataclass(frozen=True)
class CompactionRun:
    """One compaction this process ran.

    Attributes:
        started: ``time.time()`` at its start. seconds: its wall time, process start included.
        peak_rss_bytes: the child's peak resident set size with its tree worker's, as it reported it (0 when it
        failed). exit_code: its exit code (0: done or busy).
        result: ``compact-live --json``'s object (``None`` when it failed). error: the last lines of its
        standard error when it failed.
    """

    started: float
    seconds: float
    peak_rss_bytes: int
    exit_code: int
    result: dict | None
    error: str = ""


class LiveCompactor:
    """Compacts the live layer of datastore ``name`` when it is due, from a background thread (see the module
    docstring). Thread-safe; :meth:`close` stops it (and kills a compaction in flight: the previous build serves).

    Args:
        name: the datastore whose appended outputs are compacted into ``name.live``.
        database_url: a role that may build datastores (``None``: ``DATABASE_URL`` or the embedded server).
        policy: when and how (default :class:`CompactionPolicy`).

    Attributes:
        runs: the last 100 compactions this process ran (:class:`CompactionRun`), oldest first.
        checks: due checks made. failures: compactions that failed (exit code not 0).
        stopped: why the compactor stopped on its own (``None`` while it runs).

    Raises:
        ValueError: for an empty name.
    """

    def __init__(self, name: str, database_url: str | None = None, policy: CompactionPolicy | None = None) -> None:
        if not name:
            raise ValueError("LiveCompactor needs the datastore's name")
        self.name = name
        self.url = resolve_database_url(database_url)
        self.policy = policy or CompactionPolicy()
        self.runs: deque[CompactionRun] = deque(maxlen=100)
        self.checks = self.failures = 0
        self.stopped: str | None = None
        key = compactor_lock_key(name) & 0xFFFFFFFFFFFFFFFF
        self._params = {"layer": live_name(name), "name": name, "cap": self.policy.outputs,
                        "hi": key >> 32, "lo": key & 0xFFFFFFFF}
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._child: subprocess.Popen | None = None
        self._warned: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="crest-live-compactor", daemon=True)
        self._thread.start()
        at_fork(self, after_in_child=LiveCompactor._forked)

    def _forked(self) -> None:
        """In a forked child: stopped (the parent compacts; its compaction in flight is the parent's)."""
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._closing.set()
        self._child = None
        self.stopped = "forked: the parent process compacts"

    def close(self, timeout: float = 10.0) -> None:
        """Stop checking; a compaction in flight is terminated (the previous live build keeps serving)."""
        self._closing.set()
        with self._lock:
            child = self._child
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)
        self._thread.join(timeout)

    # -- the background thread ----------------------------------------------------------------------------------

    def _warn(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning(message)

    def _run(self) -> None:
        conn: psycopg.Connection | None = None
        wait = self.policy.check_s
        failing = 0
        while not self._closing.wait(wait):
            wait = self.policy.check_s
            try:
                if conn is None or conn.closed:
                    conn = connect(self.url, autocommit=True, application_name=f"{APPLICATION_NAME} live compactor")
                row = conn.execute(DUE_QUERY, self._params).fetchone()
            except psycopg.errors.InsufficientPrivilege as exc:
                self.stopped = f"the role cannot read live_outputs ({exc})"
                log.warning("live layer of %r: automatic compaction is off: its role cannot read live_outputs (%s); "
                            "give the compactor the datastores' owner (CREST_COMPACT_URL) or turn it off "
                            "(CREST_COMPACT=0); drafting is unaffected", self.name, str(exc).strip())
                break
            except (psycopg.Error, DatastoreError) as exc:
                self._warn("check", f"live layer of {self.name!r}: cannot check whether a compaction is due ({exc}); "
                                    "retrying (drafting is unaffected)")
                if conn is not None:
                    conn.close()
                conn, wait = None, self.policy.retry_s
                continue
            self.checks += 1
            if row is None:
                continue
            waiting, oldest_s, since_s, busy = row
            if busy or not self.policy.due(int(waiting), oldest_s, since_s):
                continue
            run = self._compact()
            if run is None or (self._closing.is_set() and run.exit_code != 0):  # stopped by close()
                break
            self.runs.append(run)
            if self._closing.is_set():
                break
            if run.exit_code == 2:  # refused as a usage error (the ingest extra missing, a bad setting): not retried
                self.stopped = run.error or "compact-live refused its arguments"
                log.warning("live layer of %r: automatic compaction is off: %s; fix it, or turn the compactor off "
                            "(CREST_COMPACT=0); drafting is unaffected", self.name, self.stopped)
                break
            if run.exit_code == 0:
                failing = 0
                continue
            self.failures += 1
            failing += 1
            wait = min(self.policy.retry_s * 2 ** (failing - 1), MAX_RETRY_S)
            log.warning("live layer of %r: compaction failed (exit %d, %.1f s): %s; the previous live build keeps "
                        "serving; retrying in %.0f s", self.name, run.exit_code, run.seconds, run.error or "no message",
                        wait)
        if conn is not None:
            conn.close()

    def _compact(self) -> CompactionRun | None:
        """Run ``python -m ingest compact-live`` in a child process and wait for it; ``None`` when closing."""
        p = self.policy
        argv = [sys.executable, "-m", "ingest", "compact-live", "--name", self.name, "--top-t", str(p.top_t),
                "--max-bytes", str(p.max_bytes), "--json", "--quiet", "--exit-with-parent"]
        env = dict(os.environ, DATABASE_URL=self.url)
        started, t0 = time.time(), time.perf_counter()
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            with self._lock:
                if self._closing.is_set():
                    return None
                self._child = child = spawn_idle(argv, env, out, err)
            status = self._wait(child, t0)
            with self._lock:
                self._child = None
            code = os.waitstatus_to_exitcode(status)
            out.seek(0)
            err.seek(0)
            text = out.read().decode("utf-8", "replace")
            error = "" if code == 0 else " | ".join(err.read().decode("utf-8", "replace").strip().splitlines()[-3:])
        try:
            result = json.loads(text) if code == 0 else None
        except json.JSONDecodeError:
            result, error = None, f"unreadable result: {text[:200]!r}"
        # the child's own report (wait4's figure would count the pages of this process it was forked from)
        peak = int(result.get("peak_rss_bytes", 0)) if result else 0
        return CompactionRun(started, time.perf_counter() - t0, peak, code, result, error)

    def _wait(self, child: subprocess.Popen, t0: float) -> int:
        """Reap ``child``; terminate it when closing or past the timeout. Returns its wait status."""
        killed_at = None
        while True:
            pid, status = os.waitpid(child.pid, os.WNOHANG)
            if pid == child.pid:
                child.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
                return status
            late = time.perf_counter() - t0 > self.policy.timeout_s
            if (self._closing.is_set() or late) and killed_at is None:
                child.send_signal(signal.SIGTERM)
                killed_at = time.perf_counter()
                if late:
                    self._warn("timeout", f"live layer of {self.name!r}: a compaction ran past "
                                          f"{self.policy.timeout_s:.0f} s and was stopped; the previous live build "
                                          "keeps serving")
            elif killed_at is not None and time.perf_counter() - killed_at > 5:
                child.kill()
            time.sleep(0.05)


def spawn_idle(argv: list[str], env: dict[str, str], stdout, stderr) -> subprocess.Popen:
    """Start ``argv`` as a child at the lowest CPU priority there is: ``SCHED_IDLE`` (Linux: it runs only on a core
    nothing else wants, so an engine whose threads hold every core is never stalled by it, and its threads and
    children inherit it), else ``nice 19``. Set the moment the child has started (``Popen`` returns once it runs the
    command, before its interpreter has run a line), so its work is idle.

    Args:
        argv: the command. env: its environment. stdout / stderr: files it writes to (its stdin is ``/dev/null``).

    Raises:
        OSError: when it cannot be started.
    """
    child = subprocess.Popen(argv, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, env=env)
    try:
        os.sched_setscheduler(child.pid, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):  # no SCHED_IDLE here (or the child is gone already): the lowest nice instead
        try:
            os.setpriority(os.PRIO_PROCESS, child.pid, 19)
        except OSError:
            pass
    return child
