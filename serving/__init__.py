"""Serving: our drafter inside inference engines, an application of drafting and datastore.

Public API: :class:`CrestProposer` (vLLM's ``custom_class`` speculative proposer,
``"serving.vllm_proposer.CrestProposer"``) and :class:`RowTracker` (keys an engine's batch rows to drafting requests by
their tokens, where the engine gives no ids). Our vLLM plugin (:mod:`serving.plugin`, an entry point vLLM loads itself)
hands the proposer vLLM's batch by request id. ``python -m serving`` (:mod:`serving.server`) serves an
OpenAI-compatible endpoint with it. Importing this package does not import vLLM.
"""

from .rows import RowTracker
from .vllm_proposer import CrestProposer

__all__ = ["CrestProposer", "RowTracker"]
