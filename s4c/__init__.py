"""S4C: the multi-head draft model over the target's last hidden state (He et al., "S4C: Speculative Sampling with
Syntactic and Semantic Coherence for Efficient Inference of Large Language Models", §3), trained on this machine.

Public API: :class:`S4CHeads` (the three heads, :mod:`s4c.heads`), :func:`load_heads` (trained heads by name, checked
against the target), :class:`HeadsSource` (the heads as a source of the merged drafter) and :class:`S4CMethod` (S4C
alone, with the continuous verification tree, §3.2); :func:`s4c_drafter` and :func:`merged_s4c` make the drafters.
``python -m s4c train`` trains the heads.
"""

from .drafter import HeadsSource, S4CMethod, merged_s4c, s4c_drafter
from .heads import HeadsConfig, S4CHeads
from .store import load_heads
from .tree import TreeShape

__all__ = ["HeadsConfig", "HeadsSource", "S4CHeads", "S4CMethod", "TreeShape", "load_heads", "merged_s4c",
           "s4c_drafter"]
