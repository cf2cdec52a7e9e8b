"""The CREST datastore as a drafter, and the fault-tolerant lookup it shares with the merged drafter.

CREST §3: the last ``max_n`` .. 1 tokens of the sequence select the stored tree
of the longest matching n-gram, in one round trip.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Callable, Sequence

from datastore import DatabaseUnavailable, Datastore
from datastore.tree import TokenTree

from ..draft import EMPTY_DRAFT, merge_drafts
from .base import Proposal

__all__ = ["DatastoreDrafter", "DatastoreSource"]

log = logging.getLogger(__name__)


class DatastoreSource:
    """Longest-match lookups that survive losing the server.

    When a lookup raises :class:`datastore.DatabaseUnavailable` the source logs one
    warning, answers ``None`` (no datastore draft) and tries to reconnect at most
    every ``retry_s`` seconds; decoding goes on with the other drafts, and the
    output is unchanged because verification decides every token.

    Args:
        connect: returns a fresh :class:`datastore.Datastore` (called again to reconnect).
        retry_s: seconds between reconnection attempts, >= 0.
    """

    def __init__(self, connect: Callable[[], Datastore], retry_s: float = 5.0) -> None:
        self._connect = connect
        self.retry_s = retry_s
        self.client: Datastore | None = connect()
        self.max_n = self.client.info.max_n
        self.failures = 0
        self._down_at: float | None = None
        self._warned = False

    def lookup(self, tail: Sequence[int]) -> TokenTree | None:
        """The tree of the longest stored suffix of ``tail``, or ``None`` (no match, or server down)."""
        if self.client is None:
            if time.monotonic() - (self._down_at or 0.0) < self.retry_s:
                return None
            try:
                self.client = self._connect()
            except DatabaseUnavailable:
                self._down_at = time.monotonic()
                return None
        try:
            match = self.client.lookup(tail)
        except DatabaseUnavailable as exc:
            self.failures += 1
            if not self._warned:
                log.warning("%s; drafting without the datastore until it is back (output is unaffected)", exc)
                self._warned = True
            self.close()
            self._down_at = time.monotonic()
            return None
        return None if match is None else match.tree

    def close(self) -> None:
        """Close the connection (a later lookup reconnects)."""
        if self.client is not None:
            try:
                self.client.close()
            finally:
                self.client = None


class DatastoreDrafter:
    """Drafts the stored continuation tree of the longest matching n-gram.

    Args:
        source: the datastore lookups.
        prior: additive smoothing of count ratios when ranking nodes (default 1.0, >= 0).
    """

    name = "datastore"

    def __init__(self, source: DatastoreSource, prior: float = 1.0) -> None:
        self.source = source
        self.prior = prior
        self._tail: deque[int] = deque(maxlen=source.max_n)

    def begin(self, prompt_ids: Sequence[int]) -> None:
        """Remember the prompt's last ``max_n`` tokens."""
        self._tail.clear()
        self._tail.extend(int(t) for t in prompt_ids[-self.source.max_n:])

    def extend(self, tokens: Sequence[int]) -> None:
        """Append committed tokens."""
        self._tail.extend(int(t) for t in tokens)

    def stored_tree(self) -> TokenTree | None:
        """The stored tree of the longest n-gram ending the sequence, or ``None``."""
        return self.source.lookup(list(self._tail))

    def propose(self, budget: int) -> Proposal:
        """The stored tree, pruned to ``budget`` nodes by estimated acceptance."""
        start = time.perf_counter()
        tree = self.stored_tree()
        mid = time.perf_counter()
        if tree is None or budget < 1:
            return Proposal(EMPTY_DRAFT, lookup_s=mid - start)
        draft = merge_drafts([(tree, 1.0)], budget, self.prior)
        return Proposal(draft, lookup_s=mid - start, merge_s=time.perf_counter() - mid)

    def end(self) -> None:
        """Nothing per request (the connection is kept for the next one)."""
