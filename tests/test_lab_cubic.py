"""Booster tunes Linux CUBIC in the lab (``gemini-lab cubic``, short): through an experiment, a
cubic policy searches β from one lab host's real cubic flows in a qemu guest on day 0 and then
runs its incumbent; the kernel's defaults run on day 1.

Asserted are the mechanics, read from the guest kernel and Booster's store, never the figures
(the guest runs under emulation on a busy machine; the measured comparison is recorded by
``gemini-lab cubic --record`` in benchmarks/results/cubic-tune.md): the agent wrote the
policy's θ into /sys/module/tcp_cubic/parameters, every flow ran cubic, the policy stored the
cubic flows as trials of the θ that ran, the default arm ran the kernel's values, and the
kernel's values are back after the agent's exit.
"""

from __future__ import annotations

import datetime as dt

import pytest

from gemini_api.datapaths import load_datapath
from gemini_booster.experiments.domain import ExperimentCreate
from gemini_booster.models import PolicyCreate
from gemini_lab.abtest import next_boundary
from gemini_lab.cubic import (
    BASELINE_CC,
    DEFAULT_ARM,
    HOST,
    TRIAL_CC,
    TUNED_ARM,
    CubicConfig,
    experiment_body,
    render,
    run_cubic,
    search_bounds,
)
from tests.labkit import fleet_run

CUBIC = load_datapath("cubic")
DEFAULTS = CUBIC.default()  # the kernel's own values (tests/test_cubic_datapath.py)
# Short: two-minute days, four search reports and about five intervals of the incumbent.
CFG = CubicConfig(search_reports=4, n_initial_points=3, day_s=120, boot_timeout_s=600)


def test_the_policy_and_the_experiment_are_ones_booster_accepts():
    bounds = search_bounds(CFG)
    assert bounds["beta"] == CUBIC.region_bounds("production")["beta"]
    assert all(bounds[n] == (DEFAULTS[n], DEFAULTS[n]) for n in CUBIC.names if n != "beta")
    PolicyCreate(name="p", target_cc="cubic", region="custom", bounds=bounds)
    start = next_boundary(dt.datetime.now(dt.UTC) + dt.timedelta(hours=1), CFG.day_s)
    spec = ExperimentCreate.model_validate(experiment_body("lab-cubic", "p", start, CFG))
    assert [(a.name, a.cc, a.params) for a in spec.arms] == [
        (DEFAULT_ARM, "cubic", "kernel_default"),
        (TUNED_ARM, "cubic", "policy"),
    ]
    assert spec.crossover_day == start.date() + dt.timedelta(days=1)


@pytest.fixture(scope="module")
def run(tmp_path_factory, pg_admin_url):
    return fleet_run(run_cubic, pg_admin_url, tmp_path_factory.mktemp("cubic"), CFG)


@pytest.mark.lab
@pytest.mark.slow
def test_the_agent_wrote_the_policys_theta_into_the_guest_kernel(run):
    reported = {CUBIC.key(t["theta"]) for t in run.trials}
    published = [i["theta"] for i in run.incumbents]
    assert (run.arms["day-0"], run.arms["day-1"]) == (TUNED_ARM, DEFAULT_ARM)
    for label in ("search", "day-0"):
        theta = run.readings[label]["cubic"]
        # what the guest's sysfs held is a θ the policy's trials were reported under
        assert CUBIC.key(theta) in reported, (label, theta, reported)
        lo, hi = search_bounds(CFG)["beta"]
        assert lo <= theta["beta"] <= hi
    tuned = run.readings["day-0"]["cubic"]
    assert tuned in published  # an incumbent Booster published ran on the tuned day
    # every θ the tuned arm's compared intervals ran was an incumbent (with exploration off,
    # a refit on the new flows may still move it)
    assert set(run.phases[TUNED_ARM]["theta_keys"]) <= {CUBIC.key(t) for t in published}


@pytest.mark.lab
@pytest.mark.slow
def test_every_flow_ran_cubic(run):
    fleet = run.guest["experiments"]["fleet"]
    ran = fleet["flows"][HOST]  # by the CC each finished flow's socket ran
    assert ran.get("cubic", 0) > 0 and set(ran) - {"failed"} == {"cubic"}, ran
    assert all(r["sysctl"] == "cubic" for r in run.readings.values())


@pytest.mark.lab
@pytest.mark.slow
def test_the_policy_received_the_cubic_flows_sums(run):
    assert sum(t["flows"] for t in run.trials) > 0
    assert all(set(t["theta"]) == set(CUBIC.names) for t in run.trials)
    # the tuned day's flows came as the policy's trials, the default day's as cubic baselines
    assert run.phases[TUNED_ARM]["flows"] > 0 and run.phases[TUNED_ARM]["stray_flows"] == 0
    assert run.phases[DEFAULT_ARM]["flows"] > 0 and run.phases[DEFAULT_ARM]["stray_flows"] == 0
    assert {TRIAL_CC, BASELINE_CC} <= {r["cc"] for r in run.intervals}
    days = run.results["days"]
    arms = {a["arm"] for d in days for a in d["arms"] if a["flows"] > 0}
    assert arms == {DEFAULT_ARM, TUNED_ARM}, days
    # the results endpoint counts the tuned arm's trial flows too (its day includes the search)
    tuned = sum(a["flows"] for d in days for a in d["arms"] if a["arm"] == TUNED_ARM)
    assert tuned >= run.phases[TUNED_ARM]["flows"], days


@pytest.mark.lab
@pytest.mark.slow
def test_the_default_arm_and_the_agents_exit_restore_the_kernels_values(run):
    assert run.readings["day-1"]["cubic"] == DEFAULTS  # the default arm
    assert run.readings["ended"]["cubic"] == DEFAULTS  # back on its own (Fusion) policy
    assert run.readings["after-exit"]["cubic"] == DEFAULTS
    text = render(run, CFG, "gemini-lab cubic")
    assert "| cubic-tuned |" in text and "| after-exit |" in text
