"""The θ-in-use chart follows the context selector: ``/charts/theta?context=`` counts the flows
and hosts of that context only (each context's θ apart, adding up to the policy-wide answer),
an unknown label is a 404, and the dashboard draws the chosen context's θ under a title that
names it. Real Booster (embedded PostgreSQL, reports through gRPC), headless Chromium."""

from __future__ import annotations

import json

from gemini_api.aggregate import AggregateBuilder, FlowStats
from gemini_api.theta import load_spec
from gemini_api.v1 import booster_pb2 as pb
from gemini_booster import simulation as sim
from gemini_booster.domain import ContextKey

from .conftest import OPERATOR, agent_md, auth
from .test_dashboard import Page, base_url, browser  # noqa: F401 (a fixture)

SPEC = load_spec()
POLICY = "cdn"
# Per context: the θ its host runs and how many flows it reports.
RUNS = {
    sim.ETHERNET: (SPEC.default() | {"mult_decrease": 70}, 6),
    sim.SATELLITE: (SPEC.default() | {"mult_decrease": 55}, 4),
}


def aggregate(context: sim.SyntheticContext, theta: dict[str, int], flows: int) -> pb.Aggregate:
    b = AggregateBuilder()
    for _ in range(flows):
        b.add(FlowStats(2_500_000, 1_000_000, 50_000, 40_000))
    return b.to_proto(theta, 1, context.message(), "")


def theta_chart(svc, query: str = ""):
    return svc.http.get(f"/v1/policies/{POLICY}/charts/theta{query}", headers=auth(OPERATOR))


def label(context: sim.SyntheticContext) -> str:
    return ContextKey(*context.key).label


def seeded(svc) -> None:
    r = svc.http.post("/v1/policies", json={"name": POLICY}, headers=auth(OPERATOR))
    assert r.status_code == 201, r.text
    for i, (context, (theta, flows)) in enumerate(RUNS.items()):
        req = sim.make_report(f"host-{i}", POLICY, [aggregate(context, theta, flows)])
        assert svc.stub().ReportAggregates(req, metadata=agent_md()).aggregates_stored == 1
    svc.booster.refit(svc.booster.policies[POLICY])  # plans name the contexts on the page


def test_theta_in_use_per_context(booster, browser) -> None:  # noqa: F811
    seeded(booster)
    everything = theta_chart(booster).json()
    assert everything["context"] is None
    assert everything["flows"] == sum(flows for _, flows in RUNS.values())
    for context, (theta, flows) in RUNS.items():
        one = theta_chart(booster, f"?context={label(context)}")
        assert one.status_code == 200, one.text
        d = one.json()
        assert d["context"] == label(context) and d["flows"] == flows and d["hosts"] == 1
        assert [(t["theta"], t["flows"], t["hosts"]) for t in d["thetas"]] == [(theta, flows, 1)]
    missing = theta_chart(booster, "?context=x/y->z/w@3")
    assert missing.status_code == 404 and "not found" in missing.json()["detail"]

    satellite = label(sim.SATELLITE)
    page = Page(browser, base_url(booster), f"?policy={POLICY}&context={satellite}")
    page.sign_in(OPERATOR)
    page.wait.until(lambda _: satellite in page.el("theta-title").text)
    plotted = json.loads(page.el("theta-charts").get_attribute("data-series"))
    theta, flows = RUNS[sim.SATELLITE]
    assert plotted["mult_decrease"]["flows"] == [flows]
    assert plotted["mult_decrease"]["value"] == [SPEC.natural(theta)["mult_decrease"]]
