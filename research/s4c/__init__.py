"""S4C: the multi-head draft model over the target's last hidden state (He et al., "S4C: Speculative Sampling with
Syntactic and Semantic Coherence for Efficient Inference of Large Language Models", §3), trained on this machine: its
heads (:mod:`research.s4c.heads`), the target's features over a corpus (:mod:`evaluation.features`), the training
(``python -m research.s4c train``) and the trained heads' store (:func:`load_heads`). As a fifth source of the merged
drafter it cost 12-14 ms a step on two cores and drafted in no engine (``docs/drafter-quality.md`` section 5), so the
drafter no longer runs it; the training and the features stay for a draft head of the target's own.
"""

from .heads import HeadsConfig, S4CHeads
from .store import load_heads

__all__ = ["HeadsConfig", "S4CHeads", "load_heads"]
