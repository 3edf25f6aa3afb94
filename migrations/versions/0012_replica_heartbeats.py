"""Replica heartbeats (readiness covers writing) and θ overrides (pin, freeze, roll back, kill)

``/readyz`` said only that the database answered a ``SELECT 1``; a database that can read but
not write (disk full, a read-only failover target) left every replica ready while each report
was refused. Each replica now upserts its row here every few seconds (``service/sync.py``) and
is not ready while that fails. Rows of replicas gone for a day are deleted by the others.

``theta_overrides`` holds what operators impose over the optimiser (issue #35, item 1): a θ
pinned for a whole policy or one context (set as a pin, a freeze at the incumbent, or a roll
back to an earlier incumbent), and the kill switch that sends every host of a policy (or one
context) to the datapath's safe default. Every replica applies them on its read path, so a
refit never overrides one; deleting a row restores normal planning. At most one pin and one
kill switch per scope (the policy, or one of its contexts).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27 19:50:00
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

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

    op.create_table(
        "theta_overrides",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("policy_id", sa.Integer, sa.ForeignKey("policies.id"), nullable=False),
        sa.Column("context_id", sa.Integer, sa.ForeignKey("contexts.id")),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("datapath", sa.String(16), nullable=False),
        sa.Column("theta_key", sa.String(96)),
        sa.Column("origin", sa.String(16), nullable=False),
        sa.Column("detail", JSONB, nullable=False, server_default="{}"),
        sa.Column("set_by", sa.String(64), nullable=False),
        sa.Column(
            "set_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint(
            "(kind = 'pin' AND theta_key IS NOT NULL) OR (kind = 'kill' AND theta_key IS NULL)",
            name="theta_overrides_kind_theta",
        ),
    )
    op.execute(
        "CREATE UNIQUE INDEX theta_overrides_scope"
        " ON theta_overrides (policy_id, (COALESCE(context_id, 0)), kind)"
    )


def downgrade() -> None:
    op.drop_table("theta_overrides")
    op.drop_table("replica_heartbeats")
