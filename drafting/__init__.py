"""Drafting: the merged drafter (:class:`DraftingService`: a request table over the native core, each row's draft the
union of the datastore's tree, the live layer's, the request's own tokens and this process's finished outputs, every
node scored by its calibrated acceptance probability) and the lifecycle every drafter shares (:class:`Drafter`).

Public API: :class:`DraftingService` (:meth:`DraftingService.open` composes it for a datastore name), the
:class:`Batch` an engine steps it with, the :class:`EngineRows` an engine's rows are followed by, the
:class:`StepResult` a step returns, its scorer :class:`Calibration`, the :class:`DraftHead` that
estimates the target's next state for it, the fault-tolerant :class:`DatastoreSource` it
draws on, the :class:`Draft` every drafter proposes (:class:`Drafts`, :class:`ChainDrafts`, its :class:`ScoreKind`),
an engine's step-cost curve (:class:`CostCurve`), the :class:`Drafter` protocol and the :class:`TokenDrafter` base of
a drafter written in Python. The accept rule of verification is in :mod:`drafting.accept`. Loads no torch.
"""

from crest_native import EngineRows

from .calibration import Calibration
from .draft import ChainDrafts, CostCurve, Draft, Drafts, ScoreKind
from .head import DraftHead
from .lifecycle import Drafter, TokenDrafter
from .service import DraftingService
from .source import DatastoreSource
from .step import Batch, StepResult

__all__ = ["Batch", "Calibration", "ChainDrafts", "CostCurve", "DatastoreSource", "Draft", "DraftHead", "Drafter",
           "DraftingService", "Drafts", "EngineRows", "ScoreKind", "StepResult", "TokenDrafter"]
