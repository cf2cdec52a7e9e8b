"""An engine's batch stepped by request id (:class:`EngineBatch`, :meth:`drafting.DraftingService.engine_batch`): what
vLLM's model runner holds each step (its rows' request ids in row order, its token array and counts, the requests that
finished; :mod:`serving.runner_hook` hands them over) is followed in ONE native call a step (``crest::Core::
engine_step``): the finished requests are stopped (their outputs join the output index and are handed to the live
layer's writer), the new ones started from their rows (the prompt and whatever was generated, read from the engine's
array), every other row's new tokens appended, then the batch is drafted. The engine's arrays are read in place.

A request that leaves the batch without finishing (vLLM's preemption) keeps its state and goes on from its row when it
is back, as vLLM keeps its own; a row that does not extend what its request holds is started again from the row. A row
holding an id outside the engine's vocabulary drafts nothing (logged once); the other rows go on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING

import numpy as np

import crest_native
from crest_native import START, EngineRows

from . import door
from .draft import CostCurve
from .step import StepResult

if TYPE_CHECKING:
    from .service import DraftingService

__all__ = ["EngineBatch", "Choice"]

log = logging.getLogger(__name__)

Choice = Callable[[str], "tuple[str | None, bool]"]
"""A new request's datastores, from its id: ``(datastore named or None, the shared one on)``
(:meth:`drafting.DraftingService.start_request`'s ``datastore`` and ``shared``)."""
_NO_STOPS = np.zeros(0, np.int64)
_NO_SETS = np.zeros(0, np.int32)  # a step where no request starts


class EngineBatch:
    """An engine's batch, stepped by request id (see the module docstring). Made by
    :meth:`drafting.DraftingService.engine_batch`, with the settings of every step; one engine's (its steps come from
    one thread at a time).

    Attributes:
        chain / min_score: the settings of its steps. vocab_size: the engine model's vocabulary (its rows' ids are
            below it). resynced: rows started again from the engine's row. bad_rows: rows that held an id outside the
            vocabulary.
    """

    def __init__(self, service: DraftingService, *, vocab_size: int, chain: bool, min_score: float) -> None:
        self.service = service
        self.vocab_size, self.chain, self.min_score = vocab_size, chain, min_score
        self.resynced = self.bad_rows = 0
        # the engine's arrays and the view of them the last step made (a view's own attributes are new objects)
        self._view: tuple[tuple, EngineRows | None] = ((None, None), None)
        self._last: tuple[list, np.ndarray | None, int] = ([], None, -1)  # the last step's ids, handles, generation

    def step(self, req_ids: Sequence[str], rows: np.ndarray, lengths: np.ndarray, budgets: np.ndarray, *,
             finished: Collection[str] = (), choose: Choice | None = None, curve: CostCurve | None = None,
             states: np.ndarray | None = None, state_rows: np.ndarray | None = None) -> StepResult:
        """Stop the ``finished`` requests, start the new ones, follow every row, and draft each row's request,
        ``budgets[i]`` nodes for ``req_ids[i]``, on row ``i``.

        Args:
            req_ids: ``[n]`` the request of each row of the batch, in row order (vLLM's ``input_batch.req_ids``).
            rows: the engine's ``[>= n, max_len]`` int32 (or int64) token array: row ``i`` holds its request's prompt
                and output so far in its first ``lengths[i]`` columns (read in place, not copied).
            lengths: ``[>= n]`` of the same dtype. budgets: ``[n]`` int64 (or ints), each in ``0..MAX_BUDGET``.
            finished: the requests that finished since the last step (vLLM's ``finished_req_ids``; one this batch
                never held is ignored).
            choose: a new request's datastores (``None``: the shared one).
            curve / states / state_rows: as :meth:`drafting.DraftingService.step_rows`'s.

        Returns:
            A :class:`drafting.StepResult` whose drafts are the rows' (a row that drafted nothing: an empty one).

        Raises:
            TypeError / ValueError: for rows, lengths or budgets an engine cannot mean, naming them (nothing changed).
            datastore.errors.ClosedError: after the drafter's close.
        """
        start = time.perf_counter()
        svc = self.service
        n = len(req_ids)
        made_of, view = self._view
        if made_of[0] is not rows or made_of[1] is not lengths:  # vLLM rewrites the same arrays in place
            view = EngineRows(rows, lengths, None, self.vocab_size)
            self._view = ((rows, lengths), view)
        if not (type(budgets) is np.ndarray and budgets.dtype == np.int64 and budgets.ndim == 1
                and budgets.flags.c_contiguous):
            budgets = door.budgets(budgets, n)
        cut = door.curve(curve)
        has_state = None
        if states is not None:
            states, has_state = door.states(states, state_rows, n, svc._core.model_width)
        elif state_rows is not None:
            raise TypeError("state_rows was given without states; pass the rows' states too, or neither")
        stores = svc.retrieval.stores()
        with svc._lock:
            svc._check_open()
            requests, catalog, core = svc._requests, svc.catalog, svc._core
            last_ids, last_handles, generation = self._last
            if generation == svc._generation and last_ids == req_ids:  # the steady step: the same requests, in order
                handles, new = last_handles, []
            else:
                held = [requests.get(r, START) for r in req_ids]
                handles, new = np.array(held, np.int64), [i for i, h in enumerate(held) if h == START]
            sets = _NO_SETS
            if new:
                sets = np.zeros(n, np.int32)
                for i in new:
                    sets[i] = catalog.resolve(*choose(req_ids[i])) if choose is not None else 0
                svc._forget_retired()
            stops = [requests.pop(r) for r in finished if r in requests] if finished else []
            stopped_sets = [core.set_of(h) for h in stops]
            made = core.engine_step(handles, sets, np.array(stops, np.int64) if stops else _NO_STOPS, view, budgets,
                                    self.chain, self.min_score, cut, svc.key_vocab, states, has_state, stores)
            unstarted = False  # a new row that drafted nothing for a bad id: looked up again next step
            if new:
                handles = made.handles
                for i in new:
                    if handles[i] >= 0:
                        requests[req_ids[i]] = int(handles[i])
                        catalog.acquire(int(sets[i]))
                    else:
                        unstarted = True
            for set_id in stopped_sets:
                catalog.release(set_id)
            if new or stops:
                svc._generation += 1
            # the next step's requests are these, unless one starts or stops meanwhile
            self._last = (list(req_ids), handles, -1 if unstarted else svc._generation)
            if made.drafted:
                svc._count(n, made, start)
        if stops:
            for output, set_id in zip(made.outputs, stopped_sets):
                svc._hand_on(output, set_id)
        self.resynced += made.resynced
        if made.bad >= 0:
            if not self.bad_rows:
                log.warning("row %d of the engine's batch (request %r) holds token id %d, outside the vocabulary (%d); "
                            "it drafts nothing", made.bad, req_ids[made.bad], made.bad_id, self.vocab_size)
            self.bad_rows += 1
        if made.drafted:
            svc.retrieval.drafted(made, time.perf_counter() - start, stores)
            return StepResult(made.followed, made)
        b = crest_native.Batch()  # the round trip: the rows have followed, the calls that follow draft only
        b.handles, b.chain, b.min_score, b.curve = made.handles, self.chain, self.min_score, cut
        b.budgets = np.where(np.asarray(made.followed, bool), budgets, 0)
        b.states, b.has_state = states, has_state
        if stores is not None:
            svc.retrieval.drafted(made, time.perf_counter() - start, stores)  # a replica was damaged: counted, dropped
            made = svc._call(b, None, None)
        return StepResult(made.followed, svc._round_trip(b, made, start))
