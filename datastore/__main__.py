"""``python -m datastore``: see :mod:`datastore.cli`."""

import sys

from .cli import main

sys.exit(main())
