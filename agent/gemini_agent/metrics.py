"""The agent's Prometheus metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.flows = Counter("gemini_agent_flows", "Finished flows seen", ["source"], registry=r)
        self.other_cc_flows = Counter(
            "gemini_agent_other_cc_flows",
            "Finished flows of other CCs, from socket diagnostics",
            ["cc"],
            registry=r,
        )
        self.records_dropped = Counter(
            "gemini_agent_records_dropped",
            "Flow records lost before the agent read them",
            ["where"],
            registry=r,
        )
        self.reports = Counter(
            "gemini_agent_reports", "Reports by outcome", ["outcome"], registry=r
        )
        self.set_aside = Counter(
            "gemini_agent_reports_set_aside",
            "Reports Booster refused for good, set aside and never resent, by reason "
            "(gRPC code, or quota)",
            ["reason"],
            registry=r,
        )
        self.spool_reports = Gauge(
            "gemini_agent_spool_reports", "Reports waiting in the spool", registry=r
        )
        self.theta_version = Gauge(
            "gemini_agent_theta_version", "Kernel θ version the agent applied last", registry=r
        )
        self.theta_refused = Counter(
            "gemini_agent_theta_refused", "θ from Booster refused by the agent's checks", registry=r
        )
        self.staleness = Gauge(
            "gemini_agent_parameters_staleness_seconds",
            "Seconds since Booster last answered GetParameters",
            registry=r,
        )
        self.fallbacks = Counter(
            "gemini_agent_fallbacks", "Times the agent fell back to the safe default θ", registry=r
        )
