"""Keying an engine's batch rows to drafting requests when the engine does not pass request ids.

vLLM's ``custom_class`` proposer hook hands over, each step, a row per running request (``token_ids_cpu[row,
:num_tokens]``: prompt and output so far) but no request id, and rows are reassigned as requests finish, are
preempted, or the batch is condensed. A request's drafting state depends only on its token sequence, so
:class:`RowTracker` keys a request by the tokens themselves, which the drafting service holds
(:meth:`drafting.DraftingService.follow`: one compare of the request's tokens with the row's prefix, in the native
core):

- a row whose tokens extend exactly what its request has seen is the same request: the new tokens are appended;
- otherwise the row holds another request: if some other request's tokens are a prefix of the row's (a request
  moved to another row; tried on mismatches only), that request follows it; else a new request starts from the
  row's tokens;
- requests not seen in a step are stopped (they finished or were preempted; a preempted request that resumes is
  rebuilt from its tokens).

The tracker keeps only which request each row held: the service holds the one request table.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from drafting import DraftingService


class RowTracker:
    """Follows an engine's rows across steps and keeps a :class:`drafting.DraftingService` in step.

    Args:
        service: the drafting service whose requests mirror the rows.

    Attributes:
        started / moved / stopped: requests started, followed to another row, and stopped so far.
    """

    def __init__(self, service: DraftingService) -> None:
        self.service = service
        self._by_row: dict[int, int] = {}
        self._ids = itertools.count()
        self.started = self.moved = self.stopped = 0

    def step(self, rows: Sequence[tuple[int, np.ndarray]]) -> list[int]:
        """Bring the service up to date with this step's rows; returns each row's request id.

        Args:
            rows: ``(row index, tokens)`` for every row to draft for this step; ``tokens`` is the row's whole
                sequence so far (``[num_tokens]`` int32 or int64 array).

        Returns:
            The service request id of each row, in order.
        """
        previous = self._by_row
        claimed: set[int] = set()
        current: dict[int, int] = {}
        out: list[int] = []
        for index, tokens in rows:
            rid = previous.get(index)
            if rid is None or rid in claimed or not self.service.follow(rid, tokens):  # another request: moved, or new
                rid = next((r for r in previous.values() if r not in claimed and self.service.follow(r, tokens)), None)
                if rid is not None:
                    self.moved += 1
            if rid is None:
                rid = next(self._ids)
                self.service.start_request(rid, tokens)
                self.started += 1
            claimed.add(rid)
            current[index] = rid
            out.append(rid)
        for rid in previous.values():
            if rid not in claimed:
                self.service.stop_request(rid)
                self.stopped += 1
        self._by_row = current
        return out

    @property
    def active(self) -> int:
        """Rows followed now."""
        return len(self._by_row)
