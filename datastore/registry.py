"""The registry's fixed names, shared by the readers, the writers and the SQLAlchemy models (which only the
writers import).

- ``STATES``: a build's life, ``building`` -> ``ready`` (served) -> ``retired`` (replaced by a newer build), or
  ``failed``; ``dropped``: its datastore was dropped while a session still used its table, which is dropped
  when free (``python -m datastore vacuum``, the next build or drop), and the row with it;
- ``TREE_TABLE_PREFIX``: each build's own tree table is ``token_trees_<build id>``;
- ``SWAP_CHANNEL``: the ``NOTIFY`` channel on which every swap-in and drop of a build announces its
  datastore's name (readers ``LISTEN`` to follow rebuilds at once);
- :func:`name_lock_key` / :func:`compactor_lock_key`: the session advisory locks a build of a name and the compactor
  of a datastore's live layer hold while they run (one of each per name, across every process and host);
- ``REVISIONS``: the registry schema's revisions, oldest first (the migrations of ``datastore/admin/migrations``);
  ``SCHEMA_REVISION``: the newest, the one this package reads and writes.
"""

from __future__ import annotations

import hashlib

__all__ = ["SWAP_CHANNEL", "compactor_lock_key", "name_lock_key"]

STATES = ("building", "ready", "failed", "retired", "dropped")
TREE_TABLE_PREFIX = "token_trees_"
SWAP_CHANNEL = "crest_datastores"
REVISIONS = ("0001", "0002", "0003", "0004")
SCHEMA_REVISION = REVISIONS[-1]


def name_lock_key(name: str) -> int:
    """The signed 64-bit advisory lock key a build (or a drop) of datastore ``name`` holds."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big", signed=True)


def compactor_lock_key(name: str) -> int:
    """The signed 64-bit advisory lock key the compactor of datastore ``name``'s live layer holds while it runs
    (another key than the build's own name lock; :mod:`ingest.live`)."""
    return name_lock_key(f"compact-live {name}")
