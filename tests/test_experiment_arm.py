"""Agents learn their arm from Booster: a real Booster (embedded PostgreSQL, gRPC, REST) puts
each enrolled host's arm into its GetParameters answer, from memory, and takes it out when the
experiment or the arm stops or the host leaves; a host in no experiment gets no arm. The agent
runs the arms of Booster's real answers in a fresh network namespace and restores the host.
"""

from __future__ import annotations

import functools
import subprocess
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gemini_agent import reporter as reporter_module
from gemini_agent.config import AgentSettings
from gemini_agent.daemon import Agent
from gemini_agent.datapath import ModuleParams
from gemini_agent.writeback import Kernel
from gemini_api.datapaths import load_datapath
from gemini_api.theta import load_spec
from gemini_api.v1 import booster_pb2 as pb

from .conftest import OPERATOR, agent_md, auth
from .sysctls import fusion_sysctls
from .test_agent_congestion import in_netns, route_congctl, sysctl_cc
from .test_experiments_api import host_arm

HOSTS = [f"h-{i:02d}" for i in range(10)]
PREFIX = "10.77.0.0/24"
SPEC = load_spec()


def when(delta: timedelta) -> str:
    return (datetime.now(UTC) + delta).isoformat()


def experiment(**overrides: Any) -> dict[str, Any]:
    """reno host-wide against cubic on one prefix, on ten hosts, running now."""
    return {
        "name": "reno-vs-cubic",
        "arms": [
            {"name": "control", "cc": "reno"},
            {"name": "routed", "cc": "cubic", "destinations": [PREFIX]},
        ],
        "population": {"hosts": HOSTS},
        "start": when(-timedelta(hours=1)),
        "end": when(timedelta(days=3)),
        "salt": "fixed",
    } | overrides


def ask(booster, host: str) -> pb.GetParametersResponse:
    req = pb.GetParametersRequest(host_id=host, policy="default")
    return booster.stub().GetParameters(req, metadata=agent_md(), timeout=10)


def arm_of(booster, host: str) -> pb.ExperimentArm | None:
    resp = ask(booster, host)
    return resp.experiment_arm if resp.HasField("experiment_arm") else None


def setup(booster, **overrides: Any) -> dict[str, str]:
    """The default policy and the experiment; host → its arm as REST reports it."""
    r = booster.http.post("/v1/policies", json={"name": "default"}, headers=auth(OPERATOR))
    assert r.status_code == 201, r.text
    body = experiment(**overrides)
    r = booster.http.post("/v1/experiments", json=body, headers=auth(OPERATOR))
    assert r.status_code == 201, r.text
    out = {h: host_arm(booster.http, h)["arm"]["name"] for h in HOSTS}  # type: ignore[index]
    assert set(out.values()) == {a["name"] for a in body["arms"]}
    return out


def test_get_parameters_carries_each_hosts_arm_until_the_experiment_stops(booster) -> None:
    arms = setup(booster)
    end = datetime.fromisoformat(
        booster.http.get("/v1/experiments/reno-vs-cubic", headers=auth(OPERATOR)).json()["end"]
    )
    for host, name in arms.items():
        arm = arm_of(booster, host)
        assert arm is not None and (arm.experiment, arm.arm) == ("reno-vs-cubic", name)
        assert arm.params == pb.ExperimentArm.KERNEL_DEFAULT and not arm.HasField("fixed_theta")
        assert arm.until_unix_ms == int(end.timestamp() * 1000)
        if name == "control":
            assert arm.cc == "reno" and list(arm.destination_prefixes) == []  # host-wide
        else:
            assert arm.cc == "cubic" and list(arm.destination_prefixes) == [PREFIX]
    assert arm_of(booster, "not-enrolled") is None
    r = booster.http.post("/v1/experiments/reno-vs-cubic/stop", headers=auth(OPERATOR))
    assert r.status_code == 200, r.text
    assert all(arm_of(booster, h) is None for h in HOSTS)


def test_a_stopped_arm_and_a_host_that_left_get_no_arm_the_others_keep_theirs(booster) -> None:
    arms = setup(booster)
    r = booster.http.post("/v1/experiments/reno-vs-cubic/arms/routed/stop", headers=auth(OPERATOR))
    assert r.status_code == 200, r.text
    control = [h for h, a in arms.items() if a == "control"]
    assert all(arm_of(booster, h) is None for h, a in arms.items() if a == "routed")
    assert all(arm_of(booster, h) is not None for h in control)
    r = booster.http.post(
        "/v1/experiments/reno-vs-cubic/leave", json={"hosts": control[:1]}, headers=auth(OPERATOR)
    )
    assert r.status_code == 200, r.text
    assert arm_of(booster, control[0]) is None
    assert all(arm_of(booster, h) is not None for h in control[1:])


def test_per_route_arms_need_network_prefixes(booster) -> None:
    r = booster.http.post("/v1/policies", json={"name": "default"}, headers=auth(OPERATOR))
    bad = experiment(
        arms=[
            {"name": "a", "cc": "reno"},
            {"name": "b", "cc": "bbr", "destinations": ["10.77.0.1/24"]},
        ]
    )
    r = booster.http.post("/v1/experiments", json=bad, headers=auth(OPERATOR))
    assert r.status_code == 422 and "destinations" in r.text, r.text


class Answers:
    """A channel whose GetParameters answers are the given real ones, in turn (the agent in
    the namespace cannot reach Booster's loopback, and a forked child must not use the
    parent's gRPC)."""

    def __init__(self, answers: list[bytes]) -> None:
        self.answers = iter(answers)

    def unary_unary(self, method: str, *args: Any, **kwargs: Any):
        def call(request: Any, **kw: Any) -> pb.GetParametersResponse:
            return pb.GetParametersResponse.FromString(next(self.answers))

        return call


def _agent(
    tmp: Path,
    answers: list[bytes],
    module_params: dict[str, ModuleParams] | None = None,
    monkeypatch: pytest.MonkeyPatch | None = None,
) -> Agent:
    """An agent whose Booster answers ``answers`` in turn; Fusion's sysctls in a directory.
    Without ``monkeypatch`` (in a forked worker only) the channel is replaced for good."""
    channel = lambda settings, address=None: Answers(answers)  # noqa: E731
    if monkeypatch is not None:
        monkeypatch.setattr(reporter_module, "open_channel", channel)
    else:
        reporter_module.open_channel = channel  # type: ignore[assignment]
    fusion = fusion_sysctls(tmp, version=False)
    settings = AgentSettings(
        host_id="h", policy="default", spool_dir=tmp / "spool", sysctl_root=fusion
    )
    kernel = Kernel(fusion, use_netlink=False)
    return Agent(settings, kernel=kernel, module_params=module_params or {})


def _runs_the_arms(tmp: Path, answers: list[bytes]) -> None:
    subprocess.run(["ip", "route", "add", PREFIX, "dev", "lo"], check=True)
    agent = _agent(tmp, answers)
    start = sysctl_cc()
    agent.refresh_theta()  # a host of the control arm
    assert sysctl_cc() == "reno" and route_congctl(PREFIX) is None
    agent.refresh_theta()  # the same host in the other arm (as after a crossover)
    assert sysctl_cc() == start and route_congctl(PREFIX) == "cubic"
    agent.refresh_theta()  # the experiment stopped
    assert sysctl_cc() == start and route_congctl(PREFIX) is None
    assert agent.arm is None and agent.metrics.arm_active._value.get() == 0


def _exit_restores(tmp: Path, answers: list[bytes]) -> None:
    """The daemon's loop (no flow sources) runs the arm; a stop (SIGTERM's path) restores."""
    agent = _agent(tmp, answers * 10)
    agent.make_sources = lambda: []  # type: ignore[method-assign]
    start = sysctl_cc()
    runner = threading.Thread(target=agent.run)
    runner.start()
    try:
        deadline = time.monotonic() + 30
        while sysctl_cc() != "reno" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sysctl_cc() == "reno"
    finally:
        agent.stopped.set()
        runner.join(timeout=30)
    assert not runner.is_alive() and sysctl_cc() == start


def test_a_clean_exit_of_the_agent_restores_the_host(booster, tmp_path) -> None:
    arms = setup(booster)
    control = next(h for h, a in arms.items() if a == "control")
    in_netns(
        functools.partial(_exit_restores, tmp_path, [ask(booster, control).SerializeToString()])
    )


def test_the_agent_runs_the_arms_booster_answers_and_restores_the_host(booster, tmp_path) -> None:
    arms = setup(booster)
    by_arm = {a: next(h for h, x in arms.items() if x == a) for a in ("control", "routed")}
    answers = [ask(booster, by_arm[a]).SerializeToString() for a in ("control", "routed")]
    booster.http.post("/v1/experiments/reno-vs-cubic/stop", headers=auth(OPERATOR))
    answers.append(ask(booster, by_arm["control"]).SerializeToString())
    in_netns(functools.partial(_runs_the_arms, tmp_path, answers))


@pytest.mark.parametrize(
    ("cc", "change", "outside"),
    [
        ("fusion", {"mult_decrease": 70}, {"mult_decrease": 100}),
        ("cubic", {"beta": 850}, {"beta": 1024}),
    ],
)
def test_a_fixed_arm_carries_its_theta_checked_against_its_ccs_spec(
    booster, cc: str, change: dict[str, int], outside: dict[str, int]
) -> None:
    theta = load_datapath(cc).default() | change
    arms = setup(
        booster,
        name="fixed-theta",
        arms=[
            {"name": "control", "cc": "cubic"},
            {"name": "fixed", "cc": cc, "params": "fixed", "theta": theta},
        ],
    )
    host = next(h for h, a in arms.items() if a == "fixed")
    arm = arm_of(booster, host)
    assert arm is not None and arm.params == pb.ExperimentArm.FIXED
    assert arm.fixed_theta.datapath == cc and dict(arm.fixed_theta.values) == theta
    refused = {"name": "x", "cc": cc, "params": "fixed", "theta": theta | outside}
    r = booster.http.post(
        "/v1/experiments",
        json=experiment(name="outside", arms=[{"name": "c", "cc": "cubic"}, refused]),
        headers=auth(OPERATOR),
    )
    assert r.status_code == 422 and next(iter(outside)) in r.text, r.text


def compressed(name: str, hosts: list[str], start: datetime, crossover: int, days: int) -> dict:
    """The test's experiment in days of 120 s: crossover on day ``crossover`` (its label)."""
    return experiment(
        name=name,
        population={"hosts": hosts},
        start=start.isoformat(),
        end=(start + days * timedelta(seconds=120)).isoformat(),
        crossover_day=(start.date() + timedelta(days=crossover)).isoformat(),
        day_seconds=120,
    )


def test_an_agent_is_told_to_ask_again_by_its_next_arm_change(booster) -> None:
    """A host asks again within refresh_after_seconds: by the start of an experiment it is
    scheduled in, by the crossover of one it runs; a host in no experiment at the usual pace.
    (Compressed days of 120 s put both instants minutes ahead.)"""
    day = timedelta(seconds=120)
    b = datetime.fromtimestamp(datetime.now(UTC).timestamp() // 120 * 120, UTC)  # a boundary
    r = booster.http.post("/v1/policies", json={"name": "default"}, headers=auth(OPERATOR))
    assert r.status_code == 201, r.text
    for body in (
        compressed("scheduled", HOSTS, b + 2 * day, crossover=1, days=3),
        compressed("running", ["x-1"], b - day, crossover=2, days=4),  # swaps at b + day
    ):
        r = booster.http.post("/v1/experiments", json=body, headers=auth(OPERATOR))
        assert r.status_code == 201, r.text
    usual = booster.server.settings.refresh_after_s
    asked = datetime.now(UTC)
    assert 1 <= ask(booster, HOSTS[0]).refresh_after_seconds <= (b + 2 * day - asked).seconds + 1
    assert 1 <= ask(booster, "x-1").refresh_after_seconds <= (b + day - asked).seconds + 1
    assert (b + 2 * day - asked).seconds + 1 < usual
    assert ask(booster, "not-enrolled").refresh_after_seconds == usual
