"""Trials and contexts as read for fitting, and raw reports read back: reads only.

Guarantees across replicas
--------------------------
- **Writers.** None here. Reports are appended by any replica (``ingest.py``); the refit lease
  holder folds them into trial sums exactly once (``fold.py``, whose contract this module
  relies on); contexts and a policy's admitted contexts are created by ingest on any replica.
- **Readers.** Every function here may run on any replica, at READ COMMITTED, each one
  statement: ``load_trials`` and ``load_baselines`` read the ``trials`` view (folded sums plus
  the aggregates above the watermark, in one snapshot), so a report is seen exactly once,
  whether folded yet or not. ``history`` ages points out bucket by bucket, by the database's
  clock.
- **What a follower caches.** The refit lease holder reads trials at each refit and keeps
  nothing between refits. Contexts never change once created, so any replica may cache a
  context's key for as long as it lives (``service/plan_cache.py`` does).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import Engine, func, select

from gemini_api.sums import COMPLETION_COLUMNS, CompletionSums

from ..domain import SUM_FIELDS, ContextKey, FlowSums, Trial
from .schema import Context, PolicyContext, Report, ReportAggregate
from .schema import Trial as TrialRow

_TRIAL_COLUMNS = (
    TrialRow.context_id,
    TrialRow.theta_key,
    TrialRow.flow_count,
    TrialRow.tpt_sum,
    TrialRow.tpt_sq_sum,
    TrialRow.delay_sum,
    TrialRow.delay_sq_sum,
    TrialRow.tpt_delay_sum,
    *(getattr(TrialRow, c) for c in COMPLETION_COLUMNS),
    TrialRow.slow_flows,
    TrialRow.report_count,
    TrialRow.last_seen,
    TrialRow.bucket,
)
_COMPLETION_AT = len(SUM_FIELDS)  # where the completion sums start in a trial's sums


def flow_sums(sums: Sequence[Any]) -> FlowSums:
    """A trial's sums from its columns: eq. 9's (``SUM_FIELDS``), then the completion sums
    (``COMPLETION_COLUMNS``), as selected here and by the charts' queries."""
    done = CompletionSums(*sums[_COMPLETION_AT:])
    return FlowSums(*sums[:_COMPLETION_AT], completion=done)


def _trial(row) -> Trial:
    context_id, theta_key, *sums, slow, reports, last_seen, bucket = row
    return Trial(context_id, theta_key, flow_sums(sums), slow, reports, last_seen, bucket)


def _recent(q, history: timedelta | None):
    """Trials of buckets that started within ``history``: old flows age out bucket by bucket."""
    return q if history is None else q.where(TrialRow.bucket >= func.now() - history)


def load_trials(engine: Engine, policy_id: int, history: timedelta | None = None) -> list[Trial]:
    """The model's points, one per (context, θ, bucket): Fusion trials only (a baseline CC's
    flows have no θ to learn)."""
    q = select(*_TRIAL_COLUMNS).where(TrialRow.policy_id == policy_id, TrialRow.cc == "")
    with engine.connect() as conn:
        return [_trial(r) for r in conn.execute(_recent(q, history).order_by(TrialRow.id))]


def load_baselines(
    engine: Engine, policy_id: int, history: timedelta | None = None
) -> dict[str, list[Trial]]:
    """Flows of other CCs per CC name, one record per context (theta_key '')."""
    q = select(TrialRow.cc, *_TRIAL_COLUMNS).where(
        TrialRow.policy_id == policy_id, TrialRow.cc != ""
    )
    out: dict[str, list[Trial]] = {}
    with engine.connect() as conn:
        for cc, *rest in conn.execute(_recent(q, history).order_by(TrialRow.id)):
            out.setdefault(cc, []).append(_trial(rest))
    return out


def admitted_contexts(engine: Engine, policy_id: int) -> set[int]:
    """The contexts a policy plans for: those admitted by reports with flows from them."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(PolicyContext.context_id).where(PolicyContext.policy_id == policy_id)
        )
        return {r[0] for r in rows}


_CONTEXT_COLUMNS = (
    Context.id,
    Context.src_region,
    Context.src_isp,
    Context.dst_region,
    Context.dst_isp,
    Context.hour,
)


def load_contexts(engine: Engine, ids: set[int] | None = None) -> dict[int, ContextKey]:
    """Context id → key; all contexts, or only ``ids``."""
    q = select(*_CONTEXT_COLUMNS)
    if ids is not None:
        q = q.where(Context.id.in_(sorted(ids)))
    with engine.connect() as conn:
        return {r[0]: ContextKey(*r[1:]) for r in conn.execute(q)}


@dataclass(frozen=True)
class GroupSums:
    """Fusion flows of one destination region and one group (an interval, or a θ), summed."""

    dst_region: str
    group: object
    first_interval: datetime
    sums: FlowSums


_GROUP_COLUMNS = {"interval": Report.interval_start, "theta": ReportAggregate.theta_key}


def fusion_sums_by(
    engine: Engine, policy_id: int, group: Literal["interval", "theta"]
) -> list[GroupSums]:
    """Raw Fusion aggregates as stored, summed per (destination region, reporting interval or
    θ), in the order each group was first reported: for reading a run's history exactly."""
    col = _GROUP_COLUMNS[group]
    first = func.min(Report.interval_start)
    q = (
        select(
            Context.dst_region,
            col,
            first,
            *(func.sum(getattr(ReportAggregate, f)) for f in SUM_FIELDS),
        )
        .join(Report, Report.id == ReportAggregate.report_pk)
        .join(Context, Context.id == ReportAggregate.context_id)
        .where(ReportAggregate.policy_id == policy_id, ReportAggregate.cc == "")
        .group_by(Context.dst_region, col)
        .order_by(first)
    )
    with engine.connect() as conn:
        return [
            GroupSums(region, key, start, FlowSums(int(n), *map(float, rest)))
            for region, key, start, n, *rest in conn.execute(q)
        ]


def count_reports(engine: Engine, host_id: str, since: datetime) -> int:
    """Reports stored from ``host_id`` for intervals starting at or after ``since``."""
    q = select(func.count()).where(Report.host_id == host_id, Report.interval_start >= since)
    with engine.connect() as conn:
        return conn.execute(q).scalar_one()


def host_reports(engine: Engine, host_id: str) -> list[tuple[str, datetime, datetime]]:
    """(report id, interval start, interval end) of every report from ``host_id``, in order."""
    q = (
        select(Report.report_id, Report.interval_start, Report.interval_end)
        .where(Report.host_id == host_id)
        .order_by(Report.interval_start)
    )
    with engine.connect() as conn:
        return [(r[0], r[1], r[2]) for r in conn.execute(q)]
