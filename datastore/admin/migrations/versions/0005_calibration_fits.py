"""The fleet's online calibration fits (``calibration_fits``): one learner per datastore, calibration and kind.

Every engine process refits its node scores online on the engine's verdicts (``csrc/online.hpp``) and, every few
seconds, folds the outcomes it learnt since into the fleet's learner stored here, under its row's lock, then goes on
from the result (:class:`live.FitFeed`): one fit per datastore shared by the fleet and kept across restarts. The row
is keyed by the calibration it started from (a digest: a learner never mixes two priors) and by whether it scores
with the target's state (the draft head's features). Decoders hold ``SELECT``, ``INSERT`` and ``UPDATE`` here
(``python -m datastore grant-appender``); readers ``SELECT``.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-06
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "calibration_fits",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("prior", sa.String(length=64), nullable=False),
        sa.Column("with_model", sa.Boolean(), nullable=False),
        sa.Column("state", sa.LargeBinary(), nullable=True),
        sa.Column("outcomes", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("folds", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("name", "prior", "with_model"),
    )


def downgrade() -> None:
    op.drop_table("calibration_fits")
