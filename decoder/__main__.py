"""``python -m decoder``: see :mod:`decoder.cli`."""

import sys

from datastore.extras import require

require("torch", "hf", "python -m decoder (the HF decoding loop)")

from .cli import main  # noqa: E402

sys.exit(main())
