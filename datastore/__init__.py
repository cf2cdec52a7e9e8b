"""The datastore: retrieval backends for drafting (CREST in Postgres, REST's suffix array), their schema,
codec and token trees.

Public API: :class:`Datastore` (the read-only Postgres lookup client), :class:`SuffixIndex` (REST),
the :class:`Match` both return and its :class:`TokenTree`, :class:`DatastoreError` (every fault),
and :func:`load_tokenizer`. Writers, the codec and administration live in their modules
(``datastore.writer``, ``datastore.codec``, ``datastore.catalog``, ``datastore.grants``).
"""

from .client import Datastore
from .errors import DatastoreError
from .suffix_index import SuffixIndex
from .tokenizer import load_tokenizer
from .tree import Match, TokenTree

__all__ = ["Datastore", "DatastoreError", "Match", "SuffixIndex", "TokenTree", "load_tokenizer"]
