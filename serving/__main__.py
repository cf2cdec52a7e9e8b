"""``python -m serving``: vLLM's OpenAI-compatible server with our proposer, see :mod:`serving.server`;
``python -m serving distill``: the target's own answers to a prompt set, see :mod:`serving.distill`."""

import sys

if sys.argv[1:2] == ["distill"]:
    from .distill import main as distill

    sys.exit(distill(sys.argv[2:]))

from .server import main  # noqa: E402

sys.exit(main())
