"""The registry's fixed names, shared by the readers, the writers and the SQLAlchemy models (which only the
writers import).

- ``STATES``: a build's life, ``building`` -> ``ready`` (served) -> ``retired`` (replaced by a newer build), or
  ``failed``; ``dropped``: its datastore was dropped while a session still used its table, which is dropped
  when free (``python -m datastore vacuum``, the next build or drop), and the row with it;
- ``TREE_TABLE_PREFIX``: each build's own tree table is ``token_trees_<build id>``;
- ``SWAP_CHANNEL``: the ``NOTIFY`` channel on which every swap-in and drop of a build announces its
  datastore's name (readers ``LISTEN`` to follow rebuilds at once);
- ``REVISIONS``: the registry schema's revisions, oldest first (the migrations of ``datastore/admin/migrations``);
  ``SCHEMA_REVISION``: the newest, the one this package reads and writes.
"""

from __future__ import annotations

__all__ = ["SWAP_CHANNEL"]

STATES = ("building", "ready", "failed", "retired", "dropped")
TREE_TABLE_PREFIX = "token_trees_"
SWAP_CHANNEL = "crest_datastores"
REVISIONS = ("0001", "0002", "0003", "0004")
SCHEMA_REVISION = REVISIONS[-1]
