"""Storing agent reports exactly once, many per transaction, within each policy's quotas.

A report is accepted atomically: its row, every aggregate and the contexts it admits commit
together or not at all. Idempotency rests on the unique ``reports (host_id, report_id)``: a
report id is the sending host's own key (the host authenticated by its token or certificate),
so no host can take another's id, and ``INSERT … ON CONFLICT DO NOTHING RETURNING`` names the
reports that are new, and only their aggregates are stored. Concurrent retries of one key meet
at that unique index, so a report is stored once even when two Booster replicas receive it at
the same moment.

Ingest only appends (the report row, its aggregates by COPY): it updates no shared row, so
replicas storing at once never wait for each other's row locks, and it sends no notification.
The refit owner folds the new aggregates into the trial sums behind a watermark, exactly once
(``storage/fold.py``); the view ``trials`` shows them before that.

Batching (group commit) is what makes ingestion fast: the per-transaction cost of PostgreSQL is
paid once for up to ``ingest_batch_max`` reports. ``store_reports`` is that one transaction;
the caller decides what to do when it fails (``is_refusal`` tells a database that refuses some
report's content from one that is away, ``is_transient``, or anything unforeseen).

Admission: a context becomes part of a policy with the first stored report that brings flows
from it (a ``policy_contexts`` row naming that report's host). A report that would admit more
contexts than the policy's ``max_contexts``, or more than a host may add to a policy in a day,
is refused whole (a quota rejection); the rest of its batch is stored.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import psycopg
from sqlalchemy import Connection, Engine, select, tuple_
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import DBAPIError

from gemini_api.datapaths import registry
from gemini_api.sums import COMPLETION_COLUMNS

from ..domain import CONTEXT_FIELDS, ContextKey, FlowSums
from ..experiments.assignment import assignment
from . import experiments
from .schema import Context, Report

DEFAULT_CC = registry().default.cc

# SQLSTATE classes of errors about the data written, which the same report meets again on
# every retry: data exceptions (22: a value out of range, invalid text), integrity constraints
# (23: check, not null, foreign key), program limits (54: an index row too large; raised as
# OperationalError), and refusals raised by triggers (P0).
_CONTENT_SQLSTATE_CLASSES = ("22", "23", "54", "P0")

Cursor = psycopg.Cursor[Any]
ReportKey = tuple[str, str]  # (host id, report id)


@dataclass(frozen=True)
class AggregateRow:
    """One checked aggregate: Fusion flows under ``theta_key`` (cc ''), or a baseline CC's
    flows (theta_key '')."""

    context: ContextKey
    cc: str
    theta_key: str
    theta_version: int
    sums: FlowSums
    slow_flows: int
    size_buckets: tuple[int, ...]
    sketch: bytes
    delay_sketch: bytes  # b"": not sketched (agents before the queueing-delay sketch)


@dataclass(frozen=True)
class ReportRow:
    """One checked report, with what admission needs to know of its policy (its name for
    messages and its context quota), so the writer never looks policies up."""

    report_id: str
    digest: bytes
    host_id: str
    policy_id: int
    policy_name: str
    max_contexts: int
    interval_start: datetime
    interval_end: datetime
    aggregates: tuple[AggregateRow, ...]
    trial_bucket_hours: int = 1
    target_cc: str = DEFAULT_CC  # the CC whose flows leave cc empty: the policy's datapath's

    @property
    def key(self) -> ReportKey:
        """The idempotency key: report ids are unique per host, not across hosts."""
        return (self.host_id, self.report_id)

    def flows_by_cc(self) -> list[tuple[str, FlowSums, int]]:
        """(the CC the flows ran, sums, slow flows) per aggregate: a tuned aggregate's cc is
        empty and stands for the policy's own CC."""
        return [(a.cc or self.target_cc, a.sums, a.slow_flows) for a in self.aggregates]

    def contexts(self) -> set[ContextKey]:
        return {a.context for a in self.aggregates}

    @property
    def bucket(self) -> datetime:
        """The trial bucket its flows sum into: the interval's end, floored to the policy's
        bucket width (whole hours from the Unix epoch, so every replica floors alike)."""
        width = self.trial_bucket_hours * 3600
        end = int(self.interval_end.timestamp())
        return datetime.fromtimestamp(end - end % width, UTC)


class ReportConflict(Exception):
    """The key was stored before with different content: a client bug, never a retry."""


@dataclass(frozen=True)
class Rejection:
    """Booster refuses the report for good: ``invalid`` content (including content storage
    refuses), or a ``quota`` it would exceed. Sending it again cannot succeed."""

    code: Literal["invalid", "quota"]
    message: str


@dataclass
class IngestOutcome:
    """What became of one report: ``stored`` aggregates, a ``duplicate`` of a stored report
    (with ``error`` a ReportConflict when its content differs), a permanent ``rejection``, or
    an ``error`` of storage that a retry may overcome."""

    duplicate: bool = False
    stored: int = 0
    error: Exception | None = None
    rejection: Rejection | None = None


def _driver_error(exc: BaseException) -> BaseException:
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        return exc.orig
    return exc


def is_transient(exc: BaseException) -> bool:
    """True when ``exc`` says the database is unreachable or busy rather than that it refuses
    the data: the whole batch should be retried later, not searched for a culprit."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    cause = _driver_error(exc)
    if isinstance(cause, psycopg.OperationalError):
        return not is_refusal(cause)
    return isinstance(cause, psycopg.InterfaceError)


def is_refusal(exc: BaseException) -> bool:
    """True when the database refused the data written (``_CONTENT_SQLSTATE_CLASSES``): some
    report of the batch can never be stored as sent. Anything else (the database away, a
    schema that does not match this code, a bug) is not the report's fault, and its sender
    must be told to retry rather than to drop it."""
    state = getattr(_driver_error(exc), "sqlstate", None) or ""
    return isinstance(_driver_error(exc), psycopg.Error) and state.startswith(
        _CONTENT_SQLSTATE_CLASSES
    )


@dataclass
class ContextIds:
    """Context tuple → id, cached: contexts are few and never change once written."""

    ids: dict[ContextKey, int] = field(default_factory=dict)

    def _select(self, conn: Connection, keys: list[ContextKey]) -> None:
        cols = [getattr(Context, c) for c in CONTEXT_FIELDS]
        for row in conn.execute(select(Context.id, *cols).where(tuple_(*cols).in_(keys))):
            self.ids[ContextKey(*row[1:])] = row[0]

    def lookup(self, conn: Connection, keys: Iterable[ContextKey]) -> dict[ContextKey, int]:
        """Ids of those of ``keys`` that exist, creating none (a refused report must leave
        no contexts behind)."""
        missing = [k for k in keys if k not in self.ids]
        if missing:
            self._select(conn, missing)
        return self.ids

    def resolve(self, conn: Connection, keys: set[ContextKey]) -> dict[ContextKey, int]:
        """Ids of all ``keys``, inserting the new ones in ``conn``'s transaction."""
        missing = [k for k in keys if k not in self.ids]
        if missing:
            rows = [k.as_dict() for k in sorted(ContextKey(*k) for k in missing)]
            conn.execute(pg_insert(Context).values(rows).on_conflict_do_nothing())
            self._select(conn, missing)
        return self.ids

    def forget(self) -> None:
        """After a rolled-back transaction: ids it created do not exist."""
        self.ids.clear()


@dataclass
class Admissions:
    """(policy id, context) pairs known to be admitted, so that a report whose contexts are all
    known costs no admission query. A pair enters only once it is committed (by this writer or
    seen committed by another), and admissions are never withdrawn, so the cache cannot be
    wrong in the direction that would let a report past its quota."""

    known: set[tuple[int, ContextKey]] = field(default_factory=set)

    def unknown(self, report: ReportRow) -> set[ContextKey]:
        return {c for c in report.contexts() if (report.policy_id, c) not in self.known}


_INSERT_REPORTS = """
INSERT INTO reports (report_id, digest, host_id, policy_id, interval_start, interval_end,
                     aggregate_count)
SELECT * FROM unnest(%s::text[], %s::bytea[], %s::text[], %s::int[], %s::timestamptz[],
                     %s::timestamptz[], %s::int[])
ON CONFLICT (host_id, report_id) DO NOTHING
RETURNING host_id, report_id, id
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
    "delay_sketch",
    "bucket",
    *COMPLETION_COLUMNS,
)


def _columns(rows: list[dict[str, Any]], names: Sequence[str]) -> list[list[Any]]:
    return [[r[n] for r in rows] for n in names]


def _insert_reports(cur: Cursor, reports: Sequence[ReportRow]) -> dict[ReportKey, int]:
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
    return {(host, report): pk for host, report, pk in cur.fetchall()}


def _copy_aggregates(cur: Cursor, rows: list[tuple[Any, ...]]) -> None:
    cols = ", ".join(_AGGREGATE_COLUMNS)
    with cur.copy(f"COPY report_aggregates ({cols}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


def _dedupe(reports: Sequence[ReportRow]) -> tuple[list[ReportRow], dict[int, int]]:
    """First occurrence of each key in the batch; map every index to the index it repeats."""
    first: dict[ReportKey, int] = {}
    unique: list[ReportRow] = []
    alias: dict[int, int] = {}
    for i, r in enumerate(reports):
        if r.key in first:
            alias[i] = first[r.key]
        else:
            first[r.key] = i
            unique.append(r)
    return unique, alias


_ADMITTED = """
SELECT pc.policy_id, pc.context_id
FROM policy_contexts pc JOIN unnest(%s::int[], %s::int[]) AS u(p, c)
  ON pc.policy_id = u.p AND pc.context_id = u.c
"""
_POLICY_CONTEXTS = """
SELECT policy_id, count(*) FROM policy_contexts WHERE policy_id = ANY(%s::int[])
GROUP BY policy_id
"""
_HOST_CONTEXTS_DAY = """
SELECT policy_id, first_host, count(*) FROM policy_contexts
WHERE policy_id = ANY(%s::int[]) AND first_host = ANY(%s::text[])
  AND admitted_at > now() - interval '24 hours'
GROUP BY policy_id, first_host
"""
_ADMIT = """
INSERT INTO policy_contexts (policy_id, context_id, first_host)
SELECT * FROM unnest(%s::int[], %s::int[], %s::text[])
ON CONFLICT DO NOTHING
"""


def _quota_message(
    r: ReportRow, adds: int, in_policy: int, by_host: int, host_day_quota: int
) -> str | None:
    if in_policy + adds > r.max_contexts:
        return (
            f"policy {r.policy_name!r} admits at most {r.max_contexts} contexts "
            f"({in_policy} admitted); this report adds {adds}"
        )
    if by_host + adds > host_day_quota:
        return (
            f"host {r.host_id!r} may add at most {host_day_quota} new contexts to policy "
            f"{r.policy_name!r} in 24 hours ({by_host} added); this report adds {adds}"
        )
    return None


def _quota_rejections(
    conn: Connection,
    cur: Cursor,
    reports: Sequence[ReportRow],
    context_ids: ContextIds,
    admissions: Admissions,
    host_day_quota: int,
) -> dict[ReportKey, Rejection]:
    """Reports that would admit contexts beyond a quota, by key.

    Only reports bringing contexts not known admitted pay for the queries. The batch is judged
    in order, each admitted report counting against the next. Counts are read in this
    transaction without locking, so replicas storing concurrently can each admit up to their
    quota: a quota can be overshot by at most one batch per concurrent replica.
    """
    pending = [(r, u) for r in reports if (u := admissions.unknown(r))]
    if not pending:
        return {}
    ids = context_ids.lookup(conn, {c for _, u in pending for c in u})
    by_id = {ids[c]: c for _, u in pending for c in u if c in ids}
    pairs = sorted({(r.policy_id, ids[c]) for r, u in pending for c in u if c in ids})
    if pairs:
        cur.execute(_ADMITTED, [[p for p, _ in pairs], [c for _, c in pairs]])
        admissions.known.update((p, by_id[c]) for p, c in cur.fetchall())
    policies = sorted({r.policy_id for r, _ in pending})
    cur.execute(_POLICY_CONTEXTS, [policies])
    in_policy: dict[int, int] = defaultdict(int, cur.fetchall())
    cur.execute(_HOST_CONTEXTS_DAY, [policies, sorted({r.host_id for r, _ in pending})])
    by_host: dict[tuple[int, str], int] = defaultdict(int)
    by_host.update({(p, h): n for p, h, n in cur.fetchall()})
    adding: set[tuple[int, ContextKey]] = set()
    rejections: dict[ReportKey, Rejection] = {}
    for r, _ in pending:
        new = {c for c in admissions.unknown(r) if (r.policy_id, c) not in adding}
        if not new:
            continue
        host = (r.policy_id, r.host_id)
        message = _quota_message(r, len(new), in_policy[r.policy_id], by_host[host], host_day_quota)
        if message is not None:
            rejections[r.key] = Rejection("quota", message)
            continue
        in_policy[r.policy_id] += len(new)
        by_host[host] += len(new)
        adding.update((r.policy_id, c) for c in new)
    return rejections


def _admit(
    cur: Cursor, new: Sequence[ReportRow], ids: dict[ContextKey, int], admissions: Admissions
) -> list[tuple[int, ContextKey]]:
    """Admit the contexts the stored reports bring, each by the first report (and host) that
    brought it; returns the pairs, to be known admitted once the transaction commits."""
    first_host: dict[tuple[int, ContextKey], str] = {}
    for r in new:
        for c in admissions.unknown(r):
            first_host.setdefault((r.policy_id, c), r.host_id)
    if first_host:
        # Sorted, like trial rows, so concurrent replicas take the keys in one order.
        rows = sorted((p, ids[c], h) for (p, c), h in first_host.items())
        cur.execute(_ADMIT, [[row[i] for row in rows] for i in range(3)])
    return list(first_host)


def _aggregate_rows(
    new: Sequence[ReportRow], pks: dict[ReportKey, int], ids: dict[ContextKey, int]
) -> list[tuple[Any, ...]]:
    return [
        (
            pks[r.key],
            r.policy_id,
            ids[a.context],
            a.cc,
            a.theta_key,
            a.theta_version,
            *a.sums.astuple(),
            a.slow_flows,
            list(a.size_buckets),
            a.sketch,
            a.delay_sketch,
            r.bucket,
            *a.sums.completion.values(),
        )
        for r in new
        for a in r.aggregates
    ]


def _store(
    conn: Connection,
    unique: Sequence[ReportRow],
    outcomes: dict[ReportKey, IngestOutcome],
    context_ids: ContextIds,
    admissions: Admissions,
    host_day_quota: int,
) -> list[tuple[int, ContextKey]]:
    """The body of the batch's transaction; fills ``outcomes``, returns the pairs admitted."""
    driver = conn.connection.driver_connection
    assert driver is not None  # a connection in a transaction has its driver's connection
    cur = driver.cursor()
    refused = _quota_rejections(conn, cur, unique, context_ids, admissions, host_day_quota)
    for key, rejection in refused.items():
        outcomes[key].rejection = rejection
    accepted = [r for r in unique if r.key not in refused]
    if not accepted:
        return []
    ids = context_ids.resolve(conn, {c for r in accepted for c in r.contexts()})
    new_pk = _insert_reports(cur, accepted)
    old = [r for r in accepted if r.key not in new_pk]
    if old:
        cols = tuple_(Report.host_id, Report.report_id)
        digests = {
            (host, report): digest
            for host, report, digest in conn.execute(
                select(Report.host_id, Report.report_id, Report.digest).where(
                    cols.in_([r.key for r in old])
                )
            )
        }
        for r in old:
            o = outcomes[r.key]
            o.duplicate = True
            if digests.get(r.key) != r.digest:
                o.error = ReportConflict(
                    f"report_id {r.report_id!r} was already stored with different content"
                )
    new = [r for r in accepted if r.key in new_pk]
    rows = _aggregate_rows(new, new_pk, ids)
    if rows:
        _copy_aggregates(cur, rows)
    _record_experiment_flows(conn, new)
    admitted = _admit(cur, new, ids, admissions)
    for r in new:
        outcomes[r.key].stored = len(r.aggregates)
    return admitted


def _record_experiment_flows(conn: Connection, new: Sequence[ReportRow]) -> None:
    """Add each new report's flows of its host's arm (if the host is in a running experiment
    at the report's interval start) to the experiment's per-host-day sums, in the report's
    transaction: a report is counted in its experiment exactly when it is stored."""
    if not new:
        return
    starts = [r.interval_start for r in new]
    running = experiments.experiments_of_hosts(
        conn, {r.host_id for r in new}, min(starts), max(starts)
    )
    if not running:
        return
    flows = []
    for r in new:
        for e in running:
            arm = assignment(e, r.host_id, r.interval_start)
            if arm is None:
                continue
            found = experiments.arm_flows(arm, r.host_id, r.interval_start, r.flows_by_cc())
            if found is not None:
                flows.append(found)
            break
    experiments.record_arm_flows(conn, flows)


def _repeat(first: ReportRow, outcome: IngestOutcome, again: ReportRow) -> IngestOutcome:
    """The outcome of a key sent twice in one batch: what the first got, when the content is
    the same (nothing is stored twice); a conflict otherwise."""
    if again.digest != first.digest:
        return IngestOutcome(
            duplicate=True,
            error=ReportConflict(
                f"report_id {again.report_id!r} was sent twice with different content"
            ),
        )
    if outcome.rejection is not None or outcome.error is not None:
        return outcome
    return IngestOutcome(duplicate=True)


def store_reports(
    engine: Engine,
    reports: Sequence[ReportRow],
    context_ids: ContextIds,
    admissions: Admissions,
    max_new_contexts_per_host_day: int,
) -> list[IngestOutcome]:
    """Store a batch in one transaction; the outcome list is parallel to ``reports``.

    Reports over a quota are refused (``rejection``) and the others stored. Raises when the
    transaction fails: then nothing of the batch is stored, and the caller decides whether the
    database is away (``is_transient``) or one report's content was refused.
    """
    unique, alias = _dedupe(reports)
    outcomes = {r.key: IngestOutcome() for r in unique}
    with engine.connect() as conn:
        try:
            with conn.begin():
                admitted = _store(
                    conn, unique, outcomes, context_ids, admissions, max_new_contexts_per_host_day
                )
        except Exception as e:
            context_ids.forget()
            # Errors on the raw cursor bypass SQLAlchemy's disconnect detection: a connection
            # that failed for want of the database is not used again.
            if is_transient(e) and not conn.invalidated:
                conn.invalidate()
            raise
    admissions.known.update(admitted)
    return [
        _repeat(reports[alias[i]], outcomes[r.key], r) if i in alias else outcomes[r.key]
        for i, r in enumerate(reports)
    ]
