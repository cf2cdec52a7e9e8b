"""vLLM's model runner hands our proposer its batch by request id, and the target's state (applied by the plugin,
:mod:`serving.plugin`; vLLM 0.30-0.33, the V1 ``GPUModelRunner``, which ``CPUModelRunner`` inherits).

vLLM's ``custom_class`` hook passes a proposer token arrays only. The runner method that calls it,
``GPUModelRunner.propose_draft_token_ids``, holds what a drafter needs: ``self.input_batch.req_ids`` (each row's
request, in row order), the token array and counts, ``scheduler_output.finished_req_ids``, ``self.requests`` (each
request's ``sampling_params.extra_args``), ``sample_hidden_states`` and ``spec_decode_metadata``. :func:`install` wraps
it once per process: a runner whose drafter defines ``observe`` (:class:`serving.vllm_proposer.CrestProposer`) hands
it an :class:`EngineView` of the step just before vLLM calls its ``propose`` (all else as vLLM does it); any other
drafter is called through untouched. A drafter handed a view is closed when the process exits (its ``close``). It also
wraps ``_update_states``, which runs in every step: a step that schedules no tokens (its finished requests never reach
a ``propose``) hands the drafter those requests at once (``finish``). Each row's last accepted hidden state is selected
as vLLM's own Medusa branch selects it (``offset + len(tokens) - 1``, the offset advancing ``num_draft + 1`` a row);
nothing is copied but the selected rows' vectors (and not those, where the step verified no drafts).
"""

from __future__ import annotations

import functools
import inspect
import logging
import weakref
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from .plugin import closing_at_exit

__all__ = ["DATASTORE_ARG", "MODULE", "SHARED_ARG", "VERSIONS", "EngineView", "RowStates", "install", "select_rows"]

log = logging.getLogger(__name__)

VERSIONS = ((0, 30), (0, 34))
"""The vLLM versions this change applies to: from the first, below the second."""
MODULE = "vllm.v1.worker.gpu_model_runner"
"""The module it changes."""
_NEEDED = ("scheduler_output", "sampled_token_ids", "sample_hidden_states", "spec_decode_metadata")
_WRAPPED = "_crest_runner_hook"


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


class EngineView(NamedTuple):
    """What the runner holds at a step's ``propose``, by request id (read in place; valid during the call only; a
    tuple: made every step, at the cost of one).

    Attributes:
        req_ids: ``[rows]`` each row's request, in row order. sampled: ``[rows]`` the tokens each row sampled this
            step (empty: the row is not decoding yet). tokens: ``[>= rows, max_model_len]`` int32, each row's prompt
            and output. lengths: ``[>= rows]`` int32, each row's count of tokens in ``tokens`` (drafts excluded).
        finished: the requests that finished since the last step (vLLM's ``finished_req_ids``).
        extra_args: a request's ``sampling_params.extra_args`` by its id (``None``: none).
        states: the rows' last accepted hidden states (``None``: this step's do not fit its rows).
    """

    req_ids: list[str]
    sampled: list[list[int]]
    tokens: np.ndarray
    lengths: np.ndarray
    finished: Collection[str]
    extra_args: Callable[[str], dict | None]
    states: RowStates | None
    told: set[str]  # the extra_args keys whose bad values were logged (once each, per process)

    def choice(self, req_id: str) -> tuple[str | None, bool]:
        """Request ``req_id``'s datastores from its ``extra_args`` (offline ``SamplingParams(extra_args=...)``; the
        OpenAI server's ``vllm_xargs``): ``crest_datastore`` names one (a str), and ``crest_shared`` set to 0 or false
        turns the shared one off (:meth:`drafting.DraftingService.start_request`). A value of another type is ignored,
        said once per key; any other key is vLLM's or another plugin's."""
        args = self.extra_args(req_id) or {}
        name, shared = args.get(DATASTORE_ARG), args.get(SHARED_ARG, True)
        if name is not None and type(name) is not str:
            self._tell(DATASTORE_ARG, name, "a datastore's name (a string)")
            name = None
        if shared in (0, 1, "0", "1", "true", "false") or type(shared) is bool:
            shared = shared not in (0, "0", "false")  # vllm_xargs turns true and false into 1 and 0
        else:
            self._tell(SHARED_ARG, shared, "0 or 1")
            shared = True
        return name, bool(shared)

    def _tell(self, key: str, value: object, want: str) -> None:
        if key not in self.told:
            self.told.add(key)
            log.warning("a request's extra_args %s=%r is not %s: ignored (it drafts from the shared datastore)", key,
                        value, want)


DATASTORE_ARG, SHARED_ARG = "crest_datastore", "crest_shared"
"""The ``extra_args`` keys a request names its datastores by."""


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


def install(module: Any) -> str | None:
    """Wrap ``module.GPUModelRunner``'s ``propose_draft_token_ids`` and ``_update_states`` (see the module docstring),
    once per process.

    Returns:
        ``None`` when the hook is in place; else why it is not (this vLLM's runner lacks what the wrapper reads).
    """
    runner: Any = getattr(module, "GPUModelRunner", None)
    propose = getattr(runner, "propose_draft_token_ids", None)
    update = getattr(runner, "_update_states", None)
    if propose is None or update is None:
        return "its GPUModelRunner has no propose_draft_token_ids or _update_states"
    if getattr(propose, _WRAPPED, False):
        return None
    params = list(inspect.signature(propose).parameters)
    missing = [name for name in _NEEDED if name not in params]
    if missing:
        return f"its propose_draft_token_ids lacks {', '.join(missing)}"
    at = {name: params.index(name) for name in _NEEDED}  # positions in the bound call, self at 0
    warned: list[bool] = []  # a malformed step is told of once
    told: set[str] = set()  # and each extra_args key with a bad value
    seen: weakref.WeakSet = weakref.WeakSet()  # the drafters handed a view

    def argument(name: str, args: tuple, kwargs: dict):
        return args[at[name]] if len(args) > at[name] else kwargs[name]

    @functools.wraps(propose)
    def propose_draft_token_ids(*args, **kwargs):
        runner_self = args[0]
        drafter = getattr(runner_self, "drafter", None)
        observe = getattr(drafter, "observe", None)
        if observe is None:
            return propose(*args, **kwargs)
        if drafter not in seen:  # closed at exit: its live writer flushes, its threads stop
            seen.add(drafter)
            closing_at_exit(drafter)
        sampled = argument("sampled_token_ids", args, kwargs)
        meta = argument("spec_decode_metadata", args, kwargs)
        try:
            states: RowStates | None = select_rows(sampled, argument("sample_hidden_states", args, kwargs),
                                                   None if meta is None else list(meta.num_draft_tokens))
        except ValueError as exc:  # a layout this vLLM did not promise: draft without the state, never fail
            states = None
            if not warned:
                warned.append(True)
                log.warning("the target's state does not fit the batch (%s); this step drafts without it", exc)
        batch, requests = runner_self.input_batch, runner_self.requests
        observe(EngineView(list(batch.req_ids), sampled, batch.token_ids_cpu, batch.num_tokens_no_spec,
                           argument("scheduler_output", args, kwargs).finished_req_ids,
                           lambda rid: _extra_args(requests, rid), states, told))
        return propose(*args, **kwargs)

    @functools.wraps(update)
    def _update_states(self, scheduler_output, *args, **kwargs):
        finish = getattr(getattr(self, "drafter", None), "finish", None)
        if finish is not None and not scheduler_output.total_num_scheduled_tokens and \
                scheduler_output.finished_req_ids:  # no propose comes this step: its finished requests end now
            finish(scheduler_output.finished_req_ids)
        return update(self, scheduler_output, *args, **kwargs)

    setattr(propose_draft_token_ids, _WRAPPED, True)
    runner.propose_draft_token_ids = propose_draft_token_ids
    runner._update_states = _update_states
    return None


def _extra_args(requests: dict, req_id: str) -> dict | None:
    state = requests.get(req_id)
    params = None if state is None else getattr(state, "sampling_params", None)
    return None if params is None else getattr(params, "extra_args", None)
