"""The drafter interface, named after the request lifecycle (as ArcticInference's suffix decoding).

A drafter sees one request: ``begin`` with the prompt, then per verification
step ``propose`` a draft tree and ``extend`` with the tokens the target
accepted (bonus token included), then ``end``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from ..draft import EMPTY_DRAFT, Draft

__all__ = ["Drafter", "Proposal", "NoDrafter"]


@dataclass(frozen=True)
class Proposal:
    """One step's draft and what assembling it cost.

    Attributes:
        draft: the draft tree (possibly empty).
        lookup_s: seconds spent on datastore lookups.
        trie_s: seconds spent matching the prompt trie or scanning the sequence.
        merge_s: seconds spent merging and pruning to the budget.
    """

    draft: Draft
    lookup_s: float = 0.0
    trie_s: float = 0.0
    merge_s: float = 0.0


class Drafter(Protocol):
    """What the speculative decoder needs from a drafter."""

    name: str

    def begin(self, prompt_ids: Sequence[int]) -> None:
        """Start a request with its prompt token ids."""

    def propose(self, budget: int) -> Proposal:
        """A draft tree of at most ``budget`` nodes continuing the current sequence."""

    def extend(self, tokens: Sequence[int]) -> None:
        """Append the tokens the target committed this step."""

    def end(self) -> None:
        """Finish the request and release its state."""


class NoDrafter:
    """Drafts nothing: every step verifies zero nodes, i.e. plain decoding through the same loop."""

    name = "none"

    def begin(self, prompt_ids: Sequence[int]) -> None:
        """No state."""

    def propose(self, budget: int) -> Proposal:
        """Always the empty draft."""
        return Proposal(EMPTY_DRAFT)

    def extend(self, tokens: Sequence[int]) -> None:
        """No state."""

    def end(self) -> None:
        """No state."""
