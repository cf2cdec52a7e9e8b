"""The decoder: per-prompt n-gram trie, merged draft trees, tree-attention verification, replay and benchmarks.

Public API: :func:`load_target`, :func:`speculative_generate` (lossless; greedy or sampled) and
:func:`greedy_generate` (the baseline), the :class:`Draft` every drafter proposes, and the merged
drafter with its fault-tolerant :class:`DatastoreSource`, and the :class:`Calibration` of node scores
(acceptance probabilities; :class:`decoder.service.DraftingService` takes it). The other drafters are in
``decoder.drafters``; the replay simulator in ``decoder.simulate``.
"""

from .calibration import Calibration
from .draft import Draft
from .drafters import DatastoreSource, MergedDrafter
from .generate import greedy_generate, speculative_generate
from .model import load_target

__all__ = ["Calibration", "Draft", "DatastoreSource", "MergedDrafter", "greedy_generate", "load_target", "speculative_generate"]
