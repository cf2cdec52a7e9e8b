"""The papers' own drafters, each behind the lifecycle every drafter shares (:class:`drafting.TokenDrafter`): the
baselines the merged drafter (:class:`drafting.DraftingService`) is measured against in the studies and the HF loop.

- :class:`Trie` (``trie``): the N-Gram-Trie paper's per-prompt trie, ranked by its own frequencies;
- :class:`NoDraft` (``none``): drafts nothing (plain decoding through the same loop);
- prompt lookup and a retrieval datastore ranked by its counts (CREST's stored tree, REST's retrieved tree) are the
  peers' (:class:`benchmarks.peer_drafters.PromptLookup`, :class:`benchmarks.peer_drafters.RetrievalDrafter`).
"""

from .none import NoDraft
from .trie import Trie

__all__ = ["NoDraft", "Trie"]
