"""A build's state may be ``dropped``: its datastore was dropped while a session still held its table.

``python -m datastore drop`` and every swap take a table out of the registry at once and drop it only when
no session holds it (``lock_timeout``), so that DDL never queues lookups behind it. A dropped datastore's
builds wait in state ``dropped`` until their tables are gone (``python -m datastore vacuum``, the next build
or drop).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""
from collections.abc import Sequence

from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_constraint("ck_datastores_state", "datastores", type_="check")
    op.create_check_constraint("ck_datastores_state", "datastores",
                               "state IN ('building', 'ready', 'failed', 'retired', 'dropped')")


def downgrade() -> None:
    op.execute("DELETE FROM datastores WHERE state = 'dropped'")
    op.drop_constraint("ck_datastores_state", "datastores", type_="check")
    op.create_check_constraint("ck_datastores_state", "datastores",
                               "state IN ('building', 'ready', 'failed', 'retired')")
