"""Studies over datastore configurations: the storage study (REST vs CREST vs merged, accept length vs bytes)."""

from .corpus import CORPORA, EVAL_SETS, StudyCorpus, prefix_end, prepare_corpus, rest_index
from .crest import CrestPoint, FullBuild, Materialized, full_build, materialize
from .runner import StudyGrid, StudyRow, replay_accept_length, run_corpus
from .summary import Verdict, assess, best_within, interpolate

__all__ = ["CORPORA", "EVAL_SETS", "StudyCorpus", "prefix_end", "prepare_corpus", "rest_index", "CrestPoint",
           "FullBuild", "Materialized", "full_build", "materialize", "StudyGrid", "StudyRow", "replay_accept_length",
           "run_corpus", "Verdict", "assess", "best_within", "interpolate"]
