"""Experiment days of any length dividing a calendar day: ``experiments.day_seconds``

An experiment's day (per-day results, the crossover, ``experiment_host_days.day``) was the UTC
calendar day. ``day_seconds`` is now its length: day boundaries are the multiples of it since
the Unix epoch, and day k of the experiment is labelled the start's UTC date + k days
(``experiments/domain.py``), so a lab or staging rehearsal sees a crossover within minutes.

Every existing experiment gets 86,400, which is exactly the calendar days it had: nothing it
stored changes meaning. The CHECK keeps the bounds the API enforces (60 s to one day, dividing
the day), as of this revision.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23 08:10:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

CALENDAR_DAY_SECONDS = 86_400
MIN_DAY_SECONDS = 60
CHECK = "experiments_day_seconds"


def upgrade() -> None:
    op.add_column(
        "experiments",
        sa.Column(
            "day_seconds",
            sa.Integer(),
            nullable=False,
            server_default=str(CALENDAR_DAY_SECONDS),
        ),
    )
    op.create_check_constraint(
        CHECK,
        "experiments",
        f"day_seconds BETWEEN {MIN_DAY_SECONDS} AND {CALENDAR_DAY_SECONDS}"
        f" AND {CALENDAR_DAY_SECONDS} % day_seconds = 0",
    )


def downgrade() -> None:
    """Drops the column: a compressed experiment's rows keep their day labels, which then read
    as calendar dates (delete such experiments first if that matters)."""
    op.drop_constraint(CHECK, "experiments", type_="check")
    op.drop_column("experiments", "day_seconds")
