"""time in the trials: running sums per (policy, context, cc, θ, time bucket)

A trial row used to add up every flow of a θ in a context since it was first run, and the
history window filtered on ``last_seen`` alone, so a θ that kept running never aged: its mean
held all of its old flows and could not follow a path that changed. Rows are now per time
bucket (``bucket``: the start of the reports' interval end floored to the policy's
``trial_bucket_hours``), and the window drops whole buckets.

Existing rows become one bucket each, at the hour of their ``last_seen``: their flows are not
split by time (that information was never kept), so they age out together.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 01:20:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

OLD_TRIAL_KEY = "trials_policy_id_context_id_cc_theta_key_key"
NEW_TRIAL_KEY = "trials_policy_id_context_id_cc_theta_key_bucket_key"
SUMS = (
    "flow_count",
    "tpt_sum",
    "tpt_sq_sum",
    "delay_sum",
    "delay_sq_sum",
    "tpt_delay_sum",
    "slow_flows",
    "report_count",
)


def upgrade() -> None:
    op.add_column(
        "policies",
        sa.Column("trial_bucket_hours", sa.Integer(), server_default="1", nullable=False),
    )
    op.add_column("trials", sa.Column("bucket", sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE trials SET bucket = date_trunc('hour', last_seen)")
    op.alter_column("trials", "bucket", nullable=False)
    op.drop_constraint(OLD_TRIAL_KEY, "trials", type_="unique")
    op.create_unique_constraint(
        NEW_TRIAL_KEY, "trials", ["policy_id", "context_id", "cc", "theta_key", "bucket"]
    )
    op.create_index("trials_policy_bucket", "trials", ["policy_id", "bucket"])


def downgrade() -> None:
    """Buckets folded back into one row per trial: the sums are exact, only time is lost."""
    sums = ", ".join(f"sum({c}) AS {c}" for c in SUMS)
    cols = ", ".join(SUMS)
    key = "policy_id, context_id, cc, theta_key"
    op.execute(
        f"CREATE TEMPORARY TABLE folded AS SELECT {key}, {sums}, min(first_seen) AS first_seen, "
        f"max(last_seen) AS last_seen "
        f"FROM trials GROUP BY {key}"
    )
    op.execute("DELETE FROM trials")
    op.execute(
        f"INSERT INTO trials ({key}, {cols}, first_seen, last_seen, bucket) "
        f"SELECT *, now() FROM folded"
    )
    op.execute("DROP TABLE folded")
    op.drop_index("trials_policy_bucket", table_name="trials")
    op.drop_constraint(NEW_TRIAL_KEY, "trials", type_="unique")
    op.create_unique_constraint(
        OLD_TRIAL_KEY, "trials", ["policy_id", "context_id", "cc", "theta_key"]
    )
    op.drop_column("trials", "bucket")
    op.drop_column("policies", "trial_bucket_hours")
