"""The datastore: schema (SQLAlchemy + Alembic), the token tree codec, and the lookup client."""

from .client import Datastore, DatastoreInfo, DatastoreNotFound, Match, TokenizerMismatch
from .codec import CodecError, TreeBatch, decode_tree, encode_tree, encode_trees
from .connection import DatabaseUnavailable, resolve_database_url
from .tokenizer import DEFAULT_MODEL, load_tokenizer, resolve_model, tokenizer_fingerprint
from .tree import TokenTree, TreeError
from .writer import BuildConflict, DatastoreWriter

__all__ = [
    "Datastore", "DatastoreInfo", "DatastoreNotFound", "Match", "TokenizerMismatch", "CodecError", "TreeBatch",
    "decode_tree", "encode_tree", "encode_trees", "DatabaseUnavailable", "resolve_database_url", "DEFAULT_MODEL",
    "load_tokenizer", "resolve_model", "tokenizer_fingerprint", "TokenTree", "TreeError", "BuildConflict",
    "DatastoreWriter",
]
