"""The fleet's finished outputs into this process's output index: SuffixDecoding's global tree of earlier responses
(https://arxiv.org/abs/2411.04975, §3), fed by every process of the fleet and kept across restarts.

Every process appends its outputs to the live layer (:class:`live.LiveWriter`); an :class:`OutputFeed` reads them back
(:class:`live.LiveOutputs`) into the output index of a :class:`drafting.DraftingService`, so a repeat of a request
drafts its earlier answer whole, whichever process answered it:

- at start, the newest outputs up to ``warm_tokens``;
- then, every ``poll_s`` seconds, those appended since by the other processes. Ids are settled ``settle_s`` seconds
  after they are first seen, so an output whose ``COPY`` commits after a higher id was read is still found.

It runs on one daemon thread; each read adds at most ``chunk_tokens`` tokens under the service's lock at a time. A
database fault skips that read (one warning; the next read retries): drafts never depend on it, and output never changes
(the target verifies every draft).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

import psycopg

from datastore.context import TokenIds
from datastore.errors import ClosedError, DatastoreError, InvalidContext
from toolkit.forks import at_fork

from .store import LiveOutputs, Output

__all__ = ["OutputFeed", "OutputLearner"]

log = logging.getLogger(__name__)


class OutputLearner(Protocol):
    """Where the feed puts the outputs it reads: a drafter's index of finished outputs
    (:meth:`drafting.DraftingService.learn_outputs`)."""

    def learn_outputs(self, outputs: Sequence[TokenIds]) -> int:
        """Add outputs finished elsewhere; returns the tokens added (raises ``ClosedError`` once closed)."""


class OutputFeed:
    """Feeds the live layer's outputs of the other processes into ``service``'s output index (module docstring).

    Args:
        service: the drafting service whose output index learns (:meth:`DraftingService.learn_outputs`).
        outputs: the reader of the live layer's outputs (its own connection; ``SELECT`` on ``live_outputs``).
        skip_origin: the origin this process appends its own outputs under, asked at each read (``lambda:
            writer.origin``: a :class:`~live.LiveWriter`'s, which a forked child changes to its
            own): they are in its index already (``None``: none skipped).
        poll_s: seconds between reads, > 0 (default 2: the live writer's batch interval).
        warm_tokens: at start, the newest outputs up to this many tokens, >= 0 (default 262,144: about a third of the
            default 64 MiB index, at its 60-80 bytes a token; 0: none).
        settle_s: seconds after which an id is taken as settled, >= 0 (default 60).
        chunk_tokens: most tokens added under the service's lock at once, >= 1.

    Attributes:
        learned: outputs added. tokens: their tokens. reads: reads done. failed: reads lost to a fault. refused:
            outputs left out, holding an id outside the service's vocabulary.

    Raises:
        ValueError: when an argument is out of range.
    """

    def __init__(self, service: OutputLearner, outputs: LiveOutputs, *,
                 skip_origin: Callable[[], str] | None = None, poll_s: float = 2.0, warm_tokens: int = 1 << 18,
                 settle_s: float = 60.0, chunk_tokens: int = 1 << 14) -> None:
        if not poll_s > 0 or warm_tokens < 0 or not settle_s >= 0 or chunk_tokens < 1:
            raise ValueError(f"poll_s={poll_s} must be > 0, warm_tokens={warm_tokens} >= 0, settle_s={settle_s} >= 0 "
                             f"and chunk_tokens={chunk_tokens} >= 1")
        self.service, self.outputs, self.skip_origin = service, outputs, skip_origin
        self.poll_s, self.warm_tokens, self.settle_s, self.chunk_tokens = poll_s, warm_tokens, settle_s, chunk_tokens
        self.learned = self.tokens = self.reads = self.failed = self.refused = 0
        self._floor: int | None = None  # every id at or below it is settled (None: the warm read is to come)
        self._seen: set[int] = set()    # ids above the floor already learned
        self._marks: deque[tuple[float, int]] = deque()  # (when, the largest id seen then): the floor's history
        self._warned = self._warned_vocab = False
        self._stop: threading.Event
        self._caught_up: threading.Event
        self._thread: threading.Thread
        self._start()
        at_fork(self, after_in_child=OutputFeed._start)

    def _start(self) -> None:
        """A fresh thread (at construction, and in a forked child, which goes on from the parent's floor)."""
        self._stop = threading.Event()
        self._caught_up = threading.Event()
        self._thread = threading.Thread(target=self._run, name="crest-output-feed", daemon=True)
        self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until a read after this call has been learned (or has failed); whether one was."""
        self._caught_up.clear()
        return self._caught_up.wait(timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread (a read in flight finishes) and close the reader."""
        self._stop.set()
        self._thread.join(timeout)
        self.outputs.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._read()
            except ClosedError:  # the service was closed: nothing left to feed
                return
            except (psycopg.Error, DatastoreError) as exc:
                self.failed += 1
                if not self._warned:
                    log.warning("output feed: the live layer's outputs could not be read (%s); drafting goes on "
                                "without them and the next read retries", exc)
                    self._warned = True
            self._caught_up.set()
            self._stop.wait(self.poll_s)
        self.outputs.close()

    def _origin(self) -> str:
        return "" if self.skip_origin is None else self.skip_origin()

    def _read(self) -> None:
        """One read: the warm start, or the ids after the floor that this process has not learned yet."""
        self.reads += 1
        if self._floor is None:  # the newest within the bound; every older one is passed over
            last = self.outputs.last_id()
            got = self.outputs.newest(self.warm_tokens, skip_origin=self._origin()) if self.warm_tokens else []
            self._learn(got)
            self._floor = max(last, got[-1].id if got else 0)
            return
        ids = self.outputs.ids_after(self._floor, skip_origin=self._origin())
        self._learn(self.outputs.fetch(i for i in ids if i not in self._seen))
        now = time.monotonic()
        if ids:
            self._marks.append((now, ids[-1]))
        while self._marks and self._marks[0][0] <= now - self.settle_s:  # settled: drop what lies at or below
            self._floor = max(self._floor, self._marks.popleft()[1])
        self._seen = {i for i in self._seen if i > self._floor}

    def _learn(self, got: list[Output]) -> None:
        """Add ``got`` to the index in chunks of about ``chunk_tokens`` tokens (each under the service's lock)."""
        chunk: list[Output] = []
        size = 0
        for i, out in enumerate(got):
            chunk.append(out)
            size += len(out.tokens)
            if size >= self.chunk_tokens or i == len(got) - 1:
                self._add(chunk)
                self._seen.update(o.id for o in chunk)
                chunk, size = [], 0

    def _add(self, chunk: list[Output]) -> None:
        """One chunk into the index; when one of its outputs holds an id outside this service's vocabulary (another
        model's, under the same datastore name), the others one by one, and that one refused (counted, one warning)."""
        try:
            self.tokens += self.service.learn_outputs([o.tokens for o in chunk])
            self.learned += len(chunk)
            return
        except InvalidContext:
            pass  # which output: each alone below
        for o in chunk:
            try:
                self.tokens += self.service.learn_outputs([o.tokens])
                self.learned += 1
            except InvalidContext as exc:
                self.refused += 1
                if not self._warned_vocab:
                    log.warning("output feed: live output %d is not of this vocabulary (%s); it is left out", o.id, exc)
                    self._warned_vocab = True
