"""S4C: the multi-head draft model over the target's last hidden state (He et al., "S4C: Speculative Sampling with
Syntactic and Semantic Coherence for Efficient Inference of Large Language Models", §3), trained on this machine.

Public API: :class:`S4CHeads` (the three heads, :mod:`s4c.heads`), :func:`load_heads` (trained heads by name, checked
against the target) and :class:`S4CDrafter` (S4C alone, with the continuous verification tree, §3.2). The merged
drafter takes the heads as one more source: :class:`MergedS4CDrafter`. ``python -m s4c train`` trains the heads.
"""

from .drafter import S4CDrafter
from .heads import HeadsConfig, S4CHeads
from .merged import MergedS4CDrafter, merged_service
from .store import load_heads
from .tree import TreeShape

__all__ = ["HeadsConfig", "MergedS4CDrafter", "S4CDrafter", "S4CHeads", "TreeShape", "load_heads", "merged_service"]
