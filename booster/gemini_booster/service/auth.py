"""Bearer-token credentials with roles, shared by gRPC and REST.

Roles: ``agent`` may report and read parameters over gRPC; ``viewer`` may read the REST API;
``operator`` may also change it. An agent token can never change a policy. Tokens are stored as
SHA-256 only; the live set is cached for a few seconds so a revocation takes effect quickly
without a database round trip per request.
"""

from __future__ import annotations

import hmac
import threading
import time
from dataclasses import dataclass

from sqlalchemy import Engine

from ..storage import repository as repo

CACHE_SECONDS = 5.0
MISS_RELOAD_SECONDS = 0.5  # an unknown token reloads the table at most this often
GRANTS = {
    "agent": {"agent"},
    "viewer": {"read"},
    "operator": {"read", "write", "agent"},
}


@dataclass(frozen=True)
class Principal:
    name: str
    role: str

    def may(self, permission: str) -> bool:
        return permission in GRANTS.get(self.role, set())


class AuthError(Exception):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason  # "missing", "invalid" or "forbidden"


class TokenAuthority:
    def __init__(self, engine: Engine):
        self.engine = engine
        self._tokens: dict[str, tuple[str, str]] = {}
        self._loaded_at = 0.0
        self._lock = threading.Lock()

    def _lookup(self, digest: str) -> tuple[str, str] | None:
        with self._lock:
            age = time.monotonic() - self._loaded_at
            missing = digest not in self._tokens
            stale = age > CACHE_SECONDS or (missing and age > MISS_RELOAD_SECONDS)
            if stale:
                self._tokens = repo.lookup_tokens(self.engine)
                self._loaded_at = time.monotonic()
            return self._tokens.get(digest)

    def invalidate(self) -> None:
        with self._lock:
            self._loaded_at = 0.0

    def authenticate(self, authorization: str | None) -> Principal:
        if not authorization:
            raise AuthError("missing", "missing credential: send 'authorization: Bearer <token>'")
        scheme, _, token = authorization.partition(" ")
        if not hmac.compare_digest(scheme.lower(), "bearer") or not token:
            raise AuthError("invalid", "malformed credential: expected 'Bearer <token>'")
        found = self._lookup(repo.hash_token(token.strip()))
        if found is None:
            raise AuthError("invalid", "unknown or revoked token")
        return Principal(*found)

    def require(self, authorization: str | None, permission: str) -> Principal:
        principal = self.authenticate(authorization)
        if not principal.may(permission):
            raise AuthError(
                "forbidden",
                f"token {principal.name!r} (role {principal.role}) may not {permission}",
            )
        return principal
