"""Probes and metrics, without credentials.

``/livez`` says the process still serves HTTP and nothing else: it never touches the database,
so an outage does not get healthy replicas restarted (they keep serving the last plans).
``/readyz`` says whether this replica serves current data (``Booster.ready``): a load balancer
stops sending it operators while it cannot. ``/healthz`` is readiness under its old name.
No answer carries a database driver's message.
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, HTTPException, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel

from ..core import Booster
from .deps import BoosterDep
from .errors import error

log = logging.getLogger(__name__)

router = APIRouter(tags=["health"])
NOT_READY = error(503, "this replica does not serve current data now; the detail says why")


class Live(BaseModel):
    status: str = "alive"


class Ready(BaseModel):
    status: str = "ready"
    policies: int


def not_ready_reason(booster: Booster) -> str | None:
    """None when ready; else why not, in the core's words (never an exception's text)."""
    try:
        return booster.ready()
    except Exception:
        log.exception("readiness check failed")
        return "readiness check failed"


@router.get("/livez")
async def livez() -> Live:
    return Live()


@router.get("/readyz", responses=NOT_READY)
def readyz(booster: BoosterDep) -> Ready:
    reason = not_ready_reason(booster)
    if reason is not None:
        raise HTTPException(503, reason)
    return Ready(policies=len(booster.policies))


@router.get("/healthz", responses=NOT_READY, deprecated=True)
def healthz(booster: BoosterDep) -> Ready:
    """Readiness under its old name, for probes configured before /livez and /readyz."""
    return readyz(booster)


@router.get("/metrics", response_class=Response)
def metrics(booster: BoosterDep) -> Response:
    return Response(booster.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
