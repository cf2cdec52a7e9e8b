"""Tree verification: one forward pass over a whole draft tree (tree attention), then acceptance.

SpecInfer §4.2 (https://arxiv.org/abs/2305.09781) / Medusa §2.1.2
(https://arxiv.org/abs/2401.10774) "tree attention": the draft tree is flattened
in node order behind the last committed token; every node attends to the cached
prefix, the last committed token, its ancestors and itself, and sits at position
``past_len + depth``. The logits at query ``0`` (the last committed token) score
the root's children; the logits at query ``1 + i`` score node ``i``'s children.

Greedy acceptance is :mod:`drafting.accept` (the one accept rule, shared with
replay). Sampled acceptance is SpecInfer's multi-step speculative
sampling for deterministic drafts (SpecInfer §4.3; S4C §3.2), which keeps the
target's distribution exact. Only the accepted path's KV entries are kept.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from drafting.draft import Draft

__all__ = ["tree_attention_inputs"]


def ancestor_matrix(parents: np.ndarray) -> np.ndarray:
    """``[num_nodes, num_nodes]`` bool: ``out[i, j]`` is True when node ``j`` is node ``i`` or one of its ancestors.

    Args:
        parents: ``[num_nodes]`` int, ``-1`` for a child of the root and ``parents[i] < i`` otherwise.
    """
    n = len(parents)
    anc = np.eye(n, dtype=bool)
    for i in range(n):
        p = int(parents[i])
        if p >= 0:
            anc[i] |= anc[p]
    return anc


def tree_attention_inputs(draft: Draft, past_len: int, *, dtype: torch.dtype,
                          device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The additive 4D attention mask and position ids for verifying one draft tree.

    The query is ``[last committed token] + the draft's nodes`` (``1 + num_nodes``
    tokens); the keys are the ``past_len`` cached tokens followed by the query.

    Args:
        draft: the draft tree (its ``parents`` and derived ``depths`` are used).
        past_len: tokens already in the KV cache (all committed tokens but the last).
        dtype: the model's float dtype; masked entries are ``torch.finfo(dtype).min``
            and visible ones ``0`` (additive masks are read the same way by the
            eager and SDPA attention implementations).
        device: where to build the tensors.

    Returns:
        ``mask``: ``[1, 1, 1 + num_nodes, past_len + 1 + num_nodes]`` float;
        ``position_ids``: ``[1, 1 + num_nodes]`` int64, ``past_len + depth``
        (depth 0 for the last committed token).
    """
    n = len(draft)
    visible = np.zeros((1 + n, past_len + 1 + n), dtype=bool)
    visible[:, : past_len + 1] = True  # the cached prefix and the last committed token
    visible[1:, past_len + 1 :] = ancestor_matrix(draft.parents)
    mask = torch.full(visible.shape, torch.finfo(dtype).min, dtype=dtype)
    mask.masked_fill_(torch.from_numpy(visible), 0.0)
    positions = torch.from_numpy(np.concatenate([[0], draft.depths]) + past_len)
    return mask[None, None].to(device), positions[None].to(device)


def accept_sampled(draft: Draft, probs: torch.Tensor,
                   generator: torch.Generator | None = None) -> tuple[list[int], int]:
    """Multi-draft speculative sampling over a tree of deterministic drafts (SpecInfer §4.3; S4C §3.2).

    At each reached node the children are tried in node order: child ``c`` is
    accepted with probability ``p(c)`` under the current residual ``p``; on
    rejection ``p(c)`` is set to 0 and ``p`` renormalized. When every child is
    rejected (or the node is a leaf) the next token is sampled from the residual.
    For drafts that are point masses this returns tokens distributed exactly as
    the target's (temperature-scaled) distribution.

    Args:
        draft: the draft tree (siblings differ).
        probs: ``[1 + num_nodes, vocab_size]`` float, the target's next-token
            distribution after the last committed token and after each node.
        generator: optional ``torch.Generator`` on ``probs``' device, for reproducible draws.

    Returns:
        ``(path, bonus)`` as for :func:`drafting.accept.accept_greedy`.
    """
    kids = draft.children
    path: list[int] = []
    query = 0
    while True:
        p = probs[query].to(torch.float64).clone()  # [vocab_size]
        moved = False
        for token, c in kids[query].items():
            total = float(p.sum())
            if total <= 0.0:
                break
            u = float(torch.rand((), generator=generator, dtype=torch.float64, device=p.device))
            if u * total < float(p[token]):
                path.append(c)
                query = c + 1
                moved = True
                break
            p[token] = 0.0
        if not moved:
            return path, int(torch.multinomial(p / p.sum(), 1, generator=generator))


def keep_accepted_kv(cache, past_len: int, path: Sequence[int]) -> None:
    """Keep the cached prefix, the last committed token and the accepted nodes' KV entries; drop the rest.

    After a verification pass the cache holds ``past_len + 1 + num_nodes``
    entries per layer; afterwards it holds ``past_len + 1 + len(path)``: the
    accepted nodes' entries move down to follow the last committed token.

    Args:
        cache: a transformers ``DynamicCache`` (layers with ``keys``/``values``
            of shape ``[batch, kv_heads, seq_len, head_dim]``).
        past_len: cache length before the verification pass.
        path: accepted node indices, root first (ascending, as tree order guarantees).
    """
    keep = past_len + 1 + len(path)
    src = [past_len + 1 + i for i in path]
    contiguous = src == list(range(past_len + 1, keep))
    index = None if contiguous else torch.tensor(src, dtype=torch.long)
    for layer in cache.layers:
        if index is not None:
            dst = slice(past_len + 1, keep)
            idx = index.to(layer.keys.device)
            layer.keys[..., dst, :] = layer.keys.index_select(-2, idx)
            layer.values[..., dst, :] = layer.values.index_select(-2, idx)
        drop = layer.keys.shape[-2] - keep
        if drop > 0:
            layer.crop(-drop)
