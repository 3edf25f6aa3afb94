"""Reads and writes of everything but the ingestion hot path (see ``ingest.py``)."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from sqlalchemy import Connection, Engine, delete, func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from ..domain import SUM_FIELDS, ContextKey, FlowSums, Trial
from ..models import Policy, PolicyCreate, PolicyFields, PolicyUpdate
from . import changes
from .schema import (
    ApiToken,
    AuditEntry,
    Context,
    Plan,
    PolicyContext,
    RefitLog,
    Report,
    ReportAggregate,
)
from .schema import Policy as PolicyRow
from .schema import Trial as TrialRow

ROLES = ("agent", "operator", "viewer")
TOKEN_PREFIX = "gmn_"


class NotFound(LookupError):
    pass


class Conflict(Exception):
    pass


def _policy(row) -> Policy:
    """A ``policies`` row (as a mapping) → the domain model; stored bounds are kept only when
    custom, because named regions always follow the θ spec."""
    fields = {k: row[k] for k in Policy.model_fields if k in row}
    if row["region"] != "custom":
        fields["bounds"] = None
    return Policy(**fields)


def _select_policy(conn: Connection, *where):
    return conn.execute(select(PolicyRow.__table__).where(*where)).mappings().one_or_none()


def audit(conn: Connection, actor: str, action: str, target: str, detail: dict) -> None:
    conn.execute(
        pg_insert(AuditEntry).values(actor=actor, action=action, target=target, detail=detail)
    )


def create_policy(engine: Engine, spec: PolicyCreate, actor: str) -> Policy:
    values = spec.model_dump()
    values["bounds"] = spec.resolved_bounds()
    with engine.begin() as conn:
        new_id = conn.execute(
            pg_insert(PolicyRow)
            .values(**values, revision=1)
            .on_conflict_do_nothing(index_elements=["name"])
            .returning(PolicyRow.id)
        ).scalar_one_or_none()
        if new_id is None:
            raise Conflict(f"policy {spec.name!r} exists")
        audit(conn, actor, "policy.create", spec.name, spec.model_dump(mode="json"))
        changes.notify(conn, "policy", [new_id])
        return _policy(_select_policy(conn, PolicyRow.id == new_id))


def update_policy(engine: Engine, name: str, change: PolicyUpdate, actor: str) -> Policy:
    with engine.begin() as conn:
        row = (
            conn.execute(
                select(PolicyRow.__table__).where(PolicyRow.name == name).with_for_update()
            )
            .mappings()
            .one_or_none()
        )
        if row is None:
            raise NotFound(f"policy {name!r}")
        merged = _policy(row).model_dump(exclude={"id", "name", "revision"})
        merged.update(change.model_dump(exclude_unset=True))
        if merged["region"] != "custom":
            merged["bounds"] = None
        checked = PolicyFields.model_validate(merged)  # whole-policy rules, e.g. bounds ⊆ Θ'
        values = checked.model_dump()
        values["bounds"] = checked.resolved_bounds()
        conn.execute(
            update(PolicyRow)
            .where(PolicyRow.id == row["id"])
            .values(**values, revision=row["revision"] + 1, updated_at=func.now())
        )
        audit(
            conn, actor, "policy.update", name, change.model_dump(mode="json", exclude_unset=True)
        )
        changes.notify(conn, "policy", [row["id"]])
        return _policy(_select_policy(conn, PolicyRow.id == row["id"]))


def list_policies(engine: Engine) -> list[Policy]:
    with engine.connect() as conn:
        rows = conn.execute(select(PolicyRow.__table__).order_by(PolicyRow.id)).mappings()
        return [_policy(r) for r in rows]


def get_policy(engine: Engine, name: str) -> Policy:
    with engine.connect() as conn:
        row = _select_policy(conn, PolicyRow.name == name)
    if row is None:
        raise NotFound(f"policy {name!r}")
    return _policy(row)


_TRIAL_COLUMNS = (
    TrialRow.context_id,
    TrialRow.theta_key,
    TrialRow.flow_count,
    TrialRow.tpt_sum,
    TrialRow.tpt_sq_sum,
    TrialRow.delay_sum,
    TrialRow.delay_sq_sum,
    TrialRow.tpt_delay_sum,
    TrialRow.slow_flows,
    TrialRow.report_count,
    TrialRow.last_seen,
)


def _trial(row) -> Trial:
    context_id, theta_key, *sums, slow, reports, last_seen = row
    return Trial(context_id, theta_key, FlowSums(*sums), slow, reports, last_seen)


def _recent(q, history: timedelta | None):
    return q if history is None else q.where(TrialRow.last_seen >= func.now() - history)


def load_trials(engine: Engine, policy_id: int, history: timedelta | None = None) -> list[Trial]:
    """The model's points: Fusion trials only (a baseline CC's flows have no θ to learn)."""
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
class PlanRecord:
    policy_id: int
    context_id: int
    plan_version: int
    incumbent_key: str
    incumbent_utility: float | None
    candidate_keys: tuple[str, ...]


def policy_generations(engine: Engine) -> dict[int, tuple[int, int]]:
    """policy id → (settings revision, plan generation): what a follower compares each sync."""
    with engine.connect() as conn:
        rows = conn.execute(select(PolicyRow.id, PolicyRow.revision, PolicyRow.plan_generation))
        return {r[0]: (r[1], r[2]) for r in rows}


def publish_plans(
    conn: Connection,
    policy_id: int,
    plans: list[PlanRecord],
    owner: str,
    started_at: datetime,
    trials: int,
) -> int:
    """Upsert ``plans``, move the policy's plan generation and log the refit, in ``conn``'s
    transaction (the refit owner's: see ``service/refit.py``); returns the new generation."""
    if plans:
        stmt = pg_insert(Plan).values(
            [
                {
                    "policy_id": p.policy_id,
                    "context_id": p.context_id,
                    "plan_version": p.plan_version,
                    "incumbent_key": p.incumbent_key,
                    "incumbent_utility": p.incumbent_utility,
                    "candidate_keys": list(p.candidate_keys),
                }
                for p in plans
            ]
        )
        conn.execute(
            stmt.on_conflict_do_update(
                index_elements=["policy_id", "context_id"],
                set_={c: getattr(stmt.excluded, c) for c in _PLAN_VALUES}
                | {"updated_at": func.now()},
            )
        )
    generation = conn.execute(
        update(PolicyRow)
        .where(PolicyRow.id == policy_id)
        .values(plan_generation=PolicyRow.plan_generation + 1)
        .returning(PolicyRow.plan_generation)
    ).scalar_one()
    conn.execute(
        pg_insert(RefitLog).values(
            policy_id=policy_id,
            owner=owner,
            started_at=started_at,
            plan_generation=generation,
            contexts=len(plans),
            trials=trials,
        )
    )
    conn.execute(
        delete(RefitLog).where(
            RefitLog.policy_id == policy_id,
            RefitLog.finished_at < func.now() - REFIT_LOG_KEPT,
        )
    )
    changes.notify(conn, "plans", [policy_id])
    return generation


REFIT_LOG_KEPT = timedelta(days=7)
_PLAN_VALUES = ("plan_version", "incumbent_key", "incumbent_utility", "candidate_keys")


def load_plans(engine: Engine, policy_id: int | None = None) -> tuple[list[PlanRecord], int]:
    """Plans (of one policy, or all) and the plan generation they were read at: one snapshot,
    so a follower never pairs new plans with an old generation or the reverse."""
    q = select(
        Plan.policy_id,
        Plan.context_id,
        Plan.plan_version,
        Plan.incumbent_key,
        Plan.incumbent_utility,
        Plan.candidate_keys,
    )
    gen_q = select(func.coalesce(func.sum(PolicyRow.plan_generation), 0))
    if policy_id is not None:
        q = q.where(Plan.policy_id == policy_id)
        gen_q = select(PolicyRow.plan_generation).where(PolicyRow.id == policy_id)
    with engine.connect() as conn, conn.begin():
        conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        rows = conn.execute(q).all()
        generation = conn.execute(gen_q).scalar_one_or_none() or 0
    return [PlanRecord(r[0], r[1], r[2], r[3], r[4], tuple(r[5])) for r in rows], generation


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(engine: Engine, name: str, role: str, actor: str, value: str | None = None) -> str:
    """Create a credential and return it; only its hash is kept, so it is shown this once."""
    if role not in ROLES:
        raise ValueError(f"role {role!r}: expected one of {ROLES}")
    token = value or TOKEN_PREFIX + secrets.token_urlsafe(32)
    with engine.begin() as conn:
        row = conn.execute(
            pg_insert(ApiToken)
            .values(name=name, role=role, token_sha256=hash_token(token), revoked=False)
            .on_conflict_do_nothing()
            .returning(ApiToken.id)
        ).scalar_one_or_none()
        if row is None:
            raise Conflict(f"a token named {name!r} (or with that value) exists")
        audit(conn, actor, "token.create", name, {"role": role})
        changes.notify(conn, "tokens")
    return token


def ensure_token(engine: Engine, name: str, role: str, value: str) -> None:
    """Idempotent bootstrap of a configured credential (no-op when it is already there)."""
    with engine.begin() as conn:
        conn.execute(
            pg_insert(ApiToken)
            .values(
                name=name,
                role=role,
                token_sha256=hash_token(value),
                revoked=False,
            )
            .on_conflict_do_nothing()
        )


def revoke_token(engine: Engine, name: str, actor: str) -> None:
    with engine.begin() as conn:
        n = conn.execute(
            update(ApiToken).where(ApiToken.name == name).values(revoked=True)
        ).rowcount
        if not n:
            raise NotFound(f"token {name!r}")
        audit(conn, actor, "token.revoke", name, {})
        changes.notify(conn, "tokens")


def lookup_tokens(engine: Engine) -> dict[str, tuple[str, str]]:
    """sha256 → (name, role) for every live token; the auth layer caches this."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(ApiToken.token_sha256, ApiToken.name, ApiToken.role).where(
                ApiToken.revoked.is_(False)
            )
        )
        return {r[0]: (r[1], r[2]) for r in rows}


def audit_entries(engine: Engine, limit: int = 100) -> list[dict]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(AuditEntry.__table__).order_by(AuditEntry.id.desc()).limit(limit)
        ).mappings()
        return [{**r, "at": r["at"].isoformat()} for r in rows]


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
