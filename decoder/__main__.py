"""``python -m decoder``: see :mod:`decoder.cli`."""

import sys

from .cli import main

sys.exit(main())
