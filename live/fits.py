"""The fleet's online calibration (:class:`FitFeed`): every process's verdicts folded into one learner per datastore,
kept in the database across restarts (``calibration_fits``, migration 0005).

Each process refits its node scores online on the engine's verdicts (``csrc/online.hpp``; ``online_strength``). Every
``poll_s`` seconds a :class:`FitFeed` takes, for each fit its drafter may share (:meth:`DraftingService.fits
<drafting.DraftingService.fits>`: one per datastore it drafts for, and calibration it started from), the row's lock,
folds the outcomes the process learnt since its last fold into the fleet's learner stored there, stores the result and
has the drafter go on from it (:meth:`DraftingService.fold_fit <drafting.DraftingService.fold_fit>`). So the fleet's
fit is one learner over every process's outcomes in the order they were folded; a process that starts (or restarts)
drafts from it after its first fold, and a new datastore with no calibration at all starts from the prior it is given
(:meth:`drafting.Calibration.flat`) and learns.

Bounded: one row per datastore, calibration and kind; one ``UPDATE`` per fit and poll per process; at most
``online_share`` outcomes a fold (those beyond are learnt by the process alone). A role that may only read
(``python -m datastore grant-reader``) adopts the fleet's fit once per datastore and then learns alone; one that may
write is given the rights by ``python -m datastore grant-appender``. A database fault skips that round (one warning;
the next retries), and a stored state that is not one of the fit (another calibration's with the same digest, or
damaged) is replaced by this process's: drafts never depend on the database, and output never changes (the target
verifies every draft).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Protocol

import psycopg

from datastore.connection import APPLICATION_NAME, connect, resolve_database_url
from datastore.errors import ClosedError, DatastoreError
from toolkit.forks import at_fork

if TYPE_CHECKING:
    from drafting import FitKey

__all__ = ["SHARE", "FitFeed", "FitLearner"]

SHARE = 50_000
"""The verdicts a drafter whose fits a :class:`FitFeed` folds keeps per fit between two folds (its
``online_share``): some 10,000 a second at the default ``poll_s``, more than a CPU engine's steps give."""

FITS_APPLICATION = f"{APPLICATION_NAME} fit feed"
"""The ``application_name`` of the feed's connection (``pg_stat_activity``)."""

log = logging.getLogger(__name__)


class FitLearner(Protocol):
    """A drafter whose online fits the feed folds (:class:`drafting.DraftingService`)."""

    def fits(self) -> list[FitKey]:
        """The fits it may share (raises ``ClosedError`` once closed)."""

    def fold_fit(self, key: FitKey, fleet: bytes | None) -> bytes:
        """Fold ``key``'s outcomes into ``fleet`` and go on from the result, returned (``ValueError``: ``fleet`` is no
        state of the fit; ``KeyError``: the set no longer drafts for ``key.name``)."""

    def fit(self, set_id: int = 0, with_model: bool = False) -> tuple:
        """A set's calibration now: ``(coef, intercept, outcomes)``."""


class FitFeed:
    """Folds ``service``'s online fits into the fleet's, every ``poll_s`` seconds, on one daemon thread (see the module
    docstring).

    Args:
        service: the drafter (:class:`drafting.DraftingService`, made with ``online_share`` > 0 to share its outcomes).
        database_url: a role with ``SELECT``, ``INSERT`` and ``UPDATE`` on ``calibration_fits`` (``python -m datastore
            grant-appender``), or ``SELECT`` only: it adopts the fleet's fits once (``None``: ``DATABASE_URL`` or the
            embedded server).
        poll_s: seconds between rounds, > 0 (default 5).

    Attributes:
        folds: fits folded (and stored). adopted: fits a read-only role adopted. rounds: rounds done. failed: rounds
            lost to a fault. replaced: stored states that were no state of their fit, replaced. read_only: whether the
            role may not write.

    Raises:
        ValueError: for ``poll_s <= 0``.
    """

    def __init__(self, service: FitLearner, database_url: str | None = None, *, poll_s: float = 5.0) -> None:
        if not poll_s > 0:
            raise ValueError(f"poll_s={poll_s} must be > 0 (seconds between folds)")
        self.service, self.url, self.poll_s = service, resolve_database_url(database_url), poll_s
        self.folds = self.adopted = self.rounds = self.failed = self.replaced = 0
        self.read_only = False
        self._adopted: set[FitKey] = set()
        self._warned = False
        self._stop: threading.Event
        self._wake: threading.Event  # set by flush and close: a round now, without waiting out poll_s
        self._rounds: threading.Condition  # guards _begun and _ended: the rounds begun and ended
        self._begun = self._ended = 0
        self._thread: threading.Thread
        self._start()
        at_fork(self, after_in_child=FitFeed._start)

    def _start(self) -> None:
        """A fresh thread (at construction, and in a forked child, whose drafter goes on from the parent's fits)."""
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._rounds = threading.Condition()
        self._begun = self._ended = 0
        self._thread = threading.Thread(target=self._run, name="crest-fit-feed", daemon=True)
        self._thread.start()

    def flush(self, timeout: float | None = None) -> bool:
        """Fold now (without waiting out ``poll_s``) and wait until that round has ended (folded, or failed); whether
        it did."""
        with self._rounds:
            after = self._begun
            self._wake.set()
            return self._rounds.wait_for(lambda: self._ended > after, timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread after a last round (the outcomes learnt since the last fold are folded)."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        conn: psycopg.Connection | None = None
        while True:
            stopping = self._stop.is_set()
            with self._rounds:
                self._wake.clear()
                self._begun += 1
            try:
                if conn is None or conn.closed:
                    conn = connect(self.url, autocommit=True, application_name=FITS_APPLICATION)
                for key in self.service.fits():
                    self._fold(conn, key)
                self.rounds += 1
            except ClosedError:  # the drafter was closed: nothing left to fold
                stopping = True
            except (psycopg.Error, DatastoreError) as exc:
                self.failed += 1
                if not self._warned:
                    log.warning("fit feed: the fleet's calibration fits could not be folded (%s); drafting goes on "
                                "with this process's own and the next round retries", exc)
                    self._warned = True
                if conn is not None:
                    conn.close()
                conn = None
            with self._rounds:
                self._ended = self._begun
                self._rounds.notify_all()
            if stopping:
                if conn is not None:
                    conn.close()
                return
            self._wake.wait(self.poll_s)  # a flush or close wakes it: the next round now (close's is the last)

    def _fold(self, conn: psycopg.Connection, key: FitKey) -> None:
        """One fit: fold it into the stored learner under the row's lock (a read-only role: adopt it once)."""
        where = (key.name, key.prior, key.with_model)
        if not self.read_only:
            try:
                conn.execute("INSERT INTO calibration_fits (name, prior, with_model) VALUES (%s, %s, %s) "
                             "ON CONFLICT DO NOTHING", where)
            except psycopg.errors.InsufficientPrivilege:
                self.read_only = True
                log.warning("fit feed: this role may not write calibration_fits (python -m datastore grant-appender "
                            "gives it the rights): it adopts the fleet's fits once and then learns alone")
        if self.read_only:
            if key not in self._adopted:
                row = conn.execute("SELECT state FROM calibration_fits WHERE name = %s AND prior = %s AND "
                                   "with_model = %s", where).fetchone()
                if row is not None and row[0] is not None and self._folded(key, bytes(row[0])) is not None:
                    self._adopted.add(key)
                    self.adopted += 1
            return
        with conn.transaction():
            row = conn.execute("SELECT state FROM calibration_fits WHERE name = %s AND prior = %s AND "
                               "with_model = %s FOR UPDATE", where).fetchone()
            if row is None:  # made just above; gone only if an operator deleted it since: the next round makes it
                return
            state = self._folded(key, None if row[0] is None else bytes(row[0]))
            if state is None:
                return
            outcomes = int(self.service.fit(key.set_id, key.with_model)[2])
            conn.execute("UPDATE calibration_fits SET state = %s, outcomes = %s, folds = folds + 1, updated_at = now() "
                         "WHERE name = %s AND prior = %s AND with_model = %s", (state, outcomes, *where))
        self.folds += 1

    def _folded(self, key: FitKey, stored: bytes | None) -> bytes | None:
        """The fold of ``key`` into ``stored`` (a state that is no state of the fit: into none, replacing it); ``None``
        when the set no longer drafts for its datastore."""
        try:
            return self.service.fold_fit(key, stored)
        except KeyError:
            return None
        except ValueError as exc:
            self.replaced += 1
            log.warning("fit feed: the fleet's fit of %r (calibration %s) is replaced by this process's: %s", key.name,
                        key.prior, exc)
            return self.service.fold_fit(key, None)

