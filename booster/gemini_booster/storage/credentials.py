"""Credentials: API tokens with a role, optionally bound to one host, kept as SHA-256 only.

Guarantees across replicas
--------------------------
- **Writers.** Any replica creates, rotates and revokes tokens (operator calls), and every
  replica may insert its configured bootstrap tokens at start (``ensure_token``: an
  ``ON CONFLICT DO NOTHING`` insert, so replicas starting together create each once). A
  rotation locks the host's live tokens (``FOR UPDATE``) before inserting the new one and
  shortening the old ones' expiry, in one transaction: two rotations of one host run one after
  the other. Every write is audited in its own transaction and sends ``tokens``.
- **What a follower caches.** Each replica caches the live set (``lookup_tokens``) in
  ``service/auth.py`` for ``CACHE_SECONDS``, reloads it on ``tokens`` and on an unknown token
  (rate-limited), and keeps the last set for up to ``token_max_stale_s`` while the database is
  unreachable: a revoked token may be honoured that much longer on a replica that cannot reach
  the database, never longer. Expiry is checked by wall clock at each use, whatever the cache
  holds.
- **Isolation relied on.** READ COMMITTED; uniqueness of a token's name and hash is the
  table's constraint, not a read-then-write.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from sqlalchemy import Connection, Engine, func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from . import changes
from .audit import audit
from .errors import Conflict, NotFound
from .schema import ApiToken

ROLES = ("agent", "operator", "viewer")
TOKEN_PREFIX = "gmn_"
EXPIRED_KEPT = timedelta(days=7)
MAX_HOST_ID_LEN = 128  # as a report's host_id (service/validation.py)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenRecord(NamedTuple):
    """What the auth layer keeps of a live token (never its value or hash)."""

    name: str
    role: str
    host_id: str | None = None  # the one host an agent token speaks for; None: unbound
    expires_at: float | None = None  # Unix time after which it is refused; None: never


def _insert_token(
    conn: Connection,
    name: str,
    role: str,
    token: str,
    host_id: str | None = None,
    expires_at: datetime | None = None,
) -> bool:
    """Insert one credential; False when its name or value is taken."""
    row = conn.execute(
        pg_insert(ApiToken)
        .values(
            name=name,
            role=role,
            token_sha256=hash_token(token),
            revoked=False,
            host_id=host_id,
            expires_at=expires_at,
        )
        .on_conflict_do_nothing()
        .returning(ApiToken.id)
    ).scalar_one_or_none()
    return row is not None


def _check_binding(role: str, host_id: str | None) -> None:
    if role not in ROLES:
        raise ValueError(f"role {role!r}: expected one of {ROLES}")
    if host_id is not None:
        if role != "agent":
            raise ValueError(f"only agent tokens are bound to a host, not {role} tokens")
        if not host_id or len(host_id) > MAX_HOST_ID_LEN or not host_id.isprintable():
            raise ValueError(f"host id: need a printable id of 1..{MAX_HOST_ID_LEN} characters")


def host_token_name(host_id: str, at: datetime | None = None) -> str:
    """The name a host's token gets unless one is given: the host and when it was made."""
    at = at or datetime.now(UTC)
    return f"{host_id}@{at:%Y%m%dT%H%M%S.%fZ}"


def create_token(
    engine: Engine,
    name: str,
    role: str,
    actor: str,
    value: str | None = None,
    host_id: str | None = None,
    expires_at: datetime | None = None,
) -> str:
    """Create a credential and return it; only its hash is kept, so it is shown this once.
    ``host_id`` binds an agent token to the one host it may speak for."""
    _check_binding(role, host_id)
    token = value or TOKEN_PREFIX + secrets.token_urlsafe(32)
    with engine.begin() as conn:
        if not _insert_token(conn, name, role, token, host_id, expires_at):
            raise Conflict(f"a token named {name!r} (or with that value) exists")
        detail: dict[str, object] = {"role": role}
        if host_id is not None:
            detail["host"] = host_id
        if expires_at is not None:
            detail["expires_at"] = expires_at.isoformat()
        audit(conn, actor, "token.create", name, detail)
        changes.notify(conn, "tokens")
    return token


@dataclass(frozen=True)
class Rotation:
    name: str  # of the new token
    token: str  # its value, shown once
    expiring: tuple[str, ...]  # the host's other tokens, now expiring
    expires_at: datetime  # when they do


def rotate_token(
    engine: Engine, host_id: str, actor: str, grace: timedelta, name: str | None = None
) -> Rotation:
    """A new token for ``host_id``; the host's other live tokens expire after ``grace`` (or
    keep an earlier expiry they already had), so the host can switch without a refused call.

    NotFound when the host has no live token: a rotation of a misspelt host must not quietly
    enrol a new one (``create_token`` does that, on purpose).
    """
    _check_binding("agent", host_id)
    if grace < timedelta(0):
        raise ValueError("grace period: must not be negative")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with engine.begin() as conn:
        now = conn.execute(select(func.now())).scalar_one()
        live = (
            (ApiToken.host_id == host_id)
            & ApiToken.revoked.is_(False)
            & (ApiToken.expires_at.is_(None) | (ApiToken.expires_at > now))
        )
        old = conn.execute(select(ApiToken.id, ApiToken.name).where(live).with_for_update()).all()
        if not old:
            raise NotFound(f"no live token for host {host_id!r}")
        name = name or host_token_name(host_id, now)
        if not _insert_token(conn, name, "agent", token, host_id):
            raise Conflict(f"a token named {name!r} exists")
        expires_at = now + grace
        conn.execute(
            update(ApiToken)
            .where(ApiToken.id.in_([r.id for r in old]))
            .values(
                expires_at=func.least(func.coalesce(ApiToken.expires_at, expires_at), expires_at)
            )
        )
        expiring = tuple(r.name for r in old)
        audit(
            conn,
            actor,
            "token.rotate",
            name,
            {"host": host_id, "expiring": list(expiring), "expires_at": expires_at.isoformat()},
        )
        changes.notify(conn, "tokens")
    return Rotation(name, token, expiring, expires_at)


def revoke_token(engine: Engine, name: str, actor: str) -> None:
    with engine.begin() as conn:
        n = conn.execute(
            update(ApiToken).where(ApiToken.name == name).values(revoked=True)
        ).rowcount
        if not n:
            raise NotFound(f"token {name!r}")
        audit(conn, actor, "token.revoke", name, {})
        changes.notify(conn, "tokens")


def revoke_host_tokens(engine: Engine, host_id: str, actor: str) -> list[str]:
    """Revoke every token bound to ``host_id`` (a host retired or compromised); their names."""
    with engine.begin() as conn:
        names = list(
            conn.execute(
                update(ApiToken)
                .where(ApiToken.host_id == host_id, ApiToken.revoked.is_(False))
                .values(revoked=True)
                .returning(ApiToken.name)
            ).scalars()
        )
        if not names:
            raise NotFound(f"no live token for host {host_id!r}")
        audit(conn, actor, "token.revoke", host_id, {"host": host_id, "tokens": names})
        changes.notify(conn, "tokens")
    return names


def ensure_token(
    engine: Engine, name: str, role: str, value: str, host_id: str | None = None
) -> None:
    """Idempotent bootstrap of a configured credential (no-op when it is already there)."""
    _check_binding(role, host_id)
    with engine.begin() as conn:
        if _insert_token(conn, name, role, value, host_id):
            changes.notify(conn, "tokens")


def lookup_tokens(engine: Engine) -> dict[str, TokenRecord]:
    """sha256 → record of every token not revoked, expired ones for ``EXPIRED_KEPT`` more (so
    that a host still sending one is told it expired, not that it is unknown); the auth layer
    caches this and checks the expiry at each use."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(
                ApiToken.token_sha256,
                ApiToken.name,
                ApiToken.role,
                ApiToken.host_id,
                ApiToken.expires_at,
            ).where(
                ApiToken.revoked.is_(False),
                ApiToken.expires_at.is_(None) | (ApiToken.expires_at > func.now() - EXPIRED_KEPT),
            )
        )
        return {
            r[0]: TokenRecord(r[1], r[2], r[3], r[4].timestamp() if r[4] is not None else None)
            for r in rows
        }


def list_tokens(engine: Engine) -> list[dict[str, object]]:
    """Every credential's name, role, host, state and dates (never its hash), oldest first."""
    cols = (
        ApiToken.name,
        ApiToken.role,
        ApiToken.host_id,
        ApiToken.created_at,
        ApiToken.expires_at,
        ApiToken.revoked,
    )
    with engine.connect() as conn:
        rows = conn.execute(select(*cols).order_by(ApiToken.id)).mappings()
        return [dict(r) for r in rows]
