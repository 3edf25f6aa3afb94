"""Booster's Prometheus metrics, on a registry of its own so that several instances (tests,
benchmarks) can live in one process."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
REFIT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        self.remote: dict[int, list[Metric]] = {}  # latest snapshot from each front process
        r = self.registry
        self.reports = Counter(
            "gemini_booster_reports",
            "Agent reports by outcome (accepted, duplicate, rejected)",
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
        self.best_utility = Gauge(
            "gemini_booster_best_utility",
            "Predicted eq. 9 utility of the incumbent θ",
            ["policy", "context"],
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
            "Requests refused for their credential",
            ["api", "reason"],
            registry=r,
        )

    def families(self) -> list[Metric]:
        """This process's metrics with every front process's added in."""
        return merge(self.registry.collect(), *self.remote.values())

    def exposition(self) -> bytes:
        return generate_latest(_Snapshot(self.families()))


class _Snapshot:
    def __init__(self, families: list[Metric]):
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def merge(*sources: Iterable[Metric]) -> list[Metric]:
    """Sum samples of the same name and labels across processes (counters and histograms add;
    a ``_created`` time keeps the earliest)."""
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
                elif s.name.endswith("_created"):
                    slot[key] = s._replace(value=min(slot[key].value, s.value))
                else:
                    slot[key] = slot[key]._replace(value=slot[key].value + s.value)
    for name, family in merged.items():
        family.samples = list(values[name].values())
    return list(merged.values())
