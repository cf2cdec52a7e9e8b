"""``python -m datastore``: administration, see :mod:`datastore.admin.cli`."""

import sys

from .admin.cli import main

sys.exit(main())
