"""The draft heads' candidate tree: what a draft model (S4C's heads, :mod:`s4c`) gives the merged drafter as one more
source, the ``heads`` source of the native core, for one request and one step.

Unlike the retrieval sources, whose trees carry counts, the heads' tree carries the model's probability of each node
given its parent; the core scores its nodes by their own feature block (``heads_prob``, ``heads_log_prob``,
``heads_path_prob``, ``heads_top``, ...: ``csrc/features.hpp``) under a calibration fitted with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from .method import Step

__all__ = ["HeadSource", "HeadTree"]


@dataclass(frozen=True)
class HeadTree:
    """A draft model's candidate tree below the sequence's last token.

    Attributes:
        token_ids: ``[N]`` int64 token ids (siblings differ).
        parents: ``[N]`` int32, ``-1`` for a child of the root, else ``parents[i] < i``.
        probs: ``[N]`` float64 in ``[0, 1]``: the model's probability of node ``i``'s token given its parent's path.

    Raises:
        ValueError: when the arrays differ in length or are not 1-D, a parent is out of order, a token id is negative
            or a probability is outside ``[0, 1]`` (NaN included), naming which.
    """

    token_ids: np.ndarray
    parents: np.ndarray
    probs: np.ndarray

    def __post_init__(self) -> None:
        tokens, parents, probs = (np.asarray(self.token_ids), np.asarray(self.parents), np.asarray(self.probs))
        if not (tokens.ndim == parents.ndim == probs.ndim == 1 and len(tokens) == len(parents) == len(probs)):
            raise ValueError(f"a heads tree's token_ids {tokens.shape}, parents {parents.shape} and probs "
                             f"{probs.shape} must be 1-D and of one length")
        if len(tokens) and (tokens.min() < 0 or not np.issubdtype(tokens.dtype, np.integer)):
            raise ValueError("a heads tree's token_ids must be non-negative integers")
        if np.any((parents < -1) | (parents >= np.arange(len(parents)))):
            raise ValueError("a heads tree's parents are out of order: parents[i] must be in -1..i-1")
        if not np.all((probs >= 0.0) & (probs <= 1.0)):
            raise ValueError("a heads tree's probs must lie in [0, 1]")
        object.__setattr__(self, "token_ids", tokens.astype(np.int64))
        object.__setattr__(self, "parents", parents.astype(np.int32))
        object.__setattr__(self, "probs", probs.astype(np.float64))

    def __len__(self) -> int:
        return len(self.token_ids)

    def native(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The tree as the native core reads it: ``(uint32 token ids, int32 parents, float64 probs)``."""
        return self.token_ids.astype(np.uint32), self.parents, self.probs


class HeadSource(Protocol):
    """A draft model as a source of the merged drafter (S4C's heads, :class:`s4c.HeadsSource`): it keeps a state per
    request (the target's hidden states it was fed, its own caches) beside the request's handle in the service's table,
    and gives each step's rows their candidate trees."""

    name: str

    def start(self) -> Any:
        """A new request's state."""

    def add_hidden_states(self, state: Any, hidden: Any) -> None:
        """Append the target's hidden states of a request's next positions.

        Raises:
            TypeError / ValueError: for anything but a ``[n, hidden_size]`` float tensor or array.
        """

    def trees(self, step: Step) -> list[HeadTree | None]:
        """Each row's candidate tree below its last token (``None``: none, e.g. a request without hidden states yet,
        or a budget of 0)."""

    def config(self) -> dict:
        """What changes its trees."""

    def step_seconds(self) -> dict[str, float]:
        """Seconds spent running it."""
