"""What one decoding (or its replay) produced and cost: a record per verification step, and the request's result."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["StepRecord", "GenerationResult"]


@dataclass(frozen=True)
class StepRecord:
    """One verification step.

    Attributes:
        drafted: draft tree nodes verified.
        accepted: tokens committed (accepted draft tokens + the bonus token,
            less any cut at EOS or ``max_new_tokens``).
        draft_s: seconds the drafter's ``propose`` took (lookups and merge; the drafter's own figures split it).
        verify_s: seconds for the forward pass, acceptance and KV compaction (0 in replay).
    """

    drafted: int
    accepted: int
    draft_s: float
    verify_s: float


@dataclass
class GenerationResult:
    """What one request produced and what it cost.

    Attributes:
        output_ids: generated token ids (EOS included when it ended the request).
        steps: one record per verification step (the prefill's first token is not a step).
        prefill_s: seconds for the prompt's forward pass (0 in replay).
        wall_s: seconds for the whole request, prefill included.
    """

    output_ids: list[int]
    steps: list[StepRecord] = field(default_factory=list)
    prefill_s: float = 0.0
    wall_s: float = 0.0

    @property
    def accept_length(self) -> float:
        """Mean tokens committed per verification step, bonus token included."""
        return sum(s.accepted for s in self.steps) / len(self.steps) if self.steps else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per wall-clock second, prefill included."""
        return len(self.output_ids) / self.wall_s if self.wall_s > 0 else 0.0
