"""The drafter interface: one request-keyed, batch-first lifecycle for every drafter (after ArcticInference's
suffix decoding, ``start_request`` / ``speculate`` / ``stop_request``, and vLLM's batch-first proposers).

A drafter serves many requests at once. ``start_request`` with the prompt, then per verification step
``propose`` a draft for each request of a batch (each under its own budget) and ``add_tokens`` with the
tokens the target committed (bonus token included), then ``stop_request``. The HF decoding loop, the
replay simulator, the benchmarks and the vLLM proposer all drive drafters through these four calls.
``config`` names everything that changes the drafts (the budget cache keys on it).

:class:`RequestDrafter` implements the lifecycle once (the request table, its lock, the errors); a
drafter supplies how a request's state starts, grows and drafts.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from typing import Generic, Protocol, TypeVar

import numpy as np

from datastore.context import TokenIds, check_array, check_context

from ..draft import Draft, ScoreKind

__all__ = ["Drafter", "RequestDrafter", "NoDrafter"]


class Drafter(Protocol):
    """What the speculative decoder, the replay and the serving layer need from a drafter."""

    name: str

    def start_request(self, req_id: Hashable, prompt_ids: TokenIds) -> None:
        """Start drafting for ``req_id`` from its prompt token ids (``ValueError`` when already active)."""

    def propose(self, batch: Sequence[tuple[Hashable, int]], *, chain: bool = False,
                min_score: float | None = None) -> list[Draft]:
        """One draft per ``(req_id, budget)``: at most ``budget`` nodes (a tree) or tokens (``chain``), each
        node's acceptance probability at least ``min_score`` (probability-scored drafters only)."""

    def add_tokens(self, req_id: Hashable, tokens: TokenIds) -> None:
        """Append the tokens the target committed for ``req_id``."""

    def stop_request(self, req_id: Hashable) -> None:
        """Forget ``req_id`` (one not active is ignored)."""

    def config(self) -> dict:
        """JSON-ready description of everything that changes this drafter's drafts."""


S = TypeVar("S")
_ANY_ID = 1 << 32  # a drafter has no vocabulary of its own: ids are checked to be integers >= 0 (lookups check more)


class RequestDrafter(ABC, Generic[S]):
    """The lifecycle of :class:`Drafter`, implemented once over a per-request state ``S``. Thread-safe:
    the request table is guarded by ``self._lock``, which subclasses also hold while they touch a state.

    Subclasses implement :meth:`_start`, :meth:`_extend`, :meth:`_propose` and :meth:`config`.
    """

    name = "drafter"
    score_kind = ScoreKind.NONE
    """What this drafter's scores mean: only ``probability`` drafts take a ``min_score`` cut."""

    def __init__(self) -> None:
        self._requests: dict[Hashable, S] = {}
        self._lock = threading.RLock()

    @abstractmethod
    def _start(self, prompt_ids: TokenIds) -> S:
        """A new request's state."""

    @abstractmethod
    def _extend(self, state: S, tokens: Sequence[int]) -> None:
        """Append committed tokens to a state."""

    @abstractmethod
    def _propose(self, states: list[S], budgets: list[int], chain: bool, min_score: float | None) -> list[Draft]:
        """One draft per state (called with validated budgets >= 0 and cut, outside the lock)."""

    def _stop(self, state: S) -> None:
        """A request ended (its state is already out of the table)."""

    @abstractmethod
    def config(self) -> dict:
        """JSON-ready description of everything that changes the drafts."""

    def start_request(self, req_id: Hashable, prompt_ids: TokenIds) -> None:
        """Start drafting for ``req_id`` from ``prompt_ids`` (the prompt, and any output already generated).

        Args:
            req_id: any hashable key. prompt_ids: a list, tuple or 1-D integer array of token ids.

        Raises:
            ValueError: when ``req_id`` is already active.
            datastore.errors.InvalidContext: when ``prompt_ids`` is not a sequence of token ids (nothing coerced).
        """
        state = self._start(check_context(prompt_ids, _ANY_ID, len(prompt_ids), "prompt_ids")
                            if not isinstance(prompt_ids, np.ndarray) else check_array(prompt_ids, "prompt_ids"))
        with self._lock:
            if req_id in self._requests:
                raise ValueError(f"request {req_id!r} is already active; stop_request it first")
            self._requests[req_id] = state

    def add_tokens(self, req_id: Hashable, tokens: TokenIds) -> None:
        """Append the tokens the target committed for ``req_id``.

        Raises:
            KeyError: when ``req_id`` is not active (start_request it first).
            datastore.errors.InvalidContext: when ``tokens`` is not a sequence of token ids (nothing coerced).
        """
        checked = check_context(tokens, _ANY_ID, len(tokens), "tokens")
        with self._lock:
            self._extend(self._get(req_id), checked)

    def stop_request(self, req_id: Hashable) -> None:
        """Forget ``req_id`` (a request not active is ignored)."""
        with self._lock:
            state = self._requests.pop(req_id, None)
        if state is not None:
            self._stop(state)

    def propose(self, batch: Sequence[tuple[Hashable, int]], *, chain: bool = False,
                min_score: float | None = None) -> list[Draft]:
        """One draft per ``(req_id, budget)`` of the batch, each of at most ``budget`` nodes (0: none).

        Args:
            batch: the requests to draft for and each one's budget (draft nodes, >= 0).
            chain: return each request's best path (at most ``budget`` tokens) instead of a tree.
            min_score: this step's cut, a probability in [0, 1]: nodes whose acceptance probability is below
                it are not drafted (``None``: the drafter's own setting). Only drafters whose scores are
                probabilities (``score_kind``) take a positive cut.

        Returns:
            ``[len(batch)]`` drafts, best first.

        Raises:
            KeyError: when a request is not active.
            ValueError: when a budget is negative, ``min_score`` is outside [0, 1], or a positive
                ``min_score`` is given to a drafter whose scores are not probabilities.
        """
        budgets = [int(b) for _, b in batch]
        if any(b < 0 for b in budgets):
            raise ValueError(f"budgets must be >= 0, got {budgets}")
        if min_score is not None:
            if not 0.0 <= min_score <= 1.0:
                raise ValueError(f"min_score={min_score}: must be a probability in [0, 1]")
            if min_score > 0 and self.score_kind is not ScoreKind.PROBABILITY:
                raise ValueError(f"min_score={min_score} is a probability; the {self.name} drafter's scores are "
                                 f"{self.score_kind.value}")
        with self._lock:
            states = [self._get(rid) for rid, _ in batch]
        return self._propose(states, budgets, chain, min_score)

    @property
    def active_requests(self) -> frozenset:
        """The ids of the requests started and not stopped."""
        with self._lock:
            return frozenset(self._requests)

    def _get(self, req_id: Hashable) -> S:
        try:
            return self._requests[req_id]
        except KeyError:
            raise KeyError(f"request {req_id!r} is not active; start_request it first") from None


class NoDrafter(RequestDrafter[None]):
    """Drafts nothing: every step verifies zero nodes, i.e. plain decoding through the same loop."""

    name = "none"

    def _start(self, prompt_ids: TokenIds) -> None:
        return None

    def _extend(self, state: None, tokens: Sequence[int]) -> None:
        return None

    def _propose(self, states: list[None], budgets: list[int], chain: bool, min_score: float | None) -> list[Draft]:
        return [Draft.empty() for _ in states]

    def config(self) -> dict:
        """Nothing to configure."""
        return {"name": self.name}
