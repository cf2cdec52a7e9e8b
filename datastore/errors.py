"""The datastore's errors: one base class, so a decoder can survive every datastore fault with one ``except``.

Drafting is optional for a speculative decoder: verification decides every
token, so a decoder that catches :class:`DatastoreError` and drafts without the
datastore produces the same output. Each subclass also derives from the
built-in exception it refines (``LookupError``, ``ValueError``, ``RuntimeError``).

Bad input from the caller is not a datastore fault: :class:`InvalidContext` (a ``ValueError``) is raised for a
context that is not a sequence of token ids of the tokenizer's vocabulary, and is never swallowed as a fault.
"""

from __future__ import annotations

__all__ = ["DatastoreError", "BadDatabaseUrl", "DatastoreNotFound", "TokenizerMismatch", "BuildConflict", "ClosedError"]


class DatastoreError(Exception):
    """Base of every error raised by the datastore package for a datastore that cannot serve."""


class DatabaseUnavailable(DatastoreError, RuntimeError):
    """No Postgres server can be reached or started (the message names the URL, password masked, and the fix)."""


class BadDatabaseUrl(DatastoreError, ValueError):
    """The database URL is not a libpq connection string (the message shows it, password masked, and the fix)."""


class DatastoreNotFound(DatastoreError, LookupError):
    """No ready datastore has the requested name (it was never built, or it was dropped)."""


class TokenizerMismatch(DatastoreError, ValueError):
    """The caller's tokenizer differs from the one the datastore was built with."""


class SchemaMismatch(DatastoreError, RuntimeError):
    """The database's registry schema is not the revision this client reads (run ``python -m datastore migrate``)."""


class CodecError(DatastoreError, ValueError):
    """A blob is not a valid, intact token tree of a known format version."""


class LookupFailed(DatastoreError, RuntimeError):
    """The server refused a lookup for another reason (e.g. the role lost its ``SELECT`` grant)."""


class BuildConflict(DatastoreError, RuntimeError):
    """Another build of the same datastore name is running."""


class InvalidContext(ValueError):
    """A lookup's context is not a sequence of token ids in the tokenizer's vocabulary (a caller's bug, not a
    datastore fault: it is raised, never turned into "no draft")."""


class ClosedError(RuntimeError):
    """A client or drafter was used after its ``close()`` (or after its ``with`` block): closing is final, open a new
    one (a caller's bug, not a datastore fault: it is raised, never turned into "no draft")."""
