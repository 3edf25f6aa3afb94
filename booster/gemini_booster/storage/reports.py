"""Raw reports read back whole, for a lab or benchmark run that checks what one host sent:
per reporting interval, per CC as reported and θ key, the summed flows. Not on any serving
path (it scans one host's reports); reads only, from any replica."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, func, select

from ..domain import SUM_FIELDS, FlowSums
from .schema import Report, ReportAggregate


@dataclass(frozen=True)
class IntervalSums:
    """One host's flows of one reporting interval, CC ('' the policy's own) and θ key."""

    start: datetime
    end: datetime
    cc: str
    theta_key: str
    sums: FlowSums


def interval_sums(engine: Engine, host: str) -> list[IntervalSums]:
    """Per reporting interval of ``host``, per CC and θ key: the summed flows, in interval
    order."""
    group = (
        Report.interval_start,
        Report.interval_end,
        ReportAggregate.cc,
        ReportAggregate.theta_key,
    )
    q = (
        select(*group, *(func.sum(getattr(ReportAggregate, f)) for f in SUM_FIELDS))
        .join(Report, Report.id == ReportAggregate.report_pk)
        .where(Report.host_id == host)
        .group_by(*group)
        .order_by(Report.interval_start)
    )
    with engine.connect() as conn:
        return [
            IntervalSums(start, end, cc, key, FlowSums(int(n), *map(float, rest)))
            for start, end, cc, key, n, *rest in conn.execute(q)
        ]
