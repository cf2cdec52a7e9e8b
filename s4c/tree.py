"""The continuous verification tree (S4C §3.2): vertical top-1 chains through the heads, horizontal top-k alternatives.

Interpretation (the paper's Figure 3, for a loop whose bonus token is already committed). The paper's first level,
the top-2 tokens of the target's last feature ``f0``, is in our loop the bonus token the target itself just chose, so
it is known and not drafted; the tree below it starts at head 1. Its ``branches`` (default 2, the paper's top-2) most
likely tokens are each continued vertically: at every later head by the top-1 token of the head's distribution for
that branch. At every drafted position the head's top ``widths[k]`` tokens hang side by side (horizontal
alternatives, "dips" and "casts" beside "sets" in the paper's figure), so a rejected top-1 token can be replaced by an
alternative at the same position. The heads compute every branch while advancing over the committed positions, in
one pass per head (:func:`s4c.state.advance`).

Each node carries the head's probability of its token given its parent (``probs``); its path probability (their
product) ranks it for S4C alone (``model`` scores), and the merged drafter scores it by its calibrated features.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from drafting.heads import HeadTree

from .heads import DraftLMHead, S4CHeads
from .state import HeadState, top

__all__ = ["TreeShape", "candidate_tree"]


@dataclass(frozen=True)
class TreeShape:
    """The verification tree's shape.

    Attributes:
        widths: per head, the top-k tokens drafted side by side at its position (``widths[0]`` at depth 1, ...).
        branches: head 1's most likely tokens continued vertically through the later heads (the paper's top-2).

    Raises:
        ValueError: for a width or branch count below 1, or more branches than head 1's width.
    """

    widths: tuple[int, ...] = (8, 4, 4)
    branches: int = 2

    def __post_init__(self) -> None:
        object.__setattr__(self, "widths", tuple(int(w) for w in self.widths))
        if not self.widths or min(self.widths) < 1 or self.branches < 1 or self.branches > self.widths[0]:
            raise ValueError(f"tree shape {self}: widths must be >= 1 and 1 <= branches <= widths[0]")

    @property
    def nodes(self) -> int:
        """The most nodes a tree of this shape has."""
        return self.widths[0] + self.branches * sum(self.widths[1:])


class _Builder:
    """Nodes appended in an order where parents come first."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.probs: list[float] = []

    def level(self, parent: int, logits: torch.Tensor, width: int, head: DraftLMHead) -> list[int]:
        """Append the ``width`` most likely tokens of ``logits`` ``[V']`` (over ``head``'s draft vocabulary) below
        ``parent``; returns their nodes, most likely first."""
        probs, tokens = top(logits, width, head)
        nodes = []
        for p, t in zip(probs, tokens):
            nodes.append(len(self.tokens))
            self.tokens.append(t)
            self.parents.append(parent)
            self.probs.append(p)
        return nodes

    def tree(self) -> HeadTree:
        return HeadTree(np.array(self.tokens, dtype=np.int64), np.array(self.parents, dtype=np.int32),
                        np.array(self.probs, dtype=np.float64))


def candidate_tree(heads: S4CHeads, state: HeadState, shape: TreeShape) -> HeadTree:
    """The verification tree after a request's last token, from heads advanced over its committed positions with
    ``shape.branches`` branches (:func:`s4c.state.advance`).

    Args:
        heads: the heads. state: the request's, advanced (``state.last`` and ``state.others`` are set).
        shape: the tree's widths and branches; heads past ``len(shape.widths)`` are not used.

    Returns:
        The tree, parents before children, each node with its head probability given its parent.
    """
    depth = min(len(shape.widths), len(heads.blocks))
    out = _Builder()
    roots = out.level(-1, state.last[0][1], shape.widths[0], heads.draft_head)
    for b in range(min(shape.branches, len(roots))):
        parent = roots[b]
        for k in range(1, depth):
            logits = state.last[k][1] if b == 0 else state.others[k][b - 1][1]
            parent = out.level(parent, logits, shape.widths[k], heads.draft_head)[0]
    return out.tree()
