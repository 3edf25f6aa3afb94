"""A/B comparison per context: Fusion as tuned against the other CCs on the same hosts.

Agents report flows of other congestion controls (cubic, bbr, …) alongside Fusion's, per
context, as baseline aggregates without θ. Because eq. 9 is linear in per-flow values, summing
the running sums of a context's trials gives each arm's mean utility and the variance of that
mean, so the difference between two arms comes with its standard error (Welch) for any σ.

Arms per context: ``fusion`` (every Fusion flow, exploration included: what the fleet got),
``incumbent`` (flows under the θ most hosts run now), and one arm per baseline CC.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel

from ..models import Policy
from ..policy.objective import utility
from ..storage.repository import TrialRecord
from ..storage.schema import TRIAL_SUMS

SUM_FIELDS = tuple(f for f in TRIAL_SUMS if f != "report_count")


class Arm(BaseModel):
    arm: str
    flows: int
    utility: float
    utility_stderr: float
    mean_throughput_mbps: float
    mean_queue_delay_ms: float
    slow_flow_share: float


class Versus(BaseModel):
    """``arm`` against ``baseline``: positive differences favour ``arm``."""

    arm: str
    baseline: str
    utility_difference: float
    utility_difference_stderr: float
    throughput_ratio: float | None


class ContextComparison(BaseModel):
    context: dict
    label: str
    arms: list[Arm]
    versus: list[Versus]


def _sums(trials: Iterable[TrialRecord]) -> dict[str, float]:
    out = dict.fromkeys(SUM_FIELDS, 0.0)
    for t in trials:
        for f in SUM_FIELDS:
            out[f] += getattr(t, f)
    return out


def arm(name: str, trials: Iterable[TrialRecord], sigma: float) -> Arm | None:
    s = _sums(trials)
    n = int(s["flow_count"])
    if n == 0:
        return None
    u = utility(
        sigma,
        n,
        s["tpt_sum"],
        s["tpt_sq_sum"],
        s["delay_sum"],
        s["delay_sq_sum"],
        s["tpt_delay_sum"],
    )
    return Arm(
        arm=name,
        flows=n,
        utility=u.mean,
        utility_stderr=u.var_of_mean**0.5,
        mean_throughput_mbps=s["tpt_sum"] / n,
        mean_queue_delay_ms=s["delay_sum"] / n,
        slow_flow_share=s["slow_flows"] / n,
    )


def versus(a: Arm, b: Arm) -> Versus:
    return Versus(
        arm=a.arm,
        baseline=b.arm,
        utility_difference=a.utility - b.utility,
        utility_difference_stderr=(a.utility_stderr**2 + b.utility_stderr**2) ** 0.5,
        throughput_ratio=(
            a.mean_throughput_mbps / b.mean_throughput_mbps if b.mean_throughput_mbps > 0 else None
        ),
    )


def compare_context(
    fusion: list[TrialRecord],
    incumbent_key: str | None,
    baselines: dict[str, list[TrialRecord]],
    sigma: float,
) -> tuple[list[Arm], list[Versus]]:
    ours = [
        arm("fusion", fusion, sigma),
        arm("incumbent", [t for t in fusion if t.theta_key == incumbent_key], sigma),
    ]
    ours = [a for a in ours if a is not None]
    theirs = [a for cc, ts in sorted(baselines.items()) if (a := arm(cc, ts, sigma)) is not None]
    return ours + theirs, [versus(a, b) for b in theirs for a in ours]


def compare(
    policy: Policy,
    trials: list[TrialRecord],
    baselines: dict[str, list[TrialRecord]],
    incumbents: dict[int, str],
    sigma: float | None = None,
) -> dict[int, tuple[list[Arm], list[Versus]]]:
    """Context id → (arms, comparisons) for every context where a baseline CC has flows."""
    s = policy.sigma if sigma is None else sigma
    out = {}
    contexts = {t.context_id for ts in baselines.values() for t in ts}
    for c in sorted(contexts):
        fusion = [t for t in trials if t.context_id == c]
        theirs = {cc: [t for t in ts if t.context_id == c] for cc, ts in baselines.items()}
        out[c] = compare_context(fusion, incumbents.get(c), theirs, s)
    return out
