"""The REST API for operators (FastAPI): policies, contexts and their plans, trials, tokens,
and the web dashboard (static files under /dashboard/ that call this API).

Every route but the probes (/livez, /readyz, /healthz) and /metrics needs a bearer token; every
route that changes state needs an operator token and leaves an audit entry. Request bodies are
strict pydantic models (unknown fields are a 422 naming the field), limited in size, and not
read at all before their sender is authenticated (``limits.py``).

Routers live in their own modules over shared dependencies (``deps.py``); ``create_app`` puts
the core and the token authority where those dependencies find them and assembles the rest.
"""

from __future__ import annotations

import time
from pathlib import Path

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.middleware.base import RequestResponseEndpoint

from ... import __version__
from ...config import Settings
from ..auth import TokenAuthority
from ..core import Booster
from . import credentials, docs, experiments, health, overrides, plans, policies
from .deps import authorize
from .errors import DATABASE_ERRORS, database_unavailable, validation_failed
from .limits import RequestLimits, uvicorn_limits

__all__ = ["DASHBOARD_DIR", "create_app", "uvicorn_limits"]

DASHBOARD_DIR = Path(__file__).resolve().parent.parent / "dashboard"
# The dashboard is static files calling /v1 with the operator's token: no inline code, no
# third-party origin, no framing (a token typed into a framed page could be clickjacked).
DASHBOARD_HEADERS = {
    "content-security-policy": "default-src 'self'; frame-ancestors 'none'; form-action 'self'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}


def create_app(booster: Booster, auth: TokenAuthority, settings: Settings | None = None) -> FastAPI:
    """The operator API over ``booster``; ``settings`` (the core's by default) give the limits."""
    settings = settings or booster.settings
    app = FastAPI(
        title="Gemini Booster",
        version=__version__,
        description="Operator API of Booster, the contextual Bayesian optimiser for Fusion's θ.",
        docs_url=None,  # served from the package by docs.install, not from a CDN
        redoc_url=None,
    )
    app.state.booster = booster
    app.state.authority = auth
    app.add_exception_handler(RequestValidationError, validation_failed)
    for db_error in DATABASE_ERRORS:
        app.add_exception_handler(db_error, database_unavailable)

    # Innermost of the middlewares, so the timing below also measures what it refuses.
    app.add_middleware(
        RequestLimits,
        max_body_bytes=settings.max_request_body_bytes,
        guard=lambda authorization, permission: authorize(booster, auth, authorization, permission),
    )

    @app.middleware("http")
    async def dashboard_headers(request: Request, call_next: RequestResponseEndpoint) -> Response:
        response = await call_next(request)
        if request.url.path.startswith("/dashboard"):
            response.headers.update(DASHBOARD_HEADERS)
        elif request.url.path.startswith("/docs"):
            response.headers.update(docs.DOCS_HEADERS)
        return response

    @app.middleware("http")
    async def timing(request: Request, call_next: RequestResponseEndpoint) -> Response:
        t0 = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        booster.metrics.http_latency.labels(
            request.method, getattr(route, "path", "unmatched"), str(response.status_code)
        ).observe(time.perf_counter() - t0)
        return response

    for module in (health, plans, policies, overrides, credentials, experiments):
        app.include_router(module.router)

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/dashboard/")

    docs.install(app)
    app.mount("/dashboard", StaticFiles(directory=DASHBOARD_DIR, html=True), name="dashboard")
    return app
