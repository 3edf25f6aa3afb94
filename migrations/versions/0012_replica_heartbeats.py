"""Replica heartbeats: each replica's write probe, so that readiness covers writing

``/readyz`` said only that the database answered a ``SELECT 1``; a database that can read but
not write (disk full, a read-only failover target) left every replica ready while each report
was refused. Each replica now upserts its row here every few seconds (``service/sync.py``) and
is not ready while that fails. Rows of replicas gone for a day are deleted by the others.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27 19:50:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "replica_heartbeats",
        sa.Column("replica", sa.String(200), primary_key=True),
        sa.Column("at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("replica_heartbeats")
