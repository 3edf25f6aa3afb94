"""The agent's Prometheus metrics.

Conventions: every name starts with `gemini_agent_`; counters end in `_total` (the client adds
it to the names below); units are in the name (`_seconds`, `_bytes`). Cardinality is bounded by
construction: no label takes a context, prefix, host or θ value. Labels take values from small
fixed sets (the `*_REASONS` / `*_WHERE` tuples here, the outcome names of the reporter) or, for
`cc`, the congestion controls the kernel has loaded.
"""

from __future__ import annotations

import platform
from importlib import metadata

from prometheus_client import CollectorRegistry, Counter, Gauge

from gemini_agent.table import LEFT_OUT_REASONS

FALLBACK_REASONS = ("stale", "table_refused")
RECORD_DROP_WHERE = ("socket", "kernel", "unheard", "malformed")
CATCH_ALL_REASONS = (*LEFT_OUT_REASONS, "unasked")
# Why an experiment's arm did not run, or was not fully undone (gemini_agent.congestion).
ARM_FAILURES = ("unavailable_cc", "not_allowed", "kernel_error", "restore_error", "theta_refused")


def agent_version() -> str:
    try:
        return metadata.version("gemini-agent")
    except metadata.PackageNotFoundError:
        return "unknown"


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.build_info = Gauge(
            "gemini_agent_build_info",
            "Always 1; the agent's version and Python in labels",
            ["version", "python"],
            registry=r,
        )
        self.build_info.labels(agent_version(), platform.python_version()).set(1)
        self.flows = Counter("gemini_agent_flows", "Finished flows seen", ["source"], registry=r)
        self.other_cc_flows = Counter(
            "gemini_agent_other_cc_flows",
            "Finished flows of other CCs, from socket diagnostics",
            ["cc"],
            registry=r,
        )
        self.records_dropped = Counter(
            "gemini_agent_records_dropped",
            "Flow records lost before the agent read them: its socket overran, the kernel "
            "had no room or memory for one, no listener was there (agent down), or a "
            "transport's flow-log line was not a record (malformed)",
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
        self.token_reloads = Counter(
            "gemini_agent_token_reloads",
            "Times the agent token's file changed: re-read (reloaded), or not usable, so the "
            "current token was kept (unreadable)",
            ["outcome"],
            registry=r,
        )
        self.tls_reloads = Counter(
            "gemini_agent_tls_reloads",
            "Times the TLS files (CA, client certificate, key) changed: the channel to Booster "
            "rebuilt from them (reloaded), or they did not load, so the current one was kept "
            "(unusable)",
            ["outcome"],
            registry=r,
        )
        self.spool_reports = Gauge(
            "gemini_agent_spool_reports", "Reports waiting in the spool", registry=r
        )
        self.spool_dropped = Counter(
            "gemini_agent_spool_dropped_reports",
            "Reports dropped unsent, oldest first, to keep the spool within its byte budget",
            registry=r,
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
            "gemini_agent_fallbacks",
            "Times a datapath fell back to a default θ: after Booster was silent too long "
            "(stale), every destination to Fusion's safe default and CUBIC's module parameters "
            "(when the agent set them) to the kernel's defaults, one count each; or every "
            "destination to Booster's default after the module refused the table "
            "(table_refused)",
            ["reason"],
            registry=r,
        )
        self.tables_refused = Counter(
            "gemini_agent_tables_refused",
            "Destination tables the module refused (the catch-all default went in instead)",
            registry=r,
        )
        self.table_rules = Gauge(
            "gemini_agent_table_rules",
            "Prefix rules in the installed destination table",
            registry=r,
        )
        self.table_profiles = Gauge(
            "gemini_agent_table_profiles",
            "θ profiles in the installed destination table",
            registry=r,
        )
        self.contexts_on_catch_all = Gauge(
            "gemini_agent_contexts_on_catch_all",
            "Destination contexts running the default θ instead of their own, by reason: past "
            "the module's profile or rule limit, the table refused, or beyond the contexts the "
            "agent asks Booster about",
            ["reason"],
            registry=r,
        )
        self.arm_active = Gauge(
            "gemini_agent_experiment_arm_active",
            "1 while the host runs an experiment's arm the agent applied, else 0",
            registry=r,
        )
        self.arms_applied = Counter(
            "gemini_agent_experiment_arms_applied",
            "Experiment arms applied to the kernel (a crossover or a new experiment adds one)",
            registry=r,
        )
        self.arm_failures = Counter(
            "gemini_agent_experiment_arm_failures",
            "Arms refused (a CC the kernel does not offer, or does not allow in this network "
            "namespace, a kernel write that failed, a fixed θ outside the spec: the host keeps "
            "its own settings), and restores that failed, by reason",
            ["reason"],
            registry=r,
        )
        for reason in ARM_FAILURES:
            self.arm_failures.labels(reason)
        for reason in FALLBACK_REASONS:
            self.fallbacks.labels(reason)
        for where in RECORD_DROP_WHERE:
            self.records_dropped.labels(where)
        for reason in CATCH_ALL_REASONS:
            self.contexts_on_catch_all.labels(reason)
