"""``python -m research.study``: see :mod:`research.study.cli`."""

import sys

from .cli import main

sys.exit(main())
