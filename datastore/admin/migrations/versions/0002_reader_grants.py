"""Reader grants, and the n-gram lengths of every build recorded in its params.

Adds ``reader_grants`` (roles allowed to read a datastore, see ``python -m
datastore grant-reader``). Ready builds made before this revision record their
n-gram lengths only as the keys of ``ngram_stats``: copy them into
``params.ns`` (lengths with at least one kept n-gram) and ``params.max_n``, which
the client now requires instead of assuming 5.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "reader_grants",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("role", sa.String(length=63), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("role", "name", name="uq_reader_grants_role_name"),
    )
    op.create_index("uq_reader_grants_role_all", "reader_grants", ["role"], unique=True,
                    postgresql_where=sa.text("name IS NULL"))
    op.execute("""
        UPDATE datastores d SET params = d.params || jsonb_build_object('ns', s.ns, 'max_n', s.max_n)
        FROM (SELECT id, jsonb_agg(n ORDER BY n) AS ns, max(n) AS max_n
              FROM (SELECT id, key::int AS n FROM datastores, jsonb_each(ngram_stats) AS e(key, value)
                    WHERE coalesce((value ->> 'kept')::bigint, 1) > 0) per_n
              GROUP BY id) s
        WHERE d.id = s.id AND NOT (d.params ? 'ns')
    """)


def downgrade() -> None:
    op.drop_index("uq_reader_grants_role_all", table_name="reader_grants", postgresql_where=sa.text("name IS NULL"))
    op.drop_table("reader_grants")
