"""Our vLLM proposer with its figures, for benchmarks and tests that run vLLM in their own process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``): :class:`InstrumentedProposer` times each step, records each cut and keeps a
weak reference to the last one vLLM built, so the caller can read :meth:`InstrumentedProposer.stats` after a run.

    speculative_config={"method": "custom_class", "model": "_proposer.InstrumentedProposer", ...}
    # with benchmarks/ on sys.path; then InstrumentedProposer.last().stats()
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import ClassVar

import numpy as np
from proposer_step import agreed

from datastore.lookup import LookupClient
from drafting.draft import ChainDrafts
from drafting.service import STEP_TIMES_KEPT
from serving.vllm_proposer import CrestProposer


class InstrumentedProposer(CrestProposer):
    """:class:`serving.vllm_proposer.CrestProposer` that times each ``propose`` (the hook vLLM calls), counts its
    steps, their cuts, the tokens it proposed and the calibrated expected accepted tokens of its chains (what vLLM's
    accepted-token counter is compared with: the calibration's check in the engine)."""

    _last: ClassVar[weakref.ref | None] = None

    def __init__(self, vllm_config, config=None, clock: Callable[[], float] = time.perf_counter) -> None:
        super().__init__(vllm_config, config, clock)
        self.steps = 0
        self.step_s = 0.0
        self.tokens_proposed = 0
        self.times: deque = deque(maxlen=STEP_TIMES_KEPT)
        self.cuts: deque = deque(maxlen=STEP_TIMES_KEPT)
        self.expected = 0.0  # the calibrated expected accepted tokens of every chain proposed (the sum of its scores)
        self.native: deque = deque(maxlen=STEP_TIMES_KEPT)  # each step's seconds in the native core
        self._drafts: ChainDrafts | None = None
        # each decode step the step-cost model timed: (rows, tokens verified, seconds, whether it had drafts)
        self.cost_log: deque = deque(maxlen=STEP_TIMES_KEPT)
        drafting = self.rows.propose
        observe = self.cost.observe

        def logged(tokens: int, seconds: float, *, drafted: bool) -> None:
            self.cost_log.append((self._last_rows, tokens, seconds, drafted))  # the timed step's rows (set after)
            observe(tokens, seconds, drafted=drafted)

        self.cost.observe = logged  # type: ignore[method-assign]

        def kept(*args, **kwargs):  # the step's drafts (cut to the engine's step cost), counted after the timed call
            ids, drafts = drafting(*args, **kwargs)
            self._drafts = drafts
            return ids, drafts

        self.rows.propose = kept  # type: ignore[method-assign]
        InstrumentedProposer._last = weakref.ref(self)

    @classmethod
    def last(cls) -> InstrumentedProposer | None:
        """The proposer built last in this process while vLLM still holds it, else ``None``."""
        return None if cls._last is None else cls._last()

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
        core = self.method.stats.core_s
        start = time.perf_counter()
        out = super().propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings)
        spent = time.perf_counter() - start
        self.step_s += spent
        self.times.append(spent)
        self.native.append(self.method.stats.core_s - core)
        self.steps += 1
        self.tokens_proposed += sum(map(len, out))
        if self._drafts is not None:  # what the engine is asked to verify, and the lowest score kept
            scores = self._drafts.scores
            self.expected += float(scores.sum())
            self.cuts.append(max(self.config.min_score, float(scores.min())) if len(scores) else 1.0)
            self._drafts = None
        return out

    def reset_times(self) -> None:
        """Forget the timed steps so far (a run's figures then cover that run only)."""
        self.times.clear()
        self.native.clear()
        self.cost_log.clear()
        self.service.stats.step_times.clear()

    def stats(self) -> dict:
        """Steps, the hook's ``propose`` p50/p99 and mean (ms), the service step's p50, the round trip's share, the
        steps drafted from the replicas, tokens proposed, the cuts, the step-cost fit, the rows followed, faults, the
        output index and the datastore client's figures."""
        st, merged = self.service.stats, self.method.stats
        lookups = self.method.lookups
        client = lookups.client if lookups is not None else None
        times = np.asarray(self.times) * 1e3
        service = np.asarray(st.step_times) * 1e3
        native = np.asarray(self.native) * 1e3
        return {"steps": self.steps, "step_ms_mean": 1e3 * self.step_s / max(self.steps, 1),
                "propose_ms_p50": float(np.median(times)) if len(times) else 0.0,
                "propose_ms_p99": float(np.percentile(times, 99)) if len(times) else 0.0,
                "service_step_ms_p50": float(np.median(service)) if len(service) else 0.0,
                # the drafting call itself (core_s: the native call, timed around it) and the rest of the hook
                "native_ms_p50": float(np.median(native)) if len(native) else 0.0,
                "outside_ms_p50": float(np.median(times - native)) if len(native) else 0.0,
                "lookup_share": merged.lookup_s / max(st.step_s, 1e-12), "lookup_s": merged.lookup_s,
                "replica_steps": merged.replica_steps, "round_trip_steps": merged.round_trip_steps,
                "tokens_proposed": self.tokens_proposed, "expected_accepted": self.expected,
                "cut_mean": float(np.mean(self.cuts)) if self.cuts else 0.0,
                "cut_p90": float(np.percentile(self.cuts, 90)) if self.cuts else 0.0,
                "cost_steps": self.cost.observed, "step_cost": _cost(self.cost.curve),
                "rows_started": self.rows.started, "rows_moved": self.rows.moved, "rows_stopped": self.rows.stopped,
                "faults": dict(lookups.faults) if lookups is not None else {},
                "outputs": self.service.outputs_info(),
                "datastore": client.stats() if isinstance(client, LookupClient) else None}


def _cost(curve) -> dict | None:
    """A step-cost curve as JSON: its points (tokens, ms), tail (ms per token) and a step's jump with drafts (ms)."""
    if curve is None:
        return None
    return {"tokens": curve.tokens.tolist(), "ms": (1e3 * curve.seconds).tolist(), "tail_ms": 1e3 * curve.tail,
            "draft_ms": 1e3 * curve.draft_s}


class OracleCutProposer(InstrumentedProposer):
    """A bound, not a method: ours with each chain cut exactly where the target's greedy output leaves it. The chains
    are the defaults' before the step-cost cut (``CREST_ADAPTIVE=0``; the floor ``CREST_MIN_SCORE`` kept), each trimmed
    to its prefix that the saved greedy reference continues with (``benchmarks/references.py``: vLLM fp32's own greedy
    outputs, checked output by output by the benchmark). Every token the engine verifies is accepted and none that
    would be is left out, so no cut of the same chains (no calibration, no step-cost curve) accepts more in fewer
    verified tokens: its tok/s is what a perfect cut of ours reaches. Greedy only. A row whose prompt has no reference
    (the benchmark's warm-up) drafts nothing.

    Args:
        vllm_config: as :class:`serving.vllm_proposer.CrestProposer`.
        config: the settings (default: the environment's), ``adaptive`` always off.
        references: ``(prompt, output)`` token lists (default: Spec-Bench's and HumanEval's saved references,
            ``_refs.REFERENCES``, 128 new tokens each: past them a row drafts nothing).
        clock: as :class:`serving.vllm_proposer.CrestProposer`.
    """

    def __init__(self, vllm_config, config=None, references: list[tuple[list[int], list[int]]] | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        from dataclasses import replace

        from serving.vllm_proposer import ProposerConfig

        # before any step-cost cut, whatever the settings say: a cut chain trimmed is no bound
        super().__init__(vllm_config, replace(config or ProposerConfig.from_env(), adaptive=False), clock)
        if references is None:
            from _refs import load_references

            references = [(r.prompt, r.output) for name in ("spec_bench", "humaneval") for r in load_references(name)]
        self._outputs = {tuple(prompt): output for prompt, output in references}
        self._prompt_lengths = sorted({len(prompt) for prompt, _ in references})
        self._of_request: dict[int, tuple[int, list[int]] | None] = {}  # request id -> (prompt length, output)
        self.trimmed = 0  # draft tokens cut off by the reference

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
        out = super().propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings)
        held = self.rows.held
        for i, chain in enumerate(out):
            if not chain:
                continue
            row = token_ids_cpu[i, :int(num_tokens_no_spec[i])]
            ref = self._reference(held[i], row)
            kept = [] if ref is None else agreed(chain, ref[1][len(row) - ref[0]:])
            self.trimmed += len(chain) - len(kept)
            out[i] = kept
        return out

    def _reference(self, request: int, row: np.ndarray) -> tuple[int, list[int]] | None:
        """The (prompt length, greedy output) of the request on a row holding ``row`` (its tokens so far)."""
        if request not in self._of_request:
            found = None
            for n in self._prompt_lengths:
                if n < len(row) and (output := self._outputs.get(tuple(row[:n].tolist()))) is not None:
                    found = (n, output)
                    break
            self._of_request[request] = found
        return self._of_request[request]
