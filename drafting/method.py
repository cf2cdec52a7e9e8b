"""A drafting method: how a :class:`drafting.DraftingService` drafts (a strategy it is given, never a mode it branches
on). The service holds the one request table (each request's tokens in the native core, and the method's own state
for it beside the handle); a method says what it keeps per request and drafts a checked batch.

The merged drafter (:class:`drafting.merged.MergedMethod`) drafts in the native core; the papers' drafters
(:mod:`drafting.drafters`) and S4C's heads alone (:mod:`s4c`) are methods too, so every drafter shares one lifecycle
(after ArcticInference's suffix decoding: ``start_request`` / ``speculate`` / ``stop_request``, and vLLM's batch-first
proposers).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np

from crest_native import FEATURES, Core

from .calibration import Calibration
from .draft import ChainDrafts, CostCurve, Draft, ScoreKind

__all__ = ["CoreSettings", "DraftMethod", "Follow", "FollowedStep", "Step", "TABLE_ONLY"]


class CoreSettings(NamedTuple):
    """What the service builds its native core with: the calibration's weights (``[len(FEATURES)]`` float64), intercept
    and count-ratio prior, the core's settings by keyword (:data:`crest_native.DEFAULTS` for any left out), and the
    calibration's token term (:class:`drafting.calibration.TokenBias`: ``[T]`` int64 ascending ids and ``[T]`` float64
    biases; ``None``: none)."""

    coef: np.ndarray
    intercept: float
    prior: float
    options: dict
    token_ids: np.ndarray | None = None
    token_bias: np.ndarray | None = None

    @classmethod
    def of(cls, calibration: Calibration, options: dict) -> CoreSettings:
        """The settings of a core that scores with ``calibration``, its token term included."""
        term = calibration.token_bias
        return cls(calibration.coef, calibration.intercept, calibration.prior, options,
                   None if term is None else term.tokens, None if term is None else term.bias)

    def core(self) -> Core:
        """The native core these settings describe.

        Raises:
            ValueError: naming the setting, when one is out of range (``crest_native.Core``).
        """
        return Core(self.coef, self.intercept, self.prior, self.options, self.token_ids, self.token_bias)


TABLE_ONLY = CoreSettings(np.zeros(len(FEATURES)), 0.0, 1.0, {"outputs_bytes": 0, "sources": []})
"""A core that only holds the requests' tokens (the methods that do not draft in it)."""


@dataclass(frozen=True)
class Step:
    """One checked ``propose`` batch, as the service hands it to its method.

    Attributes:
        core: the service's native core (the request table). lock: the service's lock, held by any call on ``core``.
        handles: ``[rows]`` int64, each row's request in the core. states: each row's method state.
        budgets: ``[rows]`` int64, each in ``0..MAX_BUDGET``. chain: draft each row's best path only.
        min_score: the step's cut, a probability (``None``: the method's own; only probability-scored methods get a
            positive one).
        curve: the engine's step-cost curve the step's chains are cut to (``None``: none; chains only).
    """

    core: Core
    lock: threading.Lock
    handles: np.ndarray
    states: Sequence[Any]
    budgets: np.ndarray
    chain: bool
    min_score: float | None
    curve: CostCurve | None = None

    def tokens(self, row: int, start: int = 0) -> tuple[int, np.ndarray]:
        """Row ``row``'s token count and its tokens from position ``start`` on (``[count - start]`` uint32), copied out
        of the core; ``(0, [])`` when its request was stopped meanwhile."""
        with self.lock:
            handle = int(self.handles[row])
            return self.core.count(handle), self.core.tokens(handle, start)

    def tail(self, row: int, n: int) -> np.ndarray:
        """Row ``row``'s last ``n`` tokens (fewer when it has fewer), as ``[<= n]`` uint32."""
        with self.lock:
            handle = int(self.handles[row])
            return self.core.tokens(handle, max(self.core.count(handle) - n, 0))


class Follow(NamedTuple):
    """An engine's rows to follow before a step is drafted, as the engine gives them: ``rows`` ``[rows, max_len]``
    int32 or int64 (C order), ``at`` ``[pairs]`` int64 (each pair's row), or ``None`` (pair ``i`` on row ``i``),
    ``lengths`` ``[>= rows]`` of ``rows``' dtype, ``limit`` (new ids must be below it). The one native call checks
    them before anything changes (:meth:`drafting.DraftingService.follow_and_propose`)."""

    rows: np.ndarray
    at: np.ndarray | None
    lengths: np.ndarray
    limit: int


FollowedStep = tuple[list[bool] | None, int, int, ChainDrafts | None]
"""What :meth:`DraftMethod.draft_following` returns: ``(followed per pair, bad pair, bad id, chains)``; ``followed``
``None`` when pair ``bad`` holds the new id ``bad_id`` outside ``[0, limit)`` (nothing followed, nothing drafted);
``chains`` ``None`` when a pair did not follow (nothing drafted)."""


class DraftMethod(Protocol):
    """How a service drafts (see the module docstring). The service calls ``start`` and ``extend`` under its lock, and
    ``draft`` outside it."""

    name: str
    score_kind: ScoreKind
    hidden_states: bool
    """Whether the method reads the target's hidden states (S4C's heads): :meth:`add_hidden_states` then feeds it."""
    cuts_to_curve: bool
    """Whether :meth:`draft` cuts a step's chains to ``step.curve`` itself (the merged drafter, in its native call,
    with each request's scores discounted by the engine's verdicts on its earlier drafts); else the service cuts them
    (:meth:`drafting.draft.Drafts.goodput`)."""

    def core_settings(self) -> CoreSettings:
        """The native core the service holds the requests in (:data:`TABLE_ONLY` when the method does not draft in
        it)."""

    def start(self, prompt: np.ndarray) -> Any:
        """A new request's state from its ``[N]`` uint32 prompt (``None``: the method keeps none)."""

    def extend(self, state: Any, tokens: np.ndarray) -> None:
        """Append ``[N]`` uint32 committed tokens to a request's state."""

    def add_hidden_states(self, state: Any, hidden: Any) -> None:
        """Append the target's hidden states of a request's next positions (methods with ``hidden_states``)."""

    def draft(self, step: Step) -> Sequence[Draft]:
        """One draft per row of a checked batch (empty for a budget of 0 or a request stopped meanwhile): a list, or
        the :class:`drafting.draft.Drafts` of one native call."""

    def draft_following(self, step: Step, follow: Follow) -> FollowedStep | None:
        """An engine's steady step in one native call: follow the rows (pair ``i``: request ``step.handles[i]``, row
        ``follow.at[i]``), then, when every pair followed, draft each row's chain (``step.chain`` is true). ``None``
        when the method cannot do both in one call now (the service then follows, then drafts)."""

    def stopped(self, state: Any, output: np.ndarray) -> None:
        """A request ended: its state, and its ``[N]`` uint32 output (which already joined the core's output index)."""

    def config(self) -> dict:
        """JSON-ready description of everything that changes the method's drafts."""

    def step_seconds(self) -> dict[str, float]:
        """Seconds spent so far, by part of the step."""

    def close(self) -> None:
        """Release what the method opened (lookups, writers)."""


class Stateless:
    """The parts of a :class:`DraftMethod` of a method that keeps nothing per request and opens nothing."""

    hidden_states = False
    cuts_to_curve = False

    def core_settings(self) -> CoreSettings:
        """Only the request table (:data:`TABLE_ONLY`)."""
        return TABLE_ONLY

    def start(self, prompt: np.ndarray) -> None:
        """Nothing kept per request."""

    def extend(self, state: None, tokens: np.ndarray) -> None:
        """Nothing kept per request."""

    def add_hidden_states(self, state: None, hidden: Any) -> None:
        """Never called: the method reads no hidden states."""

    def draft_following(self, step: Step, follow: Follow) -> None:
        """Not in one call: the service follows, then drafts."""

    def stopped(self, state: None, output: np.ndarray) -> None:
        """Nothing learned from finished requests."""

    def step_seconds(self) -> dict[str, float]:
        """No parts timed."""
        return {}

    def close(self) -> None:
        """Nothing opened."""
