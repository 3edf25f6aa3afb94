"""What a lab study or a benchmark does to a Booster it runs in-process, through the service
layer rather than Booster's schema: set up policies and agent tokens, wait for a host's
reports, and read back what was stored (a host's reports, its flows per interval, the trials,
Fusion's sums per interval or θ). Each write is audited as the ``actor`` given, as the REST
doors' are; reads are the stored values, as exact as the database holds them.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from sqlalchemy import Engine

from ..domain import Trial
from ..models import Policy, PolicyCreate, PolicyUpdate
from ..storage import credentials as token_store
from ..storage import policies as policy_store
from ..storage import reports
from ..storage import trials as trial_store
from ..storage.reports import IntervalSums
from ..storage.trials import GroupSums

__all__ = [
    "GroupSums",
    "IntervalSums",
    "agent_token",
    "count_reports",
    "create_policy",
    "fusion_sums_by",
    "host_reports",
    "interval_sums",
    "trials",
    "update_policy",
]


def create_policy(engine: Engine, spec: PolicyCreate, actor: str) -> Policy:
    """A new policy (audited); a running Booster sees it at its next resynchronisation."""
    return policy_store.create_policy(engine, spec, actor)


def update_policy(engine: Engine, name: str, change: PolicyUpdate, actor: str) -> Policy:
    return policy_store.update_policy(engine, name, change, actor)


def agent_token(engine: Engine, host_id: str, actor: str) -> str:
    """A new agent token bound to ``host_id`` (audited), under the host's usual token name."""
    return token_store.create_token(
        engine, token_store.host_token_name(host_id), "agent", actor, host_id=host_id
    )


def count_reports(engine: Engine, host_id: str, since: datetime) -> int:
    """Reports stored from ``host_id`` for intervals starting at or after ``since``."""
    return trial_store.count_reports(engine, host_id, since)


def host_reports(engine: Engine, host_id: str) -> list[tuple[str, datetime, datetime]]:
    """(report id, interval start, interval end) of every report from ``host_id``, in order."""
    return trial_store.host_reports(engine, host_id)


def interval_sums(engine: Engine, host_id: str) -> list[IntervalSums]:
    return reports.interval_sums(engine, host_id)


def fusion_sums_by(
    engine: Engine, policy_id: int, group: Literal["interval", "theta"]
) -> list[GroupSums]:
    return trial_store.fusion_sums_by(engine, policy_id, group)


def trials(engine: Engine, policy_id: int, history: timedelta | None = None) -> list[Trial]:
    """The policy's Fusion trials (of buckets begun within ``history``, or all)."""
    return trial_store.load_trials(engine, policy_id, history)
