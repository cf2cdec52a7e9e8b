"""Corpus ingest: sources -> token stream -> exact n-gram counts -> top-t -> token trees -> Postgres (CREST).

Public API: :class:`BuildConfig`, :func:`build_datastore` (and its :class:`BuildResult`). The stages live in their
modules: reading a corpus (``ingest.sources``, its files ``ingest.files``, chat files ``ingest.chat_files``, one chat
record ``ingest.chats``), ``ingest.counting``, ``ingest.occurrences``, ``ingest.ranking``, ``ingest.tokens``; the live
layer's compaction, ``live.compaction``.
"""

from toolkit.extras import require_all

require_all(("duckdb", "pyarrow", "ijson", "tqdm", "sqlalchemy", "alembic"), "ingest", "building datastores (ingest)")

from .build import build_datastore  # noqa: E402
from .config import BuildConfig, BuildResult  # noqa: E402

__all__ = ["BuildConfig", "BuildResult", "build_datastore"]
