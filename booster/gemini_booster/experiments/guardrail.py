"""The guardrail: stop an arm whose utility is below control's by more than a margin, with
confidence.

For each arm but control, the difference arm − control in utility (at the guardrail's σ) over
the experiment so far, as ``statistics`` estimates it (within host after a crossover, else
between hosts), gives a one-sided upper bound at the guardrail's confidence. When that bound is
below −margin, the arm is harmful beyond the margin with that confidence, and it is stopped:
its hosts are restored to their own defaults at once (``assignment``), and the rest of the
experiment carries on.

It acts only once both the arm and control have ``min_hosts`` hosts with flows, so one odd
host cannot stop an arm. Checking again and again as data arrive is repeated testing: the chance
of stopping a harmless arm some time during the experiment is larger than 1 − confidence, so
choose the confidence for the number of checks (e.g. 0.99 for checks once a day over weeks);
an arm no worse than control by the margin is stopped only by an unlucky run of such checks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .domain import Experiment, GuardrailSpec
from .statistics import Results, upper_bound


@dataclass(frozen=True)
class Decision:
    """What the guardrail made of one arm."""

    arm: str
    stop: bool
    reason: str
    difference: float | None  # utility, arm − control
    upper_bound: float | None  # one-sided at the guardrail's confidence


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def decide(experiment: Experiment, results: Results, spec: GuardrailSpec) -> list[Decision]:
    """One decision per arm but control (arms already stopped are left out)."""
    hosts = {a.arm: a.hosts for a in results.overall.arms}
    out = []
    for diff in results.overall.differences:
        if diff.arm in experiment.arm_stops:
            continue
        r = diff.ratios["utility"]
        mean, bound = _finite(float(r.mean)), _finite(float(upper_bound(r, spec.confidence)))
        few = min(hosts[diff.arm], hosts[diff.control])
        if few < spec.min_hosts:
            reason = f"waiting: {few} hosts with flows in an arm, {spec.min_hosts} needed"
            out.append(Decision(diff.arm, False, reason, mean, bound))
        elif bound is not None and bound < -spec.margin:
            reason = (
                f"utility below {diff.control} by more than {spec.margin:g} with confidence "
                f"{spec.confidence:g}: upper bound {bound:.3g}"
            )
            out.append(Decision(diff.arm, True, reason, mean, bound))
        else:
            out.append(Decision(diff.arm, False, "within the margin", mean, bound))
    return out
