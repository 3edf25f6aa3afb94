"""Experiments over storage: the one door through which the REST routes and the periodic
guardrail task (``guardrail_task.py``) reach the stored experiments.

Declarations, stops, joins and leaves are written by ``storage/experiments.py`` (audited, each
notified to every replica); results are computed here from the stored per-host-day sums by the
pure ``experiments.statistics``, and the guardrail's decisions by ``experiments.guardrail``.
Storage's ``NotFound`` and ``Conflict`` are re-exported so a caller above the service layer
names them without importing storage.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import UTC, date, datetime

from sqlalchemy import Engine

from ..experiments.assignment import Assignment
from ..experiments.domain import Experiment, ExperimentCreate, PopulationSpec
from ..experiments.guardrail import Decision, decide
from ..experiments.statistics import Results, results
from ..storage import experiments as store
from ..storage.errors import Conflict, NotFound

__all__ = [
    "ALREADY_STOPPED",
    "GUARDRAIL_ACTOR",
    "Conflict",
    "NotFound",
    "create_experiment",
    "enforce_guardrail",
    "experiment_results",
    "get_experiment",
    "guarded_experiments",
    "host_assignment",
    "join_hosts",
    "leave_hosts",
    "list_experiments",
    "stop_arm",
    "stop_experiment",
]

GUARDRAIL_ACTOR = "guardrail"
ALREADY_STOPPED = "already stopped, or the experiment no longer running"


def create_experiment(engine: Engine, spec: ExperimentCreate, actor: str) -> Experiment:
    """Store a new experiment (audited). Conflict: the name is taken, or a host is in an
    overlapping experiment."""
    return store.create_experiment(engine, spec, actor)


def list_experiments(engine: Engine) -> list[Experiment]:
    return store.list_experiments(engine)


def get_experiment(engine: Engine, name: str) -> Experiment:
    """NotFound for an unknown name."""
    return store.get_experiment(engine, name)


def stop_experiment(engine: Engine, name: str, actor: str, reason: str) -> Experiment:
    """Stop now (audited): every host is restored. Conflict when stopped or over already."""
    return store.stop_experiment(engine, name, actor, reason)


def stop_arm(engine: Engine, name: str, arm: str, actor: str, reason: str) -> bool:
    """Stop one arm now (audited); False when it already was, or the experiment is not
    running."""
    return store.stop_arm(engine, name, arm, actor, reason, {})


def join_hosts(engine: Engine, name: str, population: PopulationSpec, actor: str) -> Experiment:
    """Add hosts (audited); NotFound, or Conflict when stopped, over, or overlapping."""
    return store.join_hosts(engine, name, population, actor)


def leave_hosts(engine: Engine, name: str, hosts: Sequence[str], actor: str) -> int:
    """Hosts leave now (audited); how many of them were in the population."""
    return store.leave_hosts(engine, name, hosts, actor)


def host_assignment(engine: Engine, host_id: str, at: datetime) -> Assignment | None:
    """The arm ``host_id`` runs at ``at``, read from the database (not a replica's cache)."""
    return store.host_assignment(engine, host_id, at)


def experiment_results(
    engine: Engine, name: str, sigma: float | None = None, day: date | None = None
) -> tuple[Experiment, Results]:
    """Results per experiment day (every day it ran so far, or ``day`` only) and overall, at
    ``sigma`` (the experiment's own σ when None). NotFound for an unknown experiment. Days
    that begin after a stop are not days of the experiment's run (``Experiment.days_run``)."""
    experiment = store.get_experiment(engine, name)
    records = store.host_days(engine, experiment.id)
    days = experiment.days_run(datetime.now(UTC)) if day is None else [day]
    return experiment, results(experiment, records, sigma, days)


def enforce_guardrail(engine: Engine, name: str, actor: str = GUARDRAIL_ACTOR) -> list[Decision]:
    """Decide on every arm of a running experiment and stop the harmful ones (audited as
    ``actor``); nothing for an experiment without a guardrail or not running. A decision says
    ``stop`` only for an arm this call stopped: one stopped meanwhile by another caller (an
    operator, another replica's round) or the experiment's end is not stopped or audited
    twice."""
    experiment = store.get_experiment(engine, name)
    spec = experiment.guardrail
    if spec is None or experiment.status(datetime.now(UTC)) != "running":
        return []
    records = store.host_days(engine, experiment.id)
    sigma = experiment.sigma if spec.sigma is None else spec.sigma
    decisions = decide(experiment, results(experiment, records, sigma, days=[]), spec)
    return [_enforce(engine, name, d, actor, sigma) for d in decisions]


def _enforce(engine: Engine, name: str, d: Decision, actor: str, sigma: float) -> Decision:
    """Stop the arm if ``d`` says so; the decision as it turned out."""
    if not d.stop:
        return d
    detail = {"difference": d.difference, "upper_bound": d.upper_bound, "sigma": sigma}
    if store.stop_arm(engine, name, d.arm, actor, d.reason, detail):
        return d
    return dataclasses.replace(d, stop=False, reason=f"{ALREADY_STOPPED} ({d.reason})")


def guarded_experiments(engine: Engine) -> list[str]:
    """The names of the live experiments that have a guardrail (what a round checks)."""
    live = store.live_experiments(engine, datetime.now(UTC))
    return [e.name for e in live if e.guardrail is not None]
