"""The papers' own drafters, each on the one lifecycle (:class:`drafting.lifecycle.RequestDrafter`): the baselines
the merged drafter (:class:`drafting.DraftingService`) is measured against.

- :class:`PromptLookupDrafter` (``pld``): prompt lookup decoding, a chain copied from the sequence itself;
- :class:`TrieDrafter` (``trie``): the N-Gram-Trie paper's per-prompt trie, ranked by its own frequencies;
- :class:`RetrievalDrafter` (``datastore`` / ``rest``): CREST's stored tree or REST's retrieved tree, ranked by counts.
"""

from .pld import PromptLookupDrafter
from .retrieval import RetrievalDrafter
from .trie import TrieDrafter

__all__ = ["PromptLookupDrafter", "RetrievalDrafter", "TrieDrafter"]
