"""SQLAlchemy 2 models: the ``datastores`` registry, reader grants, and the per-build tree tables.

Every build gets a row in ``datastores`` and a table of its own, ``token_trees_<id>`` with two columns, ``key`` (the
n-gram: ``n * key_width`` bytes, each token id big-endian) and ``tree`` (a codec blob, see docs/tree-format.md). The
registry is managed by Alembic; the tree tables are created by each build and dropped with it, and Alembic ignores them.

A build is visible only in state ``ready``; at most one ready build per name is allowed (a partial unique index), so
swapping a rebuilt datastore in is one transaction that retires the old row and readies the new one.

``reader_grants`` remembers which roles may read which datastore (``python -m datastore grant-reader``): each build
grants ``SELECT`` on its new table to them in the same transaction that makes it ready, so a reader keeps reading across
rebuilds without ever holding more than ``SELECT``.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from ..registry import STATES, TREE_TABLE_PREFIX


class Base(DeclarativeBase):
    """Declarative base of the registry schema (Alembic's target metadata)."""


class DatastoreRecord(Base):
    """One datastore build.

    Attributes:
        name: the datastore's name (``--name``); several builds may share it,
            at most one of them ready.
        state: one of :data:`datastore.registry.STATES`.
        trees_table: the table holding this build's trees.
        tokenizer: the tokenizer as given (path or hub id).
        tokenizer_fingerprint: SHA-256 hex of the tokenizer (see
            :func:`toolkit.tokenizer.tokenizer_fingerprint`); lookups refuse a mismatch.
        key_width: bytes per token id in keys (2 when every id < 65,536, else 4).
        corpus: source, path, records read, malformed counts by reason.
        params: top_t, depth, tree_budget, min_count, compression, and (written when the build
            becomes ready) ``ns``, the n-gram lengths it holds, and ``max_n``, the largest; a
            client probes exactly those lengths.
        ngram_stats: per n: kept, distinct, occurrences, nodes.
        num_trees: rows in ``trees_table``.
        num_tokens: tokens in the corpus stream.
        bytes_on_disk: table + indexes + TOAST, bytes, measured after the build.
        timings: seconds per stage.
    """

    __tablename__ = "datastores"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), nullable=False)
    state: Mapped[str] = mapped_column(String(16), nullable=False, server_default="building")
    trees_table: Mapped[str] = mapped_column(String(63), nullable=False, unique=True)
    tokenizer: Mapped[str] = mapped_column(Text, nullable=False)
    tokenizer_fingerprint: Mapped[str] = mapped_column(String(64), nullable=False)
    key_width: Mapped[int] = mapped_column(SmallInteger, nullable=False)
    corpus: Mapped[dict] = mapped_column(JSONB, nullable=False, server_default=text("'{}'::jsonb"))
    params: Mapped[dict] = mapped_column(JSONB, nullable=False, server_default=text("'{}'::jsonb"))
    ngram_stats: Mapped[dict] = mapped_column(JSONB, nullable=False, server_default=text("'{}'::jsonb"))
    num_trees: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    num_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    bytes_on_disk: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    timings: Mapped[dict] = mapped_column(JSONB, nullable=False, server_default=text("'{}'::jsonb"))
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())
    completed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)

    __table_args__ = (
        CheckConstraint(f"state IN ({', '.join(repr(s) for s in STATES)})", name="ck_datastores_state"),
        CheckConstraint("key_width IN (2, 4)", name="ck_datastores_key_width"),
        Index("uq_datastores_ready_name", "name", unique=True, postgresql_where=text("state = 'ready'")),
        Index("ix_datastores_name", "name"),
    )


class ReaderGrant(Base):
    """A role allowed to read a datastore (``name``), or every datastore (``name`` NULL).

    Attributes:
        role: a Postgres role name.
        name: the datastore name, or ``None`` for all of them.
        created_at: when the grant was recorded.
    """

    __tablename__ = "reader_grants"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    role: Mapped[str] = mapped_column(String(63), nullable=False)
    name: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())

    __table_args__ = (
        UniqueConstraint("role", "name", name="uq_reader_grants_role_name"),
        Index("uq_reader_grants_role_all", "role", unique=True, postgresql_where=text("name IS NULL")),
    )


class LiveOutput(Base):
    """One finished request's output, appended by a decoder for the live layer (``live``).

    Decoders hold only ``INSERT`` here (``python -m datastore grant-appender``); ``python -m ingest
    compact-live`` folds the rows into the trees of the datastore ``<name>.live`` and evicts the oldest.

    Attributes:
        name: the datastore whose live layer this output feeds.
        tokens: the output's token ids, uint32 little-endian (``live.encode_output``).
        num_tokens: ``len(tokens) // 4``.
        origin: who appended it (host:pid, or what the decoder was given), for provenance.
        created_at: when it was appended.
    """

    __tablename__ = "live_outputs"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), nullable=False)
    tokens: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    num_tokens: Mapped[int] = mapped_column(Integer, nullable=False)
    origin: Mapped[str] = mapped_column(String(200), nullable=False, server_default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())

    __table_args__ = (
        CheckConstraint("num_tokens > 0 AND octet_length(tokens) = 4 * num_tokens", name="ck_live_outputs_length"),
        Index("ix_live_outputs_name_id", "name", "id"),
    )


class CalibrationFit(Base):
    """The fleet's online calibration fit of one datastore (:class:`live.FitFeed`, ``csrc/online.hpp``).

    Attributes:
        name: the datastore. prior: the digest of the calibration the learner started from
            (:meth:`drafting.Calibration.digest`). with_model: whether it scores with the target's state.
        state: the learner's state (``crest_native.Core.fold``; ``NULL``: none folded yet). outcomes: the verdicts it
            learnt from. folds: the folds it took. updated_at: the last fold.
    """

    __tablename__ = "calibration_fits"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    prior: Mapped[str] = mapped_column(String(64), primary_key=True)
    with_model: Mapped[bool] = mapped_column(Boolean, primary_key=True)
    state: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    outcomes: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    folds: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False, server_default=func.now())


def tree_table(name: str) -> Table:
    """The Core ``Table`` of one build's trees (not part of the registry metadata)."""
    if not name.startswith(TREE_TABLE_PREFIX) or not name[len(TREE_TABLE_PREFIX):].isdigit():
        raise ValueError(f"not a tree table name: {name!r}")
    return Table(
        name,
        MetaData(),
        Column("key", LargeBinary, nullable=False),
        Column("tree", LargeBinary, nullable=False),
    )
