"""A policy names its objective; aggregates and trials carry the completion-time sums

Eq. 9 (the mean over flows of throughput − σ·delay) rewards, in an incast, a θ whose timeouts
leave a few flows late while the rest finish early (benchmarks/results/datapaths-eval.md). A
policy may now name the completion-time objective instead (Σbits / Σduration − σ·mean delay,
``gemini_api.sums.CompletionSums``), whose running sums agents send beside eq. 9's.

- ``report_aggregates`` and ``trial_sums`` gain the eight ``completion_*`` sums, 0 for every row
  stored before (old agents' flows count for eq. 9 only, as they will after this migration).
- The view ``trials`` (migration 0014) is recreated with them.
- ``policies.objective``: ``flow-mean`` (eq. 9, what every existing policy optimised) or
  ``completion``.

Downgrade drops the columns (the completion sums are lost; eq. 9's are untouched) and restores
0014's view.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-28 17:40:00
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

KEY = "policy_id, context_id, cc, theta_key, bucket"
INTEGERS = ("flow_count", "slow_flows", "report_count", "completion_flow_count",
            "completion_bytes_sum", "completion_duration_us_sum")  # fmt: skip
EQ9_SUMS = ("flow_count", "tpt_sum", "tpt_sq_sum", "delay_sum", "delay_sq_sum", "tpt_delay_sum",
            "slow_flows")  # fmt: skip
COMPLETION = (
    "completion_flow_count",
    "completion_bytes_sum",
    "completion_duration_us_sum",
    "completion_mbit_sq_sum",
    "completion_seconds_sq_sum",
    "completion_mbit_seconds_sum",
    "completion_delay_sum",
    "completion_delay_sq_sum",
)
OBJECTIVES = ("flow-mean", "completion")


def trials_view(raw: tuple[str, ...]) -> str:
    """0014's view over the sums ``raw`` (each aggregate counts one report)."""
    summed = ", ".join(f"sum({c}){'::bigint' if c in INTEGERS else ''} AS {c}" for c in raw)
    return f"""
CREATE VIEW trials AS
SELECT max(id) AS id, {KEY}, {summed}, sum(report_count)::bigint AS report_count,
       min(first_seen) AS first_seen, max(last_seen) AS last_seen
FROM (
    SELECT id, {KEY}, {", ".join(raw)}, report_count, first_seen, last_seen FROM trial_sums
    UNION ALL
    SELECT -a.id, a.policy_id, a.context_id, a.cc, a.theta_key, a.bucket,
           {", ".join(f"a.{c}" for c in raw)}, 1, a.stored_at, a.stored_at
    FROM report_aggregates a JOIN fold_watermarks w ON w.policy_id = a.policy_id
    WHERE a.xid >= w.folded_xid
) live
GROUP BY {KEY}
"""


def _add(table: str) -> None:
    kinds = {c: "bigint" if c in INTEGERS else "double precision" for c in COMPLETION}
    columns = ", ".join(f"ADD COLUMN {c} {k} NOT NULL DEFAULT 0" for c, k in kinds.items())
    op.execute(f"ALTER TABLE {table} {columns}")


def upgrade() -> None:
    op.execute("DROP VIEW trials")
    _add("report_aggregates")  # the partitioned parent: every partition gains them
    _add("trial_sums")
    op.execute(trials_view(EQ9_SUMS + COMPLETION))
    allowed = ", ".join(f"'{o}'" for o in OBJECTIVES)
    op.execute(
        "ALTER TABLE policies ADD COLUMN objective varchar(16) NOT NULL DEFAULT 'flow-mean'"
        f" CONSTRAINT policies_objective_known CHECK (objective IN ({allowed}))"
    )


def downgrade() -> None:
    op.execute("ALTER TABLE policies DROP COLUMN objective")
    op.execute("DROP VIEW trials")
    for table in ("trial_sums", "report_aggregates"):
        op.execute(f"ALTER TABLE {table} " + ", ".join(f"DROP COLUMN {c}" for c in COMPLETION))
    op.execute(trials_view(EQ9_SUMS))
