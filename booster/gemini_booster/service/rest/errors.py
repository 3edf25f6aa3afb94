"""Errors as the API answers them: one body shape per kind, documented on the routes where they
can happen, and never a database driver's message.

Every refusal but a 422 is ``{"detail": "<what was wrong>"}`` (``ErrorOut``). Every 422 is
FastAPI's ``HTTPValidationError``, ``{"detail": [{"loc", "msg", "type", …}]}``, including the
checks that only the merged policy allows (``invalid_body``), so a client reads one schema per
status, the one the OpenAPI document shows.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import HTTPException, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from ..experiments import Conflict, NotFound

log = logging.getLogger(__name__)

# The database cannot be reached (or the pool is exhausted): the request may succeed later, so
# 503, with our words; the driver's message (host names, users, SQL) goes to the log only.
DATABASE_ERRORS: tuple[type[Exception], ...] = (OperationalError, InterfaceError, PoolTimeout)
DATABASE_UNAVAILABLE = "database unavailable; try again later"

Responses = dict[int | str, dict[str, Any]]


class ErrorOut(BaseModel):
    """A refusal: what was wrong, in words for the operator."""

    detail: str


def error(status: int, description: str) -> Responses:
    """The OpenAPI entry of one refusal a route can answer."""
    return {status: {"model": ErrorOut, "description": description}}


@contextmanager
def refusals() -> Iterator[None]:
    """Storage's refusals as the API answers them, with their own words: ``NotFound`` 404,
    ``Conflict`` 409 (every write route maps them so; one place keeps them alike)."""
    try:
        yield
    except NotFound as e:
        raise HTTPException(404, str(e)) from e
    except Conflict as e:
        raise HTTPException(409, str(e)) from e


NOT_FOUND = error(404, "no policy of that name")
TOO_LARGE = error(413, "request body above max_request_body_bytes (refused before it is read)")
UNAVAILABLE = error(
    503, f"{DATABASE_UNAVAILABLE}; or credentials cannot be checked now (retry later)"
)
# Every route that takes a credential: it may be refused, and may be unanswerable for now.
AUTH_ERRORS = (
    error(401, "no credential, a malformed one, or an unknown, revoked or expired token")
    | error(403, "the token's role lacks the permission")
    | UNAVAILABLE
)


def invalid_body(e: ValidationError, sent: dict[str, Any]) -> RequestValidationError:
    """A model check that runs after FastAPI's own (e.g. on the merged policy of a PATCH),
    reported exactly as FastAPI reports its own: each problem located under ``body``. A rule
    across fields shows what was ``sent``, not the merged model the client never saw."""
    return RequestValidationError(
        [
            {**err, "loc": ("body", *err["loc"])} | ({} if err["loc"] else {"input": sent})
            for err in e.errors(include_url=False)
        ]
    )


def _json_safe(value: Any) -> Any:
    """NaN and ±Infinity as strings: Python's JSON parser accepts them in a request, a 422
    echoes the input, and strict JSON (which the response must be) has no such numbers."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    return value


async def validation_failed(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's 422 body, safe for any input (its default handler fails on NaN: a 500), with
    the error a validator raised as its message (the default encodes it as ``{}``)."""
    assert isinstance(exc, RequestValidationError)
    problems = [
        {**err, "ctx": {k: str(v) if isinstance(v, Exception) else v for k, v in ctx.items()}}
        if isinstance(ctx := err.get("ctx"), dict)
        else err
        for err in exc.errors()
    ]
    return JSONResponse({"detail": _json_safe(jsonable_encoder(problems))}, status_code=422)


async def database_unavailable(request: Request, exc: Exception) -> JSONResponse:
    log.error("%s %s: database unavailable: %s", request.method, request.url.path, exc)
    return JSONResponse({"detail": DATABASE_UNAVAILABLE}, status_code=503)
