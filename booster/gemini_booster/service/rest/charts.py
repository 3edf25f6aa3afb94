"""The dashboard's chart data over REST, read-only: a context's rounds and incumbent history,
the θ in use, and throughput and delay percentiles. What each chart means and how it is computed
is ``service/charts.py``; this router maps it onto HTTP (an unknown context label is a 404)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query

from .. import charts
from ..charts import IncumbentsOut, PercentilesOut, RoundsOut, ThetaDistributionOut
from .deps import BoosterDep, PolicyDep
from .errors import AUTH_ERRORS, error
from .plans import SigmaQuery

router = APIRouter(prefix="/v1/policies/{name}/charts", tags=["charts"], responses=AUTH_ERRORS)

NO_CONTEXT = error(404, "no policy of that name, or no such context")
ContextQuery = Annotated[
    str, Query(max_length=300, description="a context's label, as /parameters gives it")
]


@contextmanager
def _context_found() -> Iterator[None]:
    try:
        yield
    except charts.UnknownContext as e:
        raise HTTPException(404, str(e)) from e


@router.get("/rounds", responses=NO_CONTEXT)
def rounds(
    policy: PolicyDep, booster: BoosterDep, context: ContextQuery, sigma: SigmaQuery = None
) -> RoundsOut:
    """Utility per round (time bucket) of one context: all its Fusion flows, and those of the
    incumbent in force at the round's start; the incumbent changes published since the first
    round began."""
    with _context_found():
        return charts.rounds(booster, policy, context, sigma)


@router.get("/incumbents", responses=NO_CONTEXT)
def incumbents(policy: PolicyDep, booster: BoosterDep, context: ContextQuery) -> IncumbentsOut:
    """Every change of one context's incumbent, oldest first: when each θ was published, what
    the planner predicted for it, and the refit that chose it. One row per change (not per
    refit), kept for the policy's life."""
    with _context_found():
        return charts.incumbents(booster, policy, context)


@router.get("/theta", responses=NO_CONTEXT)
def theta_distribution(
    policy: PolicyDep,
    booster: BoosterDep,
    context: Annotated[
        str | None,
        Query(max_length=300, description="this context only, by its label (default: all)"),
    ] = None,
) -> ThetaDistributionOut:
    """The θ the policy's flows (of one context, or of all) ran under over the history window
    (in its datapath's spec): per θ and, per parameter, per value, the flows, and the hosts
    that reported it in the newest reports."""
    with _context_found():
        return charts.theta_distribution(booster, policy, context)


@router.get("/percentiles", responses=NO_CONTEXT)
def percentiles(policy: PolicyDep, booster: BoosterDep, context: ContextQuery) -> PercentilesOut:
    """Throughput and queueing-delay percentiles of one context's flows over the history
    window, merged from the agents' sketches per arm: all Fusion flows, today's incumbent θ,
    each other CC seen. Flows sent without a sketch (older agents send no delay sketch) are
    counted in ``flows`` and left out of that sketch's percentiles."""
    with _context_found():
        return charts.percentiles(booster, policy, context)
