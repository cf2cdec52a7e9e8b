"""The live layer's writer: finished outputs appended to ``live_outputs`` from a background thread, never on the
decoding path (the layer itself: :mod:`live`)."""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
from collections.abc import Sequence

import psycopg

from datastore.connection import APPLICATION_NAME, connect, resolve_database_url
from datastore.errors import DatastoreError
from toolkit.forks import at_fork

from .store import encode_output

__all__ = ["LiveWriter"]

APPENDER_APPLICATION = f"{APPLICATION_NAME} live appender"
"""The ``application_name`` of the live writer's connections (``pg_stat_activity``)."""

log = logging.getLogger(__name__)
_STOP = object()


def _this_process() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class LiveWriter:
    """Appends finished outputs to the live layer of datastore ``name`` from a background thread.

    :meth:`append` only enqueues (microseconds); a daemon thread writes the queue as one ``COPY`` at most every
    ``batch_s`` seconds, so it takes the interpreter lock from the decoding thread once per batch, not once per
    output (a serving engine finishes requests every few steps). A fault (server down, grant revoked) drops that
    batch with one warning and is retried with the next one: output never depends on the live layer.

    Args:
        name: the datastore the outputs feed (the layer is :func:`datastore.layers.live_name` of it).
        database_url: a role with ``INSERT`` on ``live_outputs`` (``None``: ``DATABASE_URL`` or the embedded server).
        max_pending_bytes: most bytes of outputs queued; an output that does not fit is dropped (counted).
        origin: provenance tag stored with each output (default ``host:pid``, a forked child's its own).
        min_tokens: outputs shorter than this are not appended (nothing to learn from them).
        batch_s: seconds an output may wait for others to share its ``COPY`` (>= 0; default 2; :meth:`flush` and
            :meth:`close` write at once).

    Attributes:
        appended / dropped / written / failed: outputs enqueued, dropped (queue full or too short),
        stored, and lost to a fault. batches: ``COPY`` statements tried.

    Raises:
        ValueError: when ``max_pending_bytes < 4``, ``min_tokens < 1`` or ``batch_s < 0``.
    """

    def __init__(self, name: str, database_url: str | None = None, *, max_pending_bytes: int = 8 << 20,
                 origin: str | None = None, min_tokens: int = 2, batch_s: float = 2.0) -> None:
        if max_pending_bytes < 4 or min_tokens < 1 or not batch_s >= 0:
            raise ValueError(f"max_pending_bytes={max_pending_bytes} must be >= 4, min_tokens={min_tokens} >= 1 and "
                             f"batch_s={batch_s} >= 0")
        self.name = name
        self.batch_s = batch_s
        self.url = resolve_database_url(database_url)
        self.max_pending_bytes, self.min_tokens = max_pending_bytes, min_tokens
        self._default_origin = origin is None
        self.origin = origin if origin is not None else _this_process()
        self.appended = self.dropped = self.written = self.failed = self.batches = 0
        self._pending_bytes = 0
        self._lock: threading.Lock
        self._queue: queue.Queue
        self._idle: threading.Event
        self._now: threading.Event  # set by flush and close: write what is queued without waiting out batch_s
        self._thread: threading.Thread
        self._warned = False
        self._start()
        at_fork(self, after_in_child=LiveWriter._start)

    def _start(self) -> None:
        """A fresh queue and its thread (at construction, and in a forked child: the parent's outputs queued at the
        fork are the parent's to write, and the child's are of its own origin unless one was given)."""
        if self._default_origin:
            self.origin = _this_process()
        self._lock = threading.Lock()
        self._queue = queue.Queue()
        self._pending_bytes = 0
        self._idle = threading.Event()
        self._idle.set()
        self._now = threading.Event()
        self._thread = threading.Thread(target=self._run, name="crest-live-writer", daemon=True)
        self._thread.start()

    def append(self, tokens: Sequence[int], name: str | None = None) -> bool:
        """Enqueue one finished output (its generated tokens, not the prompt) for datastore ``name``'s live layer
        (``None``: this writer's ``name``: one writer serves every datastore a process drafts from); returns whether it
        was kept."""
        if len(tokens) < self.min_tokens:
            self.dropped += 1
            return False
        blob = encode_output(tokens)
        with self._lock:
            if self._pending_bytes + len(blob) > self.max_pending_bytes:
                self.dropped += 1
                return False
            self._pending_bytes += len(blob)
            self.appended += 1
            self._idle.clear()
        self._queue.put((self.name if name is None else name, blob))
        return True

    def flush(self, timeout: float = 10.0) -> bool:
        """Write everything enqueued so far at once and wait until it is written or dropped; returns whether it
        was."""
        self._now.set()
        return self._idle.wait(timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued, then stop the thread."""
        self._queue.put(_STOP)
        self._now.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        conn: psycopg.Connection | None = None
        while True:
            batch = [self._queue.get()]
            if batch[0] is not _STOP:
                self._now.wait(self.batch_s)  # let the batch gather (flush and close cut the wait short)
            self._now.clear()
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = any(b is _STOP for b in batch)
            blobs = [b for b in batch if b is not _STOP]
            if blobs:
                try:
                    self.batches += 1
                    if conn is None or conn.closed:
                        conn = connect(self.url, autocommit=True, application_name=APPENDER_APPLICATION)
                    with conn.cursor().copy("COPY live_outputs (name, tokens, num_tokens, origin) FROM STDIN") as cp:
                        for name, b in blobs:
                            cp.write_row((name, b, len(b) // 4, self.origin))
                    self.written += len(blobs)
                except (psycopg.Error, DatastoreError) as exc:
                    self.failed += len(blobs)
                    if not self._warned:
                        log.warning("live layer: %d outputs not appended (%s); decoding is unaffected", len(blobs), exc)
                        self._warned = True
                    if conn is not None:
                        conn.close()
                    conn = None
            with self._lock:
                self._pending_bytes -= sum(len(b) for _, b in blobs)
                if self._queue.empty():
                    self._idle.set()
            if stop:
                if conn is not None:
                    conn.close()
                return
