"""Storing agent reports exactly once, many per transaction.

A report is accepted atomically: its row, every aggregate and the trial sums it adds commit
together or not at all. Idempotency rests on the unique ``reports.report_id``:
``INSERT … ON CONFLICT DO NOTHING RETURNING`` names the reports that are new, and only those are
folded into ``trials``. Concurrent retries of one key meet at that unique index, so a report is
counted once even when two Booster replicas receive it at the same moment.

Batching (group commit) is what makes ingestion fast: the per-transaction cost of PostgreSQL is
paid once for up to ``ingest_batch_max`` reports.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Connection, Engine, func, insert, select, tuple_
from sqlalchemy.dialects.postgresql import insert as pg_insert

from .schema import TRIAL_SUMS, Context, Report, ReportAggregate, Trial

ContextKey = tuple[str, str, str, str, int]


@dataclass(frozen=True)
class AggregateRow:
    context: ContextKey
    theta_key: str
    theta_version: int
    flow_count: int
    tpt_sum: float
    tpt_sq_sum: float
    delay_sum: float
    delay_sq_sum: float
    tpt_delay_sum: float
    slow_flows: int
    size_buckets: tuple[int, ...]
    sketch: bytes


@dataclass(frozen=True)
class ReportRow:
    report_id: str
    digest: bytes
    host_id: str
    policy_id: int
    interval_start: datetime
    interval_end: datetime
    aggregates: tuple[AggregateRow, ...]


class ReportConflict(Exception):
    """The key was stored before with different content: a client bug, never a retry."""


@dataclass
class IngestOutcome:
    duplicate: bool = False
    stored: int = 0
    error: Exception | None = None


@dataclass
class ContextIds:
    """Context tuple → id, cached: contexts are few and never change once written."""

    ids: dict[ContextKey, int] = field(default_factory=dict)

    def resolve(self, conn: Connection, keys: set[ContextKey]) -> dict[ContextKey, int]:
        missing = [k for k in keys if k not in self.ids]
        if missing:
            cols = ("src_region", "src_isp", "dst_region", "dst_isp", "hour")
            rows = [dict(zip(cols, k, strict=True)) for k in sorted(missing)]
            conn.execute(pg_insert(Context).values(rows).on_conflict_do_nothing())
            found = conn.execute(
                select(Context.id, *(getattr(Context, c) for c in cols)).where(
                    tuple_(*(getattr(Context, c) for c in cols)).in_(missing)
                )
            )
            for row in found:
                self.ids[tuple(row[1:])] = row[0]
        return self.ids

    def resolve_with_engine(self, engine: Engine, keys: set[ContextKey]) -> dict[ContextKey, int]:
        with engine.begin() as conn:
            return self.resolve(conn, keys)


def _trial_deltas(reports: Sequence[ReportRow], context_ids: dict[ContextKey, int]) -> list[dict]:
    """Sum a batch per trial key first: one upsert may not touch the same row twice."""
    sums: dict[tuple[int, int, str], list[float]] = defaultdict(lambda: [0] * len(TRIAL_SUMS))
    for r in reports:
        for a in r.aggregates:
            s = sums[(r.policy_id, context_ids[a.context], a.theta_key)]
            for i, v in enumerate(
                (
                    a.flow_count,
                    a.tpt_sum,
                    a.tpt_sq_sum,
                    a.delay_sum,
                    a.delay_sq_sum,
                    a.tpt_delay_sum,
                    a.slow_flows,
                    1,
                )
            ):
                s[i] += v
    return [
        {"policy_id": p, "context_id": c, "theta_key": k, **dict(zip(TRIAL_SUMS, v, strict=True))}
        for (p, c, k), v in sums.items()
    ]


def _upsert_trials(conn: Connection, deltas: list[dict]) -> None:
    if not deltas:
        return
    stmt = pg_insert(Trial).values(
        sorted(deltas, key=lambda d: (d["policy_id"], d["context_id"], d["theta_key"]))
    )
    updates = {c: getattr(Trial, c) + getattr(stmt.excluded, c) for c in TRIAL_SUMS}
    updates["last_seen"] = func.now()
    conn.execute(
        stmt.on_conflict_do_update(
            index_elements=["policy_id", "context_id", "theta_key"], set_=updates
        )
    )


def _dedupe(reports: Sequence[ReportRow]) -> tuple[list[ReportRow], dict[int, int]]:
    """First occurrence of each key in the batch; map every index to the index it repeats."""
    first: dict[str, int] = {}
    unique: list[ReportRow] = []
    alias: dict[int, int] = {}
    for i, r in enumerate(reports):
        if r.report_id in first:
            alias[i] = first[r.report_id]
        else:
            first[r.report_id] = i
            unique.append(r)
    return unique, alias


def store_reports(
    engine: Engine, reports: Sequence[ReportRow], context_ids: ContextIds
) -> list[IngestOutcome]:
    """Store a batch in one transaction; the outcome list is parallel to ``reports``."""
    unique, alias = _dedupe(reports)
    outcomes = {r.report_id: IngestOutcome() for r in unique}
    with engine.begin() as conn:
        ids = context_ids.resolve(conn, {a.context for r in unique for a in r.aggregates})
        inserted = conn.execute(
            pg_insert(Report)
            .values(
                [
                    {
                        "report_id": r.report_id,
                        "digest": r.digest,
                        "host_id": r.host_id,
                        "policy_id": r.policy_id,
                        "interval_start": r.interval_start,
                        "interval_end": r.interval_end,
                        "aggregate_count": len(r.aggregates),
                    }
                    for r in unique
                ]
            )
            .on_conflict_do_nothing(index_elements=["report_id"])
            .returning(Report.report_id, Report.id)
        ).all()
        new_pk = dict(inserted)
        old = [r for r in unique if r.report_id not in new_pk]
        if old:
            digests = dict(
                conn.execute(
                    select(Report.report_id, Report.digest).where(
                        Report.report_id.in_([r.report_id for r in old])
                    )
                ).all()
            )
            for r in old:
                o = outcomes[r.report_id]
                o.duplicate = True
                if digests.get(r.report_id) != r.digest:
                    o.error = ReportConflict(
                        f"report_id {r.report_id!r} was already stored with different content"
                    )
        new = [r for r in unique if r.report_id in new_pk]
        rows = [
            {
                "report_pk": new_pk[r.report_id],
                "policy_id": r.policy_id,
                "context_id": ids[a.context],
                "theta_key": a.theta_key,
                "theta_version": a.theta_version,
                "flow_count": a.flow_count,
                "tpt_sum": a.tpt_sum,
                "tpt_sq_sum": a.tpt_sq_sum,
                "delay_sum": a.delay_sum,
                "delay_sq_sum": a.delay_sq_sum,
                "tpt_delay_sum": a.tpt_delay_sum,
                "slow_flows": a.slow_flows,
                "size_buckets": list(a.size_buckets),
                "sketch": a.sketch,
            }
            for r in new
            for a in r.aggregates
        ]
        if rows:
            conn.execute(insert(ReportAggregate), rows)
        _upsert_trials(conn, _trial_deltas(new, ids))
        for r in new:
            outcomes[r.report_id].stored = len(r.aggregates)
    result = []
    for i, r in enumerate(reports):
        if i in alias:
            same = reports[alias[i]].digest == r.digest
            result.append(
                IngestOutcome(
                    duplicate=True,
                    error=None
                    if same
                    else ReportConflict(
                        f"report_id {r.report_id!r} was sent twice with different content"
                    ),
                )
            )
        else:
            result.append(outcomes[r.report_id])
    return result
