"""Credentials and the audit log: tokens are created and revoked by operators, every change to
the service leaves an audit entry, and readers may see who changed what."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Response
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from ...models import NAME_PATTERN
from .. import credentials as ops
from .deps import AuthorityDep, BoosterDep, Reader, Writer
from .errors import AUTH_ERRORS, TOO_LARGE, error, refusals

Role = Literal["agent", "viewer", "operator"]

router = APIRouter(prefix="/v1", tags=["credentials"], responses=AUTH_ERRORS)


def _printable(host_id: str) -> str:
    """As the storage layer requires (``create_token`` refuses them), so a rotation refuses what a
    creation refuses, with a 422 rather than the storage layer's ValueError (a 500)."""
    if not host_id.isprintable():
        raise ValueError("host id: need printable characters only (no control or format ones)")
    return host_id


HostId = Annotated[
    str,
    Field(min_length=1, max_length=ops.MAX_HOST_ID_LEN, pattern=r"^\S+$"),
    AfterValidator(_printable),
]
MAX_GRACE_S = 30 * 86_400


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=NAME_PATTERN)
    role: Role
    host_id: HostId | None = Field(
        default=None, description="the one host an agent token may speak for"
    )

    @model_validator(mode="after")
    def _host_for_agents_only(self) -> TokenCreate:
        if self.host_id is not None and self.role != "agent":
            raise ValueError("host_id binds agent tokens only")
        return self


class TokenOut(BaseModel):
    """The token's value is shown here once; only its hash is stored."""

    name: str
    role: Role
    host_id: str | None = None
    token: str


class TokenRotate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    host_id: HostId
    grace_s: float = Field(
        default=86_400, ge=0, le=MAX_GRACE_S, description="how long the old token stays valid"
    )


class RotationOut(BaseModel):
    """The host's new token (shown once) and the old ones that now expire."""

    name: str
    host_id: str
    token: str
    expiring: list[str]
    expires_at: datetime


@router.post(
    "/tokens",
    status_code=201,
    responses=error(409, "a token of that name (or value) exists") | TOO_LARGE,
)
def create_token(
    who: Writer, body: TokenCreate, booster: BoosterDep, authority: AuthorityDep
) -> TokenOut:
    with refusals():
        token = ops.create_token(
            booster.engine, body.name, body.role, who.name, host_id=body.host_id
        )
    authority.invalidate()
    return TokenOut(name=body.name, role=body.role, host_id=body.host_id, token=token)


@router.post(
    "/tokens/rotate",
    status_code=201,
    responses=error(404, "the host has no live token") | error(409, "name taken") | TOO_LARGE,
)
def rotate_token(
    who: Writer, body: TokenRotate, booster: BoosterDep, authority: AuthorityDep
) -> RotationOut:
    """A new token for the host; its other tokens expire after ``grace_s``, so the host
    switches without a refused call."""
    with refusals():
        r = ops.rotate_token(
            booster.engine, body.host_id, who.name, timedelta(seconds=body.grace_s)
        )
    authority.invalidate()
    return RotationOut(
        name=r.name,
        host_id=body.host_id,
        token=r.token,
        expiring=list(r.expiring),
        expires_at=r.expires_at,
    )


@router.delete(
    "/tokens/{name}",
    status_code=204,
    response_class=Response,
    responses=error(404, "no token of that name"),
)
def revoke_token(who: Writer, name: str, booster: BoosterDep, authority: AuthorityDep) -> None:
    with refusals():
        ops.revoke_token(booster.engine, name, who.name)
    authority.invalidate()


@router.get("/audit")
def audit_log(
    _: Reader, booster: BoosterDep, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> list[dict[str, Any]]:
    """The newest entries first."""
    return ops.audit_entries(booster.engine, limit)
