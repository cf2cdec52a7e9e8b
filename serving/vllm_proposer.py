"""Our drafter inside vLLM: a speculative proposer behind vLLM's ``custom_class`` hook (vLLM 0.22-0.33).

    LLM(model=..., speculative_config={"method": "custom_class",
                                       "model": "serving.vllm_proposer.CrestProposer",
                                       "num_speculative_tokens": 8})

vLLM builds the class with its ``VllmConfig``, calls ``load_model(model)`` and, after every step, ``propose(...)``; it
verifies one chain of draft tokens per row. Rows carry no request id, so :class:`serving.rows.RowTracker` keys them by
their tokens, and each step drafts the whole batch in one :class:`drafting.DraftingService` step (the merged drafter:
datastore, live layer, each row's own tokens and the finished outputs), its chains cut to the batch's goodput on this
engine's measured step-cost curve (:mod:`serving.cost`). The settings are the ``CREST_*`` variables
(:class:`toolkit.settings.Settings`, read when vLLM builds the proposer). Inside vLLM the proposer also receives the
target's state: each row's last accepted hidden state every step (:mod:`serving.model_state`) and the LM-head rows from
``load_model``; and on vLLM's CPU platform it fixes the rejection sampler's expansion of temperatures
(:mod:`serving.vllm_fixes`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from drafting import Calibration, ChainDrafts, DraftHead, DraftingService
from drafting.head import DEFAULT_HEAD, target_rows
from live import Anytime, CompactionPolicy, EngineGate, LiveCompactor, OutputFeed, WhenEngineIdle
from toolkit.settings import Settings

from .cost import EngineTimer, StepCostModel
from .rows import RowTracker

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    import torch

    from .model_state import RowStates

__all__ = ["CrestProposer", "ProposeRecord"]


@dataclass(frozen=True)
class ProposeRecord:
    """One ``propose`` call, as :attr:`CrestProposer.on_step` receives it.

    Attributes:
        rows: the batch's rows. seconds: the call's wall seconds. chains: the drafts proposed (``None``: no row
            decoded). observed: the engine step this call timed for the step-cost model, ``(tokens verified, seconds,
            drafted)``, or ``None`` (a step with a prefill in it, or the first).
    """

    rows: int
    seconds: float
    chains: ChainDrafts | None
    observed: tuple[int, float, bool] | None


class CrestProposer:
    """vLLM ``custom_class`` proposer: the merged drafter's most probable chains.

    Args:
        vllm_config: vLLM's ``VllmConfig`` (``speculative_config.num_speculative_tokens``,
            ``model_config.max_model_len``, ``model_config.tokenizer`` and ``model_config.get_vocab_size()`` are
            read).
        settings: the ``CREST_*`` settings (default: :meth:`toolkit.settings.Settings.from_env`).

    Attributes:
        service: the drafter. rows: the rows' tracker. cost: the engine's step-cost model. timer: what times the
            engine's steps into it (:class:`serving.cost.EngineTimer`). gate: what the compactor waits for.
        row_states: this step's :class:`serving.model_state.RowStates` (``None``: none handed over: outside vLLM, a
            vLLM without what the hook reads, or a step whose states did not fit its rows).
        lm_head: ``[vocab, hidden]`` the target's LM-head rows (tied to its embedding where the model ties them), from
            ``load_model``; ``None`` before it or where the model has none.
        head: the draft head that scores each row's depth-1 tokens by the target's state (``CREST_HEAD``;
            :class:`drafting.DraftHead`; the core runs it), set by ``load_model``; ``None``: none (the calibration
            alone).
            head_steps: the steps drafted with the head's estimates.
        on_step: called after every ``propose`` with its :class:`ProposeRecord` (``None``: nothing; the benchmarks'
            per-step figures).

    Raises:
        ValueError: for a malformed setting, naming its variable.
    """

    def __init__(self, vllm_config, settings: Settings | None = None) -> None:
        from transformers import AutoTokenizer

        if "vllm" in sys.modules:  # built inside vLLM's engine process, beside its rejection sampler
            from .model_state import install_state_hook
            from .vllm_fixes import fix_cpu_sampling

            fix_cpu_sampling()
            install_state_hook()
        self.row_states: RowStates | None = None
        self.lm_head: torch.Tensor | None = None
        self.head: DraftHead | None = None
        self.head_steps = 0
        self.settings = s = settings or Settings.from_env()
        self.k = int(vllm_config.speculative_config.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        tokenizer = AutoTokenizer.from_pretrained(vllm_config.model_config.tokenizer)
        self._tokenizer = tokenizer
        writer = None
        if s.live:
            from live import LiveWriter

            writer = LiveWriter(s.datastore, s.live_url or s.database_url)
        self.gate: EngineGate = Anytime()  # told of every step
        compactor = None
        if s.live and s.compact:
            idle_s = s.compact_idle_s if s.compact_idle_s is not None else _engine_idle_s()
            self.gate = WhenEngineIdle(idle_s) if idle_s > 0 else Anytime()
            policy = CompactionPolicy(outputs=s.compact_outputs, after_s=s.compact_after_s, gap_s=s.compact_gap_s,
                                      fold_tokens=s.compact_fold_tokens, top_t=s.live_top_t,
                                      max_bytes=s.live_max_bytes)
            compactor = LiveCompactor(s.datastore, s.compact_url or s.database_url, policy, self.gate)
        outputs_bytes = None if s.outputs_mb is None else int(s.outputs_mb * 2**20)
        self.service = DraftingService.open(
            s.datastore, tokenizer=tokenizer, database_url=s.database_url, live=s.live,
            cache_bytes=int(s.cache_mb * 2**20), replicas=s.replicas_dir is not None,
            vocab_size=max(len(tokenizer), int(vllm_config.model_config.get_vocab_size())),
            calibration=None if s.calibration is None else Calibration.load(s.calibration),
            outputs_bytes=outputs_bytes, min_score=s.min_score, max_tokens=self.max_model_len, live_writer=writer,
            compactor=compactor)
        self.feed = None
        if writer is not None and s.outputs_shared and outputs_bytes != 0:
            from live import LiveOutputs

            own = writer  # this process's outputs are in its index already
            self.feed = OutputFeed(self.service, LiveOutputs(s.datastore, s.database_url),
                                   skip_origin=lambda: own.origin)
        self.rows = RowTracker(self.service)
        self.cost = StepCostModel()
        self.timer = EngineTimer(self.cost)
        self.on_step: Callable[[ProposeRecord], None] | None = None
        # a step's allowances: [rows] int64 of k, one per batch size, read only. A row near max_model_len drafts
        # fewer: the core cuts each draft to what fits, so nothing here reads the rows' counts
        self._full: dict[int, np.ndarray] = {}

    def load_model(self, model) -> None:
        """Keep the target's LM-head rows (:attr:`lm_head`): vLLM hands over the target module itself; then, where a
        draft head fits the target (``CREST_HEAD``), hand the drafter the LM head (a float32 copy where the model
        holds another dtype) and the head's calibration (:meth:`drafting.DraftingService.set_model`).

        Args:
            model: vLLM's target ``nn.Module``; its ``lm_head.weight`` (``[vocab, hidden]``) and input embedding are
                read.

        Raises:
            ValueError / FileNotFoundError: for a ``CREST_HEAD`` file that is missing, malformed or trained for
                another model (the default head is skipped, logged, where it does not fit).
        """
        head = getattr(getattr(model, "lm_head", None), "weight", None)
        self.lm_head = head if head is not None and head.dim() == 2 else None
        choice = self.settings.head
        if self.lm_head is None or choice == "off" or (choice is None and not DEFAULT_HEAD.exists()):
            return
        draft_head = DraftHead.load(DEFAULT_HEAD if choice is None else choice)
        embedding = _embedding_rows(model)
        found = embedding is not None and tuple(embedding.shape) == tuple(self.lm_head.shape)
        # [vocab, hidden] float32 each, one array where the model ties them (the LM head's alone where none is found)
        rows, lm_head = target_rows(embedding if embedding is not None and found else self.lm_head, self.lm_head)
        if not draft_head.fits(lm_head):
            if choice is not None:
                raise ValueError(f"CREST_HEAD={choice} was trained for another model; train one for this model with "
                                 "python -m evaluation train-head, or set CREST_HEAD=off")
            log.info("the shipped draft head was trained for another model; drafting without the target's state")
            return
        if not found:
            log.warning("the target's token embedding is not where the proposer looks; drafting without its state")
            return
        from toolkit.tokenizer import tokenizer_fingerprint

        self.service.set_head(draft_head, rows, lm_head, tokenizer_fingerprint(self._tokenizer))
        self.head = draft_head

    def observe_states(self, states: RowStates | None) -> None:
        """This step's rows' last accepted hidden states, handed over before :meth:`propose` by the runner's hook
        (:func:`serving.model_state.install_state_hook`); ``None``: none this step."""
        self.row_states = states

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
        self.gate.step()
        rows = len(sampled_token_ids)
        index: list[int] | None = None  # every row decodes (the steady case)
        if not all(sampled_token_ids):
            index = [i for i, sampled in enumerate(sampled_token_ids) if sampled]
        started, verified, chains = self.rows.started, rows, None
        if index is None or index:
            budgets = self._budgets(rows if index is None else len(index))
            adaptive = self.settings.adaptive
            if adaptive and self.cost.probe():  # a step without drafts, timed: the curve's draft_s
                budgets = np.zeros(len(budgets), np.int64)
            states = None if self.head is None else self._row_states(rows, index)
            _, chains = self.rows.propose(index, token_ids_cpu, num_tokens_no_spec, budgets,
                                          curve=self.cost.curve if adaptive else None,  # the service's min_score
                                          states=states)
            verified += chains.nodes
            if index is None:
                out = chains.token_ids
            else:
                out = [[] for _ in sampled_token_ids]
                for i, tokens in zip(index, chains.token_ids):
                    out[i] = tokens
        else:
            self.rows.step(index, token_ids_cpu, num_tokens_no_spec)
            out = [[] for _ in sampled_token_ids]
        # a decode-only step (no prefill in it) is timed
        observed = self.timer.step(start, self.rows.started == started and index is None, verified, rows)
        if self.on_step is not None:
            self.on_step(ProposeRecord(rows, self.timer.now() - start, chains, observed))
        return out

    def _row_states(self, rows: int, index: list[int] | None) -> np.ndarray | None:
        """``[rows drafted, hidden]`` float32: each drafted row's last accepted state (:attr:`row_states`, used once),
        which the core's head reads with the row's bonus token; ``None`` where none fit the drafted rows (of the
        batch's ``rows``, ``index``: as :meth:`propose`'s)."""
        given, self.row_states = self.row_states, None
        if given is None or given.rows != (list(range(rows)) if index is None else index):
            return None
        self.head_steps += 1
        # a view of the engine's tensor where it is float32 on the CPU: the head runs in the core, on this thread
        return np.ascontiguousarray(given.states.float().cpu().numpy())

    def _budgets(self, rows: int) -> np.ndarray:
        """``[rows]`` int64, read only: each row's most draft tokens, ``k``. One shared array per batch size."""
        full = self._full.get(rows)
        if full is None:
            full = self._full[rows] = np.full(rows, self.k, np.int64)
            full.flags.writeable = False
        return full


def _embedding_rows(model) -> torch.Tensor | None:
    """The target's token embedding ``[vocab, hidden]``: vLLM's decoder-only models hold it as ``model.embed_tokens``
    (transformers' as ``get_input_embeddings()``); ``None`` where neither is found."""
    inner = getattr(getattr(model, "model", None), "embed_tokens", None)
    if inner is None and callable(getattr(model, "get_input_embeddings", None)):
        inner = model.get_input_embeddings()
    weight = getattr(inner, "weight", None)
    return weight if weight is not None and weight.dim() == 2 else None


def _engine_idle_s() -> float:
    """``CREST_COMPACT_IDLE_S``'s default: 1 s on vLLM's CPU platform (its OpenMP threads hold every core), else 0
    (compact whenever due)."""
    if "vllm" not in sys.modules:
        return 0.0
    from vllm.platforms import current_platform

    return 1.0 if current_platform.is_cpu() else 0.0

