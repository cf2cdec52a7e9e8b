"""No drafting: every step verifies zero nodes, i.e. plain decoding through the same loop (the speed-up baseline)."""

from __future__ import annotations

from ..draft import Draft, ScoreKind
from ..method import Stateless, Step

__all__ = ["NoDraft"]


class NoDraft(Stateless):
    """Drafts nothing: a :class:`drafting.DraftingService` method."""

    name = "none"
    score_kind = ScoreKind.NONE

    def draft(self, step: Step) -> list[Draft]:
        """An empty draft per row."""
        return [Draft.empty() for _ in step.budgets]

    def config(self) -> dict:
        """Nothing to configure."""
        return {"name": self.name}
