"""Studies over datastore configurations, an application of ingest, datastore and decoder: the storage study
(REST vs CREST vs merged, accept length against bytes on disk; ``python -m research.study storage``) and the
corpus-size study
(accept length, build cost and lookup latency against corpus tokens; ``python -m research.study corpus-size``).

Public API: :class:`StudyGrid` (the points measured) and :func:`run_corpus` (measure one corpus); for the corpus-size
study, :func:`corpus_ladder` (the sizes), :class:`ScalingGrid` (what is measured at each) and :func:`run_size` (measure
one size). The stages live in their modules (``research.study.corpus``, ``research.study.crest``,
``research.study.summary``, ``research.study.plots``,
``research.study.sizes``, ``research.study.scaling``, ``research.study.measure``).
"""

from toolkit.extras import require_all

require_all(("matplotlib", "duckdb", "torch"), "study", "the storage study (study)")

from .runner import StudyGrid, run_corpus  # noqa: E402
from .scaling import ScalingGrid, run_size  # noqa: E402
from .sizes import corpus_ladder  # noqa: E402

__all__ = ["ScalingGrid", "StudyGrid", "corpus_ladder", "run_corpus", "run_size"]
