"""Dependencies shared by the routers: the Booster core, the token authority, the caller with a
permission, and the policy named in the path.

The routers are module-level (FastAPI's "bigger applications" layout), so what they need comes
from ``app.state`` (set by ``create_app``) through these, and a test or another assembly can
serve the same routers over another core.

Declare the principal before anything that can answer 404: dependencies resolve in declaration
order, so an unauthenticated caller learns nothing about which policies exist. ``named_policy``
itself requires read permission, so that holds even if a route forgets.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Path, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ...models import Policy
from ..auth import AuthError, Principal, TokenAuthority
from ..core import Booster

# Every reason an AuthError can carry (``auth.AuthError``): a reason missing here was a 500.
AUTH_STATUS = {
    "missing": 401,
    "invalid": 401,
    "expired": 401,
    "forbidden": 403,
    "unbound": 403,
    "host_mismatch": 403,
    "unavailable": 503,
}
CHALLENGE = {"WWW-Authenticate": "Bearer"}


def get_booster(request: Request) -> Booster:
    booster: Booster = request.app.state.booster
    return booster


def get_authority(request: Request) -> TokenAuthority:
    authority: TokenAuthority = request.app.state.authority
    return authority


BoosterDep = Annotated[Booster, Depends(get_booster)]
AuthorityDep = Annotated[TokenAuthority, Depends(get_authority)]


def authorize(
    booster: Booster, authority: TokenAuthority, authorization: str | None, permission: str
) -> Principal:
    """The caller behind ``authorization`` if it may ``permission``; else AuthError, counted.
    Shared by the dependency and the body-limit middleware, so both refuse alike."""
    try:
        return authority.require(authorization, permission)
    except AuthError as e:
        booster.metrics.auth_failures.labels("rest", e.reason).inc()
        raise


# Only for the OpenAPI document (the "Authorize" button of /docs): the header itself is read
# raw, so a malformed credential gets the authority's own message rather than a generic one.
bearer = HTTPBearer(
    auto_error=False,
    description="a token from POST /v1/tokens, or the bootstrap operator token",
)


class Permission:
    """A dependency: the caller, who must hold ``permission`` (401 or 403 otherwise)."""

    def __init__(self, permission: str) -> None:
        self.permission = permission

    def __call__(
        self,
        request: Request,
        booster: BoosterDep,
        authority: AuthorityDep,
        _: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)],
    ) -> Principal:
        try:
            return authorize(
                booster, authority, request.headers.get("authorization"), self.permission
            )
        except AuthError as e:
            raise HTTPException(AUTH_STATUS[e.reason], str(e), headers=CHALLENGE) from e


require_read = Permission("read")
require_write = Permission("write")
Reader = Annotated[Principal, Depends(require_read)]
Writer = Annotated[Principal, Depends(require_write)]


def named_policy(
    _: Reader,
    name: Annotated[str, Path(description="the policy's name")],
    booster: BoosterDep,
) -> Policy:
    """The policy named in the path, as this replica serves it; 404 if there is none."""
    policy = booster.policies.get(name)
    if policy is None:
        raise HTTPException(404, f"policy {name!r} not found")
    return policy


PolicyDep = Annotated[Policy, Depends(named_policy)]
