"""Booster's Prometheus metrics, on a registry of its own so that several instances (tests,
benchmarks) can live in one process.

Conventions (Prometheus' own): every name starts ``gemini_booster_``; counters end ``_total``;
durations are ``_seconds``; a label's values come from a fixed set (outcomes, reasons, gRPC
codes, route templates) or from policies, which operators create, never from what agents send.
Build facts are ``gemini_booster_build_info{version}`` with value 1.

Cardinality of the one per-context metric, ``gemini_booster_incumbent_utility{policy,context}``:
it is not kept in the registry but drawn at each scrape from the plans this replica serves, so
it has exactly one series per context in a policy's current plan and none for a context that
left it or a policy that is gone. A policy plans at most its ``max_contexts`` (1,000 by
default), so the series are bounded by the policies' settings, not by time.

Front processes (``fronts.py``) send their registry's samples to the main process, which adds
counters and histograms up; gauges and build info are the main process's own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from .. import __version__

PREFIX = "gemini_booster_"
ADDITIVE = ("counter", "histogram", "summary")  # summed across processes; the rest are not


@dataclass(frozen=True)
class PlannedUtility:
    """One context of one policy's current plan, for the incumbent-utility gauge."""

    policy: str
    context: str
    utility: float


PlanSource = Callable[[], Iterable[PlannedUtility]]


class PlanCollector:
    """The per-context utility gauge and the planned-contexts gauge, drawn from the plans in
    memory at each scrape, so that no series outlives its context in a plan."""

    def __init__(self) -> None:
        self.source: PlanSource = lambda: ()

    def collect(self) -> Iterator[Metric]:
        utility = GaugeMetricFamily(
            PREFIX + "incumbent_utility",
            "Predicted eq. 9 utility (throughput minus sigma times queueing delay) of the "
            "incumbent theta of each context in the policy's current plan, at the hours its "
            "most-run theta ran (hour levels taken out)",
            labels=["policy", "context"],
        )
        planned = GaugeMetricFamily(
            PREFIX + "planned_contexts", "Contexts in the policy's current plan", labels=["policy"]
        )
        counts: dict[str, int] = {}
        for p in self.source():
            utility.add_metric([p.policy, p.context], p.utility)
            counts[p.policy] = counts.get(p.policy, 0) + 1
        for policy, n in sorted(counts.items()):
            planned.add_metric([policy], n)
        yield utility
        yield planned

    def describe(self) -> Iterator[Metric]:
        return self.collect()


LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
REFIT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        self.remote: dict[int, list[Metric]] = {}  # latest snapshot from each front process
        r = self.registry
        self.plans = PlanCollector()  # drawn at scrape time, in this process only
        self.build = Info("gemini_booster_build", "Booster's version", registry=r)
        self.build.info({"version": __version__})
        self.reports = Counter(
            "gemini_booster_reports",
            "Agent reports by outcome (accepted, duplicate, rejected) and, for rejected ones, "
            "reason (garbled, invalid, unknown_policy, quota, overloaded, key_reused, storage, "
            "host_mismatch)",
            ["outcome", "reason"],
            registry=r,
        )
        self.aggregates = Counter(
            "gemini_booster_aggregates_stored", "Aggregates stored", registry=r
        )
        self.grpc_latency = Histogram(
            "gemini_booster_grpc_request_seconds",
            "gRPC request latency",
            ["method", "code"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.http_latency = Histogram(
            "gemini_booster_http_request_seconds",
            "REST request latency",
            ["method", "route", "status"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ingest_batch = Histogram(
            "gemini_booster_ingest_batch_reports",
            "Reports per ingestion transaction",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
            registry=r,
        )
        self.ingest_failures = Counter(
            "gemini_booster_ingest_failures",
            "Failed ingestion transactions: transient (agents retry) or one report refused",
            ["kind"],
            registry=r,
        )
        self.refit_seconds = Histogram(
            "gemini_booster_refit_seconds",
            "Model refit duration per policy",
            ["policy"],
            buckets=REFIT_BUCKETS,
            registry=r,
        )
        self.model_points = Gauge(
            "gemini_booster_model_points",
            "Trials the policy's model was last fit on",
            ["policy"],
            registry=r,
        )
        self.refits = Counter(
            "gemini_booster_refits", "Refits published by this replica", ["policy"], registry=r
        )
        self.last_refit = Gauge(
            "gemini_booster_last_refit_timestamp_seconds",
            "Unix time of the policy's last refit published by this replica",
            ["policy"],
            registry=r,
        )
        self.refit_failures = Counter(
            "gemini_booster_refit_failures",
            "Refits that failed (the policy keeps its last plans; other policies unaffected)",
            ["policy"],
            registry=r,
        )
        self.auth_failures = Counter(
            "gemini_booster_auth_failures",
            "Requests refused for their credential, by API (grpc, rest) and reason (missing, "
            "invalid, expired, forbidden, unbound, host_mismatch, unavailable)",
            ["api", "reason"],
            registry=r,
        )
        self.guardrail_stops = Counter(
            "gemini_booster_guardrail_stops",
            "Experiment arms stopped by the scheduled guardrail of this replica (each arm is "
            "stopped once, by one replica)",
            registry=r,
        )
        self.guardrail_failures = Counter(
            "gemini_booster_guardrail_failures",
            "Scheduled guardrail rounds that failed, wholly (database unreachable) or for some "
            "experiment (the others were still checked); the next round tries again",
            registry=r,
        )
        self.folded = Counter(
            "gemini_booster_folded_aggregates",
            "Raw aggregates this replica folded into the trial sums (as the policy's refit owner)",
            ["policy"],
            registry=r,
        )
        self.fold_lag = Gauge(
            "gemini_booster_fold_lag_seconds",
            "Age of the policy's oldest aggregate not folded yet, after this replica's last "
            "fold (0: none pending); beyond a few fold intervals, a long-open writing "
            "transaction holds the fold back",
            ["policy"],
            registry=r,
        )
        self.fold_failures = Counter(
            "gemini_booster_fold_failures",
            "Folds that failed (nothing of them committed; the next one takes the same rows)",
            ["policy"],
            registry=r,
        )
        self.unbound_agent_calls = Counter(
            "gemini_booster_unbound_agent_calls",
            "Agent calls accepted with a token bound to no host (allow_unbound_agent_tokens): "
            "zero once every host has its own token",
            registry=r,
        )

    def refit_published(self, policy: str) -> None:
        self.refits.labels(policy).inc()
        self.last_refit.labels(policy).set(time.time())

    def families(self) -> list[Metric]:
        """This process's metrics with every front process's added in, and the plans'."""
        return [
            *without_created(merge(self.registry.collect(), *self.remote.values())),
            *self.plans.collect(),
        ]

    def exposition(self) -> bytes:
        return generate_latest(_Snapshot(self.families()))


class _Snapshot:
    def __init__(self, families: list[Metric]):
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def merge(*sources: Iterable[Metric]) -> list[Metric]:
    """Sum samples of the same name and labels across processes (counters and histograms add;
    a ``_created`` time keeps the earliest); a gauge or info sample keeps the first source's
    value (the main process's, which ``families`` puts first)."""
    merged: dict[str, Metric] = {}
    values: dict[str, dict] = {}
    for source in sources:
        for family in source:
            if family.name not in merged:
                merged[family.name] = Metric(family.name, family.documentation, family.type)
                values[family.name] = {}
            slot = values[family.name]
            for s in family.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                if key not in slot:
                    slot[key] = s
                elif family.type not in ADDITIVE:
                    continue
                elif s.name.endswith("_created"):
                    slot[key] = s._replace(value=min(slot[key].value, s.value))
                else:
                    slot[key] = slot[key]._replace(value=slot[key].value + s.value)
    for name, family in merged.items():
        family.samples = list(values[name].values())
    return list(merged.values())


def without_created(families: list[Metric]) -> list[Metric]:
    """The families without their ``_created`` samples: in the text format each would be a
    series of its own per labelled child, doubling the series for a start time that
    Prometheus does not read (it sees a counter's resets by itself)."""
    for family in families:
        family.samples = [s for s in family.samples if not s.name.endswith("_created")]
    return families


SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
    "info": ("_info",),
}


def exported_names() -> set[str]:
    """Every sample name Booster's /metrics can carry, as a PromQL query names it (e.g.
    ``gemini_booster_reports_total``, ``gemini_booster_refit_seconds_bucket``): for checking
    that dashboards and alert rules ask for metrics that exist."""
    metrics = Metrics()
    names = set()
    for family in [*metrics.registry.collect(), *metrics.plans.describe()]:
        for suffix in SUFFIXES.get(family.type, ("",)):
            names.add(family.name + suffix)
    return names
