"""A/B experiments: declarations, populations, stopped arms, flows per arm, host and day

- ``experiments``: one row per experiment as an operator declared it (arms and how their
  parameters are set, control, split, schedule, crossover day, σ, guardrail) with the salt
  its assignment hashes, and when, by whom and why it was stopped early.
- ``experiment_hosts``: the population, one row per host with its region (the stratum that
  assignment is balanced in), its group (the arm it runs in the first period, fixed when it
  joins) and when it left; indexed by host for "which experiment is this host in".
- ``experiment_arm_stops``: arms stopped before the end (by an operator or the guardrail).
- ``experiment_host_days``: per (experiment, arm, host, UTC day) the running sums of eq. 9
  and the slow flows: results at any σ with intervals over hosts come from these exactly.

New tables only; nothing existing changes.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23 01:30:00
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

SUMS = ("tpt_sum", "tpt_sq_sum", "delay_sum", "delay_sq_sum", "tpt_delay_sum")


def _tz(name: str, nullable: bool = False, now: bool = False) -> sa.Column:
    return sa.Column(
        name,
        sa.DateTime(timezone=True),
        server_default=sa.func.now() if now else None,
        nullable=nullable,
    )


def _experiment_fk() -> sa.Column:
    return sa.Column(
        "experiment_id",
        sa.Integer(),
        sa.ForeignKey("experiments.id", ondelete="CASCADE"),
        primary_key=True,
    )


def upgrade() -> None:
    op.create_table(
        "experiments",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(length=64), nullable=False, unique=True),
        sa.Column("description", sa.Text(), nullable=False, server_default=""),
        sa.Column("salt", sa.String(length=64), nullable=False),
        sa.Column("arms", postgresql.JSONB(), nullable=False),
        sa.Column("control", sa.String(length=64), nullable=False),
        sa.Column("split", postgresql.JSONB(), nullable=False),
        _tz("start_at"),
        _tz("end_at"),
        sa.Column("crossover_day", sa.Date(), nullable=True),
        sa.Column("sigma", sa.Double(), nullable=False),
        sa.Column("guardrail", postgresql.JSONB(), nullable=True),
        _tz("created_at", now=True),
        sa.Column("created_by", sa.String(length=64), nullable=False),
        _tz("stopped_at", nullable=True),
        sa.Column("stopped_by", sa.String(length=64), nullable=True),
        sa.Column("stop_reason", sa.Text(), nullable=True),
    )
    op.create_table(
        "experiment_hosts",
        _experiment_fk(),
        sa.Column("host_id", sa.String(length=128), primary_key=True),
        sa.Column("region", sa.String(length=64), nullable=False),
        sa.Column("grp", sa.SmallInteger(), nullable=False),
        _tz("joined_at", now=True),
        _tz("left_at", nullable=True),
    )
    op.create_index("experiment_hosts_host", "experiment_hosts", ["host_id"])
    op.create_table(
        "experiment_arm_stops",
        _experiment_fk(),
        sa.Column("arm", sa.String(length=64), primary_key=True),
        _tz("stopped_at"),
        sa.Column("stopped_by", sa.String(length=64), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
    )
    op.create_table(
        "experiment_host_days",
        _experiment_fk(),
        sa.Column("arm", sa.String(length=64), primary_key=True),
        sa.Column("host_id", sa.String(length=128), primary_key=True),
        sa.Column("day", sa.Date(), primary_key=True),
        sa.Column("flow_count", sa.BigInteger(), nullable=False, server_default="0"),
        *(sa.Column(s, sa.Double(), nullable=False, server_default="0") for s in SUMS),
        sa.Column("slow_flows", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("report_count", sa.BigInteger(), nullable=False, server_default="0"),
        _tz("updated_at", now=True),
    )


def downgrade() -> None:
    op.drop_table("experiment_host_days")
    op.drop_table("experiment_arm_stops")
    op.drop_index("experiment_hosts_host", table_name="experiment_hosts")
    op.drop_table("experiment_hosts")
    op.drop_table("experiments")
