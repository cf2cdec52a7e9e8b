"""The target's own state, handed to our proposer every step: each row's last accepted hidden state.

vLLM's ``custom_class`` hook passes token ids only, but the runner method that calls it,
``GPUModelRunner.propose_draft_token_ids`` (``CPUModelRunner`` inherits it), holds ``sample_hidden_states``: the
final-normed hidden states the LM head read this step, one per sampled position, and ``spec_decode_metadata``, each
row's draft length. :func:`install_state_hook` wraps that method once per process. Where the runner's drafter defines
``observe_states`` (:class:`serving.vllm_proposer.CrestProposer`), the wrapper selects each row's last accepted
position as vLLM's own Medusa branch does (``offset + len(tokens) - 1``, the offset advancing ``num_draft + 1`` a
row) and hands the drafter a :class:`RowStates` before calling through; any other drafter is called through untouched.
Nothing is copied but the selected rows' vectors (and not those, where the step verified no drafts).

A vLLM whose runner lacks what the wrapper reads is told once in the log; the proposer then drafts without the state.
"""

from __future__ import annotations

import functools
import inspect
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["RowStates", "install_state_hook"]

log = logging.getLogger(__name__)

_WRAPPED = "_crest_state_hook"
_NEEDED = ("sampled_token_ids", "sample_hidden_states", "spec_decode_metadata")


@dataclass(frozen=True)
class RowStates:
    """One step's last accepted hidden state of the rows that sampled.

    Attributes:
        rows: ``[n]`` the batch rows (positions in ``sampled_token_ids``) that sampled a token this step, ascending.
        states: ``[n, hidden]`` the target's final-normed hidden state at each of those rows' last accepted token:
            the state whose LM-head logits gave the row's last sampled token (the bonus token); the runner's dtype
            and device.
    """

    rows: list[int]
    states: torch.Tensor


def select_rows(sampled_token_ids: list[list[int]], sample_hidden_states: torch.Tensor,
                num_draft_tokens: list[int] | None) -> RowStates:
    """Each sampling row's last accepted state, selected as vLLM's Medusa branch selects it.

    Args:
        sampled_token_ids: ``[rows]`` the tokens each row sampled this step (empty: the row sampled none).
        sample_hidden_states: ``[positions, hidden]`` one state per sampled position: one per row where the step
            verified no drafts, else ``num_draft + 1`` per row.
        num_draft_tokens: ``[rows]`` each row's draft length this step (``spec_decode_metadata.num_draft_tokens``), or
            None where the step verified no drafts.

    Raises:
        ValueError: when the positions do not add up to ``sample_hidden_states``'s rows.
    """
    rows = [i for i, tokens in enumerate(sampled_token_ids) if tokens]
    if num_draft_tokens is None or sample_hidden_states.shape[0] == len(sampled_token_ids):
        if sample_hidden_states.shape[0] != len(sampled_token_ids):
            raise ValueError(f"{sample_hidden_states.shape[0]} sampled states for {len(sampled_token_ids)} rows")
        if len(rows) == len(sampled_token_ids):
            return RowStates(rows, sample_hidden_states)
        return RowStates(rows, _take(sample_hidden_states, rows))
    index, offset = [], 0
    for num_draft, tokens in zip(num_draft_tokens, sampled_token_ids):
        if tokens:
            index.append(offset + len(tokens) - 1)
        offset += num_draft + 1
    if offset != sample_hidden_states.shape[0]:
        raise ValueError(f"{sample_hidden_states.shape[0]} sampled states for {offset} positions")
    return RowStates(rows, _take(sample_hidden_states, index))


def _take(states: torch.Tensor, index: list[int]) -> torch.Tensor:
    """``states[index]``: ``index_select`` over an index made through numpy (at a few rows, a third of what advanced
    indexing with a fresh ``torch.tensor`` costs)."""
    return states.index_select(0, torch.from_numpy(np.array(index, dtype=np.int64)).to(states.device))


def install_state_hook() -> bool:
    """Wrap vLLM's ``GPUModelRunner.propose_draft_token_ids`` (once per process) so that a drafter with
    ``observe_states(states: RowStates | None)`` receives the rows' states every step, before its ``propose`` (None: a
    step whose states do not fit its rows, warned about once; the drafter drafts it without them).

    Returns:
        True when the hook is in place; False (logged once, as a warning) when this vLLM's runner lacks the method or
        its ``sampled_token_ids``, ``sample_hidden_states`` or ``spec_decode_metadata`` arguments.
    """
    try:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except ImportError as exc:
        log.warning("the target's state cannot reach the proposer (%s); it drafts without it", exc)
        return False
    method = getattr(GPUModelRunner, "propose_draft_token_ids", None)
    if method is None:
        log.warning("vLLM's GPUModelRunner has no propose_draft_token_ids; the proposer drafts without the "
                    "target's state")
        return False
    if getattr(method, _WRAPPED, False):
        return True
    params = list(inspect.signature(method).parameters)
    missing = [name for name in _NEEDED if name not in params]
    if missing:
        log.warning("vLLM's propose_draft_token_ids lacks %s; the proposer drafts without the target's state",
                    ", ".join(missing))
        return False
    at = {name: params.index(name) for name in _NEEDED}  # positions in the bound call, self at 0

    warned: list[bool] = []  # a malformed step is told of once

    def argument(name: str, args: tuple, kwargs: dict):
        return args[at[name]] if len(args) > at[name] else kwargs[name]

    @functools.wraps(method)
    def propose_draft_token_ids(*args, **kwargs):
        drafter = getattr(args[0], "drafter", None)
        observe = getattr(drafter, "observe_states", None)
        if observe is not None:
            meta = argument("spec_decode_metadata", args, kwargs)
            try:
                states = select_rows(argument("sampled_token_ids", args, kwargs),
                                     argument("sample_hidden_states", args, kwargs),
                                     None if meta is None else list(meta.num_draft_tokens))
            except ValueError as exc:  # a layout this vLLM did not promise: draft without the state, never fail
                states = None
                if not warned:
                    warned.append(True)
                    log.warning("the target's state does not fit the batch (%s); this step drafts without it", exc)
            observe(states)
        return method(*args, **kwargs)

    setattr(propose_draft_token_ids, _WRAPPED, True)
    runner: Any = GPUModelRunner  # typed or not, as vLLM is installed or not
    runner.propose_draft_token_ids = propose_draft_token_ids
    return True
