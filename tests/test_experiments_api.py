"""The experiments API against a real Booster on embedded PostgreSQL: operators create (audited)
and stop experiments, viewers and agents cannot; bad input is a 422 naming the field; a stopped
experiment or arm restores its hosts; hosts join and leave without moving anyone else; results
per day and per arm come from sums stored through ``record_arm_flows``; the guardrail stops a
harmful arm."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

import numpy as np
import pytest

from gemini_api.theta import load_spec
from gemini_booster.domain import FlowSums
from gemini_booster.storage import experiments as store

from .conftest import AGENT, OPERATOR, auth
from .openapi_doc import assert_refusals_documented

REGIONS = {"eu": [f"eu-{i:02d}" for i in range(20)], "us": [f"us-{i:02d}" for i in range(20)]}
HOSTS = [h for hs in REGIONS.values() for h in hs]


def when(delta: timedelta) -> str:
    return (datetime.now(UTC) + delta).isoformat()


def spec(**overrides: Any) -> dict[str, Any]:
    """Cubic as it is against Fusion at a fixed θ, on 40 hosts of two regions, running now."""
    return {
        "name": "fusion-vs-cubic",
        "arms": [
            {"name": "control", "cc": "cubic"},
            {"name": "fusion", "cc": "fusion", "params": "fixed", "theta": load_spec().default()},
        ],
        "population": {"regions": REGIONS},
        "start": when(-timedelta(days=2)),
        "end": when(timedelta(days=5)),
        "sigma": 1.0,
    } | overrides


def create(http, token: str = OPERATOR, **overrides: Any):
    return http.post("/v1/experiments", json=spec(**overrides), headers=auth(token))


def viewer(http) -> str:
    r = http.post("/v1/tokens", json={"name": "ro", "role": "viewer"}, headers=auth(OPERATOR))
    return r.json()["token"]


def host_arm(http, host: str) -> dict | None:
    r = http.get(f"/v1/hosts/{host}/experiment", headers=auth(OPERATOR))
    assert r.status_code == 200, r.text
    return r.json()["experiment"]


def test_operator_creates_an_audited_experiment(booster) -> None:
    r = create(booster.http)
    assert r.status_code == 201, r.text
    e = r.json()
    assert e["status"] == "running" and e["hosts"] == 40 and e["created_by"] == "bootstrap-operator"
    assert e["split"] == [0.5, 0.5] and e["control"] == "control"
    assert e["day_seconds"] == 86_400 and e["crossover_at"] is None  # UTC calendar days
    assert e["balance"] == {
        "eu": {"control": 10, "fusion": 10},
        "us": {"control": 10, "fusion": 10},
    }
    [entry] = [a for a in booster.http.get("/v1/audit", headers=auth(OPERATOR)).json()]
    assert (entry["action"], entry["target"], entry["actor"]) == (
        "experiment.create",
        "fusion-vs-cubic",
        "bootstrap-operator",
    )
    assert entry["detail"]["hosts"] == 40 and entry["detail"]["salt"] == e["salt"]
    assert entry["detail"]["regions"] == {"eu": 20, "us": 20}  # counts, not a fleet of ids
    listed = booster.http.get("/v1/experiments", headers=auth(viewer(booster.http))).json()
    assert [x["name"] for x in listed] == ["fusion-vs-cubic"]
    got = booster.http.get("/v1/experiments/fusion-vs-cubic", headers=auth(OPERATOR)).json()
    assert got["salt"] == e["salt"]
    assert booster.http.get("/v1/experiments/nope", headers=auth(OPERATOR)).status_code == 404
    assert create(booster.http).status_code == 409  # the name is taken


def test_viewer_and_agent_tokens_cannot_create_or_stop(booster) -> None:
    ro = viewer(booster.http)
    assert create(booster.http, token=ro).status_code == 403
    assert create(booster.http, token=AGENT).status_code == 403
    assert booster.http.get("/v1/experiments", headers=auth(AGENT)).status_code == 403
    assert create(booster.http).status_code == 201
    r = booster.http.post("/v1/experiments/fusion-vs-cubic/stop", headers=auth(ro))
    assert r.status_code == 403
    assert booster.http.get("/v1/experiments", headers=auth(ro)).json()[0]["status"] == "running"


ARMS = spec()["arms"]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"arms": [ARMS[0], {"name": "b", "cc": "Cubic!"}]}, "cc"),
        ({"arms": [ARMS[0], {"name": "b", "cc": "x" * 17}]}, "cc"),
        ({"split": [1.5, -0.5]}, "split"),
        ({"split": [0.0, 1.0]}, "split"),
        ({"split": [0.3, 0.3]}, "split"),
        ({"end": when(-timedelta(days=3))}, "end"),
        ({"crossover_day": str(date.today() + timedelta(days=30))}, "crossover_day"),
        ({"crossover_day": str(date.today() - timedelta(days=10))}, "crossover_day"),
        ({"arms": [ARMS[0], {"name": "f", "cc": "fusion", "params": "fixed"}]}, "theta"),
        (
            {"arms": [ARMS[0], {"name": "f", "cc": "fusion", "params": "policy", "policy": "x"}]},
            "policy",
        ),
        ({"arms": [ARMS[0], {"name": "f", "cc": "bbr", "params": "fixed", "theta": {}}]}, "theta"),
        ({"control": "nope"}, "control"),
        ({"population": {"regions": {"eu": ["a", "a"]}}}, "population"),
        ({"colour": "blue"}, "colour"),
    ],
)
def test_bad_experiment_is_a_422_naming_the_field(booster, overrides, field) -> None:
    r = create(booster.http, **overrides)
    assert r.status_code == 422, r.text
    assert field in r.text
    assert booster.http.get("/v1/experiments", headers=auth(OPERATOR)).json() == []


def test_policy_arm_names_a_served_policy(booster) -> None:
    booster.http.post("/v1/policies", json={"name": "cdn"}, headers=auth(OPERATOR))
    arm = {"name": "tuned", "cc": "fusion", "params": "policy", "policy": "cdn"}
    r = create(booster.http, arms=[ARMS[0], arm])
    assert r.status_code == 201, r.text
    assert r.json()["arms"][1]["policy"] == "cdn"


def test_stopping_restores_every_host(booster) -> None:
    assert create(booster.http).status_code == 201
    arms = {h: host_arm(booster.http, h) for h in HOSTS}
    assert all(a is not None and a["experiment"] == "fusion-vs-cubic" for a in arms.values())
    assert {a["arm"]["name"] for a in arms.values() if a} == {"control", "fusion"}
    r = booster.http.post(
        "/v1/experiments/fusion-vs-cubic/stop", json={"reason": "done"}, headers=auth(OPERATOR)
    )
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "stopped" and r.json()["stop_reason"] == "done"
    assert all(host_arm(booster.http, h) is None for h in HOSTS)
    audit = booster.http.get("/v1/audit", headers=auth(OPERATOR)).json()
    assert audit[0]["action"] == "experiment.stop" and audit[0]["detail"] == {"reason": "done"}
    again = booster.http.post("/v1/experiments/fusion-vs-cubic/stop", headers=auth(OPERATOR))
    assert again.status_code == 409
    # The hosts are free again: a new experiment may take them.
    assert create(booster.http, name="second").status_code == 201


def test_a_host_is_in_one_live_experiment_at_a_time(booster) -> None:
    assert create(booster.http).status_code == 201
    r = create(booster.http, name="other", population={"hosts": ["new-1", "eu-03"]})
    assert r.status_code == 409 and "eu-03" in r.json()["detail"]
    later = {"start": when(timedelta(days=6)), "end": when(timedelta(days=9))}
    assert (
        create(booster.http, name="later", population={"hosts": ["eu-03"]}, **later).status_code
        == 201
    )


def test_hosts_join_and_leave_without_moving_anyone_else(booster) -> None:
    assert create(booster.http).status_code == 201
    before = {h: host_arm(booster.http, h)["arm"]["name"] for h in HOSTS}  # type: ignore[index]
    new = [f"eu-new-{i}" for i in range(6)]
    r = booster.http.post(
        "/v1/experiments/fusion-vs-cubic/join",
        json={"regions": {"eu": new}},
        headers=auth(OPERATOR),
    )
    assert r.status_code == 200, r.text
    assert r.json()["balance"]["eu"] == {"control": 13, "fusion": 13}
    r = booster.http.post(
        "/v1/experiments/fusion-vs-cubic/leave",
        json={"hosts": ["us-00", "us-01", "not-a-member"]},
        headers=auth(OPERATOR),
    )
    assert r.status_code == 200 and r.json() == {"left": 2}
    assert host_arm(booster.http, "us-00") is None
    after = {h: host_arm(booster.http, h) for h in HOSTS if h not in {"us-00", "us-01"}}
    assert {h: a["arm"]["name"] for h, a in after.items() if a} == {
        h: arm for h, arm in before.items() if h not in {"us-00", "us-01"}
    }
    assert all(host_arm(booster.http, h) is not None for h in new)
    actions = [a["action"] for a in booster.http.get("/v1/audit", headers=auth(OPERATOR)).json()]
    assert actions[:2] == ["experiment.leave", "experiment.join"]


def flows(rng: np.random.Generator, mean_tpt: float, n: int) -> tuple[FlowSums, int]:
    x = rng.normal(mean_tpt, 10.0, n)
    d = rng.normal(20.0, 4.0, n)
    sums = FlowSums.total(FlowSums.of_flow(a, b) for a, b in zip(x, d, strict=True))
    return sums, int((x < 0.8).sum())


def store_flows(
    booster, name: str, effect: dict[str, float], seed: int = 1
) -> list[store.ArmFlows]:
    """Flows for every host on every day so far, under the arm it runs, stored the way the
    ingest path will (``record_arm_flows``, one batch per day)."""
    e = store.get_experiment(booster.engine, name)
    rng = np.random.default_rng(seed)
    days = [d for d in e.days() if d <= datetime.now(UTC).date()]
    stored: list[store.ArmFlows] = []
    for day in days:
        batch = []
        for host, m in e.hosts.items():
            arm = e.arms[(m.group + e.period(day)) % 2].name
            sums, slow = flows(rng, 50.0 + effect[arm] + rng.normal(0, 3), int(rng.integers(5, 40)))
            batch.append(store.ArmFlows(e.id, arm, host, day, sums, slow))
        with booster.engine.begin() as conn:
            store.record_arm_flows(conn, batch)
        stored += batch
    return stored


def test_results_per_day_and_arm_from_stored_sums(booster) -> None:
    # a fixed salt: the hosts' arms, hence the interval below, are the same on every run (with
    # a random one the 95 % interval would miss the true difference in 1 run of 20)
    assert create(booster.http, salt="results").status_code == 201
    stored = store_flows(booster, "fusion-vs-cubic", {"control": 0.0, "fusion": 4.0})
    # The same flows reported twice in one batch add up (one row per key).
    extra = stored[0]
    with booster.engine.begin() as conn:
        store.record_arm_flows(conn, [extra, extra])
    stored += [extra, extra]
    r = booster.http.get("/v1/experiments/fusion-vs-cubic/results?sigma=2", headers=auth(OPERATOR))
    assert r.status_code == 200, r.text
    out = r.json()
    # Every day so far: the start two days ago, yesterday, today.
    assert out["sigma"] == 2 and out["level"] == 0.95 and len(out["days"]) == 3
    for arm in out["overall"]["arms"]:
        total = FlowSums.total(f.sums for f in stored if f.arm == arm["arm"])
        assert arm["flows"] == total.flow_count and arm["hosts"] == 20
        assert arm["utility"]["mean"] == pytest.approx(total.utility(2).mean)
        assert arm["throughput_mbps"]["mean"] == pytest.approx(total.mean_throughput)
        assert arm["utility"]["low"] < arm["utility"]["mean"] < arm["utility"]["high"]
    [diff] = out["overall"]["differences"]
    assert diff["arm"] == "fusion" and diff["control"] == "control" and diff["method"] == "parallel"
    assert diff["utility"]["low"] < 4.0 < diff["utility"]["high"]
    today = datetime.now(UTC).date()
    one = booster.http.get(
        f"/v1/experiments/fusion-vs-cubic/results?day={today}", headers=auth(viewer(booster.http))
    ).json()
    [day] = one["days"]
    assert day["day"] == str(today) and sum(a["flows"] for a in day["arms"]) == sum(
        f.sums.flow_count for f in stored if f.day == today
    )
    far = today + timedelta(days=100)
    r = booster.http.get(
        f"/v1/experiments/fusion-vs-cubic/results?day={far}", headers=auth(OPERATOR)
    )
    assert r.status_code == 422 and "day" in r.text
    r = booster.http.get("/v1/experiments/fusion-vs-cubic/results?sigma=-1", headers=auth(OPERATOR))
    assert r.status_code == 422 and "sigma" in r.text


def test_guardrail_stops_the_harmful_arm_and_restores_its_hosts(booster) -> None:
    guard = {"margin": 1.0, "confidence": 0.95, "min_hosts": 5}
    assert create(booster.http, guardrail=guard).status_code == 201
    store_flows(booster, "fusion-vs-cubic", {"control": 0.0, "fusion": -15.0})
    r = booster.http.post("/v1/experiments/fusion-vs-cubic/guardrail", headers=auth(OPERATOR))
    assert r.status_code == 200, r.text
    [decision] = r.json()
    assert decision["arm"] == "fusion" and decision["stop"] is True
    assert decision["upper_bound"] < -1.0
    e = booster.http.get("/v1/experiments/fusion-vs-cubic", headers=auth(OPERATOR)).json()
    assert e["status"] == "running"
    assert e["arms"][1]["stopped"]["by"] == "bootstrap-operator" and e["arms"][0]["stopped"] is None
    arms = {h: host_arm(booster.http, h) for h in HOSTS}
    assert {a["arm"]["name"] for a in arms.values() if a is not None} == {"control"}
    assert sum(a is None for a in arms.values()) == 20  # the fusion hosts are restored
    audit = booster.http.get("/v1/audit", headers=auth(OPERATOR)).json()
    assert audit[0]["action"] == "experiment.stop_arm" and audit[0]["detail"]["arm"] == "fusion"
    # Once stopped, the arm is not decided on again.
    assert (
        booster.http.post(
            "/v1/experiments/fusion-vs-cubic/guardrail", headers=auth(OPERATOR)
        ).json()
        == []
    )


def test_guardrail_leaves_a_harmless_arm_running(booster) -> None:
    guard = {"margin": 1.0, "confidence": 0.95, "min_hosts": 5}
    assert create(booster.http, guardrail=guard).status_code == 201
    store_flows(booster, "fusion-vs-cubic", {"control": 0.0, "fusion": 2.0})
    [decision] = booster.http.post(
        "/v1/experiments/fusion-vs-cubic/guardrail", headers=auth(OPERATOR)
    ).json()
    assert decision["stop"] is False
    assert all(host_arm(booster.http, h) is not None for h in HOSTS)


@pytest.mark.parametrize(
    ("method", "path", "statuses"),
    [
        ("post", "/v1/experiments", {"201", "401", "403", "409", "413", "422", "503"}),
        ("get", "/v1/experiments", {"200", "401", "403", "503"}),
        ("get", "/v1/experiments/{name}", {"200", "401", "403", "404", "422", "503"}),
        (
            "post",
            "/v1/experiments/{name}/stop",
            {"200", "401", "403", "404", "409", "413", "422", "503"},
        ),
        ("get", "/v1/experiments/{name}/results", {"200", "401", "403", "404", "422", "503"}),
        ("get", "/v1/hosts/{host_id}/experiment", {"200", "401", "403", "422", "503"}),
    ],
)
def test_openapi_documents_each_refusal(booster, method, path, statuses) -> None:
    spec_doc = booster.http.get("/openapi.json").json()
    assert_refusals_documented(spec_doc, path, method, statuses)
    assert spec_doc["paths"][path][method]["security"] == [{"HTTPBearer": []}]


def test_arm_flows_takes_the_flows_of_the_hosts_arm_only(booster) -> None:
    """What the ingest path will store for a report: the aggregates of the CC the host's arm
    runs (a tuned aggregate stands for its policy's CC), on the day of the report's interval
    start, nothing else."""
    assert create(booster.http).status_code == 201
    now = datetime.now(UTC)
    fusion, cubic, bbr = (FlowSums.of_flow(t, 10.0) for t in (80.0, 60.0, 40.0))
    parts = [("fusion", fusion, 0), ("cubic", cubic, 1), ("bbr", bbr, 0), ("cubic", cubic, 0)]
    taken = {}
    for host in HOSTS:
        found = store.host_assignment(booster.engine, host, now)
        assert found is not None
        got = store.arm_flows(found, host, now, parts)
        assert got is not None and got.day == now.date() and got.host_id == host
        taken[found.arm.name] = (got.sums, got.slow_flows)
    assert taken == {"fusion": (fusion, 0), "control": (cubic + cubic, 1)}
    found = store.host_assignment(booster.engine, "eu-00", now)
    assert found is not None
    assert store.arm_flows(found, "eu-00", now, [("reno", cubic, 0)]) is None


def test_operator_stops_one_arm(booster) -> None:
    assert create(booster.http).status_code == 201
    path = "/v1/experiments/fusion-vs-cubic/arms/fusion/stop"
    assert booster.http.post(path, headers=auth(viewer(booster.http))).status_code == 403
    r = booster.http.post(path, json={"reason": "rollback"}, headers=auth(OPERATOR))
    assert r.status_code == 200, r.text
    assert r.json()["arms"][1]["stopped"]["reason"] == "rollback"
    arms = [host_arm(booster.http, h) for h in HOSTS]
    assert {a["arm"]["name"] for a in arms if a is not None} == {"control"}
    assert sum(a is None for a in arms) == 20
    audit = booster.http.get("/v1/audit", headers=auth(OPERATOR)).json()
    assert audit[0]["action"] == "experiment.stop_arm" and audit[0]["detail"]["arm"] == "fusion"
    assert booster.http.post(path, headers=auth(OPERATOR)).status_code == 409
    missing = "/v1/experiments/fusion-vs-cubic/arms/nope/stop"
    assert booster.http.post(missing, headers=auth(OPERATOR)).status_code == 404
