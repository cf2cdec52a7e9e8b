"""``python -m serving``: vLLM's OpenAI-compatible server with our proposer, see :mod:`serving.server`."""

import sys

from .server import main

sys.exit(main())
