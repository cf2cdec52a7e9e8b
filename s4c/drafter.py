"""S4C's heads as drafting: a source of the merged drafter (:class:`HeadsSource`) and S4C alone as a method
(:class:`S4CMethod`: the heads' continuous verification tree, S4C §3.2, cut to the budget by its own path
probabilities). Both run in a :class:`drafting.DraftingService`, whose table holds each request's tokens; the heads keep
their own state (the target's hidden states they were fed, their caches) beside the request's handle.

The heads read the target's last hidden states (``hidden_states``): the decoding loop and the replay hand them the
states of the committed positions after each step. A row whose request has not received the states of all its
committed tokens but the last gets no tree (counted in :attr:`HeadsSource.stats`), so an engine that passes no hidden
states decodes plainly rather than failing.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch

from drafting import DraftingService, MergedMethod
from drafting.draft import Draft, ScoreKind
from drafting.heads import HeadTree
from drafting.method import TABLE_ONLY, CoreSettings, Follow, Step
from drafting.source import DatastoreSource

from .heads import S4CHeads
from .state import HeadState, add_features, advance
from .tree import TreeShape, candidate_tree

__all__ = ["HeadsSource", "S4CMethod", "merged_s4c", "s4c_drafter"]


@dataclass
class HeadStats:
    """Cumulative figures of the heads (seconds are wall-clock).

    Attributes:
        trees: candidate trees built. heads_s: seconds running the heads (advancing and branching) and building trees.
        unready: rows given no tree because their request lacked hidden states.
    """

    trees: int = 0
    heads_s: float = 0.0
    unready: int = 0


def _hidden(hidden: Any, d: int) -> torch.Tensor:
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


class HeadsSource:
    """The S4C heads as a source of the merged drafter (:class:`drafting.heads.HeadSource`). Thread-safe: one lock
    around the heads.

    Args:
        heads: trained heads (:func:`s4c.load_heads`), in eval mode, on the CPU.
        shape: the verification tree's shape (default: head 1's top 8 with its top 2 continued, top 4 at heads 2-3).
    """

    name = "s4c"

    def __init__(self, heads: S4CHeads, shape: TreeShape | None = None) -> None:
        self.heads = heads
        self.shape = shape or TreeShape()
        self.stats = HeadStats()
        self._lock = threading.Lock()

    def start(self) -> HeadState:
        """A new request's heads."""
        return HeadState()

    def add_hidden_states(self, state: HeadState, hidden: Any) -> None:
        """Append the target's hidden states of a request's next positions.

        Raises:
            TypeError / ValueError: for anything but a ``[n, hidden_size]`` float tensor or array.
        """
        block = _hidden(hidden, self.heads.config.hidden_size)
        with self._lock:
            add_features(state, block)

    def trees(self, step: Step) -> list[HeadTree | None]:
        """Each row's candidate tree (``None`` for a budget of 0 or a request lacking hidden states), the heads
        advanced first."""
        seen = [step.tokens(i, state.done) for i, state in enumerate(step.states)]  # takes the service's lock: first
        return [self.tree(state, count, recent) if budget > 0 else None
                for state, budget, (count, recent) in zip(step.states, step.budgets.tolist(), seen)]

    def tree(self, state: HeadState, count: int, recent: np.ndarray) -> HeadTree | None:
        """One request's candidate tree after its ``count`` tokens, ``recent`` those from position ``state.done`` on
        (``None`` while it lacks hidden states), the heads advanced first."""
        start = time.perf_counter()
        with self._lock:
            if not state.ready(count):
                self.stats.unready += 1
                return None
            advance(self.heads, state, recent, count, self.shape.branches)
            tree = candidate_tree(self.heads, state, self.shape)
            self.stats.trees += 1
            self.stats.heads_s += time.perf_counter() - start
        return tree

    def step_seconds(self) -> dict[str, float]:
        """Seconds spent so far running the heads (``heads``)."""
        with self._lock:
            return {"heads": self.stats.heads_s}

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


class S4CMethod:
    """S4C alone: the heads' candidate tree, ranked by its path probabilities (``model`` scores), cut to the budget (a
    :class:`drafting.DraftingService` method).

    Args:
        heads: the heads as a source (its state per request, its trees).
    """

    name = "s4c"
    score_kind = ScoreKind.MODEL
    hidden_states = True
    cuts_to_curve = False

    def __init__(self, heads: HeadsSource) -> None:
        self.source = heads

    def core_settings(self) -> CoreSettings:
        """Only the request table (the heads draft in torch)."""
        return TABLE_ONLY

    def start(self, prompt: np.ndarray) -> HeadState:
        """The request's heads."""
        return self.source.start()

    def extend(self, state: HeadState, tokens: np.ndarray) -> None:
        """Nothing: the heads read the tokens from the core."""

    def add_hidden_states(self, state: HeadState, hidden: Any) -> None:
        """Feed the heads (see :meth:`HeadsSource.add_hidden_states`)."""
        self.source.add_hidden_states(state, hidden)

    def draft(self, step: Step) -> list[Draft]:
        """Each row's tree, cut by its path probabilities (its best path for a chain)."""
        drafts = [Draft.empty(self.score_kind) for _ in step.budgets]
        for i, tree in enumerate(self.source.trees(step)):
            if tree is not None:
                draft = Draft(tree.token_ids, tree.parents, _path_probs(tree), self.score_kind)
                budget = int(step.budgets[i])
                drafts[i] = draft.cut(budget, step.chain)
        return drafts

    def draft_following(self, step: Step, follow: Follow) -> None:
        """Not in one call: the service follows, then drafts."""

    def stopped(self, state: Any, output: np.ndarray) -> None:
        """Nothing learned across requests."""

    def step_seconds(self) -> dict[str, float]:
        """The heads' seconds."""
        return self.source.step_seconds()

    def config(self) -> dict:
        """The heads'."""
        return {"name": self.name, **{k: v for k, v in self.source.config().items() if k != "name"}}

    def close(self) -> None:
        """Nothing opened."""


def _path_probs(tree: HeadTree) -> np.ndarray:
    """Each node's path probability: the product of the heads' probabilities from the root."""
    out = np.empty(len(tree), dtype=np.float64)
    for i, (p, q) in enumerate(zip(tree.parents.tolist(), tree.probs.tolist())):
        out[i] = q if p < 0 else out[p] * q
    return out


def s4c_drafter(heads: S4CHeads, *, vocab_size: int, shape: TreeShape | None = None) -> DraftingService:
    """S4C alone as a drafter."""
    return DraftingService(S4CMethod(HeadsSource(heads, shape)), vocab_size=vocab_size)


def merged_s4c(lookups: DatastoreSource | None, heads: S4CHeads, *, vocab_size: int,
               outputs_bytes: int | None = None, shape: TreeShape | None = None) -> DraftingService:
    """The merged drafter with the S4C heads as one more source, under the calibration fitted with them
    (:data:`drafting.calibration.HEADS_PATH`).

    Raises:
        FileNotFoundError: when the heads' calibration is missing (fit it: ``benchmarks/calibrate.py --heads``).
    """
    method = MergedMethod(lookups, vocab_size=vocab_size, outputs_bytes=outputs_bytes, heads=HeadsSource(heads, shape))
    return DraftingService(method, vocab_size=vocab_size)
