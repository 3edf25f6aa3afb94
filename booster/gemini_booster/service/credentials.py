"""Credentials and the audit log as the REST doors use them: tokens created, rotated and
revoked by operators (each audited, each change notified to every replica's token authority
through the database), and the audit entries readers may list.

Storage's ``NotFound`` and ``Conflict`` and the host id's length limit are re-exported so a
caller above the service layer names them without importing storage.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import Engine

from ..storage import audit as audit_store
from ..storage import credentials as token_store
from ..storage.credentials import MAX_HOST_ID_LEN, Rotation
from ..storage.errors import Conflict, NotFound

__all__ = [
    "MAX_HOST_ID_LEN",
    "Conflict",
    "NotFound",
    "Rotation",
    "audit_entries",
    "create_token",
    "revoke_token",
    "rotate_token",
]


def create_token(
    engine: Engine, name: str, role: str, actor: str, host_id: str | None = None
) -> str:
    """A new token's value (shown once; only its hash is stored). Conflict: the name is
    taken."""
    return token_store.create_token(engine, name, role, actor, host_id=host_id)


def rotate_token(engine: Engine, host_id: str, actor: str, grace: timedelta) -> Rotation:
    """A new token for the host; its other live tokens expire after ``grace``. NotFound: the
    host has no live token; Conflict: the new token's name is taken."""
    return token_store.rotate_token(engine, host_id, actor, grace)


def revoke_token(engine: Engine, name: str, actor: str) -> None:
    """NotFound: no token of that name."""
    token_store.revoke_token(engine, name, actor)


def audit_entries(engine: Engine, limit: int) -> list[dict[str, Any]]:
    """The newest ``limit`` entries first."""
    return audit_store.audit_entries(engine, limit)
