"""A/B comparison per context: Fusion as tuned against the other CCs on the same hosts.

Agents report flows of other congestion controls (cubic, bbr, …) alongside Fusion's, per
context, as baseline aggregates without θ. Because eq. 9 is linear in per-flow values, the total
of a context's trial sums (``FlowSums.total``) gives each arm's mean utility and the variance of
that mean, so the difference between two arms comes with its standard error (Welch) for any σ.

Arms per context: ``fusion`` (every Fusion flow, exploration included: what the fleet got),
``incumbent`` (flows under the θ most hosts run now), and one arm per baseline CC.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from pydantic import BaseModel

from gemini_api.sums import Objective

from ..domain import FlowSums, Trial
from ..models import Policy


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
    context: dict[str, str | int]
    label: str
    arms: list[Arm]
    versus: list[Versus]


Table = dict[int, tuple[list[Arm], list[Versus]]]


def arm(
    name: str,
    trials: Iterable[Trial],
    sigma: float,
    objective: Objective = Objective.FLOW_MEAN,
) -> Arm | None:
    """One arm from its trials: their sums added, the policy's ``objective`` at ``sigma``;
    None without flows."""
    trials = list(trials)
    sums = FlowSums.total(t.sums for t in trials)
    if sums.flow_count == 0:
        return None
    u = sums.utility(sigma, objective)
    return Arm(
        arm=name,
        flows=sums.flow_count,
        utility=u.mean,
        utility_stderr=u.stderr,
        mean_throughput_mbps=sums.mean_throughput,
        mean_queue_delay_ms=sums.mean_delay,
        slow_flow_share=sum(t.slow_flows for t in trials) / sums.flow_count,
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


def baseline_label(cc: str, policy: Policy) -> str:
    """A baseline arm's name: its CC, told apart from the tuned arm when it is the policy's
    own CC at the kernel's defaults (a host-wide datapath's kernel-default experiment arm)."""
    return f"{cc} (kernel defaults)" if cc == policy.datapath else cc


def compare_context(
    tuned: list[Trial],
    incumbent_key: str | None,
    baselines: dict[str, list[Trial]],
    sigma: float,
    tuned_name: str,
    objective: Objective = Objective.FLOW_MEAN,
) -> tuple[list[Arm], list[Versus]]:
    """The tuned arm (named after the policy's datapath), its incumbent, and each baseline."""
    candidates = [
        arm(tuned_name, tuned, sigma, objective),
        arm("incumbent", [t for t in tuned if t.theta_key == incumbent_key], sigma, objective),
    ]
    ours = [a for a in candidates if a is not None]
    arms = (arm(cc, ts, sigma, objective) for cc, ts in sorted(baselines.items()))
    theirs = [a for a in arms if a is not None]
    return ours + theirs, [versus(a, b) for b in theirs for a in ours]


def _by_context(trials: Iterable[Trial]) -> dict[int, list[Trial]]:
    out: dict[int, list[Trial]] = defaultdict(list)
    for t in trials:
        out[t.context_id].append(t)
    return out


def compare(
    policy: Policy,
    trials: list[Trial],
    baselines: dict[str, list[Trial]],
    incumbents: dict[int, str],
    sigma: float | None = None,
) -> Table:
    """Context id → (arms, comparisons) for every context where a baseline CC has flows."""
    s = policy.sigma if sigma is None else sigma
    tuned = _by_context(trials)
    theirs = {baseline_label(cc, policy): _by_context(ts) for cc, ts in baselines.items()}
    contexts = {c for per_context in theirs.values() for c in per_context}
    return {
        c: compare_context(
            tuned.get(c, []),
            incumbents.get(c),
            {cc: per_context.get(c, []) for cc, per_context in theirs.items()},
            s,
            policy.datapath,
            policy.objective,
        )
        for c in sorted(contexts)
    }
