"""What the optimiser made of a policy: the θ spec, the plan per context, the trials behind it,
and the A/B comparison against the other congestion controls on the same hosts.

Utilities are eq. 9 over stored running sums (``FlowSums.utility``), so any σ can be previewed
(``?sigma=``) without changing the policy.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel

from gemini_api.datapaths import DEFAULT_DATAPATH, datapaths, load_datapath

from ...domain import ContextKey, merge_buckets
from ...models import Sigma
from ...storage import repository as repo
from ..comparison import ContextComparison, compare
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


class TrialOut(BaseModel):
    context: dict[str, str | int]
    theta: dict[str, int]
    flows: int
    reports: int
    utility: float
    utility_stderr: float
    mean_throughput_mbps: float
    mean_queue_delay_ms: float
    slow_flow_share: float


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
    """Every Fusion trial of the policy, best first at ``sigma`` (the policy's by default);
    ``format=csv``: the same rows as CSV."""
    s = policy.sigma if sigma is None else sigma
    found = merge_buckets(repo.load_trials(booster.engine, policy.id))
    contexts = repo.load_contexts(booster.engine, {t.context_id for t in found})
    rows = []
    for t in found:
        u = t.sums.utility(s)
        rows.append(
            TrialOut(
                context=ContextKey(*contexts[t.context_id]).as_dict(),
                theta=policy.spec.from_key(t.theta_key),
                flows=t.flow_count,
                reports=t.report_count,
                utility=u.mean,
                utility_stderr=u.stderr,
                mean_throughput_mbps=t.sums.mean_throughput,
                mean_queue_delay_ms=t.sums.mean_delay,
                slow_flow_share=t.slow_flow_share,
            )
        )
    best = sorted(rows, key=lambda r: -r.utility)[:limit]
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
    history = timedelta(hours=policy.history_hours)
    fusion = repo.load_trials(booster.engine, policy.id, history)
    baselines = repo.load_baselines(booster.engine, policy.id, history)
    compared = {t.context_id for ts in baselines.values() for t in ts}
    contexts = {c: ContextKey(*k) for c, k in repo.load_contexts(booster.engine, compared).items()}
    ids = {key: c for c, key in contexts.items()}
    incumbents: dict[int, str] = {}
    for key, plan in booster.plan_snapshot(policy.id).items():
        c = ids.get(ContextKey(*key))
        if c is not None:
            incumbents[c] = plan.incumbent_key
    table = compare(policy, fusion, baselines, incumbents, sigma)
    out = [
        ContextComparison(
            context=contexts[c].as_dict(), label=contexts[c].label, arms=arms, versus=pairs
        )
        for c, (arms, pairs) in table.items()
    ]
    if format == "csv":
        rows = [
            {"row": kind, "label": c.label, **item.model_dump()}
            for c in out
            for kind, items in (("arm", c.arms), ("versus", c.versus))
            for item in items
        ]
        return csv_response(rows, f"{policy.name}-comparison.csv")
    return out
