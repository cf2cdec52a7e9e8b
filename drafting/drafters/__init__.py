"""The papers' own drafters, each a method of the one lifecycle (:class:`drafting.DraftingService`): the baselines the
merged drafter (:class:`drafting.merged.MergedMethod`) is measured against.

- :class:`PromptLookup` (``pld``): prompt lookup decoding, a chain copied from the sequence itself;
- :class:`Trie` (``trie``): the N-Gram-Trie paper's per-prompt trie, ranked by its own frequencies;
- :class:`Retrieval` (``datastore`` / ``rest``): CREST's stored tree or REST's retrieved tree, ranked by counts;
- :class:`NoDraft` (``none``): drafts nothing (plain decoding through the same loop).
"""

from .none import NoDraft
from .pld import PromptLookup
from .retrieval import Retrieval
from .trie import Trie

__all__ = ["NoDraft", "PromptLookup", "Retrieval", "Trie"]
