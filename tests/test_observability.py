"""Alerts and dashboard shipped with the chart, checked against the metrics that really exist.

The metric names come from Booster's and the agent's own registries, built in this process
(`Metrics()` and `AgentMetrics()`), not from a list kept by hand: a renamed metric breaks the
rule or panel that still uses the old name here, not silently on a Grafana screen.

- The PrometheusRule as the chart renders it passes `promtool check rules`, and its alerts fire
  on the series they are written for (`promtool test rules` with synthetic series).
- Every expression, in rules and dashboard, names only exported metric series.
- The Grafana dashboard is well-formed: unique panel ids inside the grid, every query on the
  `${datasource}` variable, the template variables it uses defined.

promtool and helm are built by deploy/install-tools.sh; without them those tests skip.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]
from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric

from gemini_agent.metrics import AgentMetrics
from gemini_booster.service.metrics import Metrics

from .test_helm import CHART, KUBE_VERSION, NAMESPACE, RELEASE, tool

DASHBOARD = CHART / "files" / "grafana-dashboard.json"
MONITORING_VALUES = CHART / "ci" / "cnpg-monitoring-staged-values.yaml"

# The alerts an SRE team must have, by name.
REQUIRED_ALERTS = {
    "GeminiBoosterDown",
    "GeminiRefitsFailing",
    "GeminiAgentStale",
    "GeminiReportsRejected",
    "GeminiThetaFallback",
}
# Series names the exposition format gives each metric type (a query never needs _created).
SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
    "info": ("_info",),
}
METRIC_NAME = re.compile(r"\bgemini_[a-z0-9_]+\b")
PROMETHEUS_OWN = {"up"}  # series Prometheus itself writes per target


def series_names(families: Iterable[Metric]) -> set[str]:
    names = set()
    for family in families:
        names |= {family.name + suffix for suffix in SUFFIXES[family.type]}
    return names


@cache
def exported() -> frozenset[str]:
    """Every series name Booster's /metrics or the agent's can carry: Booster's families as
    its endpoint serves them (registry, front processes, and the per-plan gauges drawn at
    scrape time), the agent's registry."""
    booster = series_names(Metrics().families())
    agent = series_names(AgentMetrics().registry.collect())
    return frozenset(booster | agent)


@cache
def rendered_rules() -> dict[str, Any]:
    """The rule groups of the chart's PrometheusRule, as Prometheus would load them."""
    result = subprocess.run(
        [
            str(tool("helm")), "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
            "--kube-version", KUBE_VERSION, "-f", str(MONITORING_VALUES),
            "--show-only", "templates/monitoring.yaml",
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    return dict(rule["spec"])


def rules() -> list[dict[str, Any]]:
    return [r for group in rendered_rules()["groups"] for r in group["rules"]]


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def queries() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]


# ---- rules --------------------------------------------------------------------------------


def test_promtool_checks_the_rendered_rules(tmp_path: Path) -> None:
    promtool = tool("promtool")
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rendered_rules()))
    result = subprocess.run(
        [str(promtool), "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_required_alerts_exist_with_severity_and_summary() -> None:
    alerts = {r["alert"]: r for r in rules()}
    assert set(alerts) >= REQUIRED_ALERTS
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        assert rule["annotations"]["summary"], name


def test_rules_select_this_release_and_name_exported_metrics() -> None:
    booster_job = f'job="{RELEASE}-gemini-booster",namespace="{NAMESPACE}"'
    agent_job = f'job="{NAMESPACE}/{RELEASE}-gemini-agent",namespace="{NAMESPACE}"'
    for rule in rules():
        expr = rule["expr"]
        assert "__" not in expr, f"{rule['alert']}: placeholder left in {expr}"
        assert booster_job in expr or agent_job in expr, rule["alert"]
        names = set(METRIC_NAME.findall(expr))
        assert names or "up{" in expr, rule["alert"]
        assert names <= exported(), f"{rule['alert']}: {sorted(names - exported())} not exported"


def test_alerts_fire_on_the_failures_they_name(tmp_path: Path) -> None:
    """promtool's rule unit tests: synthetic series in, the expected alerts out."""
    promtool = tool("promtool")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rendered_rules()))
    b = f'job="{RELEASE}-gemini-booster",namespace="{NAMESPACE}"'
    a = f'job="{NAMESPACE}/{RELEASE}-gemini-agent",namespace="{NAMESPACE}"'
    reports = "gemini_booster_reports_total"
    staleness = "gemini_agent_parameters_staleness_seconds"
    fallbacks = "gemini_agent_fallbacks_total"
    tests = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": f"{name}{{{selector},{labels}}}", "values": values}
                    for name, selector, labels, values in (
                        ("up", b, 'pod="booster-0"', "0x20"),
                        ("gemini_booster_refit_failures_total", b, 'policy="cdn"', "0+1x60"),
                        (reports, b, 'outcome="accepted",reason=""', "0+90x60"),
                        (reports, b, 'outcome="rejected",reason="quota"', "0+10x60"),
                        (staleness, a, 'instance="node-1"', "0+60x60"),
                        (fallbacks, a, 'instance="node-1",reason="stale"', "0x30 1x30"),
                    )
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "10m",
                        "alertname": "GeminiBoosterDown",
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "critical"},
                                "exp_annotations": alert_annotations("GeminiBoosterDown"),
                            }
                        ],
                    },
                    {"eval_time": "10m", "alertname": "GeminiRefitsFailing", "exp_alerts": []},
                    {
                        "eval_time": "50m",
                        "alertname": "GeminiRefitsFailing",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "namespace": NAMESPACE,
                                    "policy": "cdn",
                                },
                                "exp_annotations": alert_annotations(
                                    "GeminiRefitsFailing", policy="cdn"
                                ),
                            }
                        ],
                    },
                    {
                        "eval_time": "40m",
                        "alertname": "GeminiReportsRejected",
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "warning", "namespace": NAMESPACE},
                                "exp_annotations": alert_annotations(
                                    "GeminiReportsRejected", value="10%"
                                ),
                            }
                        ],
                    },
                    {"eval_time": "10m", "alertname": "GeminiAgentStale", "exp_alerts": []},
                    {
                        "eval_time": "25m",
                        "alertname": "GeminiAgentStale",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "job": f"{NAMESPACE}/{RELEASE}-gemini-agent",
                                    "namespace": NAMESPACE,
                                    "instance": "node-1",
                                },
                                "exp_annotations": alert_annotations(
                                    "GeminiAgentStale", instance="node-1", value="25m 0s"
                                ),
                            }
                        ],
                    },
                    {"eval_time": "20m", "alertname": "GeminiThetaFallback", "exp_alerts": []},
                    {
                        "eval_time": "35m",
                        "alertname": "GeminiThetaFallback",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "namespace": NAMESPACE,
                                    "instance": "node-1",
                                    "reason": "stale",
                                },
                                "exp_annotations": alert_annotations(
                                    "GeminiThetaFallback", instance="node-1", reason="stale"
                                ),
                            }
                        ],
                    },
                ],
            }
        ],
    }
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    result = subprocess.run(
        [str(promtool), "test", "rules", "tests.yaml"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def alert_annotations(alert: str, value: str = "", **labels: str) -> dict[str, str]:
    """The alert's annotations with its templates filled in (the few this test needs)."""
    (rule,) = [r for r in rules() if r.get("alert") == alert]
    out = {}
    for key, template in rule["annotations"].items():
        text = re.sub(
            r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], str(template).strip()
        )
        text = re.sub(r"\{\{ \$value \| \w+ \}\}", value, text)
        out[key] = text
    return out


def test_promtool_accepts_the_metrics_booster_and_the_agent_expose(tmp_path: Path) -> None:
    """`promtool check metrics` on both expositions, each metric with a sample."""
    promtool = tool("promtool")
    booster = Metrics()
    booster.reports.labels("accepted", "").inc()
    booster.refit_seconds.labels("cdn").observe(1.5)
    agent = AgentMetrics()
    agent.flows.labels("fusion").inc()
    for name, exposition in (
        ("booster", booster.exposition()),
        ("agent", generate_latest(agent.registry)),
    ):
        result = subprocess.run(
            [str(promtool), "check", "metrics"],
            input=exposition,
            capture_output=True,
            timeout=60,
        )
        problems = (result.stdout + result.stderr).decode()
        assert result.returncode == 0, f"{name}: {problems}"


# ---- dashboard ----------------------------------------------------------------------------


def test_dashboard_is_well_formed() -> None:
    board = dashboard()
    assert board["uid"] and board["title"] and isinstance(board["schemaVersion"], int)
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        area = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not area & cells, f"{panel['title']} overlaps another panel"
        cells |= area
        if panel["type"] == "row":
            continue
        assert panel["type"] in {"timeseries", "stat", "gauge", "table", "heatmap"}
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]
            used = set(re.findall(r"\$(\w+)", target["expr"])) - {"__rate_interval"}
            assert used <= set(variables), f"{panel['title']}: {used - set(variables)}"


def test_dashboard_covers_what_an_operator_asks() -> None:
    rows = {p["title"] for p in dashboard()["panels"] if p["type"] == "row"}
    assert rows == {"Convergence", "θ in use", "Ingestion", "Errors"}
    exprs = " ".join(queries())
    for metric in (
        "gemini_booster_incumbent_utility",  # utility per context
        "gemini_agent_theta_version",  # θ in use
        "gemini_booster_reports_total",  # ingestion
        "gemini_booster_refit_failures_total",  # errors
    ):
        assert metric in exprs


def test_dashboard_queries_name_exported_metrics() -> None:
    for expr in queries():
        names = set(METRIC_NAME.findall(expr))
        assert names, expr
        assert names <= exported(), f"{sorted(names - exported())} in {expr}"
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            names = set(METRIC_NAME.findall(variable["definition"]))
            assert names and names <= exported()


def test_the_metric_check_can_fail() -> None:
    """The name collection above tells a real series from a misspelt one."""
    assert "gemini_booster_reports_total" in exported()
    assert "gemini_booster_refit_seconds_bucket" in exported()
    assert "gemini_booster_reports" not in exported()  # a counter's bare name is no series
    assert "gemini_agent_fallback_total" not in exported()
    assert not PROMETHEUS_OWN & exported()
