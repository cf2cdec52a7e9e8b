"""No drafting: every step verifies zero nodes, i.e. plain decoding through the same loop (the speed-up baseline)."""

from __future__ import annotations

from drafting import Draft, TokenDrafter

__all__ = ["NoDraft"]


class NoDraft(TokenDrafter):
    """Drafts nothing."""

    name = "none"

    def draft(self, state, tokens: list[int], budget: int, chain: bool) -> Draft:
        """An empty draft."""
        return Draft.empty()
