"""The live layer: every decoder process's finished outputs, shared across processes and hosts, compacted into a
datastore of their own that drafts beside the corpus's (SuffixDecoding's global tree of earlier responses,
https://arxiv.org/abs/2411.04975, §3, shared by a fleet and kept across restarts).

- the store (:mod:`live.store`): outputs in the ``live_outputs`` table, appended by a :class:`LiveWriter` (its role
  needs only ``INSERT``: ``python -m datastore grant-appender``), read back by :class:`LiveOutputs`;
- compaction (:mod:`live.compaction`, ``python -m live compact``): the newest outputs within a byte budget, built like a
  corpus into ``NAME.live``, or only the new ones into its delta ``NAME.live.delta``, swapped in atomically;
- the compactor (:class:`LiveCompactor`, when :class:`CompactionPolicy` says): each drafting process keeps the layer
  fresh, one compaction per datastore across the fleet (:class:`Anytime`, :class:`WhenEngineIdle`);
- the feed (:class:`OutputFeed`): the other processes' outputs into this process's output index;
- the fleet's online calibration (:class:`FitFeed`): every process's verdicts folded into one fit per datastore
  (``calibration_fits``; the appender's role folds, a reader's adopts).

Public API: the names in ``__all__``. Importing the package loads neither the build stack nor the drafting core.
"""

from .compactor import LiveCompactor
from .feed import OutputFeed
from .fits import SHARE, FitFeed, FitLearner
from .gates import Anytime, EngineGate, WhenEngineIdle
from .policy import CompactionPolicy
from .store import LiveOutputs, decode_output, encode_output
from .writer import LiveWriter

__all__ = ["SHARE", "Anytime", "CompactionPolicy", "EngineGate", "FitFeed", "FitLearner", "LiveCompactor",
           "LiveOutputs", "LiveWriter", "OutputFeed", "WhenEngineIdle", "decode_output", "encode_output"]
