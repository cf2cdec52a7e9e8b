"""The heads' token losses through the target's frozen LM head, computed in row chunks (S4C §3.1.2, eqs. 7-8).

A head's logits are ``[positions, vocab_size]`` (2,048 x 49,152 floats, 400 MB, for one batch of SmoLM2): kept whole,
every pass over them (log-softmax, its gradient, the indexing) allocates and faults in fresh pages, and that, not the
LM head's product, dominated a training step on the CPU. So the LM head and both cross-entropies are one autograd
function that works on chunks of rows small enough to be reused by the allocator, keeps only those chunks' logits
for its backward pass, and returns each row's argmax on the way (the next head's input token, eq. 5).

- ``lm`` of a row: ``logsumexp(z) - z[label]`` (eq. 7);
- ``teacher`` of a row: ``-sum_j p_j log softmax(z)_j`` over the target's most likely tokens ``j`` with their
  probabilities ``p_j`` (eq. 8 with the target's distribution truncated to the top ``K`` tokens stored with the
  features, :mod:`evaluation.features`; the mass outside them is not taught).
"""

from __future__ import annotations

import torch

__all__ = ["head_losses", "product_dtype"]

CHUNK_ROWS = 128
"""Rows per chunk: 128 x 49,152 float32 logits are 25 MB, under glibc's largest mmap threshold (32 MB), so a chunk's
buffers come from (and go back to) the heap instead of fresh pages."""


def product_dtype() -> torch.dtype:
    """The dtype training's LM-head products run in: ``torch.bfloat16`` where oneDNN runs it on the CPU's own
    units (AVX-512 and newer: ~3.7x float32's speed on the machine the shipped heads were trained on), else
    ``torch.float32`` (on an AVX2-only CPU bfloat16 is emulated, ~3x slower than float32)."""
    native = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return torch.bfloat16 if native is not None and native() else torch.float32


class _HeadLosses(torch.autograd.Function):
    """``(lm [n], teacher [n], argmax [n])`` from features ``g [n, d]`` float32, the LM head ``weight [V, d]`` (its
    dtype is the products': :func:`product_dtype` in training), ``labels [n]`` int64 and the teacher's
    ``ids [n, K]`` int64 / ``probs [n, K]`` float32. The logits and the softmax are float32."""

    @staticmethod
    def forward(ctx, g, weight, labels, ids, probs):  # noqa: D102 - see the class
        n = g.shape[0]
        lm, teacher = torch.empty(n, dtype=torch.float32), torch.empty(n, dtype=torch.float32)
        choice = torch.empty(n, dtype=torch.long)
        lse_all, chunks = torch.empty(n, dtype=torch.float32), []
        for s in range(0, n, CHUNK_ROWS):
            e = min(n, s + CHUNK_ROWS)
            z = (g[s:e].to(weight.dtype) @ weight.T).float()  # [c, V]
            top, choice[s:e] = z.max(dim=-1)
            lse = top + (z - top[:, None]).exp_().sum(-1).log_()
            lm[s:e] = lse - z.gather(1, labels[s:e, None])[:, 0]
            p = probs[s:e]
            teacher[s:e] = p.sum(-1) * lse - (p * z.gather(1, ids[s:e])).sum(-1)
            lse_all[s:e] = lse
            chunks.append(z)
        ctx.save_for_backward(weight, labels, ids, probs, lse_all)
        ctx.chunks = chunks
        ctx.mark_non_differentiable(choice)
        return lm, teacher, choice

    @staticmethod
    def backward(ctx, d_lm, d_teacher, _d_choice):  # noqa: D102 - see the class
        weight, labels, ids, probs, lse_all = ctx.saved_tensors
        n = lse_all.shape[0]
        dg = torch.empty((n, weight.shape[1]), dtype=torch.float32)
        for i, z in enumerate(ctx.chunks):
            s = i * CHUNK_ROWS
            e = s + z.shape[0]
            a, b, p = d_lm[s:e], d_teacher[s:e], probs[s:e]
            z.sub_(lse_all[s:e, None]).exp_()  # softmax, in place: the chunk is not needed again
            z.mul_((a + b * p.sum(-1))[:, None])
            z.scatter_add_(1, labels[s:e, None], -a[:, None])
            z.scatter_add_(1, ids[s:e], -b[:, None] * p)
            dg[s:e] = z.to(weight.dtype) @ weight
        ctx.chunks = None
        return dg, None, None, None, None


def head_losses(g: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, ids: torch.Tensor,
                probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's ``lm`` and ``teacher`` cross-entropy and its argmax token through the LM head (see the module).

    Args:
        g: ``[n, d]`` float32 head features (differentiable).
        weight: ``[V, d]`` the frozen LM head, in the dtype the two products run in (:func:`product_dtype`; the
            logits are float32 either way).
        labels: ``[n]`` int64 text tokens (any valid id where a row has none: weigh its loss 0).
        ids / probs: ``[n, K]`` int64 / float32, the target's top tokens and their probabilities.

    Returns:
        ``lm [n]``, ``teacher [n]`` (differentiable in ``g``) and ``argmax [n]`` int64.
    """
    return _HeadLosses.apply(g, weight, labels, ids, probs)
