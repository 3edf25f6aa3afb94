"""Experiments over storage: results read from the stored per-host-day sums, and the guardrail
applied to live experiments. The REST routes call these; so can a periodic task (e.g. the
refit loop calling ``enforce_guardrails`` every few minutes)."""

from __future__ import annotations

from datetime import UTC, date, datetime

from sqlalchemy import Engine

from ..storage import experiments as store
from .domain import Experiment
from .guardrail import Decision, decide
from .statistics import Results, results

GUARDRAIL_ACTOR = "guardrail"


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
    ``actor``); nothing for an experiment without a guardrail or not running."""
    experiment = store.get_experiment(engine, name)
    spec = experiment.guardrail
    if spec is None or experiment.status(datetime.now(UTC)) != "running":
        return []
    records = store.host_days(engine, experiment.id)
    sigma = experiment.sigma if spec.sigma is None else spec.sigma
    decisions = decide(experiment, results(experiment, records, sigma, days=[]), spec)
    for d in decisions:
        if d.stop:
            detail = {"difference": d.difference, "upper_bound": d.upper_bound, "sigma": sigma}
            store.stop_arm(engine, name, d.arm, actor, d.reason, detail)
    return decisions


def enforce_guardrails(engine: Engine) -> dict[str, list[Decision]]:
    """The guardrail of every running experiment that has one."""
    live = store.live_experiments(engine, datetime.now(UTC))
    return {e.name: enforce_guardrail(engine, e.name) for e in live if e.guardrail is not None}
