"""The live layer's append-only table of finished outputs (``live_outputs``).

Decoders append the target's own outputs here with nothing but ``INSERT`` (``python -m datastore
grant-appender``); ``python -m live compact`` folds them into the trees of the datastore
``<name>.live``.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "live_outputs",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("tokens", sa.LargeBinary(), nullable=False),
        sa.Column("num_tokens", sa.Integer(), nullable=False),
        sa.Column("origin", sa.String(length=200), server_default="", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("num_tokens > 0 AND octet_length(tokens) = 4 * num_tokens", name="ck_live_outputs_length"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_live_outputs_name_id", "live_outputs", ["name", "id"])


def downgrade() -> None:
    op.drop_index("ix_live_outputs_name_id", table_name="live_outputs")
    op.drop_table("live_outputs")
