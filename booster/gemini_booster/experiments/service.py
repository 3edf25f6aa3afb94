"""Moved: experiments over storage are the service layer's (``service/experiments.py``). This
name re-exports what ``service/guardrail_task.py`` calls until it imports from there; it holds
no code of its own."""

from ..service.experiments import (
    ALREADY_STOPPED,
    GUARDRAIL_ACTOR,
    enforce_guardrail,
    experiment_results,
    guarded_experiments,
)

__all__ = [
    "ALREADY_STOPPED",
    "GUARDRAIL_ACTOR",
    "enforce_guardrail",
    "experiment_results",
    "guarded_experiments",
]
