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
``GET /v1/policies/{name}/parameters`` shows them). The operations are ``service/overrides.py``
(the CLI's too).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ...models import Policy
from .. import overrides as ops
from ..core import Booster
from .deps import BoosterDep, PolicyDep, Reader, Writer
from .errors import AUTH_ERRORS, NOT_FOUND, TOO_LARGE, error

router = APIRouter(prefix="/v1/policies", tags=["overrides"], responses=AUTH_ERRORS)

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
NOTHING = error(409, "no published plan to freeze at or roll back")


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


@contextmanager
def _refusals() -> Iterator[None]:
    """The operations' refusals as the API answers them."""
    try:
        yield
    except ops.BadTheta as e:
        raise RequestValidationError(
            [
                {
                    "loc": ("body", "theta", p.split(":", 1)[0]),
                    "msg": f"{e.args[0].split(':', 1)[0]}: {p}",
                    "type": "value_error",
                }
                for p in e.problems
            ]
        ) from e
    except ops.BadContextLabel as e:
        raise RequestValidationError(
            [{"loc": ("body", "context"), "msg": str(e), "type": "value_error"}]
        ) from e
    except ops.UnknownContext as e:
        raise HTTPException(404, str(e)) from e
    except ops.NothingToOverride as e:
        raise HTTPException(409, str(e)) from e


def _apply(booster: Booster, policy: Policy, op: Callable[[], int]) -> ChangedOut:
    with _refusals():
        changed = op()
    booster.overrides_changed({policy.id})  # this replica at once; others on the notification
    return ChangedOut(policy=policy.name, changed=changed)


@router.get("/{name}/overrides", responses=NOT_FOUND)
def list_overrides(_: Reader, policy: PolicyDep, booster: BoosterDep) -> OverridesOut:
    """The policy's pins and kill switches as stored (what every replica serves)."""
    return OverridesOut.model_validate(ops.listing(booster.engine, policy))


@router.post("/{name}/pin", responses=NO_CONTEXT | TOO_LARGE)
def pin(who: Writer, policy: PolicyDep, body: PinIn, booster: BoosterDep) -> ChangedOut:
    """Serve ``theta`` to every host of the policy (or of one context), no exploration."""
    return _apply(
        booster,
        policy,
        lambda: ops.pin(booster.engine, policy, body.theta, who.name, body.context, body.reason),
    )


@router.post("/{name}/freeze", responses=NO_CONTEXT | TOO_LARGE | NOTHING)
def freeze(who: Writer, policy: PolicyDep, body: FreezeIn, booster: BoosterDep) -> ChangedOut:
    """Pin every planned context (or one) at the incumbent it is served now."""
    return _apply(
        booster,
        policy,
        lambda: ops.freeze(booster.engine, policy, who.name, body.context, body.reason),
    )


@router.post("/{name}/rollback", responses=NO_CONTEXT | TOO_LARGE | NOTHING)
def rollback(who: Writer, policy: PolicyDep, body: RollbackIn, booster: BoosterDep) -> ChangedOut:
    """Pin every planned context (or one) at the incumbent it was served at ``at`` (or after
    plan generation ``plan_generation``); a context without a plan then gets the default θ
    it was served then."""
    return _apply(
        booster,
        policy,
        lambda: ops.rollback(
            booster.engine,
            policy,
            who.name,
            body.at,
            body.plan_generation,
            body.context,
            body.reason,
        ),
    )


ContextQuery = Annotated[
    str | None, Query(max_length=600, description="one context's label; else the whole policy")
]


@router.delete("/{name}/pin", responses=NO_CONTEXT)
def unpin(
    who: Writer, policy: PolicyDep, booster: BoosterDep, context: ContextQuery = None
) -> ChangedOut:
    """Remove the pins (of one context, or every pin of the policy): normal planning again."""
    return _apply(booster, policy, lambda: ops.unpin(booster.engine, policy, who.name, context))


@router.put("/{name}/kill-switch", responses=NO_CONTEXT | TOO_LARGE)
def kill(who: Writer, policy: PolicyDep, body: KillIn, booster: BoosterDep) -> ChangedOut:
    """Every host of the policy (or of one context) to the datapath's safe default θ, with no
    exploration and no experiment arm, until released."""
    return _apply(
        booster,
        policy,
        lambda: ops.kill(booster.engine, policy, who.name, body.context, body.reason),
    )


@router.delete("/{name}/kill-switch", responses=NO_CONTEXT)
def release(
    who: Writer, policy: PolicyDep, booster: BoosterDep, context: ContextQuery = None
) -> ChangedOut:
    """Release the kill switch (of the policy, or of one context)."""
    return _apply(booster, policy, lambda: ops.release(booster.engine, policy, who.name, context))
