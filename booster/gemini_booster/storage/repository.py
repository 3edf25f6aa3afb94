"""Reads and writes of everything but the ingestion hot path (see ``ingest.py``)."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal, NamedTuple

from sqlalchemy import Connection, Engine, delete, func, select, update
from sqlalchemy.dialects.postgresql import distinct_on
from sqlalchemy.dialects.postgresql import insert as pg_insert

from ..domain import SUM_FIELDS, ContextKey, FlowSums, Trial
from ..models import Policy, PolicyCreate, PolicyFields, PolicyUpdate
from . import changes
from .schema import (
    ApiToken,
    AuditEntry,
    Context,
    IncumbentChange,
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
EXPIRED_KEPT = timedelta(days=7)
MAX_HOST_ID_LEN = 128  # as a report's host_id (service/validation.py)


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
        merged = _policy(row).model_dump(exclude={"id", "name", "revision", "target_cc"})
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
        new = change.model_dump(mode="json", exclude_unset=True)
        before = _policy(row).model_dump(mode="json")
        # The new values as before, and what they replaced (``old``), for the audit view.
        audit(conn, actor, "policy.update", name, new | {"old": {k: before.get(k) for k in new}})
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
    TrialRow.bucket,
)


def _trial(row) -> Trial:
    context_id, theta_key, *sums, slow, reports, last_seen, bucket = row
    return Trial(context_id, theta_key, FlowSums(*sums), slow, reports, last_seen, bucket)


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
    sigma: float,
    datapath: str,
) -> int:
    """Upsert ``plans``, record their incumbents that changed (``incumbent_history``), move
    the policy's plan generation and log the refit, in ``conn``'s transaction (the refit
    owner's: see ``service/refit.py``); returns the new generation. ``sigma`` and
    ``datapath``: the policy's, as the refit planned with them.

    The generation moves first: its row lock orders every publish of the policy, whichever
    replica makes it, so each compares its incumbents with the history the previous publish
    left, and a change is recorded exactly once."""
    generation = conn.execute(
        update(PolicyRow)
        .where(PolicyRow.id == policy_id)
        .values(plan_generation=PolicyRow.plan_generation + 1)
        .returning(PolicyRow.plan_generation)
    ).scalar_one()
    if plans:
        _record_incumbent_changes(conn, policy_id, plans, generation, owner, sigma, datapath)
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


def _last_incumbents(conn: Connection, policy_id: int, context_ids: list[int]) -> dict[int, str]:
    """context id → the θ key of its newest incumbent history row (contexts without one are
    left out): one row per context, found along the history's index."""
    q = (
        select(IncumbentChange.context_id, IncumbentChange.theta_key)
        .where(
            IncumbentChange.policy_id == policy_id,
            IncumbentChange.context_id.in_(context_ids),
        )
        .ext(distinct_on(IncumbentChange.context_id))
        .order_by(
            IncumbentChange.context_id,
            IncumbentChange.published_at.desc(),
            IncumbentChange.id.desc(),
        )
    )
    return {cid: key for cid, key in conn.execute(q)}


def _record_incumbent_changes(
    conn: Connection,
    policy_id: int,
    plans: list[PlanRecord],
    generation: int,
    owner: str,
    sigma: float,
    datapath: str,
) -> None:
    """One history row per plan whose incumbent differs from the last recorded one."""
    last = _last_incumbents(conn, policy_id, sorted(p.context_id for p in plans))
    changed = [p for p in plans if last.get(p.context_id) != p.incumbent_key]
    if not changed:
        return
    conn.execute(  # the unique (policy, context, generation) refuses a second row per refit
        pg_insert(IncumbentChange).values(
            [
                {
                    "policy_id": policy_id,
                    "context_id": p.context_id,
                    "datapath": datapath,
                    "theta_key": p.incumbent_key,
                    "predicted_utility": p.incumbent_utility,
                    "sigma": sigma,
                    "plan_generation": generation,
                    "refit_owner": owner[:128],
                }
                for p in changed
            ]
        )
    )


@dataclass(frozen=True)
class IncumbentRecord:
    """One row of a context's incumbent history: the θ (as its datapath's key) published at
    ``published_at`` by refit ``plan_generation`` (None: carried over by migration 0009)."""

    published_at: datetime
    datapath: str
    theta_key: str
    predicted_utility: float | None
    sigma: float
    plan_generation: int | None
    refit_owner: str | None


def incumbent_history(engine: Engine, policy_id: int, context_id: int) -> list[IncumbentRecord]:
    """Every incumbent change of one (policy, context), oldest first."""
    q = (
        select(
            IncumbentChange.published_at,
            IncumbentChange.datapath,
            IncumbentChange.theta_key,
            IncumbentChange.predicted_utility,
            IncumbentChange.sigma,
            IncumbentChange.plan_generation,
            IncumbentChange.refit_owner,
        )
        .where(IncumbentChange.policy_id == policy_id, IncumbentChange.context_id == context_id)
        .order_by(IncumbentChange.published_at, IncumbentChange.id)
    )
    with engine.connect() as conn:
        return [IncumbentRecord(*r) for r in conn.execute(q)]


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


class TokenRecord(NamedTuple):
    """What the auth layer keeps of a live token (never its value or hash)."""

    name: str
    role: str
    host_id: str | None = None  # the one host an agent token speaks for; None: unbound
    expires_at: float | None = None  # Unix time after which it is refused; None: never


def _insert_token(
    conn: Connection,
    name: str,
    role: str,
    token: str,
    host_id: str | None = None,
    expires_at: datetime | None = None,
) -> bool:
    """Insert one credential; False when its name or value is taken."""
    row = conn.execute(
        pg_insert(ApiToken)
        .values(
            name=name,
            role=role,
            token_sha256=hash_token(token),
            revoked=False,
            host_id=host_id,
            expires_at=expires_at,
        )
        .on_conflict_do_nothing()
        .returning(ApiToken.id)
    ).scalar_one_or_none()
    return row is not None


def _check_binding(role: str, host_id: str | None) -> None:
    if role not in ROLES:
        raise ValueError(f"role {role!r}: expected one of {ROLES}")
    if host_id is not None:
        if role != "agent":
            raise ValueError(f"only agent tokens are bound to a host, not {role} tokens")
        if not host_id or len(host_id) > MAX_HOST_ID_LEN or not host_id.isprintable():
            raise ValueError(f"host id: need a printable id of 1..{MAX_HOST_ID_LEN} characters")


def host_token_name(host_id: str, at: datetime | None = None) -> str:
    """The name a host's token gets unless one is given: the host and when it was made."""
    at = at or datetime.now(UTC)
    return f"{host_id}@{at:%Y%m%dT%H%M%S.%fZ}"


def create_token(
    engine: Engine,
    name: str,
    role: str,
    actor: str,
    value: str | None = None,
    host_id: str | None = None,
    expires_at: datetime | None = None,
) -> str:
    """Create a credential and return it; only its hash is kept, so it is shown this once.
    ``host_id`` binds an agent token to the one host it may speak for."""
    _check_binding(role, host_id)
    token = value or TOKEN_PREFIX + secrets.token_urlsafe(32)
    with engine.begin() as conn:
        if not _insert_token(conn, name, role, token, host_id, expires_at):
            raise Conflict(f"a token named {name!r} (or with that value) exists")
        detail: dict[str, object] = {"role": role}
        if host_id is not None:
            detail["host"] = host_id
        if expires_at is not None:
            detail["expires_at"] = expires_at.isoformat()
        audit(conn, actor, "token.create", name, detail)
        changes.notify(conn, "tokens")
    return token


@dataclass(frozen=True)
class Rotation:
    name: str  # of the new token
    token: str  # its value, shown once
    expiring: tuple[str, ...]  # the host's other tokens, now expiring
    expires_at: datetime  # when they do


def rotate_token(
    engine: Engine, host_id: str, actor: str, grace: timedelta, name: str | None = None
) -> Rotation:
    """A new token for ``host_id``; the host's other live tokens expire after ``grace`` (or
    keep an earlier expiry they already had), so the host can switch without a refused call.

    NotFound when the host has no live token: a rotation of a misspelt host must not quietly
    enrol a new one (``create_token`` does that, on purpose).
    """
    _check_binding("agent", host_id)
    if grace < timedelta(0):
        raise ValueError("grace period: must not be negative")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with engine.begin() as conn:
        now = conn.execute(select(func.now())).scalar_one()
        live = (
            (ApiToken.host_id == host_id)
            & ApiToken.revoked.is_(False)
            & (ApiToken.expires_at.is_(None) | (ApiToken.expires_at > now))
        )
        old = conn.execute(select(ApiToken.id, ApiToken.name).where(live).with_for_update()).all()
        if not old:
            raise NotFound(f"no live token for host {host_id!r}")
        name = name or host_token_name(host_id, now)
        if not _insert_token(conn, name, "agent", token, host_id):
            raise Conflict(f"a token named {name!r} exists")
        expires_at = now + grace
        conn.execute(
            update(ApiToken)
            .where(ApiToken.id.in_([r.id for r in old]))
            .values(
                expires_at=func.least(func.coalesce(ApiToken.expires_at, expires_at), expires_at)
            )
        )
        expiring = tuple(r.name for r in old)
        audit(
            conn,
            actor,
            "token.rotate",
            name,
            {"host": host_id, "expiring": list(expiring), "expires_at": expires_at.isoformat()},
        )
        changes.notify(conn, "tokens")
    return Rotation(name, token, expiring, expires_at)


def revoke_token(engine: Engine, name: str, actor: str) -> None:
    with engine.begin() as conn:
        n = conn.execute(
            update(ApiToken).where(ApiToken.name == name).values(revoked=True)
        ).rowcount
        if not n:
            raise NotFound(f"token {name!r}")
        audit(conn, actor, "token.revoke", name, {})
        changes.notify(conn, "tokens")


def revoke_host_tokens(engine: Engine, host_id: str, actor: str) -> list[str]:
    """Revoke every token bound to ``host_id`` (a host retired or compromised); their names."""
    with engine.begin() as conn:
        names = list(
            conn.execute(
                update(ApiToken)
                .where(ApiToken.host_id == host_id, ApiToken.revoked.is_(False))
                .values(revoked=True)
                .returning(ApiToken.name)
            ).scalars()
        )
        if not names:
            raise NotFound(f"no live token for host {host_id!r}")
        audit(conn, actor, "token.revoke", host_id, {"host": host_id, "tokens": names})
        changes.notify(conn, "tokens")
    return names


def ensure_token(
    engine: Engine, name: str, role: str, value: str, host_id: str | None = None
) -> None:
    """Idempotent bootstrap of a configured credential (no-op when it is already there)."""
    _check_binding(role, host_id)
    with engine.begin() as conn:
        if _insert_token(conn, name, role, value, host_id):
            changes.notify(conn, "tokens")


def lookup_tokens(engine: Engine) -> dict[str, TokenRecord]:
    """sha256 → record of every token not revoked, expired ones for ``EXPIRED_KEPT`` more (so
    that a host still sending one is told it expired, not that it is unknown); the auth layer
    caches this and checks the expiry at each use."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(
                ApiToken.token_sha256,
                ApiToken.name,
                ApiToken.role,
                ApiToken.host_id,
                ApiToken.expires_at,
            ).where(
                ApiToken.revoked.is_(False),
                ApiToken.expires_at.is_(None) | (ApiToken.expires_at > func.now() - EXPIRED_KEPT),
            )
        )
        return {
            r[0]: TokenRecord(r[1], r[2], r[3], r[4].timestamp() if r[4] is not None else None)
            for r in rows
        }


def list_tokens(engine: Engine) -> list[dict[str, object]]:
    """Every credential's name, role, host, state and dates (never its hash), oldest first."""
    cols = (
        ApiToken.name,
        ApiToken.role,
        ApiToken.host_id,
        ApiToken.created_at,
        ApiToken.expires_at,
        ApiToken.revoked,
    )
    with engine.connect() as conn:
        rows = conn.execute(select(*cols).order_by(ApiToken.id)).mappings()
        return [dict(r) for r in rows]


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
