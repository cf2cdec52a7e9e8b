"""The drafter interface, named after the request lifecycle (as ArcticInference's suffix decoding).

A drafter sees one request: ``begin`` with the prompt, then per verification
step ``propose`` a draft tree and ``extend`` with the tokens the target
committed (bonus token included), then ``end``. ``config`` names everything that
changes its drafts (the budget cache keys on it).
"""

from __future__ import annotations

from typing import Protocol, Sequence

from ..draft import Draft

__all__ = ["Drafter", "NoDrafter"]


class Drafter(Protocol):
    """What the speculative decoder needs from a drafter."""

    name: str

    def begin(self, prompt_ids: Sequence[int]) -> None:
        """Start a request with its prompt token ids."""

    def propose(self, budget: int) -> Draft:
        """A draft tree of at most ``budget`` nodes continuing the current sequence, best first."""

    def extend(self, tokens: Sequence[int]) -> None:
        """Append the tokens the target committed this step."""

    def end(self) -> None:
        """Finish the request and release its state."""

    def config(self) -> dict:
        """JSON-ready description of everything that changes this drafter's drafts."""


class NoDrafter:
    """Drafts nothing: every step verifies zero nodes, i.e. plain decoding through the same loop."""

    name = "none"

    def begin(self, prompt_ids: Sequence[int]) -> None:
        """No state."""

    def propose(self, budget: int) -> Draft:
        """Always the empty draft."""
        return Draft.empty()

    def extend(self, tokens: Sequence[int]) -> None:
        """No state."""

    def end(self) -> None:
        """No state."""

    def config(self) -> dict:
        """Nothing to configure."""
        return {"name": self.name}
