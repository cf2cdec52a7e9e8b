"""``python -m evaluation``: see :mod:`evaluation.cli`."""

import sys

from toolkit.extras import require

require("torch", "hf", "python -m evaluation (the HF decoding loop)")

from .cli import main  # noqa: E402

sys.exit(main())
