"""Retrieval that survives every datastore fault: the decoder drafts without the datastore, never fails.

Verification decides every token, so a lookup that answers nothing changes speed, never output. :class:`DatastoreSource`
wraps a retrieval backend (:class:`datastore.Datastore`, :class:`datastore.shared.SharedDatastore` or REST's
:class:`datastore.SuffixIndex`) and turns each :class:`datastore.DatastoreError` into "no draft from the datastore this
step":

- the server unreachable, the datastore dropped or rebuilt with another tokenizer, the schema changed, the grant
  revoked: one warning, then drafts from the other sources; every ``retry_s`` seconds the backend is opened again;
- a rebuild with the same tokenizer is followed by the client itself, silently;
- a corrupt or undecodable tree is served as absent by the client (one warning per client).

In a forked child the parent's backend is left to the parent: the child opens its own on its first lookup.
:meth:`DatastoreSource.close` is final: nothing reopens the backend after it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from datastore.context import TokenIds
from datastore.errors import ClosedError, DatastoreError, DatastoreNotFound
from datastore.lookup import Retrieval
from datastore.tree import Match
from toolkit.forks import at_fork

if TYPE_CHECKING:
    from crest_native import Replica
    from datastore.replica import Stores

log = logging.getLogger(__name__)


class Retriever(Protocol):
    """A retrieval backend: :class:`datastore.Datastore`, :class:`datastore.shared.SharedDatastore` or
    :class:`datastore.SuffixIndex`."""

    def lookup(self, context: TokenIds) -> Match | None:
        """The longest stored suffix of ``context`` and its continuation tree, or ``None``."""

    def lookup_batch(self, contexts: Sequence[TokenIds]) -> list[Match | None]:
        """:meth:`lookup` for many contexts (one round trip for a server)."""

    def candidates_batch(self, contexts: Sequence[TokenIds]) -> list[list[Match]]:
        """Per context, the trees of all its stored suffixes, longest first (one round trip for a server)."""

    def retrieve_batch(self, contexts: Sequence[TokenIds], back_off: Sequence[bool]) -> list[Retrieval]:
        """A drafting step's lookups: per context, the candidates (all stored suffixes where its ``back_off`` is true,
        else the longest) and the live layer's longest match, its main build's and its delta's, in one round trip
        (Postgres clients only)."""

    def stores(self) -> Stores | None:
        """The host-local replicas of the builds served, when the backend keeps them and they are ready."""

    def replica_damaged(self, replica: Replica) -> None:
        """A drafting step found ``replica`` (one of :meth:`stores`) damaged."""

    def identity(self) -> dict:
        """What the backend serves (name and build, or index size and parameters)."""

    def close(self) -> None:
        """Release the connection or files."""


class DatastoreSource:
    """Longest-match lookups that survive every datastore fault.

    Thread-safe: decoders on several threads may share one source (with a thread-safe
    backend, :class:`datastore.shared.SharedDatastore`).

    Args:
        connect: opens the backend (called now, and again to recover after a fault).
        retry_s: seconds between attempts to reopen a failed backend, >= 0.
        reopen_in_background: reopen on a background thread, so that no lookup ever waits for a
            connection attempt (an engine's step must not stall while the server is down); the
            lookups answer ``None`` until the backend is open again. Default: reopen in the lookup.
        optional: a datastore that is not built yet is expected (a live layer before its first compaction):
            its absence is logged at INFO, not as a warning; every other fault still warns.

    Attributes:
        client: the open backend, or ``None`` while it is down.
        faults: count of each fault seen, by exception class name.

    Raises:
        ValueError: when ``retry_s < 0``.
    """

    def __init__(self, connect: Callable[[], Retriever], retry_s: float = 5.0, *,
                 reopen_in_background: bool = False, optional: bool = False) -> None:
        if retry_s < 0:
            raise ValueError(f"retry_s={retry_s}: must be >= 0")
        self._connect = connect
        self.retry_s = retry_s
        self._background = reopen_in_background
        self._optional = optional
        self._reopening: threading.Thread | None = None
        self.client: Retriever | None = None
        self.faults: Counter = Counter()
        self._down_at = float("-inf")
        self._degraded = False
        self._generation = 0  # close() abandons a reopen in flight (its backend is closed when it arrives)
        self._inherited: list[Retriever] = []  # a forked child's parent's backends: left alone, never closed
        self._closed = False
        self._lock = threading.RLock()
        at_fork(self, after_in_child=DatastoreSource._forked)
        with self._lock:
            self._reopen()

    def _fault(self, exc: DatastoreError) -> None:
        self.faults[type(exc).__name__] += 1
        if not self._degraded:
            level = logging.INFO if self._optional and isinstance(exc, DatastoreNotFound) else logging.WARNING
            log.log(level, "%s; drafting without the datastore until it is back (output is unaffected)", exc)
            self._degraded = True
        self._drop()
        self._down_at = time.monotonic()

    def _reopen(self) -> bool:
        try:
            self.client = self._connect()
        except DatastoreError as exc:
            self._fault(exc)
            return False
        return True

    def _reopen_later(self) -> None:
        generation = self._generation
        try:
            client = self._connect()
        except DatastoreError as exc:
            with self._lock:
                if generation == self._generation:
                    self._fault(exc)
            return
        with self._lock:
            if generation == self._generation:
                self.client = client
                return
        client.close()  # closed meanwhile: no pool or listener is left open behind close()

    def _client(self) -> Retriever | None:
        """The open backend, reopened once ``retry_s`` has passed since the last fault; ``None`` while down.

        Raises:
            datastore.errors.ClosedError: after :meth:`close`."""
        with self._lock:
            if self._closed:
                raise ClosedError("this datastore source was closed (close() is final); open a new one")
            if self.client is not None or time.monotonic() - self._down_at < self.retry_s:
                return self.client
            if not self._background:
                return self.client if self._reopen() else None
            if self._reopening is None or not self._reopening.is_alive():
                self._down_at = time.monotonic()  # one attempt at a time, the next after retry_s
                self._reopening = threading.Thread(target=self._reopen_later, name="crest-reopen", daemon=True)
                self._reopening.start()
            return None

    def _failed(self, client: Retriever, exc: DatastoreError) -> None:
        with self._lock:
            if self.client is client:  # not already handled by another thread
                self._fault(exc)

    def _recovered(self, client: Retriever) -> None:
        with self._lock:
            if self._degraded:
                log.info("the datastore is back (%s); drafting with it again", client.identity())
                self._degraded = False

    def lookup(self, context: TokenIds) -> Match | None:
        """The longest stored suffix of ``context`` and its tree; ``None`` for no match or any fault.

        The datastore counts as back only once a lookup succeeds, so a fault that lets the
        backend open but fails every lookup (a revoked grant) still warns once.
        """
        return self.lookup_batch([context])[0]

    def lookup_batch(self, contexts: Sequence[TokenIds]) -> list[Match | None]:
        """:meth:`lookup` for many contexts: one round trip for a server backend; all ``None`` on a fault."""
        return self._call(lambda c: c.lookup_batch(contexts), [None] * len(contexts))

    def candidates_batch(self, contexts: Sequence[TokenIds]) -> list[list[Match]]:
        """For each context, every stored suffix's tree, longest first (the back-off lookup's candidates,
        :meth:`datastore.shared.SharedDatastore.candidates_batch`): one round trip; all empty on a fault."""
        return self._call(lambda c: c.candidates_batch(contexts), [[] for _ in contexts])

    def retrieve_batch(self, contexts: Sequence[TokenIds], back_off: Sequence[bool]) -> list[Retrieval]:
        """A drafting step's lookups in one round trip
        (:meth:`datastore.lookup.LookupClient.retrieve_batch`): per context, the datastore's candidates (every
        stored suffix, longest first, where its ``back_off`` is true; else the longest) and the live layer's longest
        matches (its main build's and its delta's); all empty on a fault."""
        return self._call(lambda c: c.retrieve_batch(contexts, back_off), [Retrieval([], None) for _ in contexts])

    def stores(self) -> Stores | None:
        """The host-local replicas of the builds the backend serves, when it keeps them and they are ready (the merged
        drafter then drafts a step in one native call); ``None`` while the backend is down or they are not ready, or
        after :meth:`close`. Costs no round trip, and never reopens a backend."""
        client = self.client
        return None if client is None else client.stores()

    def replica_damaged(self, replica: Replica) -> None:
        """A drafting step found ``replica`` damaged: the backend drops it (one warning) and writes it again."""
        client = self.client
        if client is not None:
            client.replica_damaged(replica)

    @property
    def vocab_size(self) -> int | None:
        """The datastore's vocabulary size (token ids are below it), reopening a closed backend; ``None`` while
        it is down."""
        client = self._client()
        info = getattr(client, "info", None)
        return None if info is None else info.vocab_size

    def _call(self, ask: Callable[[Retriever], list], empty: list) -> list:
        client = self._client()
        if client is None:
            return empty
        try:
            out = ask(client)
        except DatastoreError as exc:
            self._failed(client, exc)
            return empty
        if self._degraded:
            self._recovered(client)
        return out

    def identity(self) -> dict:
        """What is being served now, reopening a closed backend (``{"down": True}`` while it is down)."""
        client = self._client()
        return {"down": True} if client is None else client.identity()

    def _drop(self) -> None:
        """Close the backend after a fault (a later lookup reopens it)."""
        with self._lock:
            client, self.client = self.client, None
        if client is not None:
            client.close()

    def close(self) -> None:
        """Close the backend and abandon a reopen in flight; final: a later lookup, :meth:`identity` or
        :attr:`vocab_size` raises :class:`datastore.errors.ClosedError`, :meth:`stores` answers ``None``, and nothing
        reopens the backend (a second ``close`` does nothing). A lookup in flight ends on the closed backend (its
        fault answers nothing)."""
        with self._lock:
            self._closed = True
            self._generation += 1
        self._drop()

    def _forked(self) -> None:
        """In a forked child: a fresh lock, and the parent's backend left to the parent (not closed: its connections
        are the parent's); the child opens its own on its first lookup."""
        self._lock = threading.RLock()
        if self.client is not None:
            self._inherited.append(self.client)
        self.client, self._reopening, self._down_at = None, None, float("-inf")
