"""flows of other congestion controls: a cc column on aggregates and trials

Rows already stored are Fusion flows, so they take cc ''. A trial is now identified by
(policy, context, cc, θ), so a baseline CC's flows in a context sum into their own row.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21 17:05:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

OLD_TRIAL_KEY = "trials_policy_id_context_id_theta_key_key"  # PostgreSQL's name for 0001's
NEW_TRIAL_KEY = "trials_policy_id_context_id_cc_theta_key_key"


def _cc() -> sa.Column:
    return sa.Column("cc", sa.String(length=16), server_default="", nullable=False)


def upgrade() -> None:
    op.add_column("report_aggregates", _cc())
    op.add_column("trials", _cc())
    op.drop_constraint(OLD_TRIAL_KEY, "trials", type_="unique")
    op.create_unique_constraint(
        NEW_TRIAL_KEY, "trials", ["policy_id", "context_id", "cc", "theta_key"]
    )


def downgrade() -> None:
    op.execute("DELETE FROM trials WHERE cc <> ''")
    op.execute("DELETE FROM report_aggregates WHERE cc <> ''")
    op.drop_constraint(NEW_TRIAL_KEY, "trials", type_="unique")
    op.create_unique_constraint(OLD_TRIAL_KEY, "trials", ["policy_id", "context_id", "theta_key"])
    op.drop_column("trials", "cc")
    op.drop_column("report_aggregates", "cc")
