"""θ overrides: what operators impose over the optimiser, per policy or per context.

A *pin* serves one θ (chosen as a pin, a freeze at the current incumbent, or a roll back to an
earlier incumbent) to every host of its scope, with no exploration; the *kill switch* serves
the datapath's safe default. Both are rows of ``theta_overrides``, read by every replica into
its plan cache (``service/plan_cache.py``) and applied on the read path, so a refit, whichever
replica runs it, never overrides one, and removing a row restores normal planning at once.

Every change is one transaction that also writes the audit entry (old and new values) and the
``overrides:<policy id>`` notification, so every replica reloads the policy's overrides.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from sqlalchemy import Connection, Engine, and_, delete, func, select
from sqlalchemy.dialects.postgresql import distinct_on
from sqlalchemy.dialects.postgresql import insert as pg_insert

from ..domain import ContextKey
from . import changes
from .audit import audit
from .schema import Context, IncumbentChange, ThetaOverride

Kind = Literal["pin", "kill"]
Origin = Literal["pin", "freeze", "rollback", "kill"]
AUDIT_TARGET_CHARS = 128


@dataclass(frozen=True)
class OverrideRecord:
    policy_id: int
    context: ContextKey | None  # None: the whole policy
    kind: str
    datapath: str
    theta_key: str | None  # None for the kill switch
    origin: str
    detail: dict
    set_by: str
    set_at: datetime


@dataclass(frozen=True)
class Change:
    """One scope's override to set: ``context_id`` None for the whole policy."""

    context_id: int | None
    label: str | None
    theta_key: str | None
    old: object  # what was in force there before (for the audit entry)
    new: object


def _context_columns():
    return (Context.src_region, Context.src_isp, Context.dst_region, Context.dst_isp, Context.hour)


def load(engine: Engine, policy_id: int | None = None) -> list[OverrideRecord]:
    """Every override (of one policy, or all), with its context's key."""
    q = select(
        ThetaOverride.policy_id,
        ThetaOverride.context_id,
        ThetaOverride.kind,
        ThetaOverride.datapath,
        ThetaOverride.theta_key,
        ThetaOverride.origin,
        ThetaOverride.detail,
        ThetaOverride.set_by,
        ThetaOverride.set_at,
        *_context_columns(),
    ).outerjoin(Context, Context.id == ThetaOverride.context_id)
    if policy_id is not None:
        q = q.where(ThetaOverride.policy_id == policy_id)
    with engine.connect() as conn:
        rows = conn.execute(q.order_by(ThetaOverride.id)).all()
    return [
        OverrideRecord(
            r[0],
            None if r[1] is None else ContextKey(*r[9:14]),
            r[2],
            r[3],
            r[4],
            r[5],
            r[6],
            r[7],
            r[8],
        )
        for r in rows
    ]


def context_id(engine: Engine, key: ContextKey) -> int | None:
    """The id of a known context; None if no agent ever reported it."""
    cols = _context_columns()
    with engine.connect() as conn:
        return conn.execute(
            select(Context.id).where(*(c == v for c, v in zip(cols, key, strict=True)))
        ).scalar_one_or_none()


def _scope(policy_id: int, context_id: int | None, kind: str):
    where = [ThetaOverride.policy_id == policy_id, ThetaOverride.kind == kind]
    where.append(
        ThetaOverride.context_id.is_(None)
        if context_id is None
        else ThetaOverride.context_id == context_id
    )
    return and_(*where)


def set_overrides(
    engine: Engine,
    policy_id: int,
    policy_name: str,
    datapath: str,
    kind: Kind,
    origin: Origin,
    items: list[Change],
    actor: str,
    detail: dict,
) -> None:
    """Set (replace) the ``kind`` override of each scope in ``items``, audited with the old
    and new values, in one transaction."""
    with engine.begin() as conn:
        for item in items:
            conn.execute(delete(ThetaOverride).where(_scope(policy_id, item.context_id, kind)))
            conn.execute(
                pg_insert(ThetaOverride).values(
                    policy_id=policy_id,
                    context_id=item.context_id,
                    kind=kind,
                    datapath=datapath,
                    theta_key=item.theta_key,
                    origin=origin,
                    detail=detail,
                    set_by=actor[:64],
                )
            )
        _audit(conn, actor, f"override.{origin}", policy_name, items, detail)
        changes.notify(conn, "overrides", [policy_id])


def clear_overrides(
    engine: Engine,
    policy_id: int,
    policy_name: str,
    kind: Kind,
    items: list[Change],
    actor: str,
    everything: bool = False,
) -> int:
    """Remove the ``kind`` override of each scope in ``items`` (``everything``: of every scope
    of the policy); the number removed. Audited with the old values."""
    with engine.begin() as conn:
        if everything:
            n = conn.execute(
                delete(ThetaOverride).where(
                    ThetaOverride.policy_id == policy_id, ThetaOverride.kind == kind
                )
            ).rowcount
        else:
            n = sum(
                conn.execute(
                    delete(ThetaOverride).where(_scope(policy_id, i.context_id, kind))
                ).rowcount
                for i in items
            )
        action = "override.unpin" if kind == "pin" else "override.kill_release"
        _audit(conn, actor, action, policy_name, items, {"removed": n})
        changes.notify(conn, "overrides", [policy_id])
    return n


def _audit(
    conn: Connection, actor: str, action: str, policy: str, items: list[Change], detail: dict
) -> None:
    changed = [{"context": i.label, "old": i.old, "new": i.new} for i in items]
    audit(
        conn,
        actor,
        action,
        policy[:AUDIT_TARGET_CHARS],
        {**detail, "changes": changed},
    )


def incumbents_at(
    engine: Engine,
    policy_id: int,
    at: datetime | None = None,
    generation: int | None = None,
    context_ids: list[int] | None = None,
) -> dict[int, str]:
    """context id → the θ key its incumbent was at instant ``at`` (or after the refit that
    published plan ``generation``), from ``incumbent_history``; contexts without a plan then
    are left out (they were served the default). Rows carried over by migration 0009 (no
    generation) count as before every generation."""
    q = select(IncumbentChange.context_id, IncumbentChange.theta_key).where(
        IncumbentChange.policy_id == policy_id
    )
    if at is not None:
        q = q.where(IncumbentChange.published_at <= at)
    if generation is not None:
        q = q.where(func.coalesce(IncumbentChange.plan_generation, 0) <= generation)
    if context_ids is not None:
        q = q.where(IncumbentChange.context_id.in_(context_ids))
    q = q.ext(distinct_on(IncumbentChange.context_id)).order_by(
        IncumbentChange.context_id, IncumbentChange.published_at.desc(), IncumbentChange.id.desc()
    )
    with engine.connect() as conn:
        return {cid: key for cid, key in conn.execute(q)}


def context_ids(engine: Engine, keys: list[ContextKey]) -> dict[ContextKey, int]:
    """Ids of the known contexts among ``keys``."""
    found = {}
    for key in keys:
        cid = context_id(engine, key)
        if cid is not None:
            found[key] = cid
    return found
