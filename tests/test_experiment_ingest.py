"""Reports count in their host's experiment arm as they are stored: through real gRPC into real
PostgreSQL, each host's flows of its own arm's congestion control (Fusion's or the baseline
CC's) go to its arm's per-day sums, exactly once, and other hosts' and other CCs' do not."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gemini_api.aggregate import AggregateBuilder, FlowStats
from gemini_api.datapaths import load_datapath
from gemini_api.theta import load_spec
from gemini_api.v1 import booster_pb2 as pb
from gemini_booster import simulation as sim
from gemini_booster.models import PolicyCreate
from gemini_booster.storage import policies as policy_store
from gemini_booster.storage import trials as trial_store

from .conftest import OPERATOR, agent_md, auth

SPEC = load_spec()
HOSTS = [f"eu-{i}" for i in range(4)]
OUTSIDER = "us-9"


def aggregate(mbps: float, flows: int, cc: str) -> pb.Aggregate:
    """``flows`` flows of 1 s at ``mbps`` with no queueing, of ``cc`` ('' is Fusion)."""
    b = AggregateBuilder()
    for _ in range(flows):
        b.add(FlowStats(int(mbps * 1e6 / 8), 1_000_000, 40_000, 40_000))
    return b.to_proto(SPEC.default(), 1, sim.ETHERNET.message(), cc)


def assert_arms(booster, experiment: str, expected: dict[str, tuple[int, int, float]]) -> None:
    """The experiment's overall results (σ = 0) give each named arm (flows, hosts, mean
    throughput in Mbit/s) as ``expected``."""
    out = booster.http.get(
        f"/v1/experiments/{experiment}/results?sigma=0", headers=auth(OPERATOR)
    ).json()
    by_arm = {a["arm"]: a for a in out["overall"]["arms"]}
    counts = {arm: (by_arm[arm]["flows"], by_arm[arm]["hosts"]) for arm in expected}
    means = {arm: by_arm[arm]["throughput_mbps"]["mean"] for arm in expected}
    assert counts == {arm: (flows, hosts) for arm, (flows, hosts, _) in expected.items()}
    assert means == pytest.approx({arm: mbps for arm, (_, _, mbps) in expected.items()}, rel=1e-3)


def cubic_against_fusion(booster, name: str, **fields) -> dict:
    """Policy 'cdn', and a running experiment ``name`` over HOSTS: cubic (control) against
    Fusion at its default θ; ``fields`` added to the declaration. Its REST answer."""
    policy_store.create_policy(booster.engine, PolicyCreate(name="cdn"), actor="test")
    booster.booster.reload_policies()
    now = datetime.now(UTC)
    body = {
        "name": name,
        "arms": [
            {"name": "control", "cc": "cubic"},
            {"name": "fusion", "cc": "fusion", "params": "fixed", "theta": SPEC.default()},
        ],
        "population": {"regions": {"eu": HOSTS}},
        "start": (now - timedelta(hours=1)).isoformat(),
        "end": (now + timedelta(days=3)).isoformat(),
        **fields,
    }
    r = booster.http.post("/v1/experiments", json=body, headers=auth(OPERATOR))
    assert r.status_code == 201, r.text
    return r.json()


def test_each_hosts_flows_of_its_arm_count_once(booster):
    cubic_against_fusion(booster, "cubic-vs-fusion")
    arms = {}
    for h in HOSTS:
        got = booster.http.get(f"/v1/hosts/{h}/experiment", headers=auth(OPERATOR)).json()
        arms[h] = got["experiment"]["arm"]["name"]
    assert sorted(arms.values()) == ["control", "control", "fusion", "fusion"]
    sent = []
    for h in [*HOSTS, OUTSIDER]:  # every host runs some Fusion and some cubic flows
        req = sim.make_report(h, "cdn", [aggregate(10.0, 3, ""), aggregate(20.0, 5, "cubic")])
        assert booster.stub().ReportAggregates(req, metadata=agent_md()).aggregates_stored == 2
        sent.append(req)
    again = booster.stub().ReportAggregates(sent[0], metadata=agent_md())  # an agent's retry
    assert again.duplicate
    # control hosts' cubic flows only (5 each), fusion hosts' Fusion flows only (3 each)
    assert_arms(booster, "cubic-vs-fusion", {"control": (10, 2, 20.0), "fusion": (6, 2, 10.0)})


def cubic_tuned(mbps: float, flows: int, theta: dict[str, int]) -> pb.Aggregate:
    """A CUBIC policy's own flows under the θ its agent set: cc empty, θ as datapath_theta."""
    a = aggregate(mbps, flows, "")
    a.ClearField("theta")
    a.datapath_theta.CopyFrom(pb.DatapathTheta(datapath="cubic", values=theta))
    return a


def test_a_cubic_policys_hosts_count_in_the_default_and_the_tuned_cubic_arm(booster):
    """'CUBIC at the kernel's defaults' against 'CUBIC tuned by Booster', the hosts' own policy
    tuning CUBIC: the tuned arm's flows (cc empty, CUBIC's θ) count for the cubic arm that
    tunes, and the default arm's cubic flows (cc 'cubic', no θ: the agent set none) are stored
    as a baseline and count for the default arm, not refused."""
    cubic = load_datapath("cubic")
    r = booster.http.post(
        "/v1/policies", json={"name": "tcp", "target_cc": "cubic"}, headers=auth(OPERATOR)
    )
    assert r.status_code == 201, r.text
    now = datetime.now(UTC)
    body = {
        "name": "cubic-tuning",
        "arms": [
            {"name": "default", "cc": "cubic"},
            {"name": "tuned", "cc": "cubic", "params": "policy", "policy": "tcp"},
        ],
        "population": {"regions": {"eu": HOSTS}},
        "start": (now - timedelta(hours=1)).isoformat(),
        "end": (now + timedelta(days=3)).isoformat(),
    }
    r = booster.http.post("/v1/experiments", json=body, headers=auth(OPERATOR))
    assert r.status_code == 201, r.text
    tuned_theta = cubic.default() | {"beta": 900}
    for h in HOSTS:
        got = booster.http.get(f"/v1/hosts/{h}/experiment", headers=auth(OPERATOR)).json()
        own = (
            aggregate(20.0, 5, "cubic")
            if got["experiment"]["arm"]["name"] == "default"
            else cubic_tuned(10.0, 3, tuned_theta)
        )
        req = sim.make_report(h, "tcp", [own, aggregate(30.0, 2, "bbr")])
        assert booster.stub().ReportAggregates(req, metadata=agent_md()).aggregates_stored == 2
    assert_arms(booster, "cubic-tuning", {"default": (10, 2, 20.0), "tuned": (6, 2, 10.0)})
    policy = booster.booster.policies["tcp"]
    assert set(trial_store.load_baselines(booster.engine, policy.id)) == {"bbr", "cubic"}
    [trial] = trial_store.load_trials(booster.engine, policy.id)
    assert trial.flow_count == 6
