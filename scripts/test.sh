#!/usr/bin/env bash
# Set up, then run the test suite against a real PostgreSQL:
# $DATABASE_URL, else the server on 127.0.0.1:5432 (database test), else the embedded one.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
