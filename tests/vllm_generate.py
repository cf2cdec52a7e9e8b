"""Run by tests/test_vllm.py in a child process (vLLM's CPU build needs its own environment, see
serving.engine.cpu_env): greedy fp32 generation in vLLM, with or without our proposer; prints JSON."""

import json
import sys
from typing import TYPE_CHECKING, Any, cast

from vllm import LLM, SamplingParams

from decoder.model import export_checkpoint

if TYPE_CHECKING:
    from vllm.inputs import TokensPrompt
    from vllm.v1.metrics.reader import Counter


def main() -> None:
    job = json.loads(sys.argv[1])
    spec = None
    if job["k"]:
        spec = {"method": "custom_class", "model": "serving.vllm_proposer.CrestProposer",
                "num_speculative_tokens": job["k"]}
    llm = LLM(model=export_checkpoint(), dtype="float32", max_model_len=2048, seed=0,
              max_num_seqs=len(job["prompts"]), speculative_config=spec, disable_log_stats=False)
    prompts: list[TokensPrompt] = [{"prompt_token_ids": p} for p in job["prompts"]]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=job["max_tokens"]), use_tqdm=False)
    result: dict[str, Any] = {"outputs": [list(o.outputs[0].token_ids) for o in outs]}
    if spec:
        from serving.vllm_proposer import CrestProposer

        proposer = CrestProposer.newest()
        assert proposer is not None  # vLLM runs in this process (tests/test_vllm.py: cpu_env(in_process=True))
        result["stats"] = proposer.stats()
        # the accepted-token metric is a counter
        result["accepted"] = sum(cast("Counter", m).value for m in llm.get_metrics()
                                 if m.name == "vllm:spec_decode_num_accepted_tokens")
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
