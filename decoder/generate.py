"""Speculative generation with draft trees, and the plain greedy loop it is measured against.

Each step: the drafter proposes a draft tree, the target verifies it in one
forward pass (:mod:`decoder.verify`), the accepted path plus the bonus token is
committed, and the KV cache keeps only the accepted path. The cache always holds
every committed token but the last, whose KV is computed in the next pass.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

import torch
from transformers import DynamicCache

from drafting.accept import accept_greedy
from drafting.draft import Draft
from drafting.lifecycle import Drafter

from .model import TargetModel
from .result import GenerationResult, StepRecord
from .verify import accept_sampled, keep_accepted_kv, tree_attention_inputs

__all__ = ["speculative_generate", "greedy_generate"]


def _next_token(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    if temperature <= 0.0:
        return int(logits.argmax())
    probs = torch.softmax(logits.to(torch.float64) / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def _prefill(target: TargetModel, prompt_ids: Sequence[int]) -> tuple[DynamicCache, torch.Tensor]:
    """The prompt's KV cache and the logits after it (``[vocab_size]``)."""
    if len(prompt_ids) == 0:
        raise ValueError("prompt_ids is empty; generation needs at least one prompt token (e.g. BOS)")
    cache = DynamicCache(config=target.model.config)
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=target.device)  # [1, prompt_len]
    out = target.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    return cache, out.logits[0, -1]


def _commit(out: list[int], new: list[int], eos: frozenset[int], max_new_tokens: int) -> list[int]:
    """Append ``new`` to ``out``, cut after the first EOS and at ``max_new_tokens``; returns what was kept."""
    kept: list[int] = []
    for t in new:
        if len(out) >= max_new_tokens:
            break
        out.append(t)
        kept.append(t)
        if t in eos:
            break
    return kept


def _done(out: list[int], eos: frozenset[int], max_new_tokens: int) -> bool:
    return len(out) >= max_new_tokens or (bool(out) and out[-1] in eos)


def _check(max_new_tokens: int, budget: int, temperature: float) -> None:
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens}: must be >= 1")
    if budget < 0:
        raise ValueError(f"budget={budget}: must be >= 0")
    if temperature < 0:
        raise ValueError(f"temperature={temperature}: must be >= 0 (0 = greedy)")


def _generator(target: TargetModel, temperature: float, seed: int | None) -> torch.Generator | None:
    """The sampling generator, on the model's device where the draws happen; None when greedy."""
    if temperature == 0:
        return None
    gen = torch.Generator(device=target.device)
    if seed is not None:
        gen.manual_seed(seed)
    return gen


@torch.inference_mode()
def speculative_generate(
    target: TargetModel,
    prompt_ids: Sequence[int],
    drafter: Drafter,
    *,
    max_new_tokens: int = 128,
    budget: int = 16,
    chain: bool = False,
    temperature: float = 0.0,
    seed: int | None = None,
) -> GenerationResult:
    """Generate with draft trees verified by the target (batch size 1).

    Greedy (``temperature == 0``) output is token-identical to plain greedy
    decoding; with ``temperature > 0`` tokens follow the target's
    temperature-scaled distribution exactly (:func:`decoder.verify.accept_sampled`).

    Args:
        target: the loaded model.
        prompt_ids: ``[prompt_len]`` token ids (chat template already applied).
        drafter: any :class:`drafting.Drafter` (the merged one is :class:`drafting.DraftingService`); this call is
            one request of it (``start_request``, a ``step`` per verification step, ``stop_request``).
        max_new_tokens: most tokens generated, >= 1.
        budget: most draft nodes verified per step, >= 0 (0: plain decoding through this loop).
        chain: verify the drafter's best path only (as chain verifiers such as vLLM do).
        temperature: 0 for greedy, > 0 to sample.
        seed: seeds the sampling generator, which lives on the model's device (ignored when greedy).

    Raises:
        ValueError: for an empty prompt, ``max_new_tokens < 1``, ``budget < 0`` or a negative temperature.
    """
    _check(max_new_tokens, budget, temperature)
    gen = _generator(target, temperature, seed)
    eos = target.eos_token_ids
    start = time.perf_counter()
    cache, logits = _prefill(target, prompt_ids)
    out: list[int] = []
    _commit(out, [_next_token(logits, temperature, gen)], eos, max_new_tokens)
    result = GenerationResult(out, prefill_s=time.perf_counter() - start)
    req = f"generate-{uuid.uuid4().hex}"  # this request's key in the drafter
    drafter.start_request(req, list(prompt_ids) + out)  # the drafter holds the request's tokens from here on
    past_len = len(prompt_ids)  # cached tokens: all committed but the last
    kept: list[int] = []
    try:
        while not _done(out, eos, max_new_tokens):
            t0 = time.perf_counter()
            draft = drafter.step([req], [budget], tokens=[kept], chain=chain).drafts[0]
            t1 = time.perf_counter()
            path, bonus = _verify(target, cache, past_len, out[-1], draft, temperature, gen)
            new = [int(draft.token_ids[i]) for i in path] + [bonus]
            kept = _commit(out, new, eos, max_new_tokens)
            past_len += len(path) + 1
            result.steps.append(StepRecord(len(draft), len(kept), t1 - t0, time.perf_counter() - t1))
        drafter.step([req], [0], tokens=[kept])  # the last tokens committed: the output is whole when it stops
    finally:
        drafter.stop_request(req)
    result.wall_s = time.perf_counter() - start
    return result


def _verify(target: TargetModel, cache: DynamicCache, past_len: int, last: int, draft: Draft, temperature: float,
            gen: torch.Generator | None) -> tuple[list[int], int]:
    """One tree-attention forward pass over ``[last] + draft``; returns the accepted path and the bonus token."""
    ids = torch.tensor([[last] + draft.token_ids.tolist()], device=target.device)  # [1, 1 + N]
    if len(draft):
        mask, positions = tree_attention_inputs(draft, past_len, dtype=target.dtype, device=target.device)
        out = target.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                           use_cache=True)
    else:
        out = target.model(input_ids=ids, past_key_values=cache, use_cache=True)
    logits = out.logits[0]  # [1 + N, vocab_size]
    if temperature <= 0.0:
        path, bonus = accept_greedy(draft, logits.argmax(-1).cpu().numpy())
    else:
        probs = torch.softmax(logits.to(torch.float64) / temperature, dim=-1)  # [1 + N, vocab_size]
        path, bonus = accept_sampled(draft, probs, gen)
    keep_accepted_kv(cache, past_len, path)
    return path, bonus


@torch.inference_mode()
def greedy_generate(target: TargetModel, prompt_ids: Sequence[int], *, max_new_tokens: int = 128) -> GenerationResult:
    """Plain greedy decoding with a KV cache, one token per forward pass: the speed-up baseline.

    Raises:
        ValueError: for an empty prompt or ``max_new_tokens < 1``.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens}: must be >= 1")
    eos = target.eos_token_ids
    start = time.perf_counter()
    cache, logits = _prefill(target, prompt_ids)
    out: list[int] = []
    _commit(out, [int(logits.argmax())], eos, max_new_tokens)
    result = GenerationResult(out, prefill_s=time.perf_counter() - start)
    while not _done(out, eos, max_new_tokens):
        t0 = time.perf_counter()
        ids = torch.tensor([[out[-1]]], device=target.device)
        logits = target.model(input_ids=ids, past_key_values=cache, use_cache=True).logits[0, -1]
        _commit(out, [int(logits.argmax())], eos, max_new_tokens)
        result.steps.append(StepRecord(0, 1, 0.0, time.perf_counter() - t0))
    result.wall_s = time.perf_counter() - start
    return result
