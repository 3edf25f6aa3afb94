"""The operator's controls over what hosts run, whatever the optimiser plans (issue #35):

- **pin** a given θ (checked against Θ', the datapath's limits) for a policy or one context;
- **freeze** a policy or a context at its current incumbent;
- **roll back** to the incumbent served at a past instant or after a past plan generation;
- the **kill switch**: every host of the policy (or of one context) to the datapath's safe
  default, with no exploration and no experiment arm;
- **unpin** / release the kill switch: normal planning again.

Overrides are stored in PostgreSQL and applied on every replica's read path (never written
into plans), so a refit never undoes one and every replica serves it from its next
GetParameters on. Every change needs the operator role and is audited with old and new θ.
Contexts are named by their label, ``src_region/src_isp->dst_region/dst_isp@hour`` (as
``GET /v1/policies/{name}/parameters`` shows them).
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, model_validator

from gemini_api.theta import ThetaSpec
from gemini_api.v1 import booster_pb2 as pb

from ...domain import ContextKey
from ...models import Policy
from ...policy.planner import Planner
from ...storage import overrides as ovr
from ...storage.overrides import Change
from ..core import Booster
from ..plan_cache import ThetaMessage
from .deps import BoosterDep, PolicyDep, Reader, Writer
from .errors import AUTH_ERRORS, NOT_FOUND, TOO_LARGE, error

router = APIRouter(prefix="/v1/policies", tags=["overrides"], responses=AUTH_ERRORS)

LABEL = re.compile(r"^(?P<s>[^/]+)/(?P<si>.*)->(?P<d>[^/]+)/(?P<di>.*)@(?P<h>\d{1,2})$")
ContextLabel = Annotated[
    str,
    Field(
        max_length=600,
        description="a context's label, src_region/src_isp->dst_region/dst_isp@hour; "
        "leave out for the whole policy",
        examples=["eu-west/cdn-a->africa/sat-isp@12"],
    ),
]
Reason = Annotated[str, Field(max_length=500, description="why, for the audit log")]
NO_CONTEXT = error(404, "no policy of that name, or no context of that label")


class PinIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    context: ContextLabel | None = None
    theta: dict[str, int] = Field(
        description="every parameter of the policy's datapath, in spec units, inside Θ'"
    )
    reason: Reason | None = None


class FreezeIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    context: ContextLabel | None = None
    reason: Reason | None = None


class RollbackIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    context: ContextLabel | None = None
    at: datetime | None = Field(None, description="the instant whose incumbents to serve again")
    plan_generation: int | None = Field(
        None, ge=0, le=2**62, description="or: the incumbents after this refit's publish"
    )
    reason: Reason | None = None

    @model_validator(mode="after")
    def _one_target(self) -> RollbackIn:
        if (self.at is None) == (self.plan_generation is None):
            raise ValueError("give exactly one of 'at' and 'plan_generation'")
        if self.at is not None and self.at.tzinfo is None:
            raise ValueError("at: needs a time zone (e.g. 2026-11-27T14:00:00Z)")
        return self


class KillIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    context: ContextLabel | None = None
    reason: Reason | None = None


class OverrideOut(BaseModel):
    context: str | None = Field(description="the context's label; null: the whole policy")
    kind: str = Field(description="pin, or kill (the safe default)")
    origin: str = Field(description="pin, freeze, rollback or kill: how it was set")
    theta: dict[str, int] | None
    detail: dict[str, Any]
    set_by: str
    set_at: datetime


class OverridesOut(BaseModel):
    policy: str
    kill_switch: bool = Field(description="every host of the policy runs the safe default")
    overrides: list[OverrideOut]


class ChangedOut(BaseModel):
    policy: str
    changed: int = Field(description="scopes whose override was set or removed")


def parse_label(label: str) -> ContextKey:
    m = LABEL.match(label)
    if m is None:
        raise RequestValidationError(
            [
                {
                    "loc": ("body", "context"),
                    "msg": "not a context label: expected src_region/src_isp->dst_region/"
                    "dst_isp@hour",
                    "type": "value_error",
                    "input": label[:100],
                }
            ]
        )
    return ContextKey(m["s"], m["si"], m["d"], m["di"], int(m["h"]))


def _context(booster: Booster, label: str | None) -> tuple[int | None, ContextKey | None]:
    if label is None:
        return None, None
    key = parse_label(label)
    cid = ovr.context_id(booster.engine, key)
    if cid is None:
        raise HTTPException(404, f"no context {label[:100]!r} has been reported")
    return cid, key


def _served(booster: Booster, policy: Policy, key: ContextKey | None) -> dict[str, int] | None:
    """The θ the scope runs now (for the audit entry's old value): its override, else its
    plan's incumbent; None for a whole policy without a policy-wide override."""
    spec = policy.spec
    current = booster.plans.overrides(policy.id)
    if key is None:
        forced = None if current is None else current.default()
        return None if forced is None else _as_dict(spec, forced)
    if current is not None and (forced := current.theta(key)) is not None:
        return _as_dict(spec, forced)
    plan = booster.plan_snapshot(policy.id).get(key)
    return None if plan is None else spec.from_key(plan.incumbent_key)


def _as_dict(spec: ThetaSpec, msg: ThetaMessage) -> dict[str, int]:
    if isinstance(msg, pb.DatapathTheta):
        return {n: int(msg.values[n]) for n in spec.names}
    return spec.from_message(msg)


def _detail(reason: str | None, **more: Any) -> dict[str, Any]:
    out = {k: v for k, v in more.items() if v is not None}
    if reason:
        out["reason"] = reason
    return out


def _applied(booster: Booster, policy: Policy, changed: int) -> ChangedOut:
    booster.overrides_changed({policy.id})  # this replica at once; others on the notification
    return ChangedOut(policy=policy.name, changed=changed)


@router.get("/{name}/overrides", responses=NOT_FOUND)
def list_overrides(_: Reader, policy: PolicyDep, booster: BoosterDep) -> OverridesOut:
    """The policy's pins and kill switches as stored (what every replica serves)."""
    rows = ovr.load(booster.engine, policy.id)
    spec = policy.spec
    return OverridesOut(
        policy=policy.name,
        kill_switch=any(r.kind == "kill" and r.context is None for r in rows),
        overrides=[
            OverrideOut(
                context=None if r.context is None else r.context.label,
                kind=r.kind,
                origin=r.origin,
                theta=None
                if r.theta_key is None or r.datapath != spec.datapath
                else spec.from_key(r.theta_key),
                detail=r.detail,
                set_by=r.set_by,
                set_at=r.set_at,
            )
            for r in rows
        ],
    )


@router.post("/{name}/pin", responses=NO_CONTEXT | TOO_LARGE)
def pin(who: Writer, policy: PolicyDep, body: PinIn, booster: BoosterDep) -> ChangedOut:
    """Serve ``theta`` to every host of the policy (or of one context), no exploration."""
    spec = policy.spec
    problems = spec.violations(body.theta, spec.limits)
    if problems:
        raise RequestValidationError(
            [
                {
                    "loc": ("body", "theta", p.split(":", 1)[0]),
                    "msg": f"θ outside Θ' of datapath {spec.datapath}: {p}",
                    "type": "value_error",
                    "input": body.theta,
                }
                for p in problems
            ]
        )
    cid, key = _context(booster, body.context)
    theta = spec.validate(body.theta, spec.limits)
    item = Change(cid, body.context, spec.key(theta), _served(booster, policy, key), theta)
    ovr.set_overrides(
        booster.engine,
        policy.id,
        policy.name,
        spec.datapath,
        "pin",
        "pin",
        [item],
        who.name,
        _detail(body.reason),
    )
    return _applied(booster, policy, 1)


@router.post("/{name}/freeze", responses=NO_CONTEXT | TOO_LARGE | error(409, "nothing to freeze"))
def freeze(who: Writer, policy: PolicyDep, body: FreezeIn, booster: BoosterDep) -> ChangedOut:
    """Pin every planned context (or one) at the incumbent it is served now."""
    spec = policy.spec
    cid, key = _context(booster, body.context)
    snapshot = booster.plan_snapshot(policy.id)
    keys = [key] if key is not None else sorted(snapshot)
    planned = [k for k in keys if k in snapshot]
    if not planned:
        raise HTTPException(409, "no published plan to freeze at (pin a θ instead)")
    ids = (
        {key: cid}
        if key is not None and cid is not None
        else ovr.context_ids(booster.engine, planned)
    )
    items = []
    for k in planned:
        theta = spec.from_key(snapshot[k].incumbent_key)
        items.append(
            Change(
                ids[k], ContextKey(*k).label, spec.key(theta), _served(booster, policy, k), theta
            )
        )
    ovr.set_overrides(
        booster.engine,
        policy.id,
        policy.name,
        spec.datapath,
        "pin",
        "freeze",
        items,
        who.name,
        _detail(body.reason),
    )
    return _applied(booster, policy, len(items))


@router.post("/{name}/rollback", responses=NO_CONTEXT | TOO_LARGE | error(409, "nothing then"))
def rollback(who: Writer, policy: PolicyDep, body: RollbackIn, booster: BoosterDep) -> ChangedOut:
    """Pin every planned context (or one) at the incumbent it was served at ``at`` (or after
    plan generation ``plan_generation``); a context without a plan then gets the default θ
    it was served then."""
    spec = policy.spec
    cid, key = _context(booster, body.context)
    snapshot = booster.plan_snapshot(policy.id)
    keys = [key] if key is not None else sorted(snapshot)
    ids = (
        {key: cid}
        if key is not None and cid is not None
        else ovr.context_ids(booster.engine, [ContextKey(*k) for k in keys])
    )
    if not ids:
        raise HTTPException(409, "the policy has no planned context to roll back")
    then = ovr.incumbents_at(
        booster.engine, policy.id, body.at, body.plan_generation, sorted(ids.values())
    )
    default = Planner(spec).clip_default(policy)
    items = []
    for k, c in ids.items():
        theta = spec.from_key(then[c]) if c in then else default
        items.append(
            Change(c, ContextKey(*k).label, spec.key(theta), _served(booster, policy, k), theta)
        )
    detail = _detail(
        body.reason,
        at=None if body.at is None else body.at.isoformat(),
        plan_generation=body.plan_generation,
    )
    ovr.set_overrides(
        booster.engine,
        policy.id,
        policy.name,
        spec.datapath,
        "pin",
        "rollback",
        items,
        who.name,
        detail,
    )
    return _applied(booster, policy, len(items))


@router.delete("/{name}/pin", responses=NO_CONTEXT)
def unpin(
    who: Writer,
    policy: PolicyDep,
    booster: BoosterDep,
    context: Annotated[
        str | None, Query(max_length=600, description="one context's label; else every pin")
    ] = None,
) -> ChangedOut:
    """Remove the pins (of one context, or every pin of the policy): normal planning again."""
    cid, key = _context(booster, context)
    items = [Change(cid, context, None, _served(booster, policy, key), None)]
    n = ovr.clear_overrides(
        booster.engine, policy.id, policy.name, "pin", items, who.name, everything=context is None
    )
    return _applied(booster, policy, n)


@router.put("/{name}/kill-switch", responses=NO_CONTEXT | TOO_LARGE)
def kill(who: Writer, policy: PolicyDep, body: KillIn, booster: BoosterDep) -> ChangedOut:
    """Every host of the policy (or of one context) to the datapath's safe default θ, with no
    exploration and no experiment arm, until released."""
    spec = policy.spec
    cid, key = _context(booster, body.context)
    safe = spec.default()
    item = Change(cid, body.context, None, _served(booster, policy, key), {"safe_default": safe})
    ovr.set_overrides(
        booster.engine,
        policy.id,
        policy.name,
        spec.datapath,
        "kill",
        "kill",
        [item],
        who.name,
        _detail(body.reason),
    )
    return _applied(booster, policy, 1)


@router.delete("/{name}/kill-switch", responses=NO_CONTEXT)
def release(
    who: Writer,
    policy: PolicyDep,
    booster: BoosterDep,
    context: Annotated[str | None, Query(max_length=600)] = None,
) -> ChangedOut:
    """Release the kill switch (of the policy, or of one context)."""
    cid, key = _context(booster, context)
    item = Change(cid, context, None, _served(booster, policy, key), None)
    n = ovr.clear_overrides(booster.engine, policy.id, policy.name, "kill", [item], who.name)
    return _applied(booster, policy, n)
