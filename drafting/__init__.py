"""Drafting: the merged drafter (:class:`DraftingService`: a request table over the native core, each row's draft the
union of the datastore's tree, the live layer's, the request's own tokens and this process's finished outputs, every
node scored by its calibrated acceptance probability) and the lifecycle every drafter shares (:class:`Drafter`).

Public API: :class:`DraftingService` (:meth:`DraftingService.open` composes it for a datastore name) over its
:class:`DatastoreCatalog` (the shared datastore and those a request names), the :class:`EngineBatch` an engine steps it
with by request id, the :class:`Batch` an engine that gives no ids steps it with by its rows (:class:`EngineRows`;
:class:`RowTracker` keys such rows to requests by their tokens), the
:class:`StepResult` a step returns, its scorer :class:`Calibration`, the :class:`DraftHead` that
estimates the target's next state for it, the fault-tolerant :class:`DatastoreSource` it
draws on, the :class:`Draft` every drafter proposes (:class:`Drafts`, :class:`ChainDrafts`, its :class:`ScoreKind`),
an engine's step-cost curve (:class:`CostCurve`), the :class:`Drafter` protocol and the :class:`TokenDrafter` base of
a drafter written in Python. The accept rule of verification is in :mod:`drafting.accept`. Loads no torch.
"""

from crest_native import EngineRows

from .calibration import Calibration
from .catalog import DatastoreCatalog
from .draft import ChainDrafts, CostCurve, Draft, Drafts, ScoreKind
from .engine import EngineBatch
from .head import DraftHead
from .lifecycle import Drafter, TokenDrafter
from .rows import RowTracker
from .service import DraftingService, FitKey
from .source import DatastoreSource
from .step import Batch, StepResult

__all__ = ["Batch", "Calibration", "ChainDrafts", "CostCurve", "DatastoreCatalog", "DatastoreSource", "Draft",
           "DraftHead", "Drafter", "DraftingService", "Drafts", "EngineBatch", "EngineRows", "FitKey", "RowTracker",
           "ScoreKind", "StepResult", "TokenDrafter"]
