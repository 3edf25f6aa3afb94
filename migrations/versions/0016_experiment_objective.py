"""An experiment names its objective; its per-host-day sums carry the completion-time sums

Migration 0015 let a policy optimise the completion-time objective (Σbits / Σduration −
σ·mean delay); an A/B experiment still compared its arms by eq. 9, the mean over flows of
throughput − σ·delay, which in an incast scores a θ whose timeouts leave a few flows late above
one that finishes the whole query sooner (benchmarks/results/datapaths-eval.md). So:

- ``experiments.objective``: ``flow-mean`` (eq. 9, what every existing experiment compared) or
  ``completion``.
- ``experiment_host_days`` gains the eight ``completion_*`` sums (as ``trial_sums`` did in
  0015), 0 for every row stored before: those flows count for eq. 9 only.

Downgrade drops both (the completion sums are lost; eq. 9's are untouched).

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-28 22:00:00
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

INTEGERS = ("completion_flow_count", "completion_bytes_sum", "completion_duration_us_sum")
COMPLETION = (
    *INTEGERS,
    "completion_mbit_sq_sum",
    "completion_seconds_sq_sum",
    "completion_mbit_seconds_sum",
    "completion_delay_sum",
    "completion_delay_sq_sum",
)
OBJECTIVES = ("flow-mean", "completion")


def upgrade() -> None:
    kinds = {c: "bigint" if c in INTEGERS else "double precision" for c in COMPLETION}
    columns = ", ".join(f"ADD COLUMN {c} {k} NOT NULL DEFAULT 0" for c, k in kinds.items())
    op.execute(f"ALTER TABLE experiment_host_days {columns}")
    allowed = ", ".join(f"'{o}'" for o in OBJECTIVES)
    op.execute(
        "ALTER TABLE experiments ADD COLUMN objective varchar(16) NOT NULL DEFAULT 'flow-mean'"
        f" CONSTRAINT experiments_objective_known CHECK (objective IN ({allowed}))"
    )


def downgrade() -> None:
    op.execute("ALTER TABLE experiments DROP COLUMN objective")
    dropped = ", ".join(f"DROP COLUMN {c}" for c in COMPLETION)
    op.execute(f"ALTER TABLE experiment_host_days {dropped}")
