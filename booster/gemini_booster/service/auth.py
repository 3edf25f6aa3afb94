"""Bearer-token credentials with roles, shared by gRPC and REST.

Roles do not nest. ``agent`` may report and read parameters over gRPC, and nothing else;
``viewer`` may read the REST API; ``operator`` may also change it, but is refused on the agent
port: agent tokens sit on every host, so the token that can change policies must never be one
of them, and a leaked agent token can never change a policy.

Tokens are stored as SHA-256 only, and the live set is cached, so a request costs no database
round trip. The set is reloaded when it is ``CACHE_SECONDS`` old; right after ``invalidate()``
(a token was created or revoked: REST calls it, and so does the listener that hears of changes
made on other replicas); and when an unknown token arrives, but then at most every
``MISS_RELOAD_SECONDS``, so a flood of forged tokens costs two queries a second, not one per
request.

The database may be unreachable for a while (a restart, a failover). Agents must keep getting
their parameters then, so the last set loaded stays in force for up to ``max_stale_s`` after it
was loaded (``Settings.token_max_stale_s``); a revoked token is thus honoured at most that much
longer. Past it, and for a token the set in hand does not know, every check fails with
``AuthUnavailable`` ("retry later"), never with "invalid": nothing was learnt about the token.
A failed reload is retried at most every ``RETRY_SECONDS`` and logged once per
``LOG_INTERVAL_S`` with the exception's class only (the driver's message names hosts and ports).

Agent tokens are bound to a host. A host's token (``host_id`` set) speaks for that host only:
the gRPC adapter refuses a report or a parameter request whose ``host_id`` is another's
(``Principal.speak_for``), so a leaked token can neither poison another host's context quota
nor read its exploration plan. An agent token bound to no host (the fleet-wide token of older
installs, and ``bootstrap_agent_token``) is refused unless ``allow_unbound_agent_tokens`` is
set, or unless the call came with a verified client certificate (mutual TLS), whose Common
Name is then the host the token speaks for (``cert_host``); a bound token and a certificate
must name the same host. A token past its ``expires_at`` (set by a rotation on the host's old
token) is refused by wall clock at each use, whatever the cache holds.

Reloads never run under the lock and never twice at once: while one caller asks the database,
others whose token the set in hand vouches for are answered from it, and ``require_nowait``
answers without ever touching the database, for callers on an event loop.
"""

from __future__ import annotations

import hmac
import logging
import math
import threading
import time
from dataclasses import dataclass
from enum import Enum

from sqlalchemy import Engine

from ..storage import credentials as token_store
from ..storage.credentials import TokenRecord
from .ratelimit_log import RateLimitedLog

log = logging.getLogger(__name__)

CACHE_SECONDS = 5.0
MISS_RELOAD_SECONDS = 0.5  # an unknown token reloads the table at most this often
RETRY_SECONDS = 1.0  # after a failed reload, the next try waits at least this long
LOG_INTERVAL_S = 30.0  # one line per interval while reloads keep failing
WAIT_SECONDS = 10.0  # longest a caller waits for another caller's reload
DEFAULT_MAX_STALE_S = 600.0
GRANTS = {
    "agent": {"agent"},
    "viewer": {"read"},
    "operator": {"read", "write"},
}
Tokens = dict[str, TokenRecord]  # sha256 → what the token may do


SHOWN_CHARS = 40  # of an identifier echoed in a refusal


def shorten(ident: str, keep: int = SHOWN_CHARS) -> str:
    """``ident`` quoted for an error message, cut to ``keep`` characters with an ellipsis and
    its length when longer: a 10 kB host id echoed whole made the refusal itself too large for
    the client's metadata limit (it saw a transport error, and retried)."""
    if len(ident) <= keep:
        return repr(ident)
    return f"{ident[:keep]!r}… ({len(ident)} characters)"


@dataclass(frozen=True)
class Principal:
    name: str
    role: str
    host_id: str | None = None  # the host an agent token speaks for; None: any (unbound)

    def may(self, permission: str) -> bool:
        return permission in GRANTS.get(self.role, set())

    def speak_for(self, host_id: str) -> None:
        """AuthError unless this credential may act as ``host_id``. Names both hosts and the
        token's name, never its value."""
        if self.host_id is not None and host_id != self.host_id:
            raise AuthError(
                "host_mismatch",
                f"token {shorten(self.name)} speaks for host {shorten(self.host_id)}, "
                f"not {shorten(host_id)}",
            )


class AuthError(Exception):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        # "missing", "invalid", "expired" (no usable credential: 401 / UNAUTHENTICATED),
        # "forbidden", "unbound", "host_mismatch" (403 / PERMISSION_DENIED), "unavailable"
        self.reason = reason


class AuthUnavailable(AuthError):
    """The credential cannot be checked now (database unreachable, cached set too old or
    silent about it): the caller should retry, unlike the other refusals."""

    def __init__(self) -> None:
        super().__init__("unavailable", "credentials cannot be checked now; retry")


class _Step(Enum):
    ANSWER = "answer"  # from the set in hand
    LOAD = "load"  # this caller reloads first
    WAIT = "wait"  # another caller is reloading and the set in hand cannot answer


class TokenAuthority:
    def __init__(
        self,
        engine: Engine,
        max_stale_s: float = DEFAULT_MAX_STALE_S,
        allow_unbound_agents: bool = False,
    ):
        self.engine = engine
        self.max_stale_s = max_stale_s
        self.allow_unbound_agents = allow_unbound_agents
        self._tokens: Tokens = {}
        self._loaded_at = -math.inf  # last successful load (monotonic)
        self._tried_at = -math.inf  # last attempt, successful or not
        self._failing = False  # the last attempt failed
        self._invalid = True  # invalidated since the last successful load
        self._generation = 0  # invalidations so far: a load that raced one is not current
        self._loading = False
        self._cond = threading.Condition()
        self._log = RateLimitedLog(log, LOG_INTERVAL_S)

    # -- the cached set ----------------------------------------------------------------------

    def _load(self) -> Tokens:
        return token_store.lookup_tokens(self.engine)

    def invalidate(self) -> None:
        """The set may have changed: the next check reloads it. Cheap and never touches the
        database, so a change listener may call it from any thread; while the database is
        unreachable, the set in hand keeps serving (within ``max_stale_s``)."""
        with self._cond:
            self._invalid = True
            self._generation += 1

    def _step(self, digest: str, now: float) -> _Step:
        known = digest in self._tokens
        since_try = now - self._tried_at
        due = (
            self._invalid
            or now - self._loaded_at > CACHE_SECONDS
            or (not known and since_try > MISS_RELOAD_SECONDS)
        )
        if not due or (self._failing and since_try < RETRY_SECONDS):
            return _Step.ANSWER
        if self._loading:
            # A periodic refresh is no reason to wait: the set in hand vouches for this token.
            return _Step.ANSWER if known and not self._invalid else _Step.WAIT
        return _Step.LOAD

    def _answer(self, digest: str, now: float) -> TokenRecord | None:
        age = now - self._loaded_at
        if not self._failing and age <= CACHE_SECONDS:
            return self._tokens.get(digest)
        # Stale: the database failed, or a reload is still under way (it may hang for as long
        # as the driver's connect timeout allows). Either way the limit holds.
        limit = self.max_stale_s if self._failing else max(self.max_stale_s, CACHE_SECONDS)
        if age > limit:
            self._log.warning(
                "tokens last loaded %.0f s ago (limit token_max_stale_s = %.0f s) and the "
                "database is unreachable: refusing every credential until it is back",
                age,
                self.max_stale_s,
            )
            raise AuthUnavailable()
        found = self._tokens.get(digest)
        if found is None and self._failing:  # perhaps created since: only the database knows
            raise AuthUnavailable()
        return found

    def _reload(self, generation: int) -> None:
        tokens: Tokens | None = None
        failure: BaseException | None = None
        try:
            tokens = self._load()
        except Exception as e:
            failure = e
        finally:
            with self._cond:
                recovered = self._failing and tokens is not None
                if tokens is not None:
                    self._tokens = tokens
                    self._loaded_at = time.monotonic()
                    self._failing = False
                    self._invalid = self._generation != generation
                else:
                    self._failing = True
                self._loading = False
                self._cond.notify_all()
                loaded_at = self._loaded_at
        if failure is not None:
            age = time.monotonic() - loaded_at
            self._log.warning(
                "cannot reload tokens (%s); the set loaded %s is honoured up to %.0f s",
                type(failure).__name__,
                f"{age:.0f} s ago" if math.isfinite(age) else "never",
                self.max_stale_s,
            )
        elif recovered:
            log.info("tokens reloaded again after the database was unreachable")

    def _lookup(self, digest: str, block: bool) -> TokenRecord | _Step | None:
        """The token's record, None if it is unknown, or ``_Step.LOAD`` when answering
        needs the database and ``block`` is false."""
        while True:
            with self._cond:
                now = time.monotonic()
                step = self._step(digest, now)
                if step is _Step.ANSWER:
                    return self._answer(digest, now)
                if not block:
                    return _Step.LOAD
                if step is _Step.WAIT:
                    if not self._cond.wait_for(lambda: not self._loading, WAIT_SECONDS):
                        raise AuthUnavailable()
                    continue
                self._loading = True
                self._tried_at = now
                generation = self._generation
            self._reload(generation)

    # -- checks --------------------------------------------------------------------------------

    @staticmethod
    def _digest(authorization: str | None) -> str:
        if not authorization:
            raise AuthError("missing", "missing credential: send 'authorization: Bearer <token>'")
        scheme, _, token = authorization.partition(" ")
        if not hmac.compare_digest(scheme.lower(), "bearer") or not token.strip():
            raise AuthError("invalid", "malformed credential: expected 'Bearer <token>'")
        return token_store.hash_token(token.strip())

    def _principal(
        self, found: TokenRecord | None, permission: str | None, cert_host: str | None = None
    ) -> Principal:
        if found is None:
            raise AuthError("invalid", "unknown or revoked token")
        if found.expires_at is not None and time.time() >= found.expires_at:
            raise AuthError("expired", f"token {found.name!r} has expired")
        principal = Principal(found.name, found.role, found.host_id)
        if permission is None:
            return principal
        if not principal.may(permission):
            raise AuthError(
                "forbidden",
                f"token {principal.name!r} (role {principal.role}) may not {permission}",
            )
        if permission == "agent" and cert_host is not None:
            return self._with_certificate(principal, cert_host)
        if permission == "agent" and principal.host_id is None and not self.allow_unbound_agents:
            raise AuthError(
                "unbound",
                f"agent token {principal.name!r} is bound to no host; give each host its own "
                "(booster token create --role agent --host <id>) or set "
                "allow_unbound_agent_tokens",
            )
        return principal

    @staticmethod
    def _with_certificate(principal: Principal, cert_host: str) -> Principal:
        """An agent whose verified client certificate names ``cert_host``: an unbound token
        speaks for that host; a bound one must name the same host."""
        if principal.host_id is None:
            return Principal(principal.name, principal.role, cert_host)
        if principal.host_id != cert_host:
            raise AuthError(
                "host_mismatch",
                f"token {shorten(principal.name)} speaks for host "
                f"{shorten(principal.host_id)}, the client certificate for {shorten(cert_host)}",
            )
        return principal

    def authenticate(self, authorization: str | None) -> Principal:
        found = self._lookup(self._digest(authorization), block=True)
        assert not isinstance(found, _Step)
        return self._principal(found, None)

    def require(
        self, authorization: str | None, permission: str, cert_host: str | None = None
    ) -> Principal:
        """The caller, if it may ``permission``; else AuthError. May query the database (and
        wait for it), so call it off any event loop."""
        found = self._lookup(self._digest(authorization), block=True)
        assert not isinstance(found, _Step)
        return self._principal(found, permission, cert_host)

    def require_nowait(
        self, authorization: str | None, permission: str, cert_host: str | None = None
    ) -> Principal | None:
        """As ``require``, from the set in hand only; None when the answer needs the database
        (then call ``require`` in a worker thread). Never blocks on the database."""
        found = self._lookup(self._digest(authorization), block=False)
        if found is _Step.LOAD:
            return None
        assert not isinstance(found, _Step)
        return self._principal(found, permission, cert_host)
