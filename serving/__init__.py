"""Serving: our drafter inside inference engines, an application of drafting and datastore.

Public API: :class:`CrestProposer` (vLLM's ``custom_class`` speculative proposer,
``"serving.vllm_proposer.CrestProposer"``). Our vLLM plugin (:mod:`serving.plugin`, an entry point vLLM loads itself)
hands it vLLM's batch by request id; where it is not loaded, the proposer keys rows by their tokens
(:class:`drafting.RowTracker`). ``python -m serving`` (:mod:`serving.server`) serves an OpenAI-compatible endpoint
with it. Importing this package does not import vLLM.
"""

from .vllm_proposer import CrestProposer

__all__ = ["CrestProposer"]
