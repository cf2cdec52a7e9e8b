"""The datastore's read path: CREST's token trees in PostgreSQL, looked up for drafting.

Public API: :class:`Datastore` (a read-only lookup client on one connection) and :class:`SharedDatastore` (the same
lookups for every thread of a process: a pool, a tree cache, build swaps followed at once), the :class:`Match` they
return and its :class:`TokenTree`, the :class:`Retrieval` of a drafting step (the datastore's candidates, its live
layer's and its delta's matches, one round trip), :class:`LiveOutputs` (the live layer's finished outputs read
back), and :class:`DatastoreError` (every fault). Writing, DDL, grants and migrations live in
:mod:`datastore.admin`; building in :mod:`ingest`.
"""

from .client import Datastore
from .errors import DatastoreError
from .live_outputs import LiveOutputs
from .lookup import Retrieval
from .shared import SharedDatastore
from .tree import Match, TokenTree

__all__ = ["Datastore", "DatastoreError", "LiveOutputs", "Match", "Retrieval", "SharedDatastore", "TokenTree"]
