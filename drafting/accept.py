"""The accept rule of greedy verification, written once for verification, replay and calibration logs.

A draft node is accepted when its token is the target's choice after its parent (after the last committed
token, for a child of the root) and its parent is accepted (REST §3.3, https://arxiv.org/abs/2311.08252;
SpecInfer §4.2, https://arxiv.org/abs/2305.09781). Siblings differ, so at most one node per depth is
accepted: the accepted nodes are one root path, and the target's choice after its last node is the bonus
token. Verification takes the choices from the target's logits; replay from a saved reference output
(:func:`reference_predictions`), which yields exactly the steps of a real greedy run.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .draft import Draft

__all__ = ["accepted_mask", "accept_greedy", "reference_predictions"]


def accepted_mask(tokens: np.ndarray, parents: np.ndarray, depths: np.ndarray, predictions: np.ndarray) -> np.ndarray:
    """``[N]`` bool: which nodes verification accepts.

    Args:
        tokens / parents / depths: ``[N]`` int arrays of the tree (parents before children).
        predictions: ``[1 + N]`` int, the target's choice after the last committed token (index 0) and
            after each node (index ``1 + i``); ``-1`` where unknown (past a reference's end).
    """
    ok = np.asarray(tokens) == np.asarray(predictions)[np.asarray(parents, dtype=np.int64) + 1]
    for depth in range(2, int(depths.max(initial=1)) + 1):
        level = depths == depth
        ok[level] &= ok[parents[level]]
    return ok


def accept_greedy(draft: Draft, predictions: Sequence[int] | np.ndarray) -> tuple[list[int], int]:
    """The accepted path and the bonus token of one verification step.

    Args:
        draft: the draft tree (siblings differ).
        predictions: ``[1 + num_nodes]`` as for :func:`accepted_mask`.

    Returns:
        ``(path, bonus)``: the accepted node indices from the root down, and the target's own next token
        after the last accepted node.
    """
    pred = np.asarray(predictions, dtype=np.int64)
    path = np.flatnonzero(accepted_mask(draft.token_ids, draft.parents, draft.depths, pred)).tolist()
    return path, int(pred[path[-1] + 1 if path else 0])


def reference_predictions(depths: np.ndarray, reference: np.ndarray, pos: int) -> np.ndarray:
    """``[1 + N]`` int64 the target's choices when ``reference[pos:]`` is what it generates next: after a node
    at depth ``d`` it emits ``reference[pos + d]`` (``-1`` past the reference's end).

    Args:
        depths: ``[N]`` int64 node depths of the draft (or node table).
        reference: ``[output_len]`` int64, the whole reference output.
        pos: index in ``reference`` of the first token not yet committed.
    """
    at = pos + np.concatenate([[0], depths])
    out = np.full(len(at), -1, dtype=np.int64)
    inside = at < len(reference)
    out[inside] = reference[at[inside]]
    return out
