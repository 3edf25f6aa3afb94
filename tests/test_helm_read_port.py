"""The Helm chart's read port (``booster.readPort``): Booster listens where its Service sends
the read port, the chart's agents ask there, the gRPC Ingress routes GetParameters there, the
NetworkPolicy admits it, and with it off nothing of it is rendered. Rendered with the same
tools and value sets as tests/test_helm.py (skipped where they are not built)."""

from __future__ import annotations

from typing import Any

import yaml  # type: ignore[import-untyped]

from .test_helm import (
    AGENT_DS,
    CHART,
    KUBE_VERSION,
    NAMESPACE,
    RELEASE,
    VALUE_SETS,
    containers,
    env_of,
    objects,
    one,
    run,
    tool,
)

BOOSTER = f"{RELEASE}-gemini-booster"
AGENT_SERVICE = f"{RELEASE}-gemini-booster-agents"
READ = "grpc-read"


def render(*flags: str) -> list[dict[str, Any]]:
    """The chart rendered with ``flags`` (values files, ``--set``)."""
    result = run(
        tool("helm"), "template", RELEASE, CHART, "--namespace", NAMESPACE,
        "--kube-version", KUBE_VERSION, *flags,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def service_port(docs: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    ports = one(docs, "Service", AGENT_SERVICE)["spec"]["ports"]
    return next((p for p in ports if p["name"] == name), None)


def test_agents_reach_the_port_booster_listens_on() -> None:
    docs = objects("defaults")
    booster = containers(one(docs, "Deployment", BOOSTER))["booster"]
    listen = env_of(booster)["GEMINI_BOOSTER_PARAMETERS_LISTEN"]["value"]
    container_port = {p["name"]: p["containerPort"] for p in booster["ports"]}[READ]
    assert listen == f"0.0.0.0:{container_port}"
    port = service_port(docs, READ)
    assert port is not None and port["targetPort"] == READ
    agent = env_of(containers(one(docs, "DaemonSet", AGENT_DS))["agent"])
    address = agent["GEMINI_AGENT_PARAMETERS_ADDRESS"]["value"]
    assert address == f"{AGENT_SERVICE}.{NAMESPACE}.svc:{port['port']}"
    assert agent["GEMINI_AGENT_BOOSTER_ADDRESS"]["value"] != address


def test_the_network_policy_admits_the_read_port() -> None:
    policy = one(objects("cnpg-monitoring-staged"), "NetworkPolicy", BOOSTER)
    agent_rule = policy["spec"]["ingress"][0]
    assert [p["port"] for p in agent_rule["ports"]] == ["grpc", READ]


def test_the_ingress_routes_get_parameters_to_the_read_port() -> None:
    ingress = one(objects("external-ingress-tls"), "Ingress", f"{RELEASE}-gemini-grpc")
    paths = ingress["spec"]["rules"][0]["http"]["paths"]
    routes = {(p["path"], p["pathType"]): p["backend"]["service"]["port"]["name"] for p in paths}
    assert routes == {
        ("/", "Prefix"): "grpc",
        ("/gemini.booster.v1.Booster/GetParameters", "Exact"): READ,
    }


def test_without_the_read_port_nothing_of_it_is_rendered() -> None:
    docs = render("--set", "booster.readPort.enabled=false")
    booster = containers(one(docs, "Deployment", BOOSTER))["booster"]
    assert "GEMINI_BOOSTER_PARAMETERS_LISTEN" not in env_of(booster)
    assert READ not in {p["name"] for p in booster["ports"]}
    assert service_port(docs, READ) is None
    agent = env_of(containers(one(docs, "DaemonSet", AGENT_DS))["agent"])
    assert "GEMINI_AGENT_PARAMETERS_ADDRESS" not in agent


def test_an_agent_only_release_asks_the_read_port_it_is_given() -> None:
    agent_only = objects("agent-only")
    agent = env_of(containers(one(agent_only, "DaemonSet", AGENT_DS))["agent"])
    assert "GEMINI_AGENT_PARAMETERS_ADDRESS" not in agent  # its Booster's ports are unknown
    given = "gemini-booster-agents.gemini.svc:50052"
    docs = render(*VALUE_SETS["agent-only"], "--set", f"agent.parametersAddress={given}")
    agent = env_of(containers(one(docs, "DaemonSet", AGENT_DS))["agent"])
    assert agent["GEMINI_AGENT_PARAMETERS_ADDRESS"]["value"] == given
