"""Drafters, one module per proposer: none, prompt lookup (pld), the n-gram trie and retrieval (CREST datastore
or REST suffix array) as their papers rank them; the fault-tolerant datastore source they draw on; and the one
request lifecycle they share. The merged drafter is :class:`decoder.service.DraftingService`."""

from .base import Drafter, NoDrafter, RequestDrafter
from .pld import PromptLookupDrafter
from .retrieval import RetrievalDrafter
from .source import DatastoreSource
from .trie import TrieDrafter

__all__ = ["Drafter", "NoDrafter", "RequestDrafter", "DatastoreSource", "PromptLookupDrafter", "RetrievalDrafter",
           "TrieDrafter"]
