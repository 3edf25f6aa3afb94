"""The REST API for operators (FastAPI): policies, contexts and their plans, trials, tokens,
and the web dashboard (static files under /dashboard/ that call this API).

Every route but /healthz and /metrics needs a bearer token; every route that changes state
needs an operator token and leaves an audit entry. Request bodies are strict pydantic models
(unknown fields are a 422 naming the field).
"""

import time
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException, Query, Request, Response
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import text

from ..models import NAME_PATTERN, Policy, PolicyCreate, PolicyUpdate
from ..policy.objective import utility
from ..storage import repository as repo
from .auth import AuthError, Principal, TokenAuthority
from .comparison import ContextComparison, compare
from .core import Booster, context_label

SigmaQuery = Annotated[float | None, Query(ge=0, description="recompute eq. 9 with this σ")]
_AUTH_STATUS = {"missing": 401, "invalid": 401, "forbidden": 403}
DASHBOARD_DIR = Path(__file__).with_name("dashboard")
# The dashboard is static files calling /v1 with the operator's token: no inline code, no
# third-party origin, no framing (a token typed into a framed page could be clickjacked).
DASHBOARD_HEADERS = {
    "content-security-policy": "default-src 'self'; frame-ancestors 'none'; form-action 'self'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=NAME_PATTERN)
    role: Literal["agent", "viewer", "operator"]


class ContextPlanOut(BaseModel):
    context: dict
    label: str
    plan_version: int
    incumbent: dict[str, int]
    incumbent_natural: dict[str, float]
    predicted_utility: float
    exploration_candidates: int


class TrialOut(BaseModel):
    context: dict
    theta: dict[str, int]
    flows: int
    reports: int
    utility: float
    utility_stderr: float
    mean_throughput_mbps: float
    mean_queue_delay_ms: float
    slow_flow_share: float


def _ctx_dict(key) -> dict:
    return dict(zip(("src_region", "src_isp", "dst_region", "dst_isp", "hour"), key, strict=True))


def create_app(booster: Booster, auth: TokenAuthority) -> FastAPI:
    app = FastAPI(
        title="Gemini Booster",
        version="1",
        description="Operator API of Booster, the contextual Bayesian optimiser for Fusion's θ.",
    )

    def principal(permission: str):
        def check(authorization: Annotated[str | None, Header()] = None) -> Principal:
            try:
                return auth.require(authorization, permission)
            except AuthError as e:
                booster.metrics.auth_failures.labels("rest", e.reason).inc()
                raise HTTPException(
                    _AUTH_STATUS[e.reason], str(e), headers={"WWW-Authenticate": "Bearer"}
                ) from e

        return check

    Reader = Annotated[Principal, Depends(principal("read"))]
    Writer = Annotated[Principal, Depends(principal("write"))]

    @app.middleware("http")
    async def dashboard_headers(request: Request, call_next):
        response = await call_next(request)
        if request.url.path.startswith("/dashboard"):
            response.headers.update(DASHBOARD_HEADERS)
        return response

    @app.middleware("http")
    async def timing(request: Request, call_next):
        t0 = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        booster.metrics.http_latency.labels(
            request.method, getattr(route, "path", "unmatched"), str(response.status_code)
        ).observe(time.perf_counter() - t0)
        return response

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict:
        try:
            with booster.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except Exception as e:
            raise HTTPException(503, "database unreachable") from e
        return {"status": "ok", "policies": len(booster.policies)}

    @app.get("/metrics", tags=["health"])
    def metrics() -> Response:
        return Response(booster.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    v1 = APIRouter(prefix="/v1")

    @v1.get("/theta-spec", tags=["theta"])
    def theta_spec(_: Reader) -> dict:
        return {
            "version": booster.spec.version,
            "params": [p.__dict__ for p in booster.spec.params],
        }

    def _policy(name: str) -> Policy:
        p = booster.policies.get(name)
        if p is None:
            raise HTTPException(404, f"policy {name!r} not found")
        return p

    @v1.get("/policies", tags=["policies"])
    def list_policies(_: Reader) -> list[Policy]:
        return list(booster.policies.values())

    @v1.post("/policies", status_code=201, tags=["policies"])
    def create_policy(body: PolicyCreate, who: Writer) -> Policy:
        try:
            created = repo.create_policy(booster.engine, body, who.name)
        except repo.Conflict as e:
            raise HTTPException(409, str(e)) from e
        booster.reload_policies()
        return created

    @v1.get("/policies/{name}", tags=["policies"])
    def get_policy(name: str, _: Reader) -> Policy:
        return _policy(name)

    @v1.patch("/policies/{name}", tags=["policies"])
    def update_policy(name: str, body: PolicyUpdate, who: Writer) -> Policy:
        try:
            updated = repo.update_policy(booster.engine, name, body, who.name)
        except repo.NotFound as e:
            raise HTTPException(404, f"policy {name!r} not found") from e
        except ValueError as e:
            raise HTTPException(422, str(e)) from e
        booster.reload_policies()
        return updated

    @v1.post("/policies/{name}/refit", tags=["policies"])
    def refit(name: str, who: Writer) -> dict:
        plans = booster.refit(_policy(name))
        return {"contexts": len(plans), "by": who.name}

    @v1.get("/policies/{name}/parameters", tags=["plans"])
    def parameters(name: str, _: Reader) -> list[ContextPlanOut]:
        p = _policy(name)
        out = []
        for key, plan in sorted(booster.plan_snapshot(p.id).items()):
            theta = booster.spec.from_key(plan.incumbent_key)
            out.append(
                ContextPlanOut(
                    context=_ctx_dict(key),
                    label=context_label(key),
                    plan_version=plan.version,
                    incumbent=theta,
                    incumbent_natural=booster.spec.natural(theta),
                    predicted_utility=plan.incumbent_utility,
                    exploration_candidates=len(plan.candidates),
                )
            )
        return out

    @v1.get("/policies/{name}/trials", tags=["plans"])
    def trials(
        name: str,
        _: Reader,
        sigma: SigmaQuery = None,
        limit: Annotated[int, Query(ge=1, le=10000)] = 500,
    ) -> list[TrialOut]:
        p = _policy(name)
        s = p.sigma if sigma is None else sigma
        contexts = repo.load_contexts(booster.engine)
        rows = []
        for t in repo.load_trials(booster.engine, p.id):
            u = utility(
                s,
                t.flow_count,
                t.tpt_sum,
                t.tpt_sq_sum,
                t.delay_sum,
                t.delay_sq_sum,
                t.tpt_delay_sum,
            )
            rows.append(
                TrialOut(
                    context=_ctx_dict(contexts[t.context_id]),
                    theta=booster.spec.from_key(t.theta_key),
                    flows=t.flow_count,
                    reports=t.report_count,
                    utility=u.mean,
                    utility_stderr=u.var_of_mean**0.5,
                    mean_throughput_mbps=t.tpt_sum / t.flow_count,
                    mean_queue_delay_ms=t.delay_sum / t.flow_count,
                    slow_flow_share=t.slow_flows / t.flow_count,
                )
            )
        return sorted(rows, key=lambda r: -r.utility)[:limit]

    @v1.get("/policies/{name}/comparison", tags=["plans"])
    def comparison(
        name: str,
        _: Reader,
        sigma: SigmaQuery = None,
    ) -> list[ContextComparison]:
        """Fusion against the other CCs the agents saw, per context with baseline flows."""
        p = _policy(name)
        history = timedelta(hours=p.history_hours)
        contexts = repo.load_contexts(booster.engine)
        ids = {key: cid for cid, key in contexts.items()}
        incumbents = {
            ids[key]: plan.incumbent_key
            for key, plan in booster.plan_snapshot(p.id).items()
            if key in ids
        }
        table = compare(
            p,
            repo.load_trials(booster.engine, p.id, history),
            repo.load_baselines(booster.engine, p.id, history),
            incumbents,
            sigma,
        )
        return [
            ContextComparison(
                context=_ctx_dict(contexts[c]),
                label=context_label(contexts[c]),
                arms=arms,
                versus=pairs,
            )
            for c, (arms, pairs) in table.items()
        ]

    @v1.post("/tokens", status_code=201, tags=["credentials"])
    def create_token(body: TokenCreate, who: Writer) -> dict:
        try:
            token = repo.create_token(booster.engine, body.name, body.role, who.name)
        except repo.Conflict as e:
            raise HTTPException(409, str(e)) from e
        auth.invalidate()
        return {"name": body.name, "role": body.role, "token": token}

    @v1.delete("/tokens/{name}", status_code=204, tags=["credentials"])
    def revoke_token(name: str, who: Writer) -> Response:
        try:
            repo.revoke_token(booster.engine, name, who.name)
        except repo.NotFound as e:
            raise HTTPException(404, str(e)) from e
        auth.invalidate()
        return Response(status_code=204)

    @v1.get("/audit", tags=["credentials"])
    def audit_log(_: Reader, limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list[dict]:
        return repo.audit_entries(booster.engine, limit)

    app.include_router(v1)

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/dashboard/")

    app.mount("/dashboard", StaticFiles(directory=DASHBOARD_DIR, html=True), name="dashboard")
    return app
