"""``python -m live compact``: see :mod:`live.cli`."""

import sys

from .cli import main

sys.exit(main())
