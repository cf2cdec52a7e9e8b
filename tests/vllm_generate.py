"""Run by tests/test_vllm.py in a child process (vLLM's CPU build needs its own environment, see
serving.engine.cpu_env): greedy fp32 generation in vLLM, with or without our proposer; prints JSON."""

import json
import sys

from vllm import LLM, SamplingParams

from decoder.model import export_checkpoint


def main() -> None:
    job = json.loads(sys.argv[1])
    spec = None
    if job["k"]:
        spec = {"method": "custom_class", "model": "serving.vllm_proposer.CrestProposer",
                "num_speculative_tokens": job["k"]}
    llm = LLM(model=export_checkpoint(), dtype="float32", max_model_len=2048, seed=0,
              max_num_seqs=len(job["prompts"]), speculative_config=spec, disable_log_stats=False)
    outs = llm.generate([{"prompt_token_ids": p} for p in job["prompts"]],
                        SamplingParams(temperature=0.0, max_tokens=job["max_tokens"]), use_tqdm=False)
    result = {"outputs": [list(o.outputs[0].token_ids) for o in outs]}
    if spec:
        from serving.vllm_proposer import CrestProposer

        result["stats"] = CrestProposer.instances[-1].stats()
        result["accepted"] = sum(m.value for m in llm.get_metrics()
                                 if m.name == "vllm:spec_decode_num_accepted_tokens")
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
