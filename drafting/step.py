"""What one batch step of the merged drafter takes and returns: the :class:`Batch` an engine's persistent batch is
stepped with, the :class:`StepResult` a step returns (its drafts or chains), the drafter's cumulative
:class:`ServiceStats`, and the protocols of the background work the drafter owns (the live layer's writer and its
compactor)."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

import numpy as np

import crest_native

from .door import RequestId
from .draft import ChainDrafts, Drafts, ScoreKind

__all__ = ["STEP_TIMES_KEPT", "UNSET", "Batch", "Closeable", "OutputSink", "ServiceStats", "StepResult"]

UNSET = object()
"""What :attr:`Batch.given` holds for an argument that the next step sets again."""
STEP_TIMES_KEPT = 10_000
"""Steps whose seconds :class:`ServiceStats` keeps one by one."""


class OutputSink(Protocol):
    """Where each finished request's output goes: the live layer's writer (:class:`live.LiveWriter`)."""

    def append(self, tokens: Sequence[int]) -> bool:
        """Take one output's token ids (enqueued: the step never waits); whether it was taken."""

    def close(self) -> None:
        """Flush what is pending and stop."""


class Closeable(Protocol):
    """Background work the drafter owns and stops with itself: the live layer's compactor
    (:class:`live.LiveCompactor`)."""

    def close(self) -> None:
        """Stop (work in flight is abandoned safely)."""


@dataclass
class ServiceStats:
    """Cumulative figures of a drafter (seconds are wall-clock, summed over calls).

    Attributes:
        steps: :meth:`DraftingService.step` calls that drafted. drafts: drafts returned. nodes: draft nodes returned.
        step_s: their seconds. step_times: the last :data:`STEP_TIMES_KEPT` steps' seconds, one each (bounded: a
            drafter lives as long as its server).
    """

    steps: int = 0
    drafts: int = 0
    nodes: int = 0
    step_s: float = 0.0
    step_times: deque = field(default_factory=lambda: deque(maxlen=STEP_TIMES_KEPT), repr=False)


class Batch:
    """A step's requests resolved once (:meth:`DraftingService.batch`): an engine's persistent batch is stepped with the
    same object step after step, and its requests are looked up again only once some request started or stopped since.
    One caller's: not shared between threads.

    Attributes:
        ids: ``[rows]`` the request of each row (read only).
    """

    __slots__ = ("generation", "given", "ids", "native")

    def __init__(self, ids: list[RequestId], handles: np.ndarray, generation: int) -> None:
        self.ids = ids
        self.generation = generation  # the drafter's table as the handles were read
        self.native = crest_native.Batch()
        self.native.handles = handles
        # what the last step set on the native batch, as the caller passed it (budgets, chain, min_score, curve,
        # tokens, states), where the native side holds it or reads it in place (else UNSET): a step passing the same
        # objects sets nothing again (setting a native attribute costs microseconds)
        self.given: list = [UNSET] * 6

    def __len__(self) -> int:
        return len(self.ids)


class StepResult:
    """What a step did: which requests followed their new tokens, and, when all did, the batch's drafts.

    Attributes:
        followed: ``[rows]`` bools: whether each request followed (always true for token lists; for
            :class:`EngineRows`, whether the request's tokens were the first of its row).
        drafted: whether the batch was drafted (every request followed).
    """

    def __init__(self, followed: list[bool], made: crest_native.Step | None) -> None:
        self.followed, self._made, self.drafted = followed, made, made is not None

    @cached_property
    def drafts(self) -> Drafts:
        """``[rows]`` drafts, best first (empty for a budget of 0 or a request stopped meanwhile).

        Raises:
            ValueError: when the batch was not drafted (a request did not follow: start or move it, then step again).
        """
        m = self._checked()
        return Drafts(m.tokens, m.parents, m.scores, m.offsets, ScoreKind.PROBABILITY, m.sources)

    def chains(self) -> ChainDrafts:
        """The drafts as an engine that verifies chains takes them: token ids per row, as lists of ints (each draft of
        a step with ``chain=True`` is a chain).

        Raises:
            ValueError: when the batch was not drafted.
        """
        m = self._checked()
        return ChainDrafts(m.token_lists(), m.scores)

    def _checked(self) -> crest_native.Step:
        if self._made is None:
            raise ValueError("this step drafted nothing: a request did not follow its row (see followed)")
        return self._made
