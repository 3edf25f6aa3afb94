"""An A/B experiment end to end in the lab: an operator creates it through Booster's REST API,
lab hosts (network namespaces in the qemu guest, each with its own agent and token) run the arm
Booster assigns them, the crossover swaps them, stopping restores each host's own CC, and the
results endpoint has both arms on both days. What each host runs is read from its kernel (the
namespace's sysctl, and the CC each finished flow's socket ran), not from the agent.

Only mechanics are asserted (which CC runs where and when): the guest runs under qemu on the
wall clock, so the arms' figures are a rehearsal, recorded by `gemini-lab abtest --record`."""

from __future__ import annotations

import datetime as dt
from collections import Counter

import pytest

from gemini_booster.experiments.domain import ExperimentCreate
from gemini_lab.abtest import (
    CONTROL,
    TREATMENT,
    AbConfig,
    experiment_body,
    flows_in_checkpoints,
    host_ids,
    next_boundary,
    render,
    run_abtest,
)
from gemini_lab.fleet import parse_ss_ccs
from tests.labkit import fleet_run

# `ss -tin state established` in a lab host: flows to receivers and the agent's connection to
# Booster through the relay on loopback (both of its ends live in the host's namespace; the
# agent's dual-stack end prints its peer IPv4-mapped).
SS_OUTPUT = (
    "Recv-Q Send-Q Local Address:Port  Peer Address:Port Process\n"
    "0      0        10.100.0.2:41010    10.1.0.2:5201\n"
    "\t cubic wscale:7,7 rto:244 rtt:43.1/2.2 mss:1448 cwnd:41 bytes_acked:2899617\n"
    "0      0         127.0.0.1:57172   127.0.0.1:50051\n"
    "\t fusion wscale:10,10 rto:204 rtt:0.025/0.012 mss:32741 cwnd:10\n"
    "0      0        10.100.0.2:41012    10.2.0.2:5201\n"
    "\t fusion wscale:7,7 rto:304 rtt:101.3/3.1 mss:1448 cwnd:88\n"
    "0      0      [::ffff:127.0.0.1]:40508 [::ffff:127.0.0.1]:50051\n"
    "\t reno wscale:11,11 rto:216 rtt:14.873/10.745 mss:65483 cwnd:10\n"
)
CFG = AbConfig()


def test_live_connections_are_read_with_their_cc_but_the_agents_own():
    assert parse_ss_ccs(SS_OUTPUT) == ["cubic", "fusion"]
    assert parse_ss_ccs("Recv-Q Send-Q Local Address:Port  Peer Address:Port Process\n") == []


def test_the_experiment_starts_on_a_day_boundary():
    at = dt.datetime(2026, 11, 23, 8, 1, 10, tzinfo=dt.UTC)
    assert next_boundary(at, 120) == dt.datetime(2026, 11, 23, 8, 2, tzinfo=dt.UTC)
    on = dt.datetime(2026, 11, 23, 8, 2, tzinfo=dt.UTC)
    assert next_boundary(on, 120) == on


def test_the_lab_experiment_is_one_the_api_accepts():
    start = next_boundary(dt.datetime.now(dt.UTC) + dt.timedelta(hours=1), CFG.day_s)
    spec = ExperimentCreate.model_validate(
        experiment_body("lab-ab", "lab-policy", host_ids(2), start, CFG)
    )
    assert [a.cc for a in spec.arms] == [CONTROL, TREATMENT]
    assert spec.crossover_day == start.date() + dt.timedelta(days=1)
    assert spec.day_seconds == CFG.day_s


@pytest.fixture(scope="module")
def run(tmp_path_factory, pg_admin_url):
    return fleet_run(run_abtest, pg_admin_url, tmp_path_factory.mktemp("abtest"), CFG)


def _kernel_cc(run, checkpoint: str) -> dict[str, str]:
    return {host: r["sysctl"] for host, r in run.readings[checkpoint].items()}


@pytest.mark.lab
@pytest.mark.slow
def test_hosts_run_their_arm_from_the_kernel_and_the_crossover_swaps_them(run):
    hosts = host_ids(CFG.hosts)
    assert _kernel_cc(run, "before") == dict.fromkeys(hosts, CFG.default_cc)
    day0, day1 = run.expected["day-0"], run.expected["day-1"]
    half = CFG.hosts // 2
    assert Counter(day0.values()) == {CONTROL: half, TREATMENT: half}  # the split, per period
    assert day1 == {h: TREATMENT if cc == CONTROL else CONTROL for h, cc in day0.items()}
    held = flows_in_checkpoints(run, CFG)
    for checkpoint in ("day-0", "day-1"):
        assert _kernel_cc(run, checkpoint) == run.expected[checkpoint]
        for host, cc in run.expected[checkpoint].items():
            # every flow the host started while its arm surely held ran the arm's CC
            assert set(held[checkpoint][host]) == {cc}, held


@pytest.mark.lab
@pytest.mark.slow
def test_stopping_the_experiment_restores_every_host(run):
    hosts = host_ids(CFG.hosts)
    assert run.expected["stopped"] == dict.fromkeys(hosts, CFG.default_cc)
    assert _kernel_cc(run, "stopped") == dict.fromkeys(hosts, CFG.default_cc)
    held = flows_in_checkpoints(run, CFG)["stopped"]
    assert all(set(held[h]) <= {CFG.default_cc} for h in hosts), held
    assert _kernel_cc(run, "after-exit") == dict.fromkeys(hosts, CFG.default_cc)
    flows = run.guest["experiments"]["fleet"]["flows"]
    for host in hosts:  # each host's finished flows ran its own CC and both arms'
        assert {CFG.default_cc, CONTROL, TREATMENT} <= set(flows[host]), flows


@pytest.mark.lab
@pytest.mark.slow
def test_results_give_both_arms_on_both_days(run):
    days = {d["day"]: d for d in run.results["days"]}
    start = dt.date.fromisoformat(run.experiment["start"][:10])
    for k, period in ((0, 0), (1, 1)):
        day = days[(start + dt.timedelta(days=k)).isoformat()]
        assert day["period"] == period
        assert {a["arm"]: a["flows"] > 0 for a in day["arms"]} == {CONTROL: True, TREATMENT: True}
    assert run.results["overall"]["differences"][0]["method"] == "crossover"
    text = render(run, CFG, "gemini-lab abtest")
    assert "| day-1 |" in text and TREATMENT in text
