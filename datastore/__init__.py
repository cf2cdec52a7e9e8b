"""The datastore: retrieval backends for drafting (CREST in Postgres, REST's suffix array), their schema,
codec and token trees.

Public API: :class:`Datastore` (a read-only lookup client on one connection) and :class:`SharedDatastore`
(the same lookups for every thread of a process: a pool, a tree cache, build swaps followed at once),
:class:`SuffixIndex` (REST), the :class:`Match` they return and its :class:`TokenTree`,
:class:`DatastoreError` (every fault), and :func:`load_tokenizer`. Writers, the codec and administration live
in their modules (``datastore.writer``, ``datastore.codec``, ``datastore.catalog``, ``datastore.grants``).
"""

from .client import Datastore
from .errors import DatastoreError
from .shared import SharedDatastore
from .suffix_index import SuffixIndex
from .tokenizer import load_tokenizer
from .tree import Match, TokenTree

__all__ = ["Datastore", "DatastoreError", "Match", "SharedDatastore", "SuffixIndex", "TokenTree", "load_tokenizer"]
