"""The queueing-delay sketch of each raw aggregate: ``report_aggregates.delay_sketch``

Agents sketched only throughput, so the dashboard's percentiles (the paper's Fig. 9) showed
queueing delay as a mean and a deviation. Aggregates now carry a second sketch of the same kind,
per-flow queueing delay in ms (``Aggregate.queue_delay_sketch``), stored as received beside the
throughput sketch.

Existing rows, and rows from agents that send no delay sketch, hold the empty value: not
sketched, as an empty ``sketch`` already means. A constant default adds the column without
rewriting the table.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-23 14:45:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "report_aggregates",
        sa.Column(
            "delay_sketch",
            sa.LargeBinary(),
            nullable=False,
            server_default=sa.text("''::bytea"),
        ),
    )


def downgrade() -> None:
    """Drops the delay sketches: percentiles of delay cannot be drawn again from the sums."""
    op.drop_column("report_aggregates", "delay_sketch")
