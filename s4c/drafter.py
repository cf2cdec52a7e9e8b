"""S4C alone as a drafter: the heads' continuous verification tree (S4C §3.2), cut to the budget by its own path
probabilities.

The drafter reads the target's last hidden states (:class:`drafting.lifecycle.ReadsHiddenStates`): the decoding loop
and the replay hand it the states of the committed positions after each step. A row whose request has not received
the states of all its committed tokens but the last gets an empty draft (counted in :attr:`S4CDrafter.stats`), so an
engine that passes no hidden states decodes plainly rather than failing.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from drafting.draft import Draft, ScoreKind
from drafting.heads import HeadTree
from drafting.lifecycle import RequestDrafter, RequestId

from .heads import S4CHeads
from .state import HeadState, add_features, advance, extend_tokens
from .tree import TreeShape, candidate_tree

__all__ = ["S4CDrafter"]


@dataclass
class HeadStats:
    """Cumulative figures of the heads (seconds are wall-clock).

    Attributes:
        trees: candidate trees built. heads_s: seconds running the heads (advancing and branching) and building trees.
        unready: rows drafted nothing because their request lacked hidden states.
    """

    trees: int = 0
    heads_s: float = 0.0
    unready: int = 0


def _hidden(hidden, d: int) -> torch.Tensor:
    """``hidden`` as a ``[n, d]`` float32 CPU tensor, checked at the door."""
    if isinstance(hidden, np.ndarray):
        hidden = torch.from_numpy(hidden)
    if not isinstance(hidden, torch.Tensor):
        raise TypeError(f"hidden is a {type(hidden).__name__}; pass the target's hidden states as a [n, {d}] "
                        "torch.Tensor or numpy array")
    if hidden.ndim != 2 or hidden.shape[1] != d or not hidden.dtype.is_floating_point:
        raise ValueError(f"hidden is {tuple(hidden.shape)} {hidden.dtype}; the heads read [n, {d}] float hidden "
                         "states (the target's final-normed last hidden state)")
    return hidden.detach().to("cpu", torch.float32)


class S4CDrafter(RequestDrafter[HeadState]):
    """The S4C heads as a drafter, request-keyed like every drafter (thread-safe: one lock around the heads).

    Args:
        heads: trained heads (:func:`s4c.load_heads`), in eval mode, on the CPU.
        shape: the verification tree's shape (default: head 1's top 8 with its top 2 continued, top 4 at heads 2-3).
    """

    name = "s4c"
    score_kind = ScoreKind.MODEL
    context_tokens = 0  # it drafts from its own tokens and hidden states

    def __init__(self, heads: S4CHeads, shape: TreeShape | None = None) -> None:
        super().__init__()
        self.heads = heads
        self.shape = shape or TreeShape()
        self.stats = HeadStats()

    def _start(self, prompt_ids: np.ndarray) -> HeadState:
        return HeadState(prompt_ids.tolist())

    def _extend(self, state: HeadState, tokens: np.ndarray) -> None:
        extend_tokens(state, tokens)

    def add_hidden_states(self, req_id: RequestId, hidden) -> None:
        """Append the target's hidden states of ``req_id``'s next positions (see
        :class:`drafting.lifecycle.ReadsHiddenStates`).

        Raises:
            KeyError: when ``req_id`` is not active.
            TypeError / ValueError: for anything but a ``[n, hidden_size]`` float tensor or array.
        """
        block = _hidden(hidden, self.heads.config.hidden_size)
        with self._lock:
            add_features(self._get(req_id), block)

    def trees(self, states: list[HeadState]) -> list[HeadTree | None]:
        """Each state's candidate tree (``None`` when it lacks hidden states), the heads advanced first."""
        start = time.perf_counter()
        out: list[HeadTree | None] = []
        with self._lock:
            for state in states:
                if not state.ready:
                    self.stats.unready += 1
                    out.append(None)
                    continue
                advance(self.heads, state, self.shape.branches)
                out.append(candidate_tree(self.heads, state, self.shape))
            self.stats.trees += sum(t is not None for t in out)
            self.stats.heads_s += time.perf_counter() - start
        return out

    def step_seconds(self) -> dict[str, float]:
        """Seconds spent so far running the heads (``heads``)."""
        with self._lock:
            return {"heads": self.stats.heads_s}

    def states(self, req_ids: list[RequestId]) -> list[HeadState]:
        """The states of active requests (for a drafter that composes this one).

        Raises:
            KeyError: when one is not active.
        """
        with self._lock:
            return [self._get(r) for r in req_ids]

    def _propose(self, states: list[HeadState], contexts: list[list[int]], budgets: list[int], chain: bool,
                 min_score: float | None) -> list[Draft]:
        drafts = [Draft.empty(self.score_kind) for _ in states]
        rows = [i for i, b in enumerate(budgets) if b > 0]
        for i, tree in zip(rows, self.trees([states[i] for i in rows])):
            if tree is not None:
                draft = Draft(tree.token_ids, tree.parents, _path_probs(tree), self.score_kind)
                drafts[i] = draft.best_path(budgets[i]) if chain else draft.top(budgets[i])
        return drafts

    @cached_property
    def weights_digest(self) -> str:
        """A short hash of the heads' weights."""
        h = hashlib.sha256()
        for name, p in sorted(self.heads.state_dict().items()):
            h.update(name.encode())
            h.update(p.detach().cpu().numpy().tobytes())
        return h.hexdigest()[:16]

    def config(self) -> dict:
        """The heads' shapes and weights (a digest) and the tree's shape."""
        return {"name": self.name, "heads": self.heads.config.to_json(), "weights": self.weights_digest,
                "shape": {"widths": list(self.shape.widths), "branches": self.shape.branches}}


def _path_probs(tree: HeadTree) -> np.ndarray:
    """Each node's path probability: the product of the heads' probabilities from the root."""
    out = np.empty(len(tree), dtype=np.float64)
    for i, (p, q) in enumerate(zip(tree.parents.tolist(), tree.probs.tolist())):
        out[i] = q if p < 0 else out[p] * q
    return out
