"""What one batch step of the merged drafter takes and returns: the :class:`Batch` an engine's persistent batch is
stepped with by its rows, the :class:`StepResult` a step returns (its drafts or chains), the drafter's cumulative
:class:`ServiceStats`, and the protocol of where finished outputs go (the live layer's writer)."""

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

__all__ = ["STEP_TIMES_KEPT", "Batch", "OutputSink", "ServiceStats", "StepResult"]

STEP_TIMES_KEPT = 10_000
"""Steps whose seconds :class:`ServiceStats` keeps one by one."""


class OutputSink(Protocol):
    """Where each finished request's output goes: the live layer's writer (:class:`live.LiveWriter`)."""

    def append(self, tokens: Sequence[int], name: str | None = None) -> bool:
        """Take one output's token ids for datastore ``name``'s live layer (``None``: the sink's own; enqueued: the
        step never waits); whether it was taken."""

    def close(self) -> None:
        """Flush what is pending and stop."""


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
    """An engine's persistent batch of requests resolved once (:meth:`DraftingService.batch`), with the settings of
    every step of it, stepped by its rows (:meth:`DraftingService.step_rows`) step after step; its requests are looked
    up again only once some request started or stopped since. One caller's: not shared between threads. It belongs to
    the drafter that made it: any other refuses it.

    Attributes:
        ids: ``[rows]`` the request of each row (read only). drafter: the drafter that made it. chain / min_score: the
            settings of its steps (:meth:`DraftingService.step`'s).
    """

    __slots__ = ("chain", "drafter", "generation", "ids", "min_score", "native")

    def __init__(self, drafter: object, ids: list[RequestId], handles: np.ndarray, generation: int, chain: bool,
                 min_score: float) -> None:
        self.drafter = drafter
        self.ids = ids
        self.generation = generation  # the drafter's table as the handles were read
        self.chain, self.min_score = chain, min_score
        self.native = crest_native.Batch()
        self.native.handles = handles
        self.native.chain, self.native.min_score = chain, min_score

    def __len__(self) -> int:
        return len(self.ids)


class StepResult:
    """What a step did: which requests followed their new tokens, and, when all did, the batch's drafts.

    Attributes:
        followed: ``[rows]`` bools: whether each request followed (always true for token lists; for
            :class:`EngineRows`, whether the request's tokens were the first of its row; true for a request another
            thread stopped during the step, which follows nothing and drafts nothing).
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
