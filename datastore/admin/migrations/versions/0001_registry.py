"""Create the datastores registry.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    jsonb = postgresql.JSONB(astext_type=sa.Text())
    op.create_table(
        "datastores",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("state", sa.String(length=16), server_default="building", nullable=False),
        sa.Column("trees_table", sa.String(length=63), nullable=False),
        sa.Column("tokenizer", sa.Text(), nullable=False),
        sa.Column("tokenizer_fingerprint", sa.String(length=64), nullable=False),
        sa.Column("key_width", sa.SmallInteger(), nullable=False),
        sa.Column("corpus", jsonb, server_default=sa.text("'{}'::jsonb"), nullable=False),
        sa.Column("params", jsonb, server_default=sa.text("'{}'::jsonb"), nullable=False),
        sa.Column("ngram_stats", jsonb, server_default=sa.text("'{}'::jsonb"), nullable=False),
        sa.Column("num_trees", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("num_tokens", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("bytes_on_disk", sa.BigInteger(), nullable=True),
        sa.Column("timings", jsonb, server_default=sa.text("'{}'::jsonb"), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("state IN ('building', 'ready', 'failed', 'retired')", name="ck_datastores_state"),
        sa.CheckConstraint("key_width IN (2, 4)", name="ck_datastores_key_width"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("trees_table"),
    )
    op.create_index("ix_datastores_name", "datastores", ["name"], unique=False)
    op.create_index("uq_datastores_ready_name", "datastores", ["name"], unique=True,
                    postgresql_where=sa.text("state = 'ready'"))


def downgrade() -> None:
    op.drop_index("uq_datastores_ready_name", table_name="datastores", postgresql_where=sa.text("state = 'ready'"))
    op.drop_index("ix_datastores_name", table_name="datastores")
    op.drop_table("datastores")
