"""Our drafter inside vLLM: a speculative proposer behind vLLM's ``custom_class`` hook (vLLM 0.30-0.33).

    LLM(model=..., speculative_config={"method": "custom_class",
                                       "model": "serving.vllm_proposer.CrestProposer",
                                       "num_speculative_tokens": 8})

vLLM builds the class with its ``VllmConfig``, calls ``load_model(model)`` and, after every step, ``propose(...)``. With
our plugin in the process (:mod:`serving.plugin`, loaded by vLLM itself), the model runner first hands the proposer the
step by request id (:meth:`CrestProposer.observe`, :class:`serving.runner_hook.EngineView`), and the batch is stopped,
started, followed and drafted by id in one native call (:class:`drafting.EngineBatch`), each new request from the
datastores its ``extra_args`` name. Without the plugin (another vLLM, or ``VLLM_PLUGINS`` leaving it out) the proposer
drafts as it did before the plugin, keying rows by their tokens (:class:`drafting.RowTracker`), and says so once.
Either way the chains are cut to the batch's goodput on this engine's measured step-cost curve (:mod:`drafting.cost`),
and a draft head reads the target's state where the plugin hands it over. Nothing but drafting runs in the engine's
process: it looks up, drafts and appends finished outputs; the live layers are compacted by ``python -m live serve``
beside it. The settings are the ``CREST_*`` variables (:class:`toolkit.settings.Settings`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass

import numpy as np

from drafting import ChainDrafts
from drafting.cost import EngineTimer, StepCostModel
from toolkit.settings import Settings

from .edge import DraftingEdge
from .runner_hook import EngineView

log = logging.getLogger(__name__)

__all__ = ["CrestProposer", "ProposeRecord"]


@dataclass(frozen=True)
class ProposeRecord:
    """One ``propose`` call, as :attr:`CrestProposer.on_step` receives it.

    Attributes:
        rows: the batch's rows. seconds: the call's wall seconds. chains: the drafts proposed (``None``: no row
            decoded). observed: the engine step this call timed for the step-cost model, ``(tokens verified, seconds,
            drafted)``, or ``None`` (a step with a prefill in it, or the first). by_id: whether the batch was stepped
            by request id (the plugin's view), else by its rows' tokens.
    """

    rows: int
    seconds: float
    chains: ChainDrafts | None
    observed: tuple[int, float, bool] | None
    by_id: bool = True


class CrestProposer:
    """vLLM ``custom_class`` proposer: the merged drafter's most probable chains (see the module docstring).

    Args:
        vllm_config: vLLM's ``VllmConfig`` (``speculative_config.num_speculative_tokens``,
            ``model_config.max_model_len``, ``model_config.tokenizer`` and ``model_config.get_vocab_size()`` are read).
        settings: the ``CREST_*`` settings (default: :meth:`toolkit.settings.Settings.from_env`).

    Attributes:
        edge: the drafter and what it owns (:class:`serving.edge.DraftingEdge`: the engine's batch, the token-keyed
            fallback, the head). service: its drafter (:class:`drafting.DraftingService`). cost: the engine's step-cost
            model. timer: what times the engine's steps into it. on_step: called after every ``propose`` with its
            :class:`ProposeRecord` (``None``: nothing).

    Raises:
        ValueError: for a malformed setting, naming its variable.
    """

    def __init__(self, vllm_config, settings: Settings | None = None) -> None:
        self.settings = s = settings or Settings.from_env()
        self.k = int(vllm_config.speculative_config.num_speculative_tokens)
        self.edge = DraftingEdge(s, vllm_config.model_config.tokenizer, int(vllm_config.model_config.max_model_len),
                                 int(vllm_config.model_config.get_vocab_size()))
        self.service = self.edge.service
        self.cost = StepCostModel()
        self.timer = EngineTimer(self.cost)
        self.on_step: Callable[[ProposeRecord], None] | None = None
        self._view: EngineView | None = None
        self._full: dict[int, np.ndarray] = {}  # [rows] int64 of k per batch size, read only

    def load_model(self, model) -> None:
        """Hand the drafter the target's LM head and a draft head that fits it (``CREST_HEAD``;
        :meth:`serving.edge.DraftingEdge.load_model`)."""
        self.edge.load_model(model)

    def observe(self, view: EngineView) -> None:
        """This step's batch by request id, handed over by the plugin's runner hook before :meth:`propose`."""
        self._view = view

    def finish(self, req_ids: Collection[str]) -> None:
        """Requests that finished in a step that proposes nothing (the plugin's runner hook): they end now."""
        self.edge.finish(req_ids)

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings=None) -> list[list[int]]:
        """One chain of draft token ids per row (``[]``: no draft).

        Args:
            sampled_token_ids: ``[num_rows]`` tokens sampled for each row this step (empty: the row is not decoding
                yet, e.g. a partial prefill; it gets no draft).
            num_tokens_no_spec: ``[>= num_rows]`` int32, tokens of each row (prompt + output), drafts excluded.
            token_ids_cpu: ``[>= num_rows, max_model_len]`` int32, each row's tokens (read in place, not copied).
            slot_mappings: unused.

        Returns:
            ``[num_rows]`` lists of at most ``num_speculative_tokens`` token ids.
        """
        start = self.timer.now()
        rows = len(sampled_token_ids)
        view, self._view = self._view, None
        decoding = [bool(sampled) for sampled in sampled_token_ids]
        budgets = self._budgets(rows) if all(decoding) else np.where(decoding, self.k, 0).astype(np.int64)
        adaptive = self.settings.adaptive
        if adaptive and self.cost.probe():  # a step without drafts, timed: the curve's draft_s
            budgets = np.zeros(rows, np.int64)
        curve = self.cost.curve if adaptive else None
        if view is not None and len(view.req_ids) == rows:
            chains = self.edge.step_by_id(view, budgets, curve)
        else:
            chains = self.edge.step_by_rows(decoding, token_ids_cpu, num_tokens_no_spec, budgets, curve)
        verified = rows + chains.nodes
        observed = self.timer.step(start, all(decoding), verified, rows)  # a decode-only step is timed
        if self.on_step is not None:
            self.on_step(ProposeRecord(rows, self.timer.now() - start, chains, observed, view is not None))
        return chains.token_ids

    def close(self) -> None:
        """Stop the drafter's threads and release what it opened (its datastores, the live writer, the feed); safe at
        interpreter exit, final (a second ``close`` does nothing)."""
        self.edge.close()

    def _budgets(self, rows: int) -> np.ndarray:
        """``[rows]`` int64, read only: each row's most draft tokens, ``k``. One shared array per batch size."""
        full = self._full.get(rows)
        if full is None:
            full = self._full[rows] = np.full(rows, self.k, np.int64)
            full.flags.writeable = False
        return full
