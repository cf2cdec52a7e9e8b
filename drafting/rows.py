"""Keying an engine's batch rows to drafting requests when it passes no request ids, and stepping its persistent batch:
the fallback of a vLLM our plugin's runner hook cannot reach (:mod:`serving.plugin`; with it, rows come by request id).

vLLM's ``custom_class`` proposer hook hands over, each step, a row per running request (``token_ids_cpu``: prompt and
output so far) but no request id, and rows are reassigned as requests finish, are preempted, or the batch is condensed.
:class:`RowTracker` keys a request by its tokens (:meth:`drafting.DraftingService.step_rows` with
:class:`drafting.EngineRows`: views of the engine's arrays, no copy):

- a row whose tokens extend exactly what its request has seen is the same request (its known prefix confirmed by one
  ``memcmp`` in the core); only the new tokens are appended;
- otherwise, if another request's tokens are a prefix of the row's, that request moved there; else a new one starts;
  requests not seen in a step are stopped.

While every row holds its request, the whole batch is one prepared :class:`drafting.Batch` stepped in one native call; a
step that starts, moves or stops requests takes a few more calls, never one per row.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import cast

import numpy as np

from crest_native import EngineRows

from .draft import ChainDrafts, CostCurve
from .service import DraftingService
from .step import Batch, StepResult

__all__ = ["RowTracker"]


class RowTracker:
    """Follows an engine's rows across steps and keeps a :class:`drafting.DraftingService` in step with them.

    Args:
        service: the drafter whose requests mirror the rows.

    Attributes:
        started / moved / stopped: requests started, followed to another row, and stopped so far.
    """

    def __init__(self, service: DraftingService) -> None:
        self.service = service
        self._vocab = service.vocab_size  # new ids are checked against it, as a prompt's are
        self._by_row: dict[int, int] = {}
        self._batch: Batch | None = None  # every row's request, while the rows hold them (None: rows changed since)
        # the engine's arrays and the view of them the last whole-batch step made (a view's attributes are new objects)
        self._view: tuple[tuple, EngineRows | None] = ((None, None), None)
        self._ids = itertools.count()
        self.started = self.moved = self.stopped = 0

    def propose(self, index: Sequence[int] | None, tokens: np.ndarray, lengths: np.ndarray, budgets: np.ndarray, *,
                curve: CostCurve | None = None) -> tuple[list[int], ChainDrafts]:
        """Bring the drafter up to date with this step's rows, then draft each row's chain.

        Args:
            index: the rows to draft for this step (each once), or ``None``: every row of the batch (``len(budgets)``
                rows from row 0).
            tokens: the engine's ``[rows, max_len]`` int32 (or int64) token array; row ``i`` holds its request's
                sequence so far in its first ``lengths[i]`` columns (read in place, not copied).
            lengths: ``[>= rows]`` of the same dtype.
            budgets: ``[len(index)]`` integers (int64 is passed as it is), each row's most draft tokens.
            curve: as :meth:`drafting.DraftingService.step_rows`.

        Returns:
            ``(request ids, chains)``, in the order of the rows (the ids: read only).

        Raises:
            As :meth:`drafting.DraftingService.step_rows` (rows, lengths or budgets an engine cannot mean).
        """
        batch = self._batch
        if index is None and batch is not None and len(batch.ids) == len(budgets):  # the steady step
            made_of, view = self._view  # the same view while the engine passes the same arrays (rewritten in place)
            if made_of[0] is not tokens or made_of[1] is not lengths:
                view = EngineRows(tokens, lengths, None, self._vocab)
                self._view = ((tokens, lengths), view)
            made = self.service.step_rows(batch, budgets, view, curve=curve)
            if made.drafted:  # every row held its request: nothing else changed
                return batch.ids, made.chains()  # type: ignore[return-value]  # ids the tracker made: ints
            rows = list(range(len(budgets)))
            guess: list[int | None] = list(batch.ids)  # type: ignore[arg-type]
            followed = made.followed
        else:
            made = None
            rows = list(range(len(budgets))) if index is None else list(index)
            guess = [self._by_row.get(i) for i in rows]
            if rows and None not in guess:  # perhaps steady: follow and draft in one step
                made = self._step(cast("list[int]", guess), budgets, tokens, lengths, None if index is None else rows,
                                  curve)
                followed = made.followed
            else:
                followed = self._follow_known(rows, guess, tokens, lengths)
        ids = self._settle(rows, tokens, lengths, guess, followed)
        whole = index is None
        if made is not None and made.drafted:
            if whole and self._batch is None:  # prepare the batch for the next steps
                self._batch = self.service.batch(ids, chain=True)
            return ids, made.chains()
        # the rows changed: follow (nothing new: each request holds its row now) and draft
        again = self._step(ids, budgets, tokens, lengths, None if whole else rows, curve)
        return ids, again.chains()

    def _step(self, ids: list[int], budgets: np.ndarray, tokens: np.ndarray, lengths: np.ndarray,
              rows: Sequence[int] | None, curve: CostCurve | None = None) -> StepResult:
        """Requests ``ids`` follow the engine's rows (pair ``i`` on row ``rows[i]``; ``None``: on row ``i``), then
        draft their chains."""
        view = EngineRows(tokens, lengths, None if rows is None else np.array(rows, np.int64), self._vocab)
        return self.service.step_rows(self.service.batch(ids, chain=True), budgets, view, curve=curve)

    def _follow_known(self, rows: list[int], guess: list[int | None], tokens: np.ndarray,
                      lengths: np.ndarray) -> list[bool]:
        """Each row with a last request: whether that request followed it (one step that drafts nothing)."""
        followed = [False] * len(rows)
        known = [k for k, rid in enumerate(guess) if rid is not None]
        if known:
            got = self._step([cast(int, guess[k]) for k in known], np.zeros(len(known), np.int64), tokens, lengths,
                             [rows[k] for k in known]).followed
            for k, ok in zip(known, got):
                followed[k] = ok
        return followed

    def _settle(self, index: Sequence[int], tokens: np.ndarray, lengths: np.ndarray, guess: list[int | None],
                followed: list[bool]) -> list[int]:
        """After the rows were followed by their last requests (``guess``, ``followed``): follow the moved requests,
        start the new ones, stop those gone; each row's request id."""
        previous = self._by_row
        if len(index) == len(previous) and all(followed):  # every row holds its request still: nothing else to do
            return guess  # type: ignore[return-value]
        self._batch = None  # the rows change: the next whole-batch step prepares the batch again
        claimed = {rid for rid, ok in zip(guess, followed) if ok}
        free = [rid for rid in previous.values() if rid not in claimed]
        open_at = [k for k, ok in enumerate(followed) if not ok]
        if free and open_at:  # requests that moved: every (free request, open row) pair in one step, rows in order
            pairs = [(k, rid) for k in open_at for rid in free]
            moved = self._step([rid for _, rid in pairs], np.zeros(len(pairs), np.int64), tokens, lengths,
                               [index[k] for k, _ in pairs]).followed
            for (k, rid), ok in zip(pairs, moved):
                if ok:
                    guess[k] = rid
                    followed[k] = True
                    claimed.add(rid)
                    self.moved += 1
        out: list[int] = []
        for k, i in enumerate(index):
            got = guess[k]
            if got is None or not followed[k]:  # a new request (one that came back after a preemption included)
                got = next(self._ids)
                self.service.start_request(got, tokens[i, :int(lengths[i])])
                self.started += 1
                claimed.add(got)
            out.append(got)
        for rid in previous.values():
            if rid not in claimed:
                self.service.stop_request(rid)
                self.stopped += 1
        self._by_row = dict(zip(index, out))
        return out

    def step(self, index: Sequence[int], tokens: np.ndarray, lengths: np.ndarray) -> list[int]:
        """Bring the drafter up to date with this step's rows without drafting (a step where no row decodes); returns
        each row's request id.

        Raises:
            As :meth:`propose`.
        """
        rows = list(index)
        guess = [self._by_row.get(i) for i in rows]
        return self._settle(rows, tokens, lengths, guess, self._follow_known(rows, guess, tokens, lengths))

    @property
    def active(self) -> int:
        """Rows followed now."""
        return len(self._by_row)

    @property
    def held(self) -> dict[int, int]:
        """Which request each row held at the last step (``row -> request id``; a copy)."""
        return dict(self._by_row)
