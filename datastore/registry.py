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
from dataclasses import dataclass

import psycopg

from toolkit.console import clause

from .errors import DatabaseUnavailable, DatastoreError, DatastoreNotFound, LookupFailed, TokenizerMismatch

__all__ = ["SWAP_CHANNEL", "DatastoreInfo", "check_tokenizer", "compactor_lock_key", "name_lock_key", "resolve_build",
           "server_error"]

STATES = ("building", "ready", "failed", "retired", "dropped")
TREE_TABLE_PREFIX = "token_trees_"
SWAP_CHANNEL = "crest_datastores"
REVISIONS = ("0001", "0002", "0003", "0004", "0005")
SCHEMA_REVISION = REVISIONS[-1]


def name_lock_key(name: str) -> int:
    """The signed 64-bit advisory lock key a build (or a drop) of datastore ``name`` holds."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big", signed=True)


def compactor_lock_key(name: str) -> int:
    """The signed 64-bit advisory lock key the compactor of datastore ``name``'s live layer holds while it runs
    (another key than the build's own name lock; :mod:`live.compaction`)."""
    return name_lock_key(f"compact-live {name}")


@dataclass(frozen=True)
class DatastoreInfo:
    """What a client needs to know about a ready build.

    Attributes:
        id: the build's registry id (changes with every rebuild).
        name: the datastore name. table: its tree table. key_width: bytes per token id in keys.
        ns: the n-gram lengths it holds, ascending (``params.ns``).
        tokenizer / tokenizer_fingerprint: what it was built with.
        params: the build parameters as recorded.
        last_output_id / base_output_id: a live layer's build (:mod:`live`): the newest output folded in,
            and for a delta build the newest output of the main build it was built on (``None``: not recorded, as
            for a corpus build).
    """

    id: int
    name: str
    table: str
    key_width: int
    ns: tuple[int, ...]
    tokenizer: str
    tokenizer_fingerprint: str
    params: dict
    last_output_id: int | None = None
    base_output_id: int | None = None

    @property
    def max_n(self) -> int:
        """The longest n-gram stored (0 for an empty build)."""
        return max(self.ns, default=0)

    @property
    def vocab_size(self) -> int:
        """Token ids are below this: the build's tokenizer's vocabulary (``params.vocab_size``; builds made before
        it was recorded: what the key width can hold)."""
        return int(self.params.get("vocab_size") or 1 << (8 * self.key_width))


def server_error(name: str, exc: psycopg.Error) -> DatastoreError:
    """The :class:`~datastore.errors.DatastoreError` for a server-side failure of a query on datastore ``name``."""
    if isinstance(exc, psycopg.OperationalError):
        return DatabaseUnavailable(f"datastore {name!r} is unreachable: {clause(exc)}")
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return LookupFailed(f"this role may not read datastore {name!r} ({clause(exc)}); grant it with "
                            f"`python -m datastore grant-reader ROLE --name {name}`")
    return LookupFailed(f"lookup in datastore {name!r} failed: {type(exc).__name__}: {clause(exc)}")


def resolve_build(conn: psycopg.Connection, name: str, build: int | None = None) -> DatastoreInfo:
    """The ready build of datastore ``name`` (one registry query).

    Args:
        build: that build only (its registry id, :attr:`DatastoreInfo.id`); ``None``: whichever is ready.

    Raises:
        datastore.errors.DatastoreNotFound: when ``name`` has no ready build, or ``build`` is not it (the message
            lists the ready ones).
        datastore.errors.LookupFailed: when the registry row records no n-gram lengths, or the role may not read it.
        datastore.errors.DatabaseUnavailable: when the server cannot be reached.
    """
    try:
        row = conn.execute(
            "SELECT id, trees_table, key_width, params, tokenizer, tokenizer_fingerprint, "
            "(corpus->>'last_output_id')::bigint, (corpus->>'base_output_id')::bigint FROM datastores "
            "WHERE name = %s AND state = 'ready' AND (%s::bigint IS NULL OR id = %s)", [name, build, build]).fetchone()
        if row is None:
            names = [r[0] for r in conn.execute("SELECT name FROM datastores WHERE state = 'ready' ORDER BY name")]
    except psycopg.Error as exc:
        raise server_error(name, exc) from exc
    if row is None and build is not None:
        raise DatastoreNotFound(f"build {build} of datastore {name!r} is not its ready build (it was replaced, or "
                                f"never was; ready datastores: {', '.join(names) or 'none'}); omit the build to take "
                                "the ready one")
    if row is None:
        raise DatastoreNotFound(
            f"no ready datastore named {name!r} (ready: {', '.join(names) or 'none'}); "
            f"build it with `python -m ingest build --name {name}`")
    ds_id, table, width, params, tok, fp, last_output, base_output = row
    if "ns" not in params:
        raise LookupFailed(f"build {ds_id} of datastore {name!r} records no n-gram lengths (params.ns); "
                           "run `python -m datastore migrate`, or rebuild it")
    return DatastoreInfo(ds_id, name, table, width, tuple(sorted(int(n) for n in params["ns"])), tok, fp, params,
                         last_output, base_output)


def check_tokenizer(info: DatastoreInfo, fingerprint: str) -> None:
    """Refuse a caller whose tokenizer differs from the build's.

    Raises:
        datastore.errors.TokenizerMismatch: naming both tokenizers and the fix.
    """
    if info.tokenizer_fingerprint != fingerprint:
        raise TokenizerMismatch(
            f"datastore {info.name!r} was built with tokenizer {info.tokenizer!r} "
            f"(fingerprint {info.tokenizer_fingerprint[:12]}), the caller's tokenizer has fingerprint "
            f"{fingerprint[:12]}; rebuild the datastore with this tokenizer (--tokenizer) or use the matching one")
