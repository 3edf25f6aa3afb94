"""The history of each context's incumbent: ``incumbent_history``

A plan keeps only the current incumbent, so nobody could tell which θ a context's hosts were
told to run at an earlier time (the paper's Fig. 6 marks the incumbent per round). Each time a
refit publishes an incumbent θ other than the last one recorded for a (policy, context), one row
is written in the plan's transaction: the θ key and its datapath, the predicted utility and the
σ it was predicted at, when, and the refit that chose it (the policy's plan generation and the
replica). One row per change, not per refit: the rows are few, and kept.

Every existing plan's incumbent is carried over as one row, dated by the plan's ``updated_at``
(the last refit that published it; it may have been incumbent since earlier, which was not
kept) and with no refit (NULL generation and owner). The datapath follows the policy's target
CC as of this revision: 'cubic' has a θ spec of its own, every other CC tunes Fusion.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23 14:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

TABLE = "incumbent_history"
UNIQUE = "incumbent_history_policy_id_context_id_plan_generation_key"
INDEX = "incumbent_history_policy_context_at"


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("id", sa.BigInteger(), primary_key=True),
        sa.Column("policy_id", sa.Integer(), sa.ForeignKey("policies.id"), nullable=False),
        sa.Column("context_id", sa.Integer(), sa.ForeignKey("contexts.id"), nullable=False),
        sa.Column("datapath", sa.String(length=16), nullable=False),
        sa.Column("theta_key", sa.String(length=96), nullable=False),
        sa.Column("predicted_utility", sa.Double(), nullable=True),
        sa.Column("sigma", sa.Double(), nullable=False),
        sa.Column(
            "published_at",
            sa.DateTime(timezone=True),
            server_default=sa.func.now(),
            nullable=False,
        ),
        sa.Column("plan_generation", sa.BigInteger(), nullable=True),
        sa.Column("refit_owner", sa.String(length=128), nullable=True),
        sa.UniqueConstraint("policy_id", "context_id", "plan_generation", name=UNIQUE),
    )
    op.create_index(INDEX, TABLE, ["policy_id", "context_id", "published_at"])
    op.execute(
        f"INSERT INTO {TABLE} (policy_id, context_id, datapath, theta_key, predicted_utility,"
        " sigma, published_at)"
        " SELECT pl.policy_id, pl.context_id,"
        " CASE WHEN p.target_cc = 'cubic' THEN 'cubic' ELSE 'fusion' END,"
        " pl.incumbent_key, pl.incumbent_utility, p.sigma, pl.updated_at"
        " FROM plans pl JOIN policies p ON p.id = pl.policy_id"
        " ORDER BY pl.policy_id, pl.context_id"
    )


def downgrade() -> None:
    """Drops the history: the plans keep the current incumbents."""
    op.drop_index(INDEX, table_name=TABLE)
    op.drop_table(TABLE)
