"""Drafters, one module per proposer: none, prompt lookup (pld), n-gram trie, retrieval (CREST datastore or
REST suffix array), merged; and the fault-tolerant datastore source they draw on."""

from .base import Drafter, NoDrafter
from .merged import MergedDrafter
from .pld import PromptLookupDrafter
from .retrieval import RetrievalDrafter
from .source import DatastoreSource
from .trie import TrieDrafter

__all__ = ["Drafter", "NoDrafter", "DatastoreSource", "MergedDrafter", "PromptLookupDrafter", "RetrievalDrafter",
           "TrieDrafter"]
