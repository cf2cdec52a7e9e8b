"""Run by tests/serving/test_vllm_proposer.py in a child process (vLLM's CPU build needs its own environment, see
serving.server.cpu_env): greedy fp32 generation in vLLM, with or without our proposer; prints JSON."""

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from vllm import LLM, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # benchmarks/_proposer.py

from decoder.model import export_checkpoint  # noqa: E402

if TYPE_CHECKING:
    from vllm.inputs import TokensPrompt
    from vllm.v1.metrics.reader import Counter

    from datastore.registry import DatastoreInfo
    from datastore.shared import SharedDatastore
    from drafting import LiveCompactor


def main() -> None:
    job = json.loads(sys.argv[1])
    spec = None
    if job["k"]:
        spec = {"method": "custom_class", "model": job.get("proposer", "_proposer.InstrumentedProposer"),
                "num_speculative_tokens": job["k"]}
    llm = LLM(model=export_checkpoint(), dtype="float32", max_model_len=job.get("max_model_len", 2048), seed=0,
              max_num_seqs=job.get("max_num_seqs", len(job["prompts"])), speculative_config=spec,
              disable_log_stats=False, **({"num_gpu_blocks_override": job["blocks"]} if job.get("blocks") else {}))
    prompts: list[TokensPrompt] = [{"prompt_token_ids": p} for p in job["prompts"]]
    params: SamplingParams | list[SamplingParams] = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"])
    if job.get("temperatures"):  # one per prompt, each sampled request seeded by its position
        params = [SamplingParams(temperature=t, max_tokens=job["max_tokens"], seed=i)
                  for i, t in enumerate(job["temperatures"])]
    outs = llm.generate(prompts, params, use_tqdm=False)
    result: dict[str, Any] = {"outputs": [list(o.outputs[0].token_ids) for o in outs]}
    if job.get("after_live"):  # once the proposer's own compactor has built the live layer, generate again
        from _proposer import InstrumentedProposer

        proposer = InstrumentedProposer.last()
        assert proposer is not None
        lookups, compactor = proposer.method.lookups, cast("LiveCompactor", proposer.method.compactor)

        def live() -> "DatastoreInfo | None":
            client = cast("SharedDatastore | None", lookups.client if lookups is not None else None)
            return None if client is None else client.live

        def recorded() -> bool:  # the layer followed is one whose compaction (its child reaped) this proposer ran
            info = live()
            return info is not None and any(r.result and r.result["build_id"] == info.id for r in compactor.runs)

        deadline = time.monotonic() + 300
        while not recorded() and time.monotonic() < deadline:
            time.sleep(0.2)
        info = live()
        result["live_build"] = None if info is None else info.id
        result["compactions"] = [r.result for r in compactor.runs]
        outs = llm.generate(prompts, params, use_tqdm=False)
        result["outputs_after_live"] = [list(o.outputs[0].token_ids) for o in outs]
    if spec:
        from _proposer import InstrumentedProposer

        proposer = InstrumentedProposer.last()
        assert proposer is not None  # vLLM runs in this process (test_vllm_proposer.py: cpu_env(in_process=True))
        result["stats"] = proposer.stats()
        # the accepted-token metric is a counter
        result["accepted"] = sum(cast("Counter", m).value for m in llm.get_metrics()
                                 if m.name == "vllm:spec_decode_num_accepted_tokens")
    result["preemptions"] = sum(cast("Counter", m).value for m in llm.get_metrics() if m.name == "vllm:num_preemptions")
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
