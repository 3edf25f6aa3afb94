"""Booster's /metrics as Prometheus scrapes it: names that follow Prometheus' conventions, build
info, refit failures and refusals counted by reason, a per-context gauge with one series per
context of the current plan and none for a context that left it, and a list of exported names
that dashboards and alert rules can be checked against. ``promtool check metrics`` runs too
when promtool is installed (deploy/install-tools.sh puts it under var/tools/bin)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import grpc
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

import gemini_booster
from gemini_api.theta import load_spec
from gemini_booster import simulation as sim
from gemini_booster.models import PolicyCreate
from gemini_booster.service.metrics import exported_names
from gemini_booster.storage import plans as plan_store
from gemini_booster.storage import policies as policy_store
from gemini_booster.storage import trials as trial_store

from .conftest import Running, agent_md

POLICY = "p1"
ROOT = Path(__file__).resolve().parent.parent
PROMTOOL = shutil.which("promtool") or str(ROOT / "var/tools/bin/promtool")
# Units Prometheus wants spelt in base units: seconds, bytes, and no scaled prefixes.
NOT_BASE_UNITS = re.compile(r"_(ms|milliseconds|minutes|hours|days|kb|mb|kilobytes|megabytes)(_|$)")


@pytest.fixture
def svc(booster: Running) -> Running:
    policy_store.create_policy(booster.engine, PolicyCreate(name=POLICY), actor="test")
    booster.booster.reload_policies()
    return booster


def send_round(svc: Running, seed: int, hosts: int = 3) -> None:
    rng = np.random.default_rng(seed)
    theta = load_spec().default()
    for h in range(hosts):
        aggs = [sim.make_aggregate(c, theta, 1.0, 20, rng) for c in sim.DEFAULT_CONTEXTS]
        req = sim.make_report(f"host-{h}", POLICY, aggs)
        svc.stub().ReportAggregates(req, metadata=agent_md(), timeout=10)


def scrape(svc: Running) -> str:
    r = svc.http.get("/metrics")
    assert r.status_code == 200
    return r.text


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [
        (s.labels, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    ]


def test_names_follow_prometheus_conventions(svc: Running) -> None:
    send_round(svc, 0)
    svc.booster.refit(svc.booster.policies[POLICY])
    text = scrape(svc)
    families = list(text_string_to_metric_families(text))
    assert families
    for family in families:
        assert family.name.startswith("gemini_booster_"), family.name
        assert not NOT_BASE_UNITS.search(family.name), family.name
        assert family.documentation, family.name
        if family.type == "counter":
            # The parser strips _total from a counter's family name; every sample has it.
            for s in family.samples:
                assert s.name.endswith(("_total", "_created")), s.name
        else:
            assert not family.name.endswith("_total"), family.name
        if "seconds" in family.name:
            assert family.name.endswith(("_seconds", "_timestamp_seconds")), family.name
    # What is exported is what exported_names() lists, for dashboards and alerts to check.
    seen = {s.name for f in families for s in f.samples if not s.name.endswith("_created")}
    assert seen <= exported_names()


@pytest.mark.skipif(not Path(PROMTOOL).exists(), reason="promtool is not installed")
def test_promtool_accepts_the_exposition(svc: Running) -> None:
    send_round(svc, 0)
    svc.booster.refit(svc.booster.policies[POLICY])
    result = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=scrape(svc), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "" and result.stderr.strip() == ""


def test_build_info_names_the_version(svc: Running) -> None:
    found = samples(scrape(svc), "gemini_booster_build_info")
    assert found == [({"version": gemini_booster.__version__}, 1.0)]


def test_the_utility_gauge_has_one_series_per_planned_context(svc: Running) -> None:
    policy = svc.booster.policies[POLICY]
    for seed in range(3):  # more reports and refits add no series
        send_round(svc, seed)
        svc.booster.refit(policy)
        series = samples(scrape(svc), "gemini_booster_incumbent_utility")
        planned = svc.booster.plan_snapshot(policy.id)
        assert len(series) == len(planned) == len(sim.DEFAULT_CONTEXTS)
        assert {labels["context"] for labels, _ in series} == {k.label for k in planned}
        assert all(labels["policy"] == POLICY for labels, _ in series)
    planned_count = samples(scrape(svc), "gemini_booster_planned_contexts")
    assert planned_count == [({"policy": POLICY}, float(len(sim.DEFAULT_CONTEXTS)))]

    # A context that leaves the plan leaves the gauge: the plans now hold one context.
    kept = next(iter(svc.booster.plan_snapshot(policy.id)))
    records, generation = plan_store.load_plans(svc.engine, policy.id)
    contexts = trial_store.load_contexts(svc.engine, {r.context_id for r in records})
    one = [r for r in records if contexts[r.context_id] == kept]
    svc.booster.plans.replace(policy.id, one, contexts, generation + 1)
    series = samples(scrape(svc), "gemini_booster_incumbent_utility")
    assert [labels["context"] for labels, _ in series] == [kept.label]


def counter(svc: Running, name: str) -> float:
    return sum(value for _, value in samples(scrape(svc), name))


def test_refit_failures_are_counted(svc: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    policy = svc.booster.policies[POLICY]
    # Settle the background worker: a refit it began (after taking the lease) ends here, and
    # after this explicit refit it waits refit_interval_s (an hour here) before another.
    svc.booster.refit(policy)
    svc.booster.refit_dirty()
    before = counter(svc, "gemini_booster_refits_total")

    send_round(svc, 0)
    svc.booster.refit(policy)
    refits = samples(scrape(svc), "gemini_booster_refits_total")
    assert refits == [({"policy": POLICY}, before + 1)]
    assert samples(scrape(svc), "gemini_booster_last_refit_timestamp_seconds")[0][1] > 0

    refit_service = svc.booster.refits
    assert refit_service is not None
    attempts: list[int] = []

    def broken(*args, **kwargs):
        attempts.append(1)
        raise RuntimeError("the model could not be fit")

    monkeypatch.setattr(refit_service, "_plan", broken)
    refit_service.mark_dirty({policy.id})
    svc.booster.refit_dirty()
    assert attempts == [1]
    failures = samples(scrape(svc), "gemini_booster_refit_failures_total")
    assert failures == [({"policy": POLICY}, 1.0)]
    assert counter(svc, "gemini_booster_refits_total") == before + 1


def test_refusals_are_counted_by_reason(svc: Running) -> None:
    stub = svc.stub()
    with pytest.raises(grpc.RpcError):
        stub.ReportAggregates(sim.make_report("h", "nope", []), metadata=agent_md(), timeout=10)
    with pytest.raises(grpc.RpcError):
        stub.ReportAggregates(sim.make_report("h", POLICY, []), metadata=agent_md("forged"))
    text = scrape(svc)
    rejected = {
        labels["reason"]: value
        for labels, value in samples(text, "gemini_booster_reports_total")
        if labels["outcome"] == "rejected"
    }
    assert rejected == {"unknown_policy": 1.0}
    auth = samples(text, "gemini_booster_auth_failures_total")
    assert auth == [({"api": "grpc", "reason": "invalid"}, 1.0)]
