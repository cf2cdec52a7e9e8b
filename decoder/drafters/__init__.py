"""Drafters, one module per proposer: none, prompt lookup (pld), n-gram trie, datastore, merged, rest."""

from .base import Drafter, NoDrafter, Proposal
from .datastore import DatastoreDrafter, DatastoreSource
from .merged import MergedDrafter
from .pld import PromptLookupDrafter
from .rest import RestDrafter
from .trie import TrieDrafter

__all__ = ["Drafter", "NoDrafter", "Proposal", "DatastoreDrafter", "DatastoreSource", "MergedDrafter",
           "PromptLookupDrafter", "RestDrafter", "TrieDrafter"]
