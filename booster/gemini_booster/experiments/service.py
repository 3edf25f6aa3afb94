"""Experiments over storage: results read from the stored per-host-day sums, and the guardrail
applied to live experiments. The REST routes call these, and so does the periodic guardrail
task (``service/guardrail_task.py``) for every experiment ``guarded_experiments`` names."""

from __future__ import annotations

import dataclasses
from datetime import UTC, date, datetime

from sqlalchemy import Engine

from ..storage import experiments as store
from .domain import Experiment
from .guardrail import Decision, decide
from .statistics import Results, results

GUARDRAIL_ACTOR = "guardrail"
ALREADY_STOPPED = "already stopped, or the experiment no longer running"


def experiment_results(
    engine: Engine, name: str, sigma: float | None = None, day: date | None = None
) -> tuple[Experiment, Results]:
    """Results per experiment day (every day begun so far, or ``day`` only) and overall, at
    ``sigma`` (the experiment's own σ when None). NotFound for an unknown experiment."""
    experiment = store.get_experiment(engine, name)
    records = store.host_days(engine, experiment.id)
    days = experiment.days_begun(datetime.now(UTC)) if day is None else [day]
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
