"""``python -m research.s4c``: see :mod:`research.s4c.cli`."""

import sys

from toolkit.extras import require

require("torch", "hf", "python -m research.s4c (training the S4C heads)")

from .cli import main  # noqa: E402

sys.exit(main())
