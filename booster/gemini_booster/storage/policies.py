"""Policies: their settings, revision and plan generation.

Guarantees across replicas
--------------------------
- **Writers.** Any replica creates and updates a policy (an operator's REST call or CLI
  command lands on whichever replica). ``update_policy`` locks the row (``FOR UPDATE``) and
  bumps ``revision`` in one transaction at READ COMMITTED, so two concurrent updates apply one
  after the other, each to the other's result, and each is audited once. The plan generation
  is the refit lease holder's alone to move (``plans.publish_plans``).
- **Notification.** Every write sends ``policy:<id>`` (``changes.py``), delivered on commit
  only.
- **What a follower caches.** Every replica keeps every policy in memory
  (``service/core.py``) and reloads one when it hears ``policy:<id>``, or when the periodic
  comparison of ``policy_generations`` (every ``sync.FULL_SYNC_S``, 5 s) shows its revision
  moved: a settings change is served everywhere within milliseconds, at most 5 s after a lost
  notification. Through a database outage the last loaded settings stay in force.
- **Isolation relied on.** READ COMMITTED only: each read is one statement.
"""

from __future__ import annotations

from sqlalchemy import Connection, Engine, func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from ..models import Policy, PolicyCreate, PolicyFields, PolicyUpdate
from . import changes
from .audit import audit
from .errors import Conflict, NotFound
from .schema import Policy as PolicyRow


def _policy(row) -> Policy:
    """A ``policies`` row (as a mapping) → the domain model; stored bounds are kept only when
    custom, because named regions always follow the θ spec."""
    fields = {k: row[k] for k in Policy.model_fields if k in row}
    if row["region"] != "custom":
        fields["bounds"] = None
    return Policy(**fields)


def _select_policy(conn: Connection, *where):
    return conn.execute(select(PolicyRow.__table__).where(*where)).mappings().one_or_none()


def create_policy(engine: Engine, spec: PolicyCreate, actor: str) -> Policy:
    values = spec.model_dump()
    values["bounds"] = spec.resolved_bounds()
    values["theta_spec_version"] = spec.spec.version
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
        stored = _policy(row)
        merged = stored.model_dump(include=set(PolicyFields.model_fields))
        merged.update(change.model_dump(exclude_unset=True))
        if merged["region"] != "custom":
            merged["bounds"] = None
        checked = PolicyFields.model_validate(merged)  # whole-policy rules, e.g. bounds ⊆ Θ'
        values = checked.model_dump()
        values["bounds"] = checked.resolved_bounds()
        if checked.datapath != stored.datapath:  # its θ are the new datapath's from now on
            values["theta_spec_version"] = checked.spec.version
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


def restart_policy(engine: Engine, name: str, actor: str) -> tuple[str, Policy]:
    """For a held policy (``Policy.held``): keep it, and what it learnt, under a new name
    (``<name>.<datapath>-v<its version>``), and create ``name`` again with the same settings
    in the spec version Booster reads now, with no trials. Agents asking for ``name`` get the
    new policy. Both in one transaction, audited; ``Conflict`` when the policy is not held or
    the kept name is taken, ``NotFound`` when there is no policy ``name``."""
    with engine.begin() as conn:
        row = _select_policy(conn, PolicyRow.name == name)
        if row is None:
            raise NotFound(f"policy {name!r}")
        held = _policy(row)
        if held.held is None:
            raise Conflict(f"policy {name!r} is not held: its θ are in the spec Booster reads")
        kept = f"{name}.{held.datapath}-v{held.theta_spec_version}"[:64]
        if _select_policy(conn, PolicyRow.name == kept) is not None:
            raise Conflict(f"policy {kept!r} exists: rename it first")
        conn.execute(update(PolicyRow).where(PolicyRow.id == held.id).values(name=kept))
        fields = held.model_dump(include=set(PolicyFields.model_fields))
        fresh = PolicyCreate.model_validate({**fields, "name": name})
        values = fresh.model_dump()
        values["bounds"] = fresh.resolved_bounds()
        values["theta_spec_version"] = fresh.spec.version
        new_id = conn.execute(
            pg_insert(PolicyRow).values(**values, revision=1).returning(PolicyRow.id)
        ).scalar_one()
        audit(conn, actor, "policy.restart", name, {"kept_as": kept, "held": held.held})
        changes.notify(conn, "policy", [held.id, new_id])
        return kept, _policy(_select_policy(conn, PolicyRow.id == new_id))


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


def policy_generations(engine: Engine) -> dict[int, tuple[int, int]]:
    """policy id → (settings revision, plan generation): what a follower compares each sync."""
    with engine.connect() as conn:
        rows = conn.execute(select(PolicyRow.id, PolicyRow.revision, PolicyRow.plan_generation))
        return {r[0]: (r[1], r[2]) for r in rows}
