"""``python -m study``: see :mod:`study.cli`."""

import sys

from .cli import main

sys.exit(main())
