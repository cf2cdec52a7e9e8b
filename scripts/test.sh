#!/usr/bin/env bash
# Set up, then run the product's tests (the first tier: `-m "not slow"`) against a real PostgreSQL:
# $DATABASE_URL, else the server on 127.0.0.1:5432 (database test), else the embedded one.
# `-m slow` runs the second tier instead (research/'s tests, the vLLM engines, the long builds; CI runs both tiers), and
# `-m "slow or not slow"` everything. Two test workers (pytest-xdist; each with a database of its own and pinned to its
# own CPUs), each module on one worker and the vLLM engines one at a time (tests/conftest.py). Other arguments go to
# pytest (a later -m replaces the default one): `-n 0` runs in this process, `-n 4` on four workers.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist loadgroup --no-loadscope-reorder -m "not slow" "$@"
