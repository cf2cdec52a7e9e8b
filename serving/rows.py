"""Keying an engine's batch rows to drafting requests when the engine does not pass request ids.

vLLM's ``custom_class`` proposer hook hands over, each step, a row per running request (``token_ids_cpu[row,
:num_tokens]``: prompt and output so far) but no request id, and rows are reassigned as requests finish, are
preempted, or the batch is condensed. A request's drafting state depends only on its token sequence, so
:class:`RowTracker` keys a request by the tokens themselves, which the drafting service holds
(:meth:`drafting.DraftingService.follow_rows`: one native call for the batch, views of the engine's arrays, no copy):

- a row whose tokens extend exactly what its request has seen is the same request: only the new tokens are appended
  (each row's known prefix is confirmed by one ``memcmp`` in the core, the only exact test without request ids);
- otherwise the row holds another request: if some other request's tokens are a prefix of the row's (a request
  moved to another row; tried on mismatches only, every such pair in one more native call), that request follows it;
  else a new request starts from the row's tokens;
- requests not seen in a step are stopped (they finished or were preempted; a preempted request that resumes is
  rebuilt from its tokens).

:meth:`RowTracker.propose` does a whole step: in a steady step (every row still holds its request) following the rows
and drafting them is one native call (:meth:`drafting.DraftingService.follow_and_propose`); a step that starts, moves
or stops requests takes a few more calls (never one per row). A whole batch (vLLM's steps) is then prepared once
(:class:`drafting.service.SteadyBatch`), and its steady steps go straight to that call, nothing re-checked that held
since the last: on caches a forward pass has just flushed, each Python layer a step passes costs microseconds (the
hook outside the native call took 0.090 ms a step through the checked path, 0.055 ms through the prepared batch;
``docs/serving.md``).

The tracker keeps only which request each row held: the service holds the one request table.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from drafting import DraftingService, SteadyBatch
from drafting.draft import ChainDrafts, CostCurve

__all__ = ["RowTracker"]


class RowTracker:
    """Follows an engine's rows across steps and keeps a :class:`drafting.DraftingService` in step.

    Args:
        service: the drafting service whose requests mirror the rows.

    Attributes:
        started / moved / stopped: requests started, followed to another row, and stopped so far.
    """

    def __init__(self, service: DraftingService) -> None:
        self.service = service
        self._vocab = service.vocab_size  # new ids are checked against it, as a prompt's are
        self._by_row: dict[int, int] = {}
        # the batch as the last whole-batch step left it, prepared for the next (None: none yet, or rows changed since),
        # and the min_score it was prepared with
        self._batch: SteadyBatch | None = None
        self._batch_score: float | None = None
        self._ids = itertools.count()
        self.started = self.moved = self.stopped = 0

    def step(self, index: Sequence[int], tokens: np.ndarray, lengths: np.ndarray) -> list[int]:
        """Bring the service up to date with this step's rows; returns each row's request id.

        Args:
            index: the rows to draft for this step (each once).
            tokens: the engine's ``[rows, max_len]`` int32 (or int64) token array; row ``i`` holds its request's
                sequence so far in its first ``lengths[i]`` columns.
            lengths: ``[>= rows]`` of the same dtype.

        Returns:
            The service request id of each row of ``index``, in order.

        Raises:
            datastore.errors.InvalidContext: for arrays of another shape or dtype.
        """
        guess: list[int | None] = [self._by_row.get(i) for i in index]
        followed = self.service.follow_rows(guess, tokens, lengths, index, vocab_size=self._vocab)
        return self._settle(index, tokens, lengths, guess, followed)

    def propose(self, index: Sequence[int] | None, tokens: np.ndarray, lengths: np.ndarray, budgets: np.ndarray, *,
                min_score: float | None = None, curve: CostCurve | None = None) -> tuple[list[int], ChainDrafts]:
        """:meth:`step`, then each row's chain (:meth:`drafting.DraftingService.propose`, ``chain=True``): one native
        call when every row holds the request it held at the last step.

        Args:
            index: as :meth:`step`, or ``None``: every row of the batch (``len(budgets)`` rows from row 0).
            tokens / lengths: as :meth:`step`. budgets: ``[rows]`` integers (int64 is passed as it is), each row's
                most draft tokens.
            min_score: as :meth:`drafting.DraftingService.propose`.
            curve: the engine's step-cost curve the chains are cut to (``None``: not cut; see
                :meth:`drafting.DraftingService.follow_and_propose`).

        Returns:
            ``(request ids, chains)``, in the order of the rows.

        Raises:
            As :meth:`step` and :meth:`drafting.DraftingService.propose`.
        """
        rows = range(len(budgets)) if index is None else index
        batch = self._batch
        if index is None and batch is not None and len(batch.ids) == len(rows) and min_score == self._batch_score:
            made = batch.draft(tokens, lengths, budgets, curve)  # the batch as it was: nothing re-checked
            if made is not None:
                ids = self._settle(rows, tokens, lengths, list(batch.ids), made[0])  # type: ignore[arg-type]
                if made[1] is not None:
                    return ids, made[1]
                return ids, self._chains(ids, budgets, min_score, curve)
        by_row = self._by_row
        guess: list[int | None] = [by_row.get(i) for i in rows]
        if rows and None not in guess:  # perhaps a steady step: follow and draft in one call
            followed, chains = self.service.follow_and_propose(guess, tokens, lengths, index, budgets,
                                                               min_score=min_score, vocab_size=self._vocab,
                                                               curve=curve)
            ids = self._settle(rows, tokens, lengths, guess, followed)
            if chains is not None:
                if index is None:  # prepare the batch for the next steps
                    self._batch = self.service.steady_batch(ids, min_score=min_score, vocab_size=self._vocab)
                    self._batch_score = min_score
                return ids, chains
        else:
            ids = self.step(rows, tokens, lengths)
        return ids, self._chains(ids, budgets, min_score, curve)

    def _chains(self, ids: list[int], budgets: np.ndarray, min_score: float | None,
                curve: CostCurve | None) -> ChainDrafts:
        """Each request's chain, by :meth:`drafting.DraftingService.propose` (after a step that moved, started or
        stopped requests)."""
        return self.service.propose(list(zip(ids, np.asarray(budgets).tolist())), chain=True, min_score=min_score,
                                    curve=curve).chains()

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
        if free and open_at:  # requests that moved: every (free request, open row) pair in one call, rows in order
            pairs = [(k, rid) for k in open_at for rid in free]
            moved = self.service.follow_rows([rid for _, rid in pairs], tokens, lengths, [index[k] for k, _ in pairs],
                                             vocab_size=self._vocab)
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

    @property
    def active(self) -> int:
        """Rows followed now."""
        return len(self._by_row)

    @property
    def held(self) -> dict[int, int]:
        """Which request each row held at the last step (``row -> request id``; a copy)."""
        return dict(self._by_row)
