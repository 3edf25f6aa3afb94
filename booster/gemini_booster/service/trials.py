"""What the optimiser learned from, as operators read it: the policy's trials and the A/B
comparison against the other congestion controls on the same hosts.

Both follow the one history rule (``Policy.history_window``): the time buckets that began
within ``history_hours`` of now, the same trials the refit fits its model on, so a trial listed
is one the model saw and the comparison's arms add up from the trials listed. Utilities are
eq. 9 over the stored running sums (``FlowSums.utility``), at the policy's σ or a preview σ.
"""

from __future__ import annotations

from pydantic import BaseModel

from ..domain import ContextKey, merge_buckets
from ..models import Policy
from ..storage import trials as trial_store
from .comparison import ContextComparison, compare
from .core import Booster


class TrialOut(BaseModel):
    context: dict[str, str | int]
    theta: dict[str, int]
    flows: int
    reports: int
    utility: float
    utility_stderr: float
    mean_throughput_mbps: float
    mean_queue_delay_ms: float
    slow_flow_share: float


def trials(booster: Booster, policy: Policy, sigma: float | None, limit: int) -> list[TrialOut]:
    """The policy's Fusion trials of the history window, one per (context, θ) with its time
    buckets added, best first at ``sigma`` (the policy's when None), ``limit`` at most."""
    s = policy.sigma if sigma is None else sigma
    found = merge_buckets(trial_store.load_trials(booster.engine, policy.id, policy.history_window))
    contexts = trial_store.load_contexts(booster.engine, {t.context_id for t in found})
    rows = []
    for t in found:
        u = t.sums.utility(s, policy.objective)
        rows.append(
            TrialOut(
                context=ContextKey(*contexts[t.context_id]).as_dict(),
                theta=policy.spec.from_key(t.theta_key),
                flows=t.flow_count,
                reports=t.report_count,
                utility=u.mean,
                utility_stderr=u.stderr,
                mean_throughput_mbps=t.sums.mean_throughput,
                mean_queue_delay_ms=t.sums.mean_delay,
                slow_flow_share=t.slow_flow_share,
            )
        )
    return sorted(rows, key=lambda r: -r.utility)[:limit]


def comparison(booster: Booster, policy: Policy, sigma: float | None) -> list[ContextComparison]:
    """Per context with baseline flows in the history window: the tuned arm, its incumbent
    and each baseline CC, and each of ours against each of theirs."""
    window = policy.history_window
    fusion = trial_store.load_trials(booster.engine, policy.id, window)
    baselines = trial_store.load_baselines(booster.engine, policy.id, window)
    compared = {t.context_id for ts in baselines.values() for t in ts}
    contexts = {
        c: ContextKey(*k) for c, k in trial_store.load_contexts(booster.engine, compared).items()
    }
    ids = {key: c for c, key in contexts.items()}
    incumbents: dict[int, str] = {}
    for key, plan in booster.plan_snapshot(policy.id).items():
        c = ids.get(ContextKey(*key))
        if c is not None:
            incumbents[c] = plan.incumbent_key
    table = compare(policy, fusion, baselines, incumbents, sigma)
    return [
        ContextComparison(
            context=contexts[c].as_dict(), label=contexts[c].label, arms=arms, versus=pairs
        )
        for c, (arms, pairs) in table.items()
    ]
