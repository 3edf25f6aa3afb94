"""Policies: what an operator declares for one fleet (σ, region, exploration, model limits).

Changes go through ``service/policies.py``: written to PostgreSQL first (with an audit entry),
this replica reloads its policy table at once and the others follow through the database.
"""

from __future__ import annotations

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ValidationError

from ...models import Policy, PolicyCreate, PolicyUpdate
from .. import core
from .. import policies as ops
from .deps import BoosterDep, PolicyDep, Reader, Writer
from .errors import AUTH_ERRORS, NOT_FOUND, TOO_LARGE, error, invalid_body


class _NeverRaised(Exception):
    """Stands in for RefitElsewhere in a core that has no refit ownership."""


# Raised by Booster.refit when another replica owns the policy's refits.
RefitElsewhere: type[Exception] = getattr(core, "RefitElsewhere", _NeverRaised)

router = APIRouter(prefix="/v1/policies", tags=["policies"], responses=AUTH_ERRORS)


class RefitOut(BaseModel):
    contexts: int
    by: str


@router.get("")
def list_policies(_: Reader, booster: BoosterDep) -> list[Policy]:
    return list(booster.policies.values())


@router.post(
    "",
    status_code=201,
    responses=error(409, "a policy of that name exists") | TOO_LARGE,
)
def create_policy(who: Writer, body: PolicyCreate, booster: BoosterDep) -> Policy:
    try:
        return ops.create_policy(booster, body, who.name)
    except ops.Conflict as e:
        raise HTTPException(409, str(e)) from e


@router.get("/{name}", responses=NOT_FOUND)
def get_policy(policy: PolicyDep) -> Policy:
    return policy


@router.patch("/{name}", responses=NOT_FOUND | TOO_LARGE)
def update_policy(who: Writer, name: str, body: PolicyUpdate, booster: BoosterDep) -> Policy:
    """Change some settings; the merged policy is checked whole (e.g. custom bounds need
    region custom), and a refusal leaves the policy as it was."""
    try:
        return ops.update_policy(booster, name, body, who.name)
    except ops.NotFound as e:
        raise HTTPException(404, f"policy {name!r} not found") from e
    except ValidationError as e:
        raise invalid_body(e, body.model_dump(mode="json", exclude_unset=True)) from e


@router.post(
    "/{name}/refit",
    responses=NOT_FOUND | error(409, "another replica owns this policy's refits; it names it"),
)
def refit(who: Writer, policy: PolicyDep, booster: BoosterDep) -> RefitOut:
    """Refit the policy's model now and publish its plans (normally done when data arrives)."""
    try:
        plans = booster.refit(policy)
    except RefitElsewhere as e:
        raise HTTPException(409, str(e)) from e
    return RefitOut(contexts=len(plans), by=who.name)
