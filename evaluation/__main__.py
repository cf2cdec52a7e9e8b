"""``python -m evaluation``: see :mod:`evaluation.cli`; ``python -m evaluation distill``: the target's own answers to a
prompt set, see :mod:`evaluation.distill`."""

import sys

if sys.argv[1:2] == ["distill"]:
    from .distill import main as distill

    sys.exit(distill(sys.argv[2:]))

from .cli import main  # noqa: E402

sys.exit(main())
