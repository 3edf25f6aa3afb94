"""Plans: each context's incumbent and candidates, the incumbent history and the refit log.

Guarantees across replicas
--------------------------
- **Writers.** Only the refit lease holder of a policy publishes its plans (``publish_plans``),
  inside the fenced transaction on its lease connection (``service/leases.py``): the
  transaction first checks that this session still holds the policy's advisory lock, so an
  owner that lost its lease cannot publish over the next owner's plans. ``publish_plans``
  moves the policy's plan generation first; that row lock orders every publish of the policy,
  so each compares its incumbents with the history the previous one left and an incumbent
  change is recorded exactly once (a unique (policy, context, generation) index refuses a
  second). Plans, history, generation and refit log commit together, with ``plans:<id>``.
- **What a follower caches.** Every replica serves plans from memory
  (``service/plan_cache.py``), reloaded on ``plans:<id>`` and when the periodic comparison of
  generations (``policies.policy_generations``, every ``sync.FULL_SYNC_S``) shows the
  generation moved; through a database outage it keeps serving the plans it holds, for as
  long as the outage lasts (a plan is a valid θ of Θ' whatever its age).
- **Isolation relied on.** ``load_plans`` reads plans and generation in one REPEATABLE READ
  READ ONLY transaction, so a follower never pairs new plans with an old generation or the
  reverse; the rest at READ COMMITTED.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, Engine, delete, func, select, update
from sqlalchemy.dialects.postgresql import distinct_on
from sqlalchemy.dialects.postgresql import insert as pg_insert

from . import changes
from .schema import IncumbentChange, Plan, RefitLog
from .schema import Policy as PolicyRow

REFIT_LOG_KEPT = timedelta(days=7)
_PLAN_VALUES = ("plan_version", "incumbent_key", "incumbent_utility", "candidate_keys")


@dataclass(frozen=True)
class PlanRecord:
    policy_id: int
    context_id: int
    plan_version: int
    incumbent_key: str
    incumbent_utility: float | None
    candidate_keys: tuple[str, ...]


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
