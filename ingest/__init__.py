"""Corpus ingest: sources -> token stream -> exact n-gram counts -> top-t -> token trees -> Postgres (CREST)."""

from .build import BuildConfig, BuildResult, build_datastore
from .counting import KeptNgrams, count_top_t
from .occurrences import tag_occurrences
from .sources import SOURCES, SourceError, SourceReport, iter_documents
from .tokens import SEPARATOR, TokenStreamWriter, open_stream
from .trees import build_trees

__all__ = [
    "BuildConfig", "BuildResult", "build_datastore", "KeptNgrams", "count_top_t", "tag_occurrences",
    "SOURCES", "SourceError", "SourceReport", "iter_documents", "SEPARATOR", "TokenStreamWriter",
    "open_stream", "build_trees",
]
