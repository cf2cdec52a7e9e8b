"""Studies over datastore configurations, an application of ingest, datastore and decoder: the storage study
(REST vs CREST vs merged, accept length against bytes on disk). ``python -m study storage``.

Public API: :class:`StudyGrid` (the points measured) and :func:`run_corpus` (measure one corpus);
the stages live in their modules (``study.corpus``, ``study.crest``, ``study.summary``, ``study.plots``).
"""

from toolkit.extras import require_all

require_all(("matplotlib", "duckdb", "torch"), "study", "the storage study (study)")

from .runner import StudyGrid, run_corpus  # noqa: E402

__all__ = ["StudyGrid", "run_corpus"]
