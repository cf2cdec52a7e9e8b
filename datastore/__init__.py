"""The datastore's read path: CREST's token trees in PostgreSQL, looked up for drafting.

Public API: :class:`Datastore` (a read-only lookup client on one connection) and :class:`SharedDatastore` (the same
lookups for every thread of a process: a pool, a tree cache, build swaps followed at once), the :class:`Match` they
return and its :class:`TokenTree`, the :class:`Retrieval` of a drafting step (the datastore's candidates, its live
layer's and its delta's matches, one round trip), and :class:`DatastoreError` (every fault). How a
datastore's layers are named (its live layer's, its delta's) is :mod:`datastore.layers`. Writing, DDL, grants and
migrations live in :mod:`datastore.admin`; building in :mod:`ingest`; the live layer's store, writer and compaction in
:mod:`live`.
"""

from .client import Datastore
from .errors import DatastoreError
from .lookup import Retrieval
from .shared import SharedDatastore
from .tree import Match, TokenTree

__all__ = ["Datastore", "DatastoreError", "Match", "Retrieval", "SharedDatastore", "TokenTree"]
