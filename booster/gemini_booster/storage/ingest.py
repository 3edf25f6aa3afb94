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

from sqlalchemy import Connection, Engine, select, tuple_
from sqlalchemy.dialects.postgresql import insert as pg_insert

from .schema import TRIAL_SUMS, Context, Report

ContextKey = tuple[str, str, str, str, int]


@dataclass(frozen=True)
class AggregateRow:
    """One checked aggregate: Fusion flows under ``theta_key`` (cc ''), or a baseline CC's
    flows (theta_key '')."""

    context: ContextKey
    cc: str
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
    sums: dict[tuple[int, int, str, str], list[float]] = defaultdict(lambda: [0] * len(TRIAL_SUMS))
    for r in reports:
        for a in r.aggregates:
            s = sums[(r.policy_id, context_ids[a.context], a.cc, a.theta_key)]
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
        {
            "policy_id": p,
            "context_id": c,
            "cc": cc,
            "theta_key": k,
            **dict(zip(TRIAL_SUMS, v, strict=True)),
        }
        for (p, c, cc, k), v in sums.items()
    ]


_UPSERT_TRIALS = """
INSERT INTO trials (policy_id, context_id, cc, theta_key, {cols}, first_seen, last_seen)
SELECT p, c, cc, k, {unnest_cols}, now(), now()
FROM unnest(%s::int[], %s::int[], %s::text[], %s::text[], {arrays}) AS u(p, c, cc, k, {ucols})
ON CONFLICT (policy_id, context_id, cc, theta_key) DO UPDATE SET {updates}, last_seen = now()
""".format(
    cols=", ".join(TRIAL_SUMS),
    unnest_cols=", ".join(f"u_{c}" for c in TRIAL_SUMS),
    ucols=", ".join(f"u_{c}" for c in TRIAL_SUMS),
    arrays=", ".join(
        "%s::bigint[]" if c in ("flow_count", "slow_flows", "report_count") else "%s::float8[]"
        for c in TRIAL_SUMS
    ),
    updates=", ".join(f"{c} = trials.{c} + excluded.{c}" for c in TRIAL_SUMS),
)

_INSERT_REPORTS = """
INSERT INTO reports (report_id, digest, host_id, policy_id, interval_start, interval_end,
                     aggregate_count)
SELECT * FROM unnest(%s::text[], %s::bytea[], %s::text[], %s::int[], %s::timestamptz[],
                     %s::timestamptz[], %s::int[])
ON CONFLICT (report_id) DO NOTHING
RETURNING report_id, id
"""

_AGGREGATE_COLUMNS = (
    "report_pk",
    "policy_id",
    "context_id",
    "cc",
    "theta_key",
    "theta_version",
    "flow_count",
    "tpt_sum",
    "tpt_sq_sum",
    "delay_sum",
    "delay_sq_sum",
    "tpt_delay_sum",
    "slow_flows",
    "size_buckets",
    "sketch",
)


def _columns(rows: list[dict], names: Sequence[str]) -> list[list]:
    return [[r[n] for r in rows] for n in names]


def _upsert_trials(cur, deltas: list[dict]) -> None:
    if not deltas:
        return
    # Sorted, so concurrent replicas lock trial rows in one order and cannot deadlock.
    key = ("policy_id", "context_id", "cc", "theta_key")
    deltas = sorted(deltas, key=lambda d: tuple(d[k] for k in key))
    cur.execute(_UPSERT_TRIALS, _columns(deltas, (*key, *TRIAL_SUMS)))


def _insert_reports(cur, reports: Sequence[ReportRow]) -> dict[str, int]:
    """One statement for the whole batch (arrays + unnest), prepared once per connection."""
    cur.execute(
        _INSERT_REPORTS,
        [
            [r.report_id for r in reports],
            [r.digest for r in reports],
            [r.host_id for r in reports],
            [r.policy_id for r in reports],
            [r.interval_start for r in reports],
            [r.interval_end for r in reports],
            [len(r.aggregates) for r in reports],
        ],
    )
    return dict(cur.fetchall())


def _copy_aggregates(cur, rows: list[tuple]) -> None:
    cols = ", ".join(_AGGREGATE_COLUMNS)
    with cur.copy(f"COPY report_aggregates ({cols}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


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
        cur = conn.connection.driver_connection.cursor()
        new_pk = _insert_reports(cur, unique)
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
            (
                new_pk[r.report_id],
                r.policy_id,
                ids[a.context],
                a.cc,
                a.theta_key,
                a.theta_version,
                a.flow_count,
                a.tpt_sum,
                a.tpt_sq_sum,
                a.delay_sum,
                a.delay_sq_sum,
                a.tpt_delay_sum,
                a.slow_flows,
                list(a.size_buckets),
                a.sketch,
            )
            for r in new
            for a in r.aggregates
        ]
        if rows:
            _copy_aggregates(cur, rows)
        _upsert_trials(cur, _trial_deltas(new, ids))
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
