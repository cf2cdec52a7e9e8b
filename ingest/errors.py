"""The error a corpus source raises when it cannot be read at all.

It lives on its own so that every reader (:mod:`ingest.files`, :mod:`ingest.chat_files`,
:mod:`ingest.sources`) can raise it without importing the others; :mod:`ingest.sources` re-exports it.
"""

from __future__ import annotations

__all__ = ["SourceError"]


class SourceError(ValueError):
    """Raised when a source cannot be read at all (missing path, wrong column type)."""
