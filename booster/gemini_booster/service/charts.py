"""What the dashboard's charts draw, read-only: per context, utility per time bucket (a round)
with the incumbent of that round marked; the θ in use across hosts, by flows; throughput and
queueing-delay percentiles from the agents' quantile sketches; all over the policy's history
window (``Policy.history_window``, the rule the trials and the comparison follow too). Also the
history of a context's incumbent, for auditing when hosts were moved to another θ.

Utilities are eq. 9 over stored running sums (``FlowSums.utility``), so a chart at another σ is
exact, as for the trials endpoint. A round's incumbent is the one in force at the round's start
(``incumbent_history``: the last change published at or before it): the θ the context's
exploiting hosts were told to run as the round began, so its flows in the round are the
incumbent's own; a change published during a round shows as a change (``changes``) at its
instant and marks the next round. Sketches and hosts exist only in the raw aggregates, which
are read from the policy's newest reports only (``storage.charts.MAX_RECENT_REPORTS``): flows
come from the trials' sums over the whole window. The queries are ``storage/charts.py``'s; this
module turns their rows into the charts' values.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from datetime import datetime

from ddsketch import DDSketch
from pydantic import BaseModel, Field

from gemini_api import sketch as sketches
from gemini_api.datapaths import load_datapath
from gemini_api.sums import Objective
from gemini_api.theta import ThetaSpec
from gemini_api.v1 import booster_pb2 as pb

from ..domain import ContextKey, FlowSums
from ..models import Policy
from ..storage import charts as queries
from ..storage import plans as plan_store
from .comparison import baseline_label
from .core import Booster

# Throughput and delay percentiles drawn (Fig. 9 of the paper shows the median and tails).
QUANTILES = (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99)
INCUMBENT_ARM = "incumbent"  # the tuned arm is named after the policy's datapath


class UnknownContext(LookupError):
    """The label names no context (not a label, or no report ever came from it)."""


class RoundOut(BaseModel):
    """One time bucket of a context: all its Fusion flows, and those of the incumbent in force
    at the bucket's start among them."""

    bucket: datetime
    flows: int
    thetas: int = Field(description="distinct θ that ran in the bucket")
    utility: float
    utility_stderr: float
    incumbent_theta: dict[str, int] | None = Field(
        description="the incumbent published at or before the bucket's start; null: none yet"
    )
    incumbent_published_at: datetime | None
    incumbent_flows: int
    incumbent_utility: float | None
    incumbent_utility_stderr: float | None


class IncumbentOut(BaseModel):
    theta: dict[str, int]
    natural: dict[str, float]
    predicted_utility: float | None


class IncumbentChangeOut(BaseModel):
    """A refit published this θ as the context's incumbent, replacing the previous one."""

    published_at: datetime
    datapath: str = Field(description="whose θ (the policy's target CC may have changed)")
    theta: dict[str, int]
    natural: dict[str, float]
    predicted_utility: float | None = Field(
        description="the planner's, at ``sigma``, at the hours the context's most-run θ ran "
        "(hour levels taken out; the trials show the flows as measured)"
    )
    sigma: float = Field(description="the policy's σ at that refit")
    plan_generation: int | None = Field(
        description="the refit that chose it (the policy's plan generation it published); "
        "null: the plan in force when the history began (migration 0009)"
    )
    refit_owner: str | None = Field(description="the replica that ran that refit")


class RoundsOut(BaseModel):
    label: str
    sigma: float
    bucket_hours: int
    incumbent: IncumbentOut | None = Field(description="today's published incumbent, if planned")
    incumbent_history_stored: bool = Field(
        True, description="true: each round is marked with the incumbent of its own time"
    )
    changes: list[IncumbentChangeOut] = Field(
        description="incumbent changes published at or after the first round's start"
    )
    rounds: list[RoundOut]


class IncumbentsOut(BaseModel):
    label: str
    changes: list[IncumbentChangeOut] = Field(description="oldest first, one per change")


class ValueShare(BaseModel):
    value: float
    flows: int
    hosts: int


class ParamDistribution(BaseModel):
    name: str
    symbol: str
    unit: str
    values: list[ValueShare] = Field(description="each value in use, ascending")


class ThetaInUse(BaseModel):
    theta: dict[str, int]
    natural: dict[str, float]
    flows: int = Field(description="over the window, from the trials' sums")
    hosts: int = Field(description="hosts that reported it in the newest reports")


class ThetaDistributionOut(BaseModel):
    datapath: str = Field(description="whose θ: the policy's datapath (fusion, cubic, ...)")
    context: str | None = Field(None, description="the context's label; null: every context")
    hours: float = Field(description="the window of flows: the policy's history_hours")
    flows: int
    hosts: int = Field(description="hosts in the newest reports (``reports``) that ran Fusion")
    reports: int = Field(description="newest reports of the window read for hosts")
    thetas: list[ThetaInUse] = Field(description="most flows first")
    params: list[ParamDistribution]


class ArmPercentiles(BaseModel):
    arm: str
    flows: int
    sketched_flows: int = Field(description="flows whose aggregates carried a throughput sketch")
    throughput_mbps: list[float | None] = Field(description="at each of ``quantiles``")
    delay_sketched_flows: int = Field(
        description="flows whose aggregates carried a queueing-delay sketch (older agents "
        "send none)"
    )
    queue_delay_ms: list[float | None] = Field(
        description="at each of ``quantiles``, from the delay-sketched flows"
    )
    mean_queue_delay_ms: float = Field(description="of all flows, from the sums")
    queue_delay_sd_ms: float


class PercentilesOut(BaseModel):
    label: str
    hours: float
    quantiles: list[float]
    reports: int = Field(description="newest reports of the window read")
    truncated: bool = Field(description="the window held more reports than were read")
    arms: list[ArmPercentiles]


def context_id(booster: Booster, label: str) -> int:
    """The stored context with ``label``; UnknownContext when there is none."""
    key = ContextKey.from_label(label)
    if key is None:
        raise UnknownContext(f"context {label!r} is not a context label")
    found = queries.context_id(booster.engine, key)
    if found is None:
        raise UnknownContext(f"context {label!r} not found")
    return found


def _incumbent_key(booster: Booster, policy: Policy, label: str) -> tuple[str, float | None]:
    for key, plan in booster.plan_snapshot(policy.id).items():
        if ContextKey(*key).label == label:
            return plan.incumbent_key, plan.incumbent_utility
    return "", None


def _change(rec: plan_store.IncumbentRecord) -> IncumbentChangeOut:
    spec = load_datapath(rec.datapath)
    theta = spec.from_key(rec.theta_key)
    return IncumbentChangeOut(
        published_at=rec.published_at,
        datapath=rec.datapath,
        theta=theta,
        natural=spec.natural(theta),
        predicted_utility=rec.predicted_utility,
        sigma=rec.sigma,
        plan_generation=rec.plan_generation,
        refit_owner=rec.refit_owner,
    )


def _in_force(
    history: list[plan_store.IncumbentRecord], at: datetime
) -> plan_store.IncumbentRecord | None:
    """The incumbent published last at or before ``at`` (``history`` oldest first)."""
    i = bisect.bisect_right([h.published_at for h in history], at)
    return history[i - 1] if i else None


def _round(
    bucket: datetime,
    by_theta: dict[str, FlowSums],
    incumbent: plan_store.IncumbentRecord | None,
    s: float,
    objective: Objective,
) -> RoundOut:
    u = FlowSums.total(by_theta.values()).utility(s, objective)
    inc = None if incumbent is None else by_theta.get(incumbent.theta_key)
    iu = None if inc is None else inc.utility(s, objective)
    return RoundOut(
        bucket=bucket,
        flows=u.flows,
        thetas=len(by_theta),
        utility=u.mean,
        utility_stderr=u.stderr,
        incumbent_theta=None
        if incumbent is None
        else load_datapath(incumbent.datapath).from_key(incumbent.theta_key),
        incumbent_published_at=None if incumbent is None else incumbent.published_at,
        incumbent_flows=0 if iu is None else iu.flows,
        incumbent_utility=None if iu is None else iu.mean,
        incumbent_utility_stderr=None if iu is None else iu.stderr,
    )


def rounds(booster: Booster, policy: Policy, label: str, sigma: float | None) -> RoundsOut:
    """Utility per round (time bucket) of one context: all its Fusion flows, and those of the
    incumbent in force at the round's start; the incumbent changes published since the first
    round began. UnknownContext for a label that names none."""
    s = policy.sigma if sigma is None else sigma
    context = context_id(booster, label)
    buckets = queries.bucket_sums(booster.engine, policy.id, context, policy.history_window)
    history = plan_store.incumbent_history(booster.engine, policy.id, context)
    key, predicted = _incumbent_key(booster, policy, label)
    incumbent = None
    if key:
        theta = policy.spec.from_key(key)
        incumbent = IncumbentOut(
            theta=theta, natural=policy.spec.natural(theta), predicted_utility=predicted
        )
    first = min(buckets, default=None)
    return RoundsOut(
        label=label,
        sigma=s,
        bucket_hours=policy.trial_bucket_hours,
        incumbent=incumbent,
        changes=[_change(h) for h in history if first is not None and h.published_at >= first],
        rounds=[
            _round(b, by_theta, _in_force(history, b), s, policy.objective)
            for b, by_theta in buckets.items()
        ],
    )


def incumbents(booster: Booster, policy: Policy, label: str) -> IncumbentsOut:
    """Every change of one context's incumbent, oldest first (UnknownContext: no context)."""
    history = plan_store.incumbent_history(booster.engine, policy.id, context_id(booster, label))
    return IncumbentsOut(label=label, changes=[_change(h) for h in history])


def _param_distributions(spec: ThetaSpec, thetas: list[ThetaInUse]) -> list[ParamDistribution]:
    out = []
    for p in spec.params:
        flows: dict[float, int] = defaultdict(int)
        hosts: dict[float, int] = defaultdict(int)
        for t in thetas:
            flows[t.natural[p.name]] += t.flows
            hosts[t.natural[p.name]] += t.hosts  # a host running two θ counts under both
        values = [ValueShare(value=v, flows=flows[v], hosts=hosts[v]) for v in sorted(flows)]
        out.append(ParamDistribution(name=p.name, symbol=p.symbol, unit=p.unit, values=values))
    return out


def theta_distribution(
    booster: Booster, policy: Policy, label: str | None = None
) -> ThetaDistributionOut:
    """The θ the policy's flows (of the context ``label``, or of every context) ran under over
    the history window (in its datapath's spec): per θ and, per parameter, per value, the
    flows, and the hosts that reported it in the newest reports. UnknownContext for a label
    that names none."""
    window = policy.history_window
    context = None if label is None else context_id(booster, label)
    flows = queries.theta_flows(booster.engine, policy.id, window, context)
    hosts = queries.theta_hosts(booster.engine, policy.id, window, context)
    thetas = []
    for key in flows.keys() | hosts.per_theta.keys():
        theta = policy.spec.from_key(key)
        thetas.append(
            ThetaInUse(
                theta=theta,
                natural=policy.spec.natural(theta),
                flows=flows.get(key, 0),
                hosts=hosts.per_theta.get(key, 0),
            )
        )
    thetas.sort(key=lambda t: (-t.flows, sorted(t.theta.items())))
    return ThetaDistributionOut(
        datapath=policy.spec.datapath,
        context=label,
        hours=policy.history_hours,
        flows=sum(t.flows for t in thetas),
        hosts=hosts.hosts,
        reports=hosts.reports,
        thetas=thetas,
        params=_param_distributions(policy.spec, thetas),
    )


def _quantiles(sketch: DDSketch) -> list[float | None]:
    return [sketch.get_quantile_value(q) if sketch.count else None for q in QUANTILES]


class _Arm:
    """One arm's merged throughput and queueing-delay sketches, and its flow sums."""

    def __init__(self) -> None:
        self.sketch = sketches.new_sketch()
        self.delay_sketch = sketches.new_sketch()
        self.sums = FlowSums()

    def add(self, sums: FlowSums, raw_sketch: bytes, raw_delay_sketch: bytes) -> None:
        """Sketches were checked at ingest (``sketch_errors``), so stored bytes parse; b''
        is an aggregate sent without that sketch."""
        self.sums = self.sums + sums
        for sketch, raw in ((self.sketch, raw_sketch), (self.delay_sketch, raw_delay_sketch)):
            if raw:
                sketch.merge(sketches.from_proto(pb.QuantileSketch.FromString(raw)))

    def out(self, arm: str) -> ArmPercentiles:
        n = self.sums.flow_count
        mean = self.sums.mean_delay
        var = max(self.sums.delay_sq_sum / n - mean * mean, 0.0) if n else 0.0
        return ArmPercentiles(
            arm=arm,
            flows=n,
            sketched_flows=round(self.sketch.count),
            throughput_mbps=_quantiles(self.sketch),
            delay_sketched_flows=round(self.delay_sketch.count),
            queue_delay_ms=_quantiles(self.delay_sketch),
            mean_queue_delay_ms=mean,
            queue_delay_sd_ms=var**0.5,
        )


def percentiles(booster: Booster, policy: Policy, label: str) -> PercentilesOut:
    """Throughput and queueing-delay percentiles of one context's flows over the history
    window, merged from the agents' sketches per arm: all Fusion flows, today's incumbent θ,
    each other CC seen. Flows sent without a sketch (older agents send no delay sketch) are
    counted in ``flows`` and left out of that sketch's percentiles."""
    context = context_id(booster, label)
    incumbent, _ = _incumbent_key(booster, policy, label)
    found = queries.context_aggregates(booster.engine, policy.id, context, policy.history_window)
    arms: dict[str, _Arm] = defaultdict(_Arm)
    for a in found.aggregates:
        tuned = [policy.datapath] + ([INCUMBENT_ARM] if a.theta_key == incumbent else [])
        for name in [baseline_label(a.cc, policy)] if a.cc else tuned:
            arms[name].add(a.sums, a.sketch, a.delay_sketch)
    ours = [policy.datapath, INCUMBENT_ARM]
    order = [*ours, *sorted(set(arms) - set(ours))]
    return PercentilesOut(
        label=label,
        hours=policy.history_hours,
        quantiles=list(QUANTILES),
        reports=found.reports,
        truncated=found.truncated,
        arms=[arms[a].out(a) for a in order if a in arms],
    )
