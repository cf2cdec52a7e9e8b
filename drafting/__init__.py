"""Drafting: the one lifecycle every drafter shares (:class:`DraftingService`: a request table, the request's tokens
in the native core, each argument checked once at the door), the methods it drafts with (the merged drafter,
:class:`MergedMethod`: datastore + live layer + each request's own tokens + this process's finished outputs, every node
scored by its calibrated acceptance probability, in the native core; the papers' drafters, :mod:`drafting.drafters`),
and the draft type they share.

Public API: :class:`DraftingService` (and the :class:`SteadyBatch` it prepares for an engine's steady steps),
:class:`MergedMethod` (:meth:`MergedMethod.open` composes it for a datastore
name) and its scorer :class:`Calibration`, the fault-tolerant :class:`DatastoreSource` it draws on, the
:class:`Draft` every drafter proposes (and its :class:`ScoreKind`), the :class:`Drafter` protocol, the
:class:`DraftMethod` protocol and the :class:`Step` a method drafts; a draft model's candidate tree
(:class:`HeadTree`) and the protocol of a draft model as a source (:class:`HeadSource`, S4C's: :mod:`s4c`). The
accept rule of verification is in :mod:`drafting.accept`. The live layer's automatic compaction
(:class:`LiveCompactor`, when :class:`CompactionPolicy`, and while the engine leaves it the cores: :class:`Anytime`,
:class:`WhenEngineIdle`) runs beside the service, and :class:`OutputFeed` feeds the
fleet's finished outputs into its output index. Drafting loads no torch.
"""

from .calibration import Calibration
from .compaction import Anytime, CompactionPolicy, EngineGate, LiveCompactor, WhenEngineIdle
from .draft import Draft, ScoreKind
from .heads import HeadSource, HeadTree
from .lifecycle import Drafter
from .merged import MergedMethod
from .method import DraftMethod, Step
from .output_feed import OutputFeed
from .service import DraftingService, SteadyBatch
from .source import DatastoreSource

__all__ = ["Anytime", "Calibration", "CompactionPolicy", "DatastoreSource", "Draft", "DraftMethod", "Drafter",
           "DraftingService", "EngineGate", "HeadSource", "HeadTree", "LiveCompactor", "MergedMethod", "OutputFeed",
           "ScoreKind", "SteadyBatch", "Step", "WhenEngineIdle"]
