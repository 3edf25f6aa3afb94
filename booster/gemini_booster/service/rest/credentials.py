"""Credentials and the audit log: tokens are created and revoked by operators, every change to
the service leaves an audit entry, and readers may see who changed what."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from ...models import NAME_PATTERN
from ...storage import repository as repo
from .deps import AuthorityDep, BoosterDep, Reader, Writer
from .errors import AUTH_ERRORS, TOO_LARGE, error

Role = Literal["agent", "viewer", "operator"]

router = APIRouter(prefix="/v1", tags=["credentials"], responses=AUTH_ERRORS)


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=NAME_PATTERN)
    role: Role


class TokenOut(BaseModel):
    """The token's value is shown here once; only its hash is stored."""

    name: str
    role: Role
    token: str


@router.post(
    "/tokens",
    status_code=201,
    responses=error(409, "a token of that name (or value) exists") | TOO_LARGE,
)
def create_token(
    who: Writer, body: TokenCreate, booster: BoosterDep, authority: AuthorityDep
) -> TokenOut:
    try:
        token = repo.create_token(booster.engine, body.name, body.role, who.name)
    except repo.Conflict as e:
        raise HTTPException(409, str(e)) from e
    authority.invalidate()
    return TokenOut(name=body.name, role=body.role, token=token)


@router.delete(
    "/tokens/{name}",
    status_code=204,
    response_class=Response,
    responses=error(404, "no token of that name"),
)
def revoke_token(who: Writer, name: str, booster: BoosterDep, authority: AuthorityDep) -> None:
    try:
        repo.revoke_token(booster.engine, name, who.name)
    except repo.NotFound as e:
        raise HTTPException(404, str(e)) from e
    authority.invalidate()


@router.get("/audit")
def audit_log(
    _: Reader, booster: BoosterDep, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> list[dict[str, Any]]:
    """The newest entries first."""
    return repo.audit_entries(booster.engine, limit)
