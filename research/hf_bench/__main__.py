"""``python -m research.hf_bench``: see :mod:`research.hf_bench.cli`."""

import sys

from toolkit.extras import require

require("torch", "hf", "python -m research.hf_bench (the HF decoding loop)")

from .cli import main  # noqa: E402

sys.exit(main())
