#!/usr/bin/env bash
# Set up, then run the main job: the full default datastore build (ShareGPT, --top-t 2M).
# Without DATABASE_URL it starts an embedded PostgreSQL in a per-user data directory.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m ingest build --top-t 2M "$@"
