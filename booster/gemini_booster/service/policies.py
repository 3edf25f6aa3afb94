"""Policies as the REST doors change them: written to PostgreSQL first (with an audit entry
holding the old and new values), then this replica reloads its policy table at once; the other
replicas follow through the database's change notices.

Storage's ``NotFound`` and ``Conflict`` are re-exported so a caller above the service layer
names them without importing storage.
"""

from __future__ import annotations

from ..models import Policy, PolicyCreate, PolicyUpdate
from ..storage import policies as policy_store
from ..storage.errors import Conflict, NotFound
from .core import Booster

__all__ = ["Conflict", "NotFound", "create_policy", "update_policy"]


def create_policy(booster: Booster, spec: PolicyCreate, actor: str) -> Policy:
    """Conflict when a policy of that name exists."""
    created = policy_store.create_policy(booster.engine, spec, actor)
    booster.reload_policies()
    return created


def update_policy(booster: Booster, name: str, change: PolicyUpdate, actor: str) -> Policy:
    """Change some settings; the merged policy is checked whole (pydantic's ValidationError
    when it fails, leaving the policy as it was). NotFound for an unknown name."""
    updated = policy_store.update_policy(booster.engine, name, change, actor)
    booster.reload_policies()
    return updated
