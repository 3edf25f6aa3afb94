"""a fleet of replicas: refit ownership records, plan generations, admitted contexts

- ``policies.plan_generation`` moves whenever the refit owner publishes plans, so every other
  replica reloads exactly the policies whose plans changed.
- ``policies.max_contexts`` bounds how many contexts a policy plans for.
- ``policy_contexts`` is the admission table: a context is part of a policy once a report
  brought flows from it, and ``first_host`` is the host that brought it (per-host quotas).
- ``refit_log`` records every published refit with its owner, so that "one owner at a time" can
  be checked from the database (kept 7 days).
- Policy settings stored before their ranges existed are clamped into them (a history window
  of 1 h to 10 years, at most a million flows for an incumbent), so every stored policy loads.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 19:20:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def _now() -> sa.Column:
    return sa.Column(
        "admitted_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
    )


def upgrade() -> None:
    op.add_column(
        "policies",
        sa.Column("plan_generation", sa.BigInteger(), server_default="0", nullable=False),
    )
    op.add_column(
        "policies", sa.Column("max_contexts", sa.Integer(), server_default="1000", nullable=False)
    )
    op.create_table(
        "policy_contexts",
        sa.Column("policy_id", sa.Integer(), sa.ForeignKey("policies.id"), primary_key=True),
        sa.Column("context_id", sa.Integer(), sa.ForeignKey("contexts.id"), primary_key=True),
        sa.Column("first_host", sa.String(length=128), nullable=False),
        _now(),
    )
    op.create_index(
        "policy_contexts_host", "policy_contexts", ["policy_id", "first_host", "admitted_at"]
    )
    op.execute(
        "INSERT INTO policy_contexts (policy_id, context_id, first_host) "
        "SELECT DISTINCT policy_id, context_id, '' FROM trials "
        "UNION SELECT policy_id, context_id, '' FROM plans "
        "ON CONFLICT DO NOTHING"
    )
    op.create_table(
        "refit_log",
        sa.Column("id", sa.BigInteger(), primary_key=True),
        sa.Column("policy_id", sa.Integer(), sa.ForeignKey("policies.id"), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "finished_at",
            sa.DateTime(timezone=True),
            server_default=sa.func.clock_timestamp(),
            nullable=False,
        ),
        sa.Column("plan_generation", sa.BigInteger(), nullable=False),
        sa.Column("contexts", sa.Integer(), nullable=False),
        sa.Column("trials", sa.Integer(), nullable=False),
    )
    op.create_index("refit_log_policy", "refit_log", ["policy_id", "id"])
    op.create_index("refit_log_policy_finished", "refit_log", ["policy_id", "finished_at"])
    op.execute(
        "UPDATE policies SET history_hours = least(greatest(history_hours, 1), 87660), "
        "min_flows = least(min_flows, 1000000) "
        "WHERE history_hours NOT BETWEEN 1 AND 87660 OR min_flows > 1000000 "
        "OR history_hours = 'NaN'"
    )


def downgrade() -> None:
    op.drop_table("refit_log")
    op.drop_table("policy_contexts")
    op.drop_column("policies", "max_contexts")
    op.drop_column("policies", "plan_generation")
