#!/usr/bin/env bash
# The peer benchmark in one command: installs vLLM's CPU build, arctic-inference (SuffixDecoding) and SGLang's
# wheel (its NGRAM drafter), builds
# what is missing (the `sharegpt` and `code` datastores, REST's indexes of both corpora, the greedy references),
# then prints the table (benchmarks/peers.py; extra flags are passed through). Each step is skipped when its
# output exists. Without DATABASE_URL the datastores go to the embedded PostgreSQL.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-vllm.sh --arctic --sglang
PY=.venv/bin/python
STDLIB=$($PY -c "import sysconfig; print(sysconfig.get_paths()['stdlib'])")
$PY -m datastore migrate
$PY -m datastore stats --name sharegpt > /dev/null 2>&1 || $PY -m ingest build --top-t 2M --quiet
$PY -m datastore stats --name code > /dev/null 2>&1 || $PY -m ingest build --name code --source code --path "$STDLIB" --top-t 2M --quiet
for corpus in sharegpt code; do
  dir=$($PY -c "from datastore import load_tokenizer; from benchmarks.rest_index import default_index_dir; print(default_index_dir(load_tokenizer(), '$corpus'))")
  if [ ! -d "$dir" ]; then
    if [ "$corpus" = code ]; then $PY -m benchmarks.rest_index --source code --path "$STDLIB" --quiet
    else $PY -m benchmarks.rest_index --quiet; fi
  fi
done
$PY -m evaluation references
exec $PY -m benchmarks.peers "$@"
