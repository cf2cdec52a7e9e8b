"""Drafting: the merged drafter (datastore + live layer + each request's own tokens + this process's finished
outputs, every node scored by its calibrated acceptance probability, in the native core), the papers' drafters, and
the one lifecycle and draft type they share.

Public API: :class:`DraftingService` (the merged drafter: request-keyed, batched, thread-safe;
:meth:`DraftingService.open` composes it for a datastore name), its scorer :class:`Calibration`, the fault-tolerant
:class:`DatastoreSource` it draws on, the :class:`Draft` every drafter proposes (and its :class:`ScoreKind`), the
:class:`Drafter` protocol and :class:`NoDrafter` (plain decoding through the same loop); a draft model's candidate
tree for the ``heads`` source (:class:`HeadTree`) and the protocol of drafters that read the target's hidden states
(:class:`ReadsHiddenStates`, S4C's: :mod:`s4c`).
The papers' drafters are in :mod:`drafting.drafters`; the accept rule of verification in :mod:`drafting.accept`.
Drafting loads no torch.
"""

from .calibration import Calibration
from .draft import Draft, ScoreKind
from .heads import HeadTree
from .lifecycle import Drafter, NoDrafter, ReadsHiddenStates
from .service import DraftingService
from .source import DatastoreSource

__all__ = ["Calibration", "DatastoreSource", "Draft", "Drafter", "DraftingService", "HeadTree", "NoDrafter",
           "ReadsHiddenStates", "ScoreKind"]
