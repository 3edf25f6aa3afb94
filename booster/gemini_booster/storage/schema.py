"""Booster's PostgreSQL schema (SQLAlchemy 2). Alembic migrations in ``migrations/`` create it.

Raw aggregates are kept exactly as agents sent them (appended, in daily partitions, for
``raw_retention_days``); the refit owner folds them into running sums per (policy, context, θ,
time bucket) in ``trial_sums`` (``storage/fold.py``), and the view ``trials`` adds the aggregates
not folded yet, so readers see every stored report at once. Because eq. 9 is linear in the
sums, a change of σ recomputes utilities from ``trials`` without collecting anything again.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import UserDefinedType

from gemini_api.sums import COMPLETION_COLUMNS


class Base(DeclarativeBase):
    pass


class XID8(UserDefinedType[str]):
    """PostgreSQL's 64-bit transaction id (``xid8``), read as its decimal text."""

    cache_ok = True

    def get_col_spec(self, **kw: object) -> str:
        return "xid8"


def _now() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)


def _zero(kind: type[BigInteger] | type[Double]) -> Mapped:
    """A sum column that rows from before it hold as 0 (no flows counted)."""
    return mapped_column(kind, nullable=False, server_default=text("0"))


def _cc() -> Mapped[str]:
    """'' for Fusion flows (θ says what ran); else the name of the baseline CC that ran."""
    return mapped_column(String(16), nullable=False, server_default="")


class Policy(Base):
    """An operator's optimisation goal: σ, the θ region, the CC, and how to explore."""

    __tablename__ = "policies"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True, nullable=False)
    sigma: Mapped[float] = mapped_column(Double, nullable=False)
    region: Mapped[str] = mapped_column(String(16), nullable=False)
    bounds: Mapped[dict] = mapped_column(JSONB, nullable=False)
    datapath: Mapped[str] = mapped_column(String(32), nullable=False)
    # gemini_api.sums.Objective (migration 0015): what the utility is over a θ's flows.
    objective: Mapped[str] = mapped_column(String(16), nullable=False, server_default="flow-mean")
    # The version of the datapath's θ spec the policy's stored θ keys are in (migration 0017).
    theta_spec_version: Mapped[int] = mapped_column(Integer, nullable=False)
    exploration_share: Mapped[float] = mapped_column(Double, nullable=False)
    mode: Mapped[str] = mapped_column(String(16), nullable=False)
    acq_func: Mapped[str] = mapped_column(String(16), nullable=False)
    n_initial_points: Mapped[int] = mapped_column(Integer, nullable=False)
    time_buckets: Mapped[int] = mapped_column(SmallInteger, nullable=False)
    trial_bucket_hours: Mapped[int] = mapped_column(Integer, nullable=False, server_default="1")
    history_hours: Mapped[float] = mapped_column(Double, nullable=False)
    max_model_points: Mapped[int] = mapped_column(Integer, nullable=False)
    min_flows: Mapped[int] = mapped_column(Integer, nullable=False)
    max_contexts: Mapped[int] = mapped_column(Integer, nullable=False, server_default="1000")
    plan_generation: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    revision: Mapped[int] = mapped_column(Integer, nullable=False, default=1)
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()


class Context(Base):
    """The hidden variables h (Table II): who talks to whom, over which ISPs, at what hour."""

    __tablename__ = "contexts"
    __table_args__ = (UniqueConstraint("src_region", "src_isp", "dst_region", "dst_isp", "hour"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    src_region: Mapped[str] = mapped_column(String(64), nullable=False)
    src_isp: Mapped[str] = mapped_column(String(64), nullable=False)
    dst_region: Mapped[str] = mapped_column(String(64), nullable=False)
    dst_isp: Mapped[str] = mapped_column(String(64), nullable=False)
    hour: Mapped[int] = mapped_column(SmallInteger, nullable=False)


class Report(Base):
    """One agent report, stored once per idempotency key, (host, report id): a host's ids are
    its own (migration 0013); the digest detects a reused key."""

    __tablename__ = "reports"
    __table_args__ = (
        UniqueConstraint("host_id", "report_id", name="reports_host_id_report_id_key"),
    )
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    report_id: Mapped[str] = mapped_column(String(128), nullable=False)
    digest: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    host_id: Mapped[str] = mapped_column(String(128), nullable=False)
    policy_id: Mapped[int] = mapped_column(ForeignKey("policies.id"), nullable=False)
    interval_start: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    interval_end: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    aggregate_count: Mapped[int] = mapped_column(Integer, nullable=False)
    received_at: Mapped[datetime] = _now()


class _FlowSums:
    """Eq. 9's running sums over a set of flows (count, Σx, Σx², Σd, Σd², Σxd, flows under
    the slow-flow bar): what an aggregate carries and what a trial adds up. Utilities at any σ
    are computed from them, so they are stored, never a utility."""

    flow_count: Mapped[int] = mapped_column(BigInteger, nullable=False)
    tpt_sum: Mapped[float] = mapped_column(Double, nullable=False)
    tpt_sq_sum: Mapped[float] = mapped_column(Double, nullable=False)
    delay_sum: Mapped[float] = mapped_column(Double, nullable=False)
    delay_sq_sum: Mapped[float] = mapped_column(Double, nullable=False)
    tpt_delay_sum: Mapped[float] = mapped_column(Double, nullable=False)
    slow_flows: Mapped[int] = mapped_column(BigInteger, nullable=False)
    # The completion-time objective's sums (gemini_api.sums.CompletionSums; migration 0015):
    # zero for aggregates from agents older than them, which then train no policy whose
    # objective is completion time.
    completion_flow_count: Mapped[int] = _zero(BigInteger)
    completion_bytes_sum: Mapped[int] = _zero(BigInteger)
    completion_duration_us_sum: Mapped[int] = _zero(BigInteger)
    completion_mbit_sq_sum: Mapped[float] = _zero(Double)
    completion_seconds_sq_sum: Mapped[float] = _zero(Double)
    completion_mbit_seconds_sum: Mapped[float] = _zero(Double)
    completion_delay_sum: Mapped[float] = _zero(Double)
    completion_delay_sq_sum: Mapped[float] = _zero(Double)


class ReportAggregate(_FlowSums, Base):
    """An aggregate exactly as received (the raw material for any later recomputation).

    Partitioned by ``stored_at`` (a partition per UTC day, dropped after
    ``raw_retention_days``; migration 0014). ``xid`` is the storing transaction's id, which the
    fold's watermark is compared with; ``bucket`` the trial bucket its flows sum into."""

    __tablename__ = "report_aggregates"
    __table_args__ = (
        Index("report_aggregates_report_pk", "report_pk"),
        Index("report_aggregates_policy_xid", "policy_id", "xid"),
        {"postgresql_partition_by": "RANGE (stored_at)"},
    )
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    report_pk: Mapped[int] = mapped_column(
        ForeignKey("reports.id", ondelete="CASCADE"), nullable=False
    )
    policy_id: Mapped[int] = mapped_column(ForeignKey("policies.id"), nullable=False)
    context_id: Mapped[int] = mapped_column(ForeignKey("contexts.id"), nullable=False)
    cc: Mapped[str] = _cc()
    theta_key: Mapped[str] = mapped_column(String(96), nullable=False)
    theta_version: Mapped[int] = mapped_column(BigInteger, nullable=False)
    size_buckets: Mapped[list[int]] = mapped_column(ARRAY(BigInteger), nullable=False)
    sketch: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    # The queueing-delay sketch; empty when the agent sent none (older agents, rows before
    # migration 0010), like an empty ``sketch``.
    delay_sketch: Mapped[bytes] = mapped_column(
        LargeBinary, nullable=False, server_default=text("''::bytea")
    )
    bucket: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    stored_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), primary_key=True, server_default=func.now()
    )
    xid: Mapped[str] = mapped_column(
        XID8, nullable=False, server_default=text("pg_current_xact_id()")
    )


TRIAL_SUMS = (
    "flow_count",
    "tpt_sum",
    "tpt_sq_sum",
    "delay_sum",
    "delay_sq_sum",
    "tpt_delay_sum",
    "slow_flows",
    *COMPLETION_COLUMNS,
    "report_count",  # last: the fold counts aggregates for it
)


class _TrialColumns(_FlowSums):
    """Running sums of every aggregate for one (policy, context, θ): one point for the model.
    Rows with a ``cc`` are another CC's flows in that context (θ ''): the A/B baseline, never
    a point for the model."""

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    policy_id: Mapped[int] = mapped_column(ForeignKey("policies.id"), nullable=False)
    context_id: Mapped[int] = mapped_column(ForeignKey("contexts.id"), nullable=False)
    cc: Mapped[str] = _cc()
    theta_key: Mapped[str] = mapped_column(String(96), nullable=False)
    report_count: Mapped[int] = mapped_column(BigInteger, nullable=False)
    # The start of the time bucket the flows ran in (the reports' interval ends, floored to the
    # policy's trial_bucket_hours): the history window drops whole buckets, so the old flows of
    # a θ that keeps running age out instead of pinning its mean.
    bucket: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    # When the first and the newest of its aggregates were stored.
    first_seen: Mapped[datetime] = _now()
    last_seen: Mapped[datetime] = _now()


class Trial(_TrialColumns, Base):
    """The view ``trials`` (read only): ``trial_sums`` plus the aggregates stored since the
    policy's fold watermark, one row per trial key, each stored report counted once. An id is
    the folded row's, or minus an aggregate's id for a key not folded yet."""

    __tablename__ = "trials"
    __table_args__ = ({"info": {"is_view": True}},)


class TrialSums(_TrialColumns, Base):
    """The folded sums, written only by the fold (``storage/fold.py``)."""

    __tablename__ = "trial_sums"
    __table_args__ = (
        UniqueConstraint(
            "policy_id",
            "context_id",
            "cc",
            "theta_key",
            "bucket",
            name="trials_policy_id_context_id_cc_theta_key_bucket_key",
        ),
        Index("trials_policy_bucket", "policy_id", "bucket"),
    )


class Plan(Base):
    """Booster's current answer for one (policy, context): kept so a restart answers the same."""

    __tablename__ = "plans"
    policy_id: Mapped[int] = mapped_column(ForeignKey("policies.id"), primary_key=True)
    context_id: Mapped[int] = mapped_column(ForeignKey("contexts.id"), primary_key=True)
    plan_version: Mapped[int] = mapped_column(BigInteger, nullable=False)
    incumbent_key: Mapped[str] = mapped_column(String(96), nullable=False)
    incumbent_utility: Mapped[float | None] = mapped_column(Double)
    candidate_keys: Mapped[list[str]] = mapped_column(JSONB, nullable=False)
    updated_at: Mapped[datetime] = _now()


class IncumbentChange(Base):
    """A change of a (policy, context)'s published incumbent: one row each time a refit
    publishes an incumbent θ other than the last one recorded, in the same transaction as the
    plan. Rows are few (one per change, not per refit) and kept: they are the audit trail of
    when hosts were moved to another θ, and what the dashboard marks per round."""

    __tablename__ = "incumbent_history"
    __table_args__ = (
        UniqueConstraint(
            "policy_id",
            "context_id",
            "plan_generation",
            name="incumbent_history_policy_id_context_id_plan_generation_key",
        ),
        Index("incumbent_history_policy_context_at", "policy_id", "context_id", "published_at"),
    )
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    policy_id: Mapped[int] = mapped_column(ForeignKey("policies.id"), nullable=False)
    context_id: Mapped[int] = mapped_column(ForeignKey("contexts.id"), nullable=False)
    # Whose θ the key is in (the policy's target_cc can change): 'fusion', 'cubic', ...
    datapath: Mapped[str] = mapped_column(String(16), nullable=False)
    theta_key: Mapped[str] = mapped_column(String(96), nullable=False)
    # The planner's posterior mean of eq. 9 at the policy's σ of that refit.
    predicted_utility: Mapped[float | None] = mapped_column(Double)
    sigma: Mapped[float] = mapped_column(Double, nullable=False)
    published_at: Mapped[datetime] = _now()
    # The refit that chose it: the policy's plan generation it published (refit_log has the
    # same number while it keeps the refit) and the replica that ran it. NULL for the plans
    # carried over when the table was created (migration 0009).
    plan_generation: Mapped[int | None] = mapped_column(BigInteger)
    refit_owner: Mapped[str | None] = mapped_column(String(128))


class PolicyContext(Base):
    """A context admitted to a policy (by the first report with flows from it): what the
    policy plans for, bounded by ``policies.max_contexts`` and per-host quotas."""

    __tablename__ = "policy_contexts"
    policy_id: Mapped[int] = mapped_column(ForeignKey("policies.id"), primary_key=True)
    context_id: Mapped[int] = mapped_column(ForeignKey("contexts.id"), primary_key=True)
    first_host: Mapped[str] = mapped_column(String(128), nullable=False)
    admitted_at: Mapped[datetime] = _now()


class FoldWatermark(Base):
    """Per policy, the transaction id below which every stored aggregate is in ``trial_sums``
    (``storage/fold.py``); a trigger adds the row with its policy (migration 0014)."""

    __tablename__ = "fold_watermarks"
    policy_id: Mapped[int] = mapped_column(
        ForeignKey("policies.id", ondelete="CASCADE"), primary_key=True
    )
    folded_xid: Mapped[str] = mapped_column(XID8, nullable=False)
    folded_at: Mapped[datetime] = _now()


class RefitLog(Base):
    """One published refit: which replica owned the policy's refit, and when."""

    __tablename__ = "refit_log"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    policy_id: Mapped[int] = mapped_column(ForeignKey("policies.id"), nullable=False)
    owner: Mapped[str] = mapped_column(String(128), nullable=False)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    finished_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.clock_timestamp(), nullable=False
    )
    plan_generation: Mapped[int] = mapped_column(BigInteger, nullable=False)
    contexts: Mapped[int] = mapped_column(Integer, nullable=False)
    trials: Mapped[int] = mapped_column(Integer, nullable=False)


class ApiToken(Base):
    """A bearer credential; only its SHA-256 is stored."""

    __tablename__ = "api_tokens"
    __table_args__ = (
        CheckConstraint("host_id IS NULL OR role = 'agent'", name="api_tokens_host_agent_only"),
        Index("api_tokens_host", "host_id"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(160), unique=True, nullable=False)
    role: Mapped[str] = mapped_column(String(16), nullable=False)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True, nullable=False)
    created_at: Mapped[datetime] = _now()
    revoked: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    # The one host an agent token speaks for (NULL: not bound; see service/auth.py).
    host_id: Mapped[str | None] = mapped_column(String(128))
    # Refused after this instant (NULL: never); set on a host's old token by a rotation.
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class AuditEntry(Base):
    """Who changed what: every state-changing operator call leaves one row."""

    __tablename__ = "audit_log"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    at: Mapped[datetime] = _now()
    actor: Mapped[str] = mapped_column(String(64), nullable=False)
    action: Mapped[str] = mapped_column(String(64), nullable=False)
    target: Mapped[str] = mapped_column(String(128), nullable=False)
    detail: Mapped[dict] = mapped_column(JSONB, nullable=False)
    note: Mapped[str | None] = mapped_column(Text)


class ReplicaHeartbeat(Base):
    """Each replica's write probe (``service/sync.py``): upserted every few seconds, so a
    database that answers reads but cannot write makes the replica not ready (migration 0012)."""

    __tablename__ = "replica_heartbeats"
    replica: Mapped[str] = mapped_column(String(200), primary_key=True)
    at: Mapped[datetime] = _now()


class ThetaOverride(Base):
    """What an operator imposes over the optimiser for a policy (``context_id`` NULL) or one
    of its contexts: a pinned θ (``kind`` 'pin'; ``origin`` says how it was chosen: pin,
    freeze, rollback) or the kill switch ('kill': the datapath's safe default). Applied on
    every replica's read path (``service/plan_cache.py``); migration 0012."""

    __tablename__ = "theta_overrides"
    __table_args__ = (
        CheckConstraint(
            "(kind = 'pin' AND theta_key IS NOT NULL) OR (kind = 'kill' AND theta_key IS NULL)",
            name="theta_overrides_kind_theta",
        ),
        Index(
            "theta_overrides_scope",
            "policy_id",
            text("(COALESCE(context_id, 0))"),
            "kind",
            unique=True,
        ),
    )
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    policy_id: Mapped[int] = mapped_column(ForeignKey("policies.id"), nullable=False)
    context_id: Mapped[int | None] = mapped_column(ForeignKey("contexts.id"))
    kind: Mapped[str] = mapped_column(String(8), nullable=False)
    datapath: Mapped[str] = mapped_column(String(16), nullable=False)
    theta_key: Mapped[str | None] = mapped_column(String(96))
    origin: Mapped[str] = mapped_column(String(16), nullable=False)
    detail: Mapped[dict] = mapped_column(JSONB, nullable=False, server_default="{}")
    set_by: Mapped[str] = mapped_column(String(64), nullable=False)
    set_at: Mapped[datetime] = _now()
