"""Our drafter inside vLLM: a speculative proposer behind vLLM's ``custom_class`` hook (vLLM 0.22-0.33).

    LLM(model=..., speculative_config={"method": "custom_class",
                                       "model": "serving.vllm_proposer.CrestProposer",
                                       "num_speculative_tokens": 8})

vLLM builds the class with its ``VllmConfig``, calls ``load_model(model)`` and then,
after every step, ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu,
slot_mappings=...)``; it verifies one chain of draft tokens per row (an empty list:
no draft). Nothing else of vLLM is used. Rows carry no request id, so
:class:`serving.rows.RowTracker` keys them by their tokens. Each step, every row is
drafted by one :class:`decoder.service.DraftingService` call: one batched lookup in
the shared datastore (most answered by its cache), then one call of the native core for
the batch: per row the merge of the datastore's tree, the live layer's (every process's
earlier outputs, compacted), the row's own longest earlier match (its suffix automaton) and
the match in this process's finished outputs (learned the moment a request finishes), and
the chain with the largest expected accepted length under the calibrated probabilities,
cut before the first node scoring below ``CREST_MIN_SCORE`` or below the break-even score
of this batch size on this engine (so a large batch on a CPU drafts only near-certain
tokens, and throughput does not fall below no speculation). Every datastore fault drafts
without the datastore, so vLLM's output never changes.

Configuration (environment variables, read when vLLM builds the proposer):

``CREST_DATASTORE``      datastore name (default ``sharegpt``);
``DATABASE_URL``         where it lives (default: the embedded server);
``CREST_MIN_SCORE``      a probability: chains stop before the first node whose calibrated acceptance probability
                         (:mod:`decoder.calibration`) is below it (default 0.1, with ``num_speculative_tokens``
                         8: chosen on the fit half, ``benchmarks/choose_k.py``);
``CREST_ADAPTIVE``       ``1`` (default): also stop before the first node scoring below the step's
                         break-even score (:class:`serving.cost.StepCostModel`, fitted to the engine's
                         own step times: a token drafted below it costs more than it brings); ``0``: off;
``CREST_CACHE_MB``       the tree cache's bound, MiB (default 64);
``CREST_LIVE``           ``1`` (default): also draft from the live layer ``<CREST_DATASTORE>.live`` (once
                         ``python -m ingest compact-live`` has built it) and append every finished request's
                         output to it from a background thread (:mod:`datastore.live`); ``0``: off;
``CREST_LIVE_URL``       the role that appends outputs (INSERT on ``live_outputs`` only; default ``DATABASE_URL``);
``CREST_OUTPUTS_MB``     the bound of this process's index of finished outputs, MiB (default 64; 0: off);
``CREST_PROPOSER_STATS`` a JSON file the proposer rewrites every 50 steps and at exit with its
                         figures (steps, per-step time and the datastore's share, cache hit rate).
"""

from __future__ import annotations

import atexit
import json
import os
import time
import weakref
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from datastore.live import LiveWriter, live_name
from datastore.lookup import LookupClient
from datastore.shared import SharedDatastore
from decoder.core import default_core
from decoder.drafters import DatastoreSource
from decoder.service import STEP_TIMES_KEPT, DraftingService

from .cost import StepCostModel
from .rows import RowTracker

__all__ = ["CrestProposer", "ProposerConfig"]


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
    cache_mb: float = 64.0
    stats_path: str | None = None
    live: bool = True
    live_url: str | None = None
    outputs_mb: float = 64.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_score <= 1.0:
            raise ValueError(f"CREST_MIN_SCORE={self.min_score}: must be a probability in [0, 1]")
        if self.cache_mb < 0:
            raise ValueError(f"CREST_CACHE_MB={self.cache_mb}: must be >= 0")
        if self.outputs_mb < 0:
            raise ValueError(f"CREST_OUTPUTS_MB={self.outputs_mb}: must be >= 0")

    @classmethod
    def from_env(cls) -> ProposerConfig:
        """Read the ``CREST_*`` variables and ``DATABASE_URL``."""
        env = os.environ

        def number(name: str, default: float) -> float:
            try:
                return float(env.get(name, default))
            except ValueError:
                raise ValueError(f"{name}={env[name]!r} is not a number") from None

        def flag(name: str, default: str) -> bool:
            value = env.get(name, default)
            if value not in ("0", "1"):
                raise ValueError(f"{name}={value!r}: must be 0 or 1")
            return value == "1"

        return cls(datastore=env.get("CREST_DATASTORE", "sharegpt"), database_url=env.get("DATABASE_URL") or None,
                   min_score=number("CREST_MIN_SCORE", 0.1), adaptive=flag("CREST_ADAPTIVE", "1"),
                   cache_mb=number("CREST_CACHE_MB", 64.0),
                   stats_path=env.get("CREST_PROPOSER_STATS") or None,
                   live=flag("CREST_LIVE", "1"), live_url=env.get("CREST_LIVE_URL") or None,
                   outputs_mb=number("CREST_OUTPUTS_MB", 64.0))


class CrestProposer:
    """vLLM ``custom_class`` proposer: the merged drafter's most probable chains (datastore, live layer, each row's
    own tokens, this process's finished outputs).

    Args:
        vllm_config: vLLM's ``VllmConfig`` (``speculative_config.num_speculative_tokens``,
            ``model_config.max_model_len`` and ``model_config.tokenizer`` are read).
        config: the settings; default :meth:`ProposerConfig.from_env`.

    Raises:
        ValueError: for a malformed setting.
    """

    _newest: weakref.ref | None = None  # held weakly: a proposer lives as long as vLLM keeps it

    def __init__(self, vllm_config, config: ProposerConfig | None = None) -> None:
        from transformers import AutoTokenizer

        self.config = config or ProposerConfig.from_env()
        self.k = int(vllm_config.speculative_config.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        tokenizer = AutoTokenizer.from_pretrained(vllm_config.model_config.tokenizer)
        cfg = self.config
        self.source = DatastoreSource(lambda: SharedDatastore.open(
            cfg.datastore, tokenizer=tokenizer, database_url=cfg.database_url, cache_bytes=int(cfg.cache_mb * 2**20)),
            reopen_in_background=True)  # vLLM waits for every propose: never on a connection attempt
        live = writer = None
        if cfg.live:  # not compacted yet is the normal first state of a live layer: no warning for that
            live = DatastoreSource(lambda: SharedDatastore.open(
                live_name(cfg.datastore), tokenizer=tokenizer, database_url=cfg.database_url),
                reopen_in_background=True, optional=True)
            writer = LiveWriter(cfg.datastore, cfg.live_url or cfg.database_url)
        core = default_core(outputs_bytes=int(cfg.outputs_mb * 2**20))
        self.service = DraftingService(self.source, core=core, min_score=cfg.min_score, live=live, live_writer=writer)
        self.rows = RowTracker(self.service)
        self.cost = StepCostModel()
        self._last_end: float | None = None  # when the previous propose returned ...
        self._last_tokens = 0                # ... and how many tokens the engine then verified
        self.cuts: deque = deque(maxlen=STEP_TIMES_KEPT)  # recent cuts (max of min_score, break-even)
        self.steps = 0
        self.step_s = 0.0
        self.tokens_proposed = 0
        if cfg.stats_path:
            atexit.register(self.write_stats)
        CrestProposer._newest = weakref.ref(self)

    @classmethod
    def newest(cls) -> CrestProposer | None:
        """The proposer built last in this process while vLLM still holds it (benchmarks and tests read its
        :meth:`stats` when vLLM runs in-process, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``), else ``None``."""
        return None if cls._newest is None else cls._newest()

    def load_model(self, model) -> None:
        """Nothing to load: the drafts come from the datastore and the prompts."""

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings=None) -> list[list[int]]:
        """One chain of draft token ids per row (``[]``: no draft).

        Args:
            sampled_token_ids: ``[num_rows]`` tokens sampled for each row this step (empty: the row
                is not decoding yet, e.g. a partial prefill; it gets no draft).
            num_tokens_no_spec: ``[>= num_rows]`` int, tokens of each row (prompt + output), drafts excluded.
            token_ids_cpu: ``[>= num_rows, max_model_len]`` int, each row's tokens.
            slot_mappings: unused.

        Returns:
            ``[num_rows]`` lists of at most ``num_speculative_tokens`` token ids.
        """
        start = time.perf_counter()
        rows, budgets = [], []
        for i, sampled in enumerate(sampled_token_ids):
            if not sampled:
                continue
            n = int(num_tokens_no_spec[i])
            rows.append((i, token_ids_cpu[i, :n]))
            budgets.append(max(0, min(self.k, self.max_model_len - n - 1)))
        started = self.rows.started
        req_ids = self.rows.step(rows)
        if self._last_end is not None and self.rows.started == started and len(rows) == len(sampled_token_ids):
            self.cost.observe(self._last_tokens, start - self._last_end)  # a decode-only step: no prefill in it
        cut = max(self.config.min_score, self.cost.break_even(len(rows)) if self.config.adaptive else 0.0)
        self.cuts.append(cut)
        drafts = self.service.propose(list(zip(req_ids, budgets)), chain=True, min_score=cut) if rows else []
        out: list[list[int]] = [[] for _ in sampled_token_ids]
        for (i, _), draft in zip(rows, drafts):
            out[i] = draft.token_ids.tolist()
            self.tokens_proposed += len(draft)
        self._last_tokens = sum(1 + len(d) for d in out)
        self.steps += 1
        self._last_end = time.perf_counter()
        self.step_s += self._last_end - start
        if self.config.stats_path and self.steps % 50 == 0:
            self.write_stats()
        return out

    def stats(self) -> dict:
        """Steps, mean and median step time (ms), the datastore lookup's share, tokens proposed, the tree
        cache's hit rate and the rows followed."""
        st = self.service.stats
        client = self.source.client
        times = np.asarray(st.step_times) * 1e3
        return {"steps": self.steps, "step_ms_mean": 1e3 * self.step_s / max(self.steps, 1),
                "service_step_ms_p50": float(np.median(times)) if len(times) else 0.0,
                "lookup_share": st.lookup_s / max(st.step_s, 1e-12), "lookup_s": st.lookup_s,
                "tokens_proposed": self.tokens_proposed,
                "cut_mean": float(np.mean(self.cuts)) if self.cuts else 0.0,
                "cut_p90": float(np.percentile(self.cuts, 90)) if self.cuts else 0.0,
                "cost_steps": self.cost.observed,
                "step_cost": self.cost.coefficients, "rows_started": self.rows.started, "rows_moved": self.rows.moved,
                "rows_stopped": self.rows.stopped,
                "faults": dict(self.source.faults), "outputs": self.service.core.outputs_info(),
                "datastore": client.stats() if isinstance(client, LookupClient) else None,
                "config": asdict(self.config)}

    def write_stats(self) -> None:
        """Write :meth:`stats` to ``CREST_PROPOSER_STATS`` (atomically; nothing when it is unset)."""
        if self.config.stats_path is None:
            return
        path = Path(self.config.stats_path)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.stats(), indent=1))
        tmp.replace(path)
