"""Retrieval that survives every datastore fault: the decoder drafts without the datastore, never fails.

Verification decides every token, so a lookup that answers nothing changes
speed, never output. :class:`DatastoreSource` wraps a retrieval backend (the
Postgres :class:`datastore.Datastore`, or REST's :class:`datastore.SuffixIndex`)
and turns each :class:`datastore.DatastoreError` into "no draft from the
datastore this step":

- the server unreachable (at start or mid-run), the datastore dropped, rebuilt
  with another tokenizer, the schema changed, the role's grant revoked: one
  warning, then trie-only drafts; every ``retry_s`` seconds the backend is
  opened again, which picks up whatever build is ready by then;
- a rebuild with the same tokenizer is followed by the client itself, silently;
- a corrupt or undecodable tree: that step drafts without it (one warning per source).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Callable, Protocol, Sequence

from datastore.errors import CodecError, DatastoreError
from datastore.tree import Match

__all__ = ["Retriever", "DatastoreSource"]

log = logging.getLogger(__name__)


class Retriever(Protocol):
    """A retrieval backend: :class:`datastore.Datastore` or :class:`datastore.SuffixIndex`."""

    def lookup(self, context: Sequence[int]) -> Match | None:
        """The longest stored suffix of ``context`` and its continuation tree, or ``None``."""

    def identity(self) -> dict:
        """What the backend serves (name and build, or index size and parameters)."""

    def close(self) -> None:
        """Release the connection or files."""


class DatastoreSource:
    """Longest-match lookups that survive every datastore fault.

    Args:
        connect: opens the backend (called now, and again to recover after a fault).
        retry_s: seconds between attempts to reopen a failed backend, >= 0.

    Attributes:
        client: the open backend, or ``None`` while it is down.
        faults: count of each fault seen, by exception class name.

    Raises:
        ValueError: when ``retry_s < 0``.
    """

    def __init__(self, connect: Callable[[], Retriever], retry_s: float = 5.0) -> None:
        if retry_s < 0:
            raise ValueError(f"retry_s={retry_s}: must be >= 0")
        self._connect = connect
        self.retry_s = retry_s
        self.client: Retriever | None = None
        self.faults: Counter = Counter()
        self._down_at = float("-inf")
        self._degraded = False
        self._warned_corrupt = False
        self._reopen()

    def _fault(self, exc: DatastoreError) -> None:
        self.faults[type(exc).__name__] += 1
        if not self._degraded:
            log.warning("%s; drafting without the datastore until it is back (output is unaffected)", exc)
            self._degraded = True
        self.close()
        self._down_at = time.monotonic()

    def _reopen(self) -> bool:
        try:
            self.client = self._connect()
        except DatastoreError as exc:
            self._fault(exc)
            return False
        return True

    def lookup(self, context: Sequence[int]) -> Match | None:
        """The longest stored suffix of ``context`` and its tree; ``None`` for no match or any fault.

        The datastore counts as back only once a lookup succeeds, so a fault that lets the
        backend open but fails every lookup (a revoked grant) still warns once.
        """
        if self.client is None and (time.monotonic() - self._down_at < self.retry_s or not self._reopen()):
            return None
        try:
            match = self.client.lookup(context)
        except CodecError as exc:
            self.faults[type(exc).__name__] += 1
            if not self._warned_corrupt:
                log.warning("%s; drafting without that tree (output is unaffected)", exc)
                self._warned_corrupt = True
            return None
        except DatastoreError as exc:
            self._fault(exc)
            return None
        if self._degraded:
            log.info("the datastore is back (%s); drafting with it again", self.client.identity())
            self._degraded = False
        return match

    def identity(self) -> dict:
        """What is being served now (``{"down": True}`` while the backend is down)."""
        return {"down": True} if self.client is None else self.client.identity()

    def close(self) -> None:
        """Close the backend (a later lookup reopens it)."""
        client, self.client = self.client, None
        if client is not None:
            client.close()
