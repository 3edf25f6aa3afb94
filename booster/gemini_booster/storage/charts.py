"""The dashboard's chart queries, read-only, each behind a named function: a context found by
its key, a context's Fusion sums per time bucket and θ, the flows per θ, and what the newest
raw reports hold (hosts per θ, a context's aggregates with their quantile sketches).

Every query is bounded by the window the caller passes (the policy's history window; the
service layer decides it, see ``models.Policy.history_window``). Sketches and hosts exist only
in the raw aggregates, which are read from the policy's newest reports only (``limit``, by
default ``MAX_RECENT_REPORTS``): reports have no index by time, so the newest are found
backwards along their primary key, a bound on one request's work whatever the table's size.
Reads only: any replica may answer them from the database as it is.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, Engine, Subquery, func, select

from gemini_api.sums import COMPLETION_COLUMNS

from ..domain import SUM_FIELDS, ContextKey, FlowSums
from .schema import Context, Report, ReportAggregate
from .schema import Trial as TrialRow
from .trials import flow_sums

MAX_RECENT_REPORTS = 20_000


@dataclass(frozen=True)
class RecentHosts:
    """Hosts that reported Fusion flows in the newest reports: per θ key, in all, and how
    many reports were read."""

    per_theta: dict[str, int]
    hosts: int
    reports: int


@dataclass(frozen=True)
class Aggregate:
    """One raw aggregate of a report: its CC ('' for the tuned datapath), θ key, the encoded
    throughput and delay sketches (b'': sent without), and its flow sums."""

    cc: str
    theta_key: str
    sketch: bytes
    delay_sketch: bytes
    sums: FlowSums


@dataclass(frozen=True)
class RecentAggregates:
    aggregates: list[Aggregate]
    reports: int = 0
    truncated: bool = False  # the window held more reports than were read


def context_id(engine: Engine, key: ContextKey) -> int | None:
    """The stored context of ``key``; None when no report ever named it."""
    q = select(Context.id).where(
        Context.src_region == key.src_region,
        Context.src_isp == key.src_isp,
        Context.dst_region == key.dst_region,
        Context.dst_isp == key.dst_isp,
        Context.hour == key.hour,
    )
    with engine.connect() as conn:
        found = conn.execute(q).scalar_one_or_none()
    return None if found is None else int(found)


def bucket_sums(
    engine: Engine, policy_id: int, context: int, window: timedelta
) -> dict[datetime, dict[str, FlowSums]]:
    """Bucket → θ key → Fusion flow sums of one context, buckets that began within
    ``window``, oldest first."""
    q = (
        select(
            TrialRow.bucket,
            TrialRow.theta_key,
            *(getattr(TrialRow, f) for f in SUM_FIELDS),
            *(getattr(TrialRow, c) for c in COMPLETION_COLUMNS),
        )
        .where(
            TrialRow.policy_id == policy_id,
            TrialRow.context_id == context,
            TrialRow.cc == "",
            TrialRow.bucket >= func.now() - window,
        )
        .order_by(TrialRow.bucket)
    )
    out: dict[datetime, dict[str, FlowSums]] = defaultdict(dict)
    with engine.connect() as conn:
        for bucket, key, *sums in conn.execute(q):
            out[bucket][key] = flow_sums(sums)
    return dict(out)


def theta_flows(
    engine: Engine, policy_id: int, window: timedelta, context: int | None = None
) -> dict[str, int]:
    """θ key → Fusion flows of buckets that began within ``window``, from the trials' sums (of
    one context, or of all when None)."""
    q = (
        select(TrialRow.theta_key, func.sum(TrialRow.flow_count))
        .where(
            TrialRow.policy_id == policy_id,
            TrialRow.cc == "",
            TrialRow.bucket >= func.now() - window,
        )
        .group_by(TrialRow.theta_key)
    )
    if context is not None:
        q = q.where(TrialRow.context_id == context)
    with engine.connect() as conn:
        return {key: int(n) for key, n in conn.execute(q)}


def _recent_reports(policy_id: int, window: timedelta, limit: int) -> Subquery:
    """The newest ``limit`` reports of the policy that ended within ``window``: id and host."""
    return (
        select(Report.id, Report.host_id)
        .where(Report.policy_id == policy_id, Report.interval_end >= func.now() - window)
        .order_by(Report.id.desc())
        .limit(limit)
        .subquery()
    )


def _count_recent(
    conn: Connection, policy_id: int, window: timedelta, limit: int
) -> tuple[int, bool]:
    """How many reports ``_recent_reports`` reads, and whether the window held more."""
    more = _recent_reports(policy_id, window, limit + 1)
    n = int(conn.execute(select(func.count()).select_from(more)).scalar_one())
    return min(n, limit), n > limit


def theta_hosts(
    engine: Engine,
    policy_id: int,
    window: timedelta,
    context: int | None = None,
    limit: int = MAX_RECENT_REPORTS,
) -> RecentHosts:
    """Hosts that reported Fusion flows (of one context, or of any when None), per θ key and
    in all, in the newest reports."""
    recent = _recent_reports(policy_id, window, limit)
    fusion_q = (
        select(ReportAggregate.theta_key, recent.c.host_id)
        .join(recent, recent.c.id == ReportAggregate.report_pk)
        .where(ReportAggregate.cc == "")
    )
    if context is not None:
        fusion_q = fusion_q.where(ReportAggregate.context_id == context)
    fusion = fusion_q.subquery()
    per_theta = select(fusion.c.theta_key, func.count(func.distinct(fusion.c.host_id))).group_by(
        fusion.c.theta_key
    )
    with engine.connect() as conn:
        hosts = {key: int(n) for key, n in conn.execute(per_theta)}
        total = conn.execute(select(func.count(func.distinct(fusion.c.host_id)))).scalar_one()
        reports, _ = _count_recent(conn, policy_id, window, limit)
    return RecentHosts(hosts, int(total), reports)


def context_aggregates(
    engine: Engine,
    policy_id: int,
    context: int,
    window: timedelta,
    limit: int = MAX_RECENT_REPORTS,
) -> RecentAggregates:
    """Every raw aggregate of one context in the newest reports, with their sketches."""
    recent = _recent_reports(policy_id, window, limit)
    q = (
        select(
            ReportAggregate.cc,
            ReportAggregate.theta_key,
            ReportAggregate.sketch,
            ReportAggregate.delay_sketch,
            *(getattr(ReportAggregate, f) for f in SUM_FIELDS),
        )
        .join(recent, recent.c.id == ReportAggregate.report_pk)
        .where(ReportAggregate.context_id == context)
    )
    with engine.connect() as conn:
        reports, truncated = _count_recent(conn, policy_id, window, limit)
        rows = conn.execute(q).all()
    aggregates = [
        Aggregate(cc, key, raw, raw_delay, FlowSums(int(n), *map(float, sums)))
        for cc, key, raw, raw_delay, n, *sums in rows
    ]
    return RecentAggregates(aggregates, reports, truncated)
