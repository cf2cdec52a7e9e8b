"""One request's heads while it decodes: the target features it has received and each head's cache of committed
positions (S4C §3.1.1 at inference); the request's tokens are the drafting service's (read from its core).

After ``x[0..T]`` with features ``F[0..T-1]`` (the verification pass gives the feature of every committed token but
the last), :func:`advance` runs the heads over the positions they have not seen, each head after the one before it,
exactly as in training (:meth:`s4c.heads.S4CHeads.forward`): head 1 reads ``[E(x[t + 1]), F[t]]``, head ``k + 1``
reads head ``k``'s feature and its argmax token. Their keys and values join the caches, and the last position's
outputs (``t = T - 1``: the distributions of ``x[T + 1]``, ``x[T + 2]``, ``x[T + 3]`` along the top-1 chain) are
kept for drafting. In the same pass of each head, the tree's other branches run at that same position for other
input tokens (head 1's next most likely tokens), attending to the cached positions before it and not cached.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .heads import DraftLMHead, LayerCache, S4CHeads

__all__ = ["HeadState", "advance", "top"]


@dataclass
class HeadState:
    """One request's heads.

    Attributes:
        features: ``[n, d]`` float32 blocks of target features received, in order (not yet run through the heads).
        num_features: features received in all.
        caches: per head, its keys and values at the positions run (empty before the first).
        done: positions the heads have run (``t < done``).
        last: per head, ``(feature [d], logits [V'])`` at position ``done - 1`` along the top-1 chain (over the draft
            vocabulary).
        others: per head, the same for each other branch (head 1's next most likely tokens, continued by the top-1
            token of each later head; none at head 1).
    """

    features: list[torch.Tensor] = field(default_factory=list)
    num_features: int = 0
    caches: list[LayerCache] = field(default_factory=list)
    done: int = 0
    last: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    others: list[list[tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=list)

    def ready(self, count: int) -> bool:
        """Whether the heads can draft after the last of a request's ``count`` tokens: every committed token but the
        last has its feature."""
        return self.num_features == count - 1 and self.num_features > 0


def _take(state: HeadState, n: int) -> torch.Tensor:
    """The first ``n`` features received and not run, as one ``[n, d]`` block (taken from the state)."""
    block = state.features[0] if len(state.features) == 1 else torch.cat(state.features)
    state.features = [block[n:]] if len(block) > n else []
    return block[:n]


def top(logits: torch.Tensor, k: int, head: DraftLMHead) -> tuple[list[float], list[int]]:
    """The ``k`` most likely tokens of ``logits`` ``[V']`` over ``head``'s draft vocabulary, most likely first: their
    softmax probabilities and token ids (the one ranking the tree and the branches share)."""
    found = torch.softmax(logits.double(), dim=-1).topk(k)
    return found.values.tolist(), [int(t) for t in head.tokens(found.indices).tolist()]


@torch.no_grad()
def advance(heads: S4CHeads, state: HeadState, recent: np.ndarray, count: int, branches: int = 1) -> None:
    """Run the heads over the positions with a feature that they have not run (committed positions), and at the last
    of them, when it is the request's last but one, the ``branches - 1`` other branches of the tree: head 1's next
    most likely tokens continued through the later heads (:attr:`HeadState.others`). One pass per head.

    Args:
        recent: the request's tokens from position ``state.done`` on (``[count - state.done]`` ints).
        count: the request's tokens in all.
    """
    stop = min(state.num_features, count - 1)
    if stop <= state.done:
        return
    feats = _take(state, stop - state.done)
    start, n = state.done, stop - state.done
    e = heads.embed(torch.as_tensor(recent[1: n + 1].astype(np.int64)))  # [n, d]: tokens start + 1 .. stop
    f = feats
    if not state.caches:
        state.caches = [LayerCache() for _ in heads.blocks]
    state.last, state.others = [], []
    draft = heads.draft_head
    for k, head in enumerate(heads.blocks):
        b = len(e) - n  # branch rows after the committed ones
        positions = torch.cat([torch.arange(start, stop), torch.full((b,), stop - 1)])[None]
        g, keys, values = head.layer.step(head.inputs(e, f)[None], positions, state.caches[k], start, branches=b)
        state.caches[k].append(keys[0, :, :n], values[0, :, :n])
        logits = draft.logits(g[0])  # [n + b, V'] over the draft vocabulary
        state.last.append((g[0, n - 1], logits[n - 1]))
        state.others.append([(g[0, n + i], logits[n + i]) for i in range(b)])
        tokens = draft.tokens(logits.argmax(-1))
        f = g[0]
        if k == 0 and branches > 1 and stop == count - 1:  # the other branches start at head 2
            _, others = top(logits[n - 1], branches, draft)
            tokens = torch.cat([tokens, torch.tensor(others[1:])])
            f = torch.cat([f, g[0, n - 1].expand(branches - 1, -1)])
        e = heads.embed(tokens)
    state.done = stop


def add_features(state: HeadState, features: torch.Tensor) -> None:
    """Append received target features ``[n, d]`` (float32 on the CPU)."""
    state.features.append(features)
    state.num_features += int(features.shape[0])
