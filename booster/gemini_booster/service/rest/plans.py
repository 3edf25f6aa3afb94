"""What the optimiser made of a policy: the θ spec, the plan per context, the trials behind it,
and the A/B comparison against the other congestion controls on the same hosts.

Trials and comparison cover the same history window (``Policy.history_window``), computed by
``service/trials.py``. Utilities are eq. 9 over stored running sums (``FlowSums.utility``), so
any σ can be previewed (``?sigma=``) without changing the policy.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel

from gemini_api.datapaths import DEFAULT_DATAPATH, datapaths, load_datapath

from ...domain import ContextKey
from ...models import Sigma
from .. import trials as service_trials
from ..comparison import ContextComparison
from ..trials import TrialOut
from .csvout import CSV_MEDIA, Format, csv_response
from .deps import BoosterDep, PolicyDep, Reader
from .errors import AUTH_ERRORS, NOT_FOUND

SigmaQuery = Annotated[Sigma | None, Query(description="recompute eq. 9 with this σ")]

router = APIRouter(prefix="/v1", tags=["plans"], responses=AUTH_ERRORS)
CSV: dict[int | str, dict[str, Any]] = {
    200: {"content": {CSV_MEDIA: {}}, "description": "the rows as JSON, or CSV (format=csv)"}
}


class ContextPlanOut(BaseModel):
    context: dict[str, str | int]
    label: str
    plan_version: int
    incumbent: dict[str, int]
    incumbent_natural: dict[str, float]
    predicted_utility: float
    exploration_candidates: int


@router.get("/theta-spec", tags=["theta"])
def theta_spec(
    _: Reader,
    booster: BoosterDep,
    datapath: Annotated[
        str, Query(pattern=r"^[a-z0-9_]{1,16}$", description="fusion (default), cubic, ...")
    ] = DEFAULT_DATAPATH,
) -> dict[str, Any]:
    """A datapath's θ spec: its parameters, units, regions and defaults."""
    if datapath not in datapaths():
        raise HTTPException(404, f"no θ spec for datapath {datapath!r}; have {datapaths()}")
    spec = load_datapath(datapath)
    return {
        "version": spec.version,
        "datapath": spec.datapath,
        "scope": spec.scope,
        "params": [p.__dict__ for p in spec.params],
    }


@router.get("/policies/{name}/parameters", responses=NOT_FOUND)
def parameters(policy: PolicyDep, booster: BoosterDep) -> list[ContextPlanOut]:
    """The published plan per context: the incumbent θ and how many θ are being explored."""
    out = []
    for key, plan in sorted(booster.plan_snapshot(policy.id).items()):
        context = ContextKey(*key)
        theta = policy.spec.from_key(plan.incumbent_key)
        out.append(
            ContextPlanOut(
                context=context.as_dict(),
                label=context.label,
                plan_version=plan.version,
                incumbent=theta,
                incumbent_natural=policy.spec.natural(theta),
                predicted_utility=plan.incumbent_utility,
                exploration_candidates=len(plan.candidates),
            )
        )
    return out


@router.get("/policies/{name}/trials", responses=NOT_FOUND | CSV, response_model=list[TrialOut])
def trials(
    policy: PolicyDep,
    booster: BoosterDep,
    sigma: SigmaQuery = None,
    limit: Annotated[int, Query(ge=1, le=10000)] = 500,
    format: Format = "json",
) -> Any:
    """The policy's Fusion trials over its history window (the comparison's and the model's:
    ``Policy.history_window``), one per context and θ, best first at ``sigma`` (the policy's
    by default); ``format=csv``: the same rows as CSV."""
    best = service_trials.trials(booster, policy, sigma, limit)
    if format == "csv":
        return csv_response((r.model_dump() for r in best), f"{policy.name}-trials.csv")
    return best


@router.get(
    "/policies/{name}/comparison",
    responses=NOT_FOUND | CSV,
    response_model=list[ContextComparison],
)
def comparison(
    policy: PolicyDep, booster: BoosterDep, sigma: SigmaQuery = None, format: Format = "json"
) -> Any:
    """Fusion against the other CCs the agents saw, per context with baseline flows, over the
    policy's history window; ``format=csv``: one row per context and arm, then one per
    context and pair (``row`` says which), with the same values."""
    out = service_trials.comparison(booster, policy, sigma)
    if format == "csv":
        rows = [
            {"row": kind, "label": c.label, **item.model_dump()}
            for c in out
            for kind, items in (("arm", c.arms), ("versus", c.versus))
            for item in items
        ]
        return csv_response(rows, f"{policy.name}-comparison.csv")
    return out
