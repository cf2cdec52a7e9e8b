"""``python -m ingest``: see :mod:`ingest.cli`."""

import sys

from .cli import main

sys.exit(main())
