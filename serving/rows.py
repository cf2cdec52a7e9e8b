"""Keying an engine's batch rows to drafting requests when the engine does not pass request ids.

vLLM's ``custom_class`` proposer hook hands over, each step, a row per running
request (``token_ids_cpu[row, :num_tokens]``: prompt and output so far) but no
request id, and rows are reassigned as requests finish, are preempted, or the
batch is condensed. A row's drafting state (its prompt trie) depends only on the
row's token sequence, so :class:`RowTracker` keys a request by the tokens
themselves:

- a row whose tokens *extend* exactly the tokens its state has seen is the same
  request: the new tokens are appended (one ``memcmp`` of the prefix, ~1 µs per
  1,000 tokens);
- otherwise the row holds another request: if some other state's tokens are a
  prefix of the row's (a request moved to another row; a scan of the states, on
  mismatches only), that state follows it;
  else a new request starts from the row's tokens;
- states not seen in a step are stopped (their requests finished or were
  preempted; a preempted request that resumes is rebuilt from its tokens).

Two requests whose whole token sequences so far are identical share drafting
state, which is exact: their tries would be identical.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from decoder.service import DraftingService

__all__ = ["RowTracker"]

@dataclass
class _State:
    req_id: int
    tokens: np.ndarray  # capacity buffer; the first `n` are the request's tokens
    n: int

    def extends(self, row: np.ndarray) -> bool:
        return self.n <= len(row) and np.array_equal(self.tokens[:self.n], row[:self.n])

    def append(self, row: np.ndarray) -> np.ndarray:
        new = row[self.n:]
        if len(row) > len(self.tokens):
            grown = np.empty(max(2 * len(self.tokens), len(row)), dtype=np.int64)
            grown[:self.n] = self.tokens[:self.n]
            self.tokens = grown
        self.tokens[self.n:len(row)] = new
        self.n = len(row)
        return new


class RowTracker:
    """Follows an engine's rows across steps and keeps a :class:`decoder.service.DraftingService` in step.

    Args:
        service: the drafting service whose requests mirror the rows.

    Attributes:
        started / moved / stopped: requests started, followed to another row, and stopped so far.
    """

    def __init__(self, service: DraftingService) -> None:
        self.service = service
        self._by_row: dict[int, _State] = {}
        self._ids = itertools.count()
        self.started = self.moved = self.stopped = 0

    def _start(self, row: np.ndarray) -> _State:
        buf = np.empty(max(2 * len(row), 64), dtype=np.int64)
        buf[:len(row)] = row
        st = _State(next(self._ids), buf, len(row))
        self.service.start_request(st.req_id, row.tolist())
        self.started += 1
        return st

    def step(self, rows: Sequence[tuple[int, np.ndarray]]) -> list[int]:
        """Bring the service up to date with this step's rows; returns each row's request id.

        Args:
            rows: ``(row index, tokens)`` for every row to draft for this step; ``tokens`` is the
                row's whole sequence so far (``[num_tokens]`` int array).

        Returns:
            The service request id of each row, in order.
        """
        previous = self._by_row
        claimed: set[int] = set()  # ids of states matched this step
        current: dict[int, _State] = {}
        out: list[int] = []
        for index, tokens in rows:
            row = np.asarray(tokens, dtype=np.int64)
            st = previous.get(index)
            if st is None or id(st) in claimed or not st.extends(row):  # another request: moved here, or new
                st = next((c for c in previous.values() if id(c) not in claimed and c.extends(row)), None)
                if st is not None:
                    self.moved += 1
            if st is None:
                st = self._start(row)
            elif st.n < len(row):
                self.service.add_tokens(st.req_id, st.append(row).tolist())
            claimed.add(id(st))
            current[index] = st
            out.append(st.req_id)
        for st in previous.values():
            if id(st) not in claimed:
                self.service.stop_request(st.req_id)
                self.stopped += 1
        self._by_row = current
        return out

    @property
    def active(self) -> int:
        """Rows followed now."""
        return len(self._by_row)
