"""Experiments in PostgreSQL: their declarations, populations, stopped arms, and the flows of
each arm per host and experiment day (migration 0006; an experiment's ``day_seconds``, 0008).
A day is stored as its label, a date (``experiments/domain.py``: a UTC calendar date with the
default day of 86,400 s, the start's date + k for day k of a compressed experiment).

``experiment_host_days`` holds, per (experiment, arm, host, day), the running sums of eq. 9
(``FlowSums``) and the slow flows, so results per day and per arm, at any σ and with intervals
over hosts, are computed from it exactly (``experiments/statistics.py``). The ingest path adds
to it with ``record_arm_flows``, in the same transaction as the report it comes from.

Hosts of a live experiment are in no other experiment that overlaps it in time: creation
refuses an overlap (``Conflict``) under a transaction-scoped advisory lock, so two operators
creating experiments at once cannot enrol a host twice.
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Connection,
    Date,
    DateTime,
    Double,
    Engine,
    ForeignKey,
    Index,
    Integer,
    Row,
    SmallInteger,
    String,
    Text,
    any_,
    bindparam,
    func,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Mapped, mapped_column

from gemini_api.sums import COMPLETION_COLUMNS, Objective

from ..domain import SUM_FIELDS, FlowSums
from ..experiments.assignment import Assignment, assignment, initial_groups, join_groups
from ..experiments.domain import (
    CALENDAR_DAY_SECONDS,
    MIN_DAY_SECONDS,
    ArmSpec,
    ArmStop,
    Experiment,
    ExperimentCreate,
    GuardrailSpec,
    Member,
    PopulationSpec,
)
from ..experiments.statistics import HostDay
from . import changes
from .audit import audit
from .errors import Conflict, NotFound
from .schema import Base
from .trials import flow_sums

CREATE_LOCK = 0x6578_7074  # pg_advisory_xact_lock key: one experiment creation at a time
SALT_BYTES = 8
AUDITED_HOSTS = 100  # host ids named in a join or leave audit entry (the count is always kept)
NOTIFY_KIND: changes.Kind = "experiments"  # payload "experiments:<id>" on the changes channel


def _now_column() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), server_default=func.now(), nullable=False)


def _sum(kind: type[BigInteger] | type[Double]) -> Mapped[Any]:
    return mapped_column(kind, nullable=False, server_default="0")


class ExperimentRow(Base):
    """One experiment as declared, and whether (and why) it was stopped early."""

    __tablename__ = "experiments"
    __table_args__ = (
        CheckConstraint(
            f"day_seconds BETWEEN {MIN_DAY_SECONDS} AND {CALENDAR_DAY_SECONDS}"
            f" AND {CALENDAR_DAY_SECONDS} % day_seconds = 0",
            name="experiments_day_seconds",
        ),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True, nullable=False)
    description: Mapped[str] = mapped_column(Text, nullable=False, server_default="")
    salt: Mapped[str] = mapped_column(String(64), nullable=False)
    arms: Mapped[list] = mapped_column(JSONB, nullable=False)
    control: Mapped[str] = mapped_column(String(64), nullable=False)
    split: Mapped[list] = mapped_column(JSONB, nullable=False)
    start_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    end_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    crossover_day: Mapped[date | None] = mapped_column(Date)
    day_seconds: Mapped[int] = mapped_column(
        Integer, nullable=False, server_default=str(CALENDAR_DAY_SECONDS)
    )
    sigma: Mapped[float] = mapped_column(Double, nullable=False)
    # gemini_api.sums.Objective (migration 0016): what the arms' utility is over their flows.
    objective: Mapped[str] = mapped_column(String(16), nullable=False, server_default="flow-mean")
    guardrail: Mapped[dict | None] = mapped_column(JSONB)
    created_at: Mapped[datetime] = _now_column()
    created_by: Mapped[str] = mapped_column(String(64), nullable=False)
    stopped_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    stopped_by: Mapped[str | None] = mapped_column(String(64))
    stop_reason: Mapped[str | None] = mapped_column(Text)


class ExperimentHost(Base):
    """A host of an experiment's population: its region (the stratum it is balanced in), its
    group (``experiments/assignment.py``), and when it left (NULL: still in)."""

    __tablename__ = "experiment_hosts"
    __table_args__ = (Index("experiment_hosts_host", "host_id"),)
    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True
    )
    host_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    region: Mapped[str] = mapped_column(String(64), nullable=False)
    grp: Mapped[int] = mapped_column(SmallInteger, nullable=False)
    joined_at: Mapped[datetime] = _now_column()
    left_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class ExperimentArmStop(Base):
    """An arm stopped before the experiment's end (by an operator or the guardrail)."""

    __tablename__ = "experiment_arm_stops"
    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True
    )
    arm: Mapped[str] = mapped_column(String(64), primary_key=True)
    stopped_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    stopped_by: Mapped[str] = mapped_column(String(64), nullable=False)
    reason: Mapped[str] = mapped_column(Text, nullable=False)


class ExperimentHostDay(Base):
    """The flows one host ran under one arm on one experiment day (its label): eq. 9's
    running sums, and the completion-time objective's (migration 0016; 0 for flows of agents
    older than them, and for rows stored before)."""

    __tablename__ = "experiment_host_days"
    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True
    )
    arm: Mapped[str] = mapped_column(String(64), primary_key=True)
    host_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    day: Mapped[date] = mapped_column(Date, primary_key=True)
    flow_count: Mapped[int] = _sum(BigInteger)
    tpt_sum: Mapped[float] = _sum(Double)
    tpt_sq_sum: Mapped[float] = _sum(Double)
    delay_sum: Mapped[float] = _sum(Double)
    delay_sq_sum: Mapped[float] = _sum(Double)
    tpt_delay_sum: Mapped[float] = _sum(Double)
    completion_flow_count: Mapped[int] = _sum(BigInteger)
    completion_bytes_sum: Mapped[int] = _sum(BigInteger)
    completion_duration_us_sum: Mapped[int] = _sum(BigInteger)
    completion_mbit_sq_sum: Mapped[float] = _sum(Double)
    completion_seconds_sq_sum: Mapped[float] = _sum(Double)
    completion_mbit_seconds_sum: Mapped[float] = _sum(Double)
    completion_delay_sum: Mapped[float] = _sum(Double)
    completion_delay_sq_sum: Mapped[float] = _sum(Double)
    slow_flows: Mapped[int] = _sum(BigInteger)
    report_count: Mapped[int] = _sum(BigInteger)
    updated_at: Mapped[datetime] = _now_column()


def _notify(conn: Connection, experiment_id: int) -> None:
    """Tell other replicas (and their assignment caches) that this experiment changed."""
    changes.notify(conn, NOTIFY_KIND, [experiment_id])


def _audit_detail(spec: ExperimentCreate, salt: str) -> dict[str, Any]:
    """The declaration without the host lists (a fleet's worth of ids): counts per region."""
    detail = spec.model_dump(mode="json", exclude={"population", "salt"})
    detail["salt"] = salt
    regions = spec.population.host_regions()
    detail["hosts"] = len(regions)
    detail["regions"] = dict(sorted(Counter(regions.values()).items()))
    return detail


def _overlaps(
    conn: Connection, hosts: Sequence[str], start: datetime, end: datetime, other_than: int = 0
) -> list:
    """(experiment, host) pairs of live experiments (but ``other_than``) overlapping
    [start, end) whose population holds any of ``hosts`` (and they have not left)."""
    q = (
        select(ExperimentRow.name, ExperimentHost.host_id)
        .join(ExperimentHost, ExperimentHost.experiment_id == ExperimentRow.id)
        .where(
            ExperimentRow.stopped_at.is_(None),
            ExperimentRow.id != other_than,
            ExperimentHost.left_at.is_(None),
            ExperimentRow.start_at < end,
            ExperimentRow.end_at > start,
            # One array parameter: a population can exceed PostgreSQL's 65,535 parameters.
            ExperimentHost.host_id == any_(bindparam("hosts", list(hosts), ARRAY(String))),
        )
        .order_by(ExperimentRow.name, ExperimentHost.host_id)
        .limit(5)
    )
    return list(conn.execute(q).all())


def create_experiment(engine: Engine, spec: ExperimentCreate, actor: str) -> Experiment:
    """Store a new experiment (with a random salt unless the spec gives one); Conflict when the
    name is taken or a host is already in a live experiment that overlaps it in time."""
    hosts = spec.population.host_regions()
    salt = spec.salt or secrets.token_hex(SALT_BYTES)
    split = tuple(spec.split or [1 / len(spec.arms)] * len(spec.arms))
    with engine.begin() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": CREATE_LOCK})
        clash = _overlaps(conn, list(hosts), spec.start, spec.end)
        if clash:
            pairs = ", ".join(f"{h} in {e!r}" for e, h in clash)
            raise Conflict(f"hosts already in a live experiment overlapping this one: {pairs}")
        new_id = conn.execute(
            pg_insert(ExperimentRow)
            .values(
                name=spec.name,
                description=spec.description,
                salt=salt,
                arms=[a.model_dump(mode="json") for a in spec.arms],
                control=spec.control or spec.arms[0].name,
                split=list(split),
                start_at=spec.start,
                end_at=spec.end,
                crossover_day=spec.crossover_day,
                day_seconds=spec.day_seconds,
                sigma=spec.sigma,
                objective=spec.objective.value,
                guardrail=None if spec.guardrail is None else spec.guardrail.model_dump(),
                created_by=actor,
            )
            .on_conflict_do_nothing(index_elements=["name"])
            .returning(ExperimentRow.id)
        ).scalar_one_or_none()
        if new_id is None:
            raise Conflict(f"experiment {spec.name!r} exists")
        groups = initial_groups(hosts, split, salt)
        conn.execute(
            pg_insert(ExperimentHost),
            [
                {"experiment_id": new_id, "host_id": h, "region": r, "grp": groups[h]}
                for h, r in hosts.items()
            ],
        )
        audit(conn, actor, "experiment.create", spec.name, _audit_detail(spec, salt))
        _notify(conn, new_id)
        return _load(conn, ExperimentRow.id == new_id)[0]


def _stops(conn: Connection, ids: list[int]) -> dict[int, dict[str, ArmStop]]:
    out: dict[int, dict[str, ArmStop]] = {i: {} for i in ids}
    q = select(ExperimentArmStop.__table__).where(ExperimentArmStop.experiment_id.in_(ids))
    for s in conn.execute(q).all():
        out[s.experiment_id][s.arm] = ArmStop(s.stopped_at, s.stopped_by, s.reason)
    return out


def _hosts(
    conn: Connection, ids: list[int], only: Collection[str] | None
) -> dict[int, dict[str, Member]]:
    out: dict[int, dict[str, Member]] = {i: {} for i in ids}
    h = ExperimentHost
    q = select(h.experiment_id, h.host_id, h.region, h.grp, h.left_at).where(
        h.experiment_id.in_(ids)
    )
    if only is not None:
        q = q.where(h.host_id.in_(sorted(only)))
    for experiment_id, host, region, group, left_at in conn.execute(q):
        out[experiment_id][host] = Member(region, group, left_at)
    return out


def _load(
    conn: Connection, *where: Any, only_hosts: Collection[str] | None = None
) -> list[Experiment]:
    """Experiments matching ``where``, oldest first; with ``only_hosts``, their population is
    those hosts (enough for their assignments, without reading a fleet's worth of rows)."""
    q = select(ExperimentRow.__table__).where(*where).order_by(ExperimentRow.id)
    rows = conn.execute(q).all()
    if not rows:
        return []
    ids = [r.id for r in rows]
    hosts, stops = _hosts(conn, ids, only_hosts), _stops(conn, ids)
    return [
        Experiment(
            id=r.id,
            name=r.name,
            description=r.description,
            salt=r.salt,
            arms=tuple(ArmSpec.model_validate(a) for a in r.arms),
            control=r.control,
            split=tuple(float(s) for s in r.split),
            hosts=hosts[r.id],
            start=r.start_at,
            end=r.end_at,
            crossover_day=r.crossover_day,
            sigma=r.sigma,
            objective=Objective(r.objective),
            guardrail=None if r.guardrail is None else GuardrailSpec.model_validate(r.guardrail),
            created_at=r.created_at,
            created_by=r.created_by,
            stopped_at=r.stopped_at,
            stopped_by=r.stopped_by,
            stop_reason=r.stop_reason,
            arm_stops=stops[r.id],
            day_seconds=r.day_seconds,
        )
        for r in rows
    ]


def list_experiments(engine: Engine) -> list[Experiment]:
    with engine.connect() as conn:
        return _load(conn)


def get_experiment(engine: Engine, name: str) -> Experiment:
    with engine.connect() as conn:
        found = _load(conn, ExperimentRow.name == name)
    if not found:
        raise NotFound(f"experiment {name!r} not found")
    return found[0]


def live_experiments(engine: Engine, at: datetime) -> list[Experiment]:
    """Experiments running at ``at`` (started, not ended, not stopped), with their hosts: what
    an assignment cache holds."""
    with engine.connect() as conn:
        return _load(
            conn,
            ExperimentRow.stopped_at.is_(None),
            ExperimentRow.start_at <= at,
            ExperimentRow.end_at > at,
        )


def pending_experiments(engine: Engine, at: datetime) -> list[Experiment]:
    """Experiments not stopped and not over at ``at`` (running or scheduled), with their hosts:
    what the agents' assignment cache holds (a start, crossover or end then needs no reload)."""
    with engine.connect() as conn:
        return _load(conn, ExperimentRow.stopped_at.is_(None), ExperimentRow.end_at > at)


def change_mark(engine: Engine) -> tuple[Any, ...]:
    """A value that moves whenever an experiment is created or stopped, an arm stopped, or a
    host joins or leaves: a cache reloads when it differs from the one it loaded with (one
    cheap query instead of reading every population again)."""
    e, s, h = ExperimentRow, ExperimentArmStop, ExperimentHost
    q = select(
        *(
            select(f).scalar_subquery()
            for f in (
                func.count(e.id),
                func.max(e.id),
                func.count(e.stopped_at),
                func.count(s.arm),
                func.count(h.host_id),
                func.count(h.left_at),
                func.max(h.left_at),
                func.max(h.joined_at),
            )
        )
    )
    with engine.connect() as conn:
        return tuple(conn.execute(q).one())


def host_assignment(engine: Engine, host_id: str, at: datetime) -> Assignment | None:
    """What ``host_id`` runs at ``at``: its arm of the live experiment it is in, or None (no
    experiment, or its arm stopped: the host is restored to its own defaults)."""
    with engine.connect() as conn:
        candidates = _load(
            conn,
            ExperimentRow.stopped_at.is_(None),
            ExperimentRow.start_at <= at,
            ExperimentRow.end_at > at,
            ExperimentRow.id.in_(
                select(ExperimentHost.experiment_id).where(ExperimentHost.host_id == host_id)
            ),
            only_hosts=(host_id,),
        )
    for e in candidates:
        found = assignment(e, host_id, at)
        if found is not None:
            return found
    return None


def experiments_of_hosts(
    conn: Connection, hosts: Collection[str], start: datetime, end: datetime
) -> list[Experiment]:
    """Experiments not stopped before ``start`` that run at some time in [start, end] and
    enrol any of ``hosts``, with only those hosts as population: one query per ingest batch,
    inside its transaction."""
    return _load(
        conn,
        or_(ExperimentRow.stopped_at.is_(None), ExperimentRow.stopped_at > start),
        ExperimentRow.start_at <= end,
        ExperimentRow.end_at > start,
        ExperimentRow.id.in_(
            select(ExperimentHost.experiment_id).where(ExperimentHost.host_id.in_(sorted(hosts)))
        ),
        only_hosts=hosts,
    )


def _locked(conn: Connection, name: str) -> Row[Any]:
    """The experiment's row, locked for the transaction; NotFound when there is none."""
    row = conn.execute(
        select(ExperimentRow.__table__).where(ExperimentRow.name == name).with_for_update()
    ).one_or_none()
    if row is None:
        raise NotFound(f"experiment {name!r} not found")
    return row


def _open_for_changes(conn: Connection, row: Row[Any]) -> None:
    """Conflict unless the experiment can still take changes (not stopped, not over)."""
    now = _utc_now(conn)
    if row.stopped_at is not None:
        raise Conflict(f"experiment {row.name!r} was stopped at {row.stopped_at.isoformat()}")
    if row.end_at <= now:
        raise Conflict(f"experiment {row.name!r} ended at {row.end_at.isoformat()}")


def join_hosts(engine: Engine, name: str, population: PopulationSpec, actor: str) -> Experiment:
    """Add hosts to the population (``assignment.join_groups``: nobody else's arm changes);
    a host that left comes back with its group. Conflict when the experiment is stopped or
    over, or a host is in another live experiment overlapping it."""
    joining = population.host_regions()
    with engine.begin() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": CREATE_LOCK})
        row = _locked(conn, name)
        _open_for_changes(conn, row)
        clash = _overlaps(conn, list(joining), row.start_at, row.end_at, other_than=row.id)
        if clash:
            pairs = ", ".join(f"{h} in {e!r}" for e, h in clash)
            raise Conflict(f"hosts already in a live experiment overlapping this one: {pairs}")
        current = _load(conn, ExperimentRow.id == row.id)[0]
        now = _utc_now(conn)
        groups = join_groups(current.hosts, joining, current.split, current.salt, now)
        stmt = pg_insert(ExperimentHost).values(
            [
                {"experiment_id": row.id, "host_id": h, "region": r, "grp": groups[h]}
                for h, r in joining.items()
            ]
        )
        conn.execute(
            stmt.on_conflict_do_update(
                index_elements=["experiment_id", "host_id"],
                set_={"left_at": None, "region": stmt.excluded.region},
            )
        )
        detail = {"count": len(joining), "hosts": sorted(joining)[:AUDITED_HOSTS]}
        audit(conn, actor, "experiment.join", name, detail)
        _notify(conn, row.id)
        return _load(conn, ExperimentRow.id == row.id)[0]


def leave_hosts(engine: Engine, name: str, hosts: Sequence[str], actor: str) -> int:
    """Hosts leave the population now (they keep their group for the results); how many were
    in it. Nobody else's arm changes."""
    with engine.begin() as conn:
        row = _locked(conn, name)
        left = conn.execute(
            update(ExperimentHost)
            .where(
                ExperimentHost.experiment_id == row.id,
                ExperimentHost.host_id == any_(bindparam("hosts", list(hosts), ARRAY(String))),
                ExperimentHost.left_at.is_(None),
            )
            .values(left_at=func.now())
        ).rowcount
        detail = {"count": len(hosts), "hosts": sorted(hosts)[:AUDITED_HOSTS], "left": left}
        audit(conn, actor, "experiment.leave", name, detail)
        _notify(conn, row.id)
        return int(left)


def _utc_now(conn: Connection) -> datetime:
    now: datetime = conn.execute(select(func.now())).scalar_one()
    return now.astimezone(UTC)


def stop_experiment(engine: Engine, name: str, actor: str, reason: str) -> Experiment:
    """Stop at once: every host of it is restored. Conflict when it is stopped or over."""
    with engine.begin() as conn:
        row = _locked(conn, name)
        _open_for_changes(conn, row)
        now = _utc_now(conn)
        conn.execute(
            update(ExperimentRow)
            .where(ExperimentRow.id == row.id)
            .values(stopped_at=now, stopped_by=actor, stop_reason=reason)
        )
        audit(conn, actor, "experiment.stop", name, {"reason": reason})
        _notify(conn, row.id)
        return _load(conn, ExperimentRow.id == row.id)[0]


def stop_arm(
    engine: Engine, name: str, arm: str, actor: str, reason: str, detail: dict[str, Any]
) -> bool:
    """Stop one arm of a running experiment (its hosts are restored); False when it already
    was, or the experiment is not running."""
    with engine.begin() as conn:
        row = _locked(conn, name)
        now = _utc_now(conn)
        if row.stopped_at is not None or not row.start_at <= now < row.end_at:
            return False
        stored = conn.execute(
            pg_insert(ExperimentArmStop)
            .values(experiment_id=row.id, arm=arm, stopped_at=now, stopped_by=actor, reason=reason)
            .on_conflict_do_nothing()
            .returning(ExperimentArmStop.arm)
        ).scalar_one_or_none()
        if stored is None:
            return False
        audit(conn, actor, "experiment.stop_arm", name, {"arm": arm, "reason": reason} | detail)
        _notify(conn, row.id)
        return True


@dataclass(frozen=True)
class ArmFlows:
    """Flows one host ran under its arm, to be added to that (experiment, arm, host, day)."""

    experiment_id: int
    arm: str
    host_id: str
    day: date
    sums: FlowSums
    slow_flows: int
    reports: int = 1


_ADDED = (*SUM_FIELDS, *COMPLETION_COLUMNS, "slow_flows", "report_count")


def arm_flows(
    found: Assignment, host_id: str, at: datetime, parts: Iterable[tuple[str, FlowSums, int]]
) -> ArmFlows | None:
    """What one report adds to its host's arm: of ``parts`` (the CC the flows ran, sums, slow
    flows) per aggregate (``ReportRow.flows_by_cc``: a tuned aggregate stands for its
    policy's CC, whether the arm tunes it or the host's own policy does), those of the arm's
    CC, on the experiment day of ``at`` (the report's interval start: the whole report counts
    for that day, so a rehearsal's agents report at intervals no longer than its day); None
    without any. ``found`` is ``assignment(experiment, host_id, at)`` (or
    ``host_assignment``)."""
    mine = [(sums, slow) for cc, sums, slow in parts if cc == found.arm.cc]
    if not mine or not any(s.flow_count for s, _ in mine):
        return None
    return ArmFlows(
        found.experiment_id,
        found.arm.name,
        host_id,
        found.calendar.day_of(at),
        FlowSums.total(s for s, _ in mine),
        sum(slow for _, slow in mine),
    )


_KEY = ("experiment_id", "arm", "host_id", "day")
_COMPLETION_INTEGERS = 3  # the flow count, bytes and microseconds: exact integers
_COMPLETION = tuple(enumerate(COMPLETION_COLUMNS))
_COLUMN_TYPES = {
    "experiment_id": "int",
    "arm": "text",
    "host_id": "text",
    "day": "date",
    "flow_count": "bigint",
    **dict.fromkeys(SUM_FIELDS[1:], "float8"),
    **{c: "bigint" if i < _COMPLETION_INTEGERS else "float8" for i, c in _COMPLETION},
    "slow_flows": "bigint",
    "report_count": "bigint",
}
# One statement for any number of rows: each column is one array parameter (unnest), so the
# statement text, and its plan, are the same for every batch.
_UPSERT_HOST_DAYS = text(
    f"INSERT INTO experiment_host_days ({', '.join(_COLUMN_TYPES)}) "
    "SELECT * FROM unnest("
    + ", ".join(f"CAST(:{c} AS {t}[])" for c, t in _COLUMN_TYPES.items())
    + f") ON CONFLICT ({', '.join(_KEY)}) DO UPDATE SET "
    + ", ".join(f"{c} = experiment_host_days.{c} + EXCLUDED.{c}" for c in _ADDED)
    + ", updated_at = now()"
)


def record_arm_flows(conn: Connection, flows: Iterable[ArmFlows]) -> None:
    """Add ``flows`` to the per-host-day sums, in ``conn``'s transaction (one statement).

    The ingest path calls it in the transaction that stores new reports (``_store`` in
    ``ingest.py``), with ``arm_flows(...)`` of each new report whose host has an assignment at
    the report's interval start. A report stored once is counted once: call it for new
    reports only, never for a duplicate report id.
    """
    # One row per key: an upsert cannot touch the same row twice in one statement.
    merged: dict[tuple[int, str, str, date], tuple[FlowSums, int, int]] = {}
    for f in flows:
        key = (f.experiment_id, f.arm, f.host_id, f.day)
        sums, slow, reports = merged.get(key, (FlowSums(), 0, 0))
        merged[key] = (sums + f.sums, slow + f.slow_flows, reports + f.reports)
    if not merged:
        return
    # Sorted, so concurrent replicas lock rows in one order and cannot deadlock.
    rows = [
        (*key, *sums.astuple(), *sums.completion.values(), slow, n)
        for key, (sums, slow, n) in sorted(merged.items())
    ]
    columns = dict(zip(_COLUMN_TYPES, map(list, zip(*rows, strict=True)), strict=True))
    conn.execute(_UPSERT_HOST_DAYS, columns)


def host_days(
    engine: Engine, experiment_id: int, days: Iterable[date] | None = None
) -> list[HostDay]:
    """The stored per-host-day sums of an experiment (of ``days`` only, when given)."""
    c = ExperimentHostDay
    sums = (*SUM_FIELDS, *COMPLETION_COLUMNS)
    q = select(c.arm, c.host_id, c.day, *(getattr(c, f) for f in sums), c.slow_flows).where(
        c.experiment_id == experiment_id
    )
    if days is not None:
        q = q.where(c.day.in_(sorted(set(days))))
    with engine.connect() as conn:
        return [
            HostDay(arm, host, day, flow_sums(values), int(slow))
            for arm, host, day, *values, slow in conn.execute(q)
        ]
