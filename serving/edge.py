"""What our proposer owns inside an engine's process (:class:`DraftingEdge`): the drafter over the shared datastore and
those requests may name (:meth:`drafting.DraftingService.open`, ``CREST_DATASTORE`` and ``CREST_DATASTORES``), the live
layer's writer, the feed of the fleet's outputs and that of its online fits (its only threads, beside the datastores'
own), the engine's batch by request id (:class:`drafting.EngineBatch`), the token-keyed fallback for a vLLM without
our plugin (:class:`drafting.RowTracker`), and the draft head that reads the target's state.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import TYPE_CHECKING

import numpy as np

from drafting import Calibration, ChainDrafts, CostCurve, DraftHead, DraftingService, RowTracker
from drafting.head import DEFAULT_HEAD, target_rows
from toolkit.settings import Settings

if TYPE_CHECKING:
    import torch

    from .runner_hook import EngineView

__all__ = ["DraftingEdge"]

log = logging.getLogger(__name__)


class DraftingEdge:
    """The drafter of one engine process and what it owns (see the module docstring).

    Args:
        settings: the ``CREST_*`` settings. tokenizer: the target's tokenizer folder. max_model_len: the engine's
            context length. model_vocab: the engine model's vocabulary size.

    Attributes:
        service: the drafter. engine: the engine's batch by request id. rows: the token-keyed fallback (``None`` until
            a step comes without the plugin's view). feed: the fleet's outputs into the output index (``None``: off).
            fits: the fleet's online fits, folded into and read back (:class:`live.FitFeed`; ``None``: off).
        head: the draft head the core runs (``None``: none). head_steps: the steps drafted with the target's state.
        lm_head: the target's ``[vocab, hidden]`` LM-head rows, from ``load_model`` (``None`` before it).

    Raises:
        ValueError: for a malformed setting, naming its variable.
    """

    def __init__(self, settings: Settings, tokenizer: str, max_model_len: int, model_vocab: int) -> None:
        from transformers import AutoTokenizer

        from live import SHARE, FitFeed, LiveWriter, OutputFeed

        s = self.settings = settings
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        writer = LiveWriter(s.datastore, s.live_url or s.database_url) if s.live else None
        fits_shared = writer is not None and s.fits_shared and s.online_strength != 0
        outputs_bytes = None if s.outputs_mb is None else int(s.outputs_mb * 2**20)
        vocab = max(len(self.tokenizer), model_vocab)
        self.service = DraftingService.open(
            s.datastore, tokenizer=self.tokenizer, database_url=s.database_url, live=s.live,
            cache_bytes=int(s.cache_mb * 2**20), replicas=s.replicas_dir is not None, vocab_size=vocab,
            calibration=None if s.calibration is None else Calibration.load(s.calibration),
            outputs_bytes=outputs_bytes, min_score=s.min_score, max_tokens=max_model_len, live_writer=writer,
            datastores=s.datastores or (), max_open=s.datastores_open, online_strength=s.online_strength,
            online_share=SHARE if fits_shared else None)
        # the fleet's fit of each datastore: folded into by this process's verdicts, read back (live.fits)
        self.fits = FitFeed(self.service, s.live_url or s.database_url) if fits_shared else None
        self.feed = None
        if writer is not None and s.outputs_shared and outputs_bytes != 0:
            from live import LiveOutputs

            own = writer  # this process's outputs are in its index already
            self.feed = OutputFeed(self.service, LiveOutputs(s.datastore, s.database_url),
                                   skip_origin=lambda: own.origin)
        self.engine = self.service.engine_batch(vocab_size=vocab, chain=True)
        self.rows: RowTracker | None = None
        self.head: DraftHead | None = None
        self.lm_head: torch.Tensor | None = None
        self.head_steps = 0
        self._closed = False

    def step_by_id(self, view: EngineView, budgets: np.ndarray, curve: CostCurve | None) -> ChainDrafts:
        """Draft the engine's batch by request id (the plugin's view of the step): one native call."""
        states = state_rows = None
        if self.head is not None and view.states is not None:
            states, state_rows = self._states(view.states.rows, view.states.states, len(view.req_ids))
        made = self.engine.step(view.req_ids, view.tokens, view.lengths, budgets, finished=view.finished,
                                choose=view.choice, curve=curve, states=states, state_rows=state_rows)
        return made.chains()

    def step_by_rows(self, decoding: list[bool], tokens: np.ndarray, lengths: np.ndarray, budgets: np.ndarray,
                     curve: CostCurve | None) -> ChainDrafts:
        """Draft the engine's batch keyed by its rows' tokens (a vLLM without our plugin's view): the rows that
        decode, the others followed only."""
        if self.rows is None:
            log.warning("the crest vLLM plugin's runner hook is not in this process: requests are keyed by their rows' "
                        "tokens, and the target's state does not reach the drafter (see the log of serving.plugin)")
            self.rows = RowTracker(self.service)
        index = None if all(decoding) else [i for i, d in enumerate(decoding) if d]
        if index == []:
            self.rows.step(list(range(len(decoding))), tokens, lengths)
            return ChainDrafts([[] for _ in decoding], np.zeros(0))
        _, chains = self.rows.propose(index, tokens, lengths, budgets if index is None else budgets[index],
                                      curve=curve)
        if index is None:
            return chains
        out: list[list[int]] = [[] for _ in decoding]
        for i, drafted in zip(index, chains.token_ids):
            out[i] = drafted
        return ChainDrafts(out, chains.scores)

    def finish(self, req_ids: Collection[str]) -> None:
        """Stop requests that finished (their outputs join the index and the live layer)."""
        for rid in req_ids:
            self.service.stop_request(rid)

    def load_model(self, model) -> None:
        """Where a draft head fits the target (``CREST_HEAD``), hand the drafter the target's LM head (a float32 copy
        where the model holds another dtype), its token embedding and the head (:meth:`DraftingService.set_head`).

        Args:
            model: vLLM's target ``nn.Module``; its ``lm_head.weight`` (``[vocab, hidden]``) and input embedding are
                read.

        Raises:
            ValueError / FileNotFoundError: for a ``CREST_HEAD`` file that is missing, malformed or trained for
                another model (the default head is skipped, logged, where it does not fit).
        """
        weight = getattr(getattr(model, "lm_head", None), "weight", None)
        lm = self.lm_head = weight if weight is not None and weight.dim() == 2 else None
        choice = self.settings.head
        if lm is None or choice == "off" or (choice is None and not DEFAULT_HEAD.exists()):
            return
        draft_head = DraftHead.load(DEFAULT_HEAD if choice is None else choice)
        embedding = _embedding_rows(model)
        found = embedding is not None and tuple(embedding.shape) == tuple(lm.shape)
        # [vocab, hidden] float32 each, one array where the model ties them (the LM head's alone where none is found)
        rows, lm_head = target_rows(embedding if embedding is not None and found else lm, lm)
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

        self.service.set_head(draft_head, rows, lm_head, tokenizer_fingerprint(self.tokenizer))
        self.head = draft_head

    def _states(self, rows: list[int], states: torch.Tensor, n: int) -> tuple[np.ndarray, np.ndarray | None]:
        """``[n, hidden]`` float32 (a view of the engine's tensor where it is float32 on the CPU, and every row has a
        state) and the rows that have one (``None``: all)."""
        self.head_steps += 1
        given = np.ascontiguousarray(states.float().cpu().numpy())
        if len(rows) == n:
            return given, None
        full = np.zeros((n, given.shape[1]), np.float32)
        full[rows] = given
        has = np.zeros(n, np.bool_)
        has[rows] = True
        return full, has

    def close(self) -> None:
        """Stop the feed, then close the drafter (its writer flushes, its datastores close); final."""
        if self._closed:
            return
        self._closed = True
        if self.feed is not None:
            self.feed.close()
        if self.fits is not None:
            self.fits.close()  # a last fold
        self.service.close()


def _embedding_rows(model) -> torch.Tensor | None:
    """The target's token embedding ``[vocab, hidden]``: vLLM's decoder-only models hold it as ``model.embed_tokens``
    (transformers' as ``get_input_embeddings()``); ``None`` where neither is found."""
    inner = getattr(getattr(model, "model", None), "embed_tokens", None)
    if inner is None and callable(getattr(model, "get_input_embeddings", None)):
        inner = model.get_input_embeddings()
    weight = getattr(inner, "weight", None)
    return weight if weight is not None and weight.dim() == 2 else None
