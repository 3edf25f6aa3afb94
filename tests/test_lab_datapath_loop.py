"""The closed loop (agent → Booster → agent → kernel) with a GEMINI policy and a DC-Vegas policy
in the lab (issue #31): gemini_lab.cubic's loop generalised to any datapath of the registry
(gemini_lab.datapath_loop), short.

For each datapath, in a qemu guest (Debian's kernel, the module built for it): the guest loads
the module, one lab host runs the datapath's CC, a policy of that datapath searches one θ
parameter through an experiment (the datapath tuned on day 0, its defaults on day 1). GEMINI
and DC-Vegas run per context as Fusion does: the agent installs Booster's θ in the module's own
profile table (a rule for the loop's destination) and net.<name>.* sysctls, and reports each
flow from the module's record with the θ it ran. Asserted are the mechanics, read from the
guest kernel (the lab host's namespace: its table dumped over the module's netlink family and
its sysctls, gemini_lab.cubic_guest.table_dump) and Booster's store, never the figures (qemu's
emulation on a busy machine): the table gave the loop's destination the policy's θ, every flow
ran the datapath's CC, the policy stored the flows as trials of the θ the records carried, the
default arm ran the spec's defaults, and the defaults are what the namespace runs after the
experiment and the agent's exit.

Each datapath's loop runs in a process of its own (the ``run`` fixture): run one after the
other in one process, the second run's guest found Booster unreachable (UNAVAILABLE) for its
whole boot (benchmarks/results/datapaths-loop.md).
"""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from gemini_api.datapaths import datapath
from gemini_lab.cubic import (
    CubicConfig,
    CubicResult,
    reading_params,
    render,
    run_cubic,
    search_bounds,
    theta_for,
)
from gemini_lab.datapath_loop import LOOPS, loop_config
from tests.conftest import OPERATOR, free_port, lab_fleet_settings, new_database
from tests.labkit import guest_kernel

NAMES = tuple(LOOPS)
# The loops run: the first by default (a qemu loop costs about 7 minutes of CI's lab tier, and
# every loop runs the same registry-driven code); GEMINI_LAB_LOOPS=gemini,dcvegas runs more.
# Both were run and recorded (benchmarks/results/datapaths-loop.md).
RUN = tuple(os.environ.get("GEMINI_LAB_LOOPS", NAMES[0]).split(","))
# Short, as tests/test_lab_cubic.py: two-minute days, four search reports.
BASE = CubicConfig(search_reports=4, n_initial_points=3, day_s=120, boot_timeout_s=600)


def test_each_loop_searches_one_parameter_of_its_datapaths_spec():
    for name in NAMES:
        cfg = loop_config(name, BASE)
        spec = datapath(name).spec
        bounds = search_bounds(cfg)
        assert set(bounds) == set(spec.names)
        (tuned,) = cfg.tuned
        assert bounds[tuned] == spec.region_bounds("production")[tuned]
        assert cfg.arms() == (f"{name}-default", f"{name}-tuned")


def test_a_reading_gives_the_destination_the_theta_of_its_longest_rule():
    table = {
        "sysctls": {"k": 1},
        "rules": [["0.0.0.0/0", {"k": 2}], ["10.1.0.0/16", {"k": 3}], ["10.1.0.0/24", {"k": 4}]],
    }
    assert theta_for(table, "10.1.0.2") == {"k": 4}
    assert theta_for(table, "10.1.7.2") == {"k": 3}
    assert theta_for(table, "10.2.0.2") == {"k": 2}
    assert theta_for({"sysctls": {"k": 1}, "rules": []}, "10.1.0.2") == {"k": 1}  # no table yet
    assert reading_params({"tables": {"gemini": table}}, "gemini", "10.1.0.2") == {"k": 4}


def _run_loop(name: str, admin_url: str, port: int, out_dir: Path) -> CubicResult:
    """One datapath's loop, in a process of its own (see ``run``)."""
    cfg = loop_config(name, BASE)
    settings = lab_fleet_settings(new_database(admin_url))
    return run_cubic(settings, port, OPERATOR, out_dir, cfg)


@pytest.fixture(scope="module", params=RUN)
def run(request, tmp_path_factory, pg_admin_url):
    """Each datapath's loop runs in a fresh process: run one after the other in one process,
    the second run's guest found Booster unreachable for its whole boot (not understood yet;
    each alone passes), so that a test process holds no state of an earlier loop."""
    guest_kernel()  # skipped where none is installed
    out_dir = tmp_path_factory.mktemp(f"loop-{request.param}")
    spawn = multiprocessing.get_context("spawn")
    with spawn.Pool(1) as pool:
        result = pool.apply(_run_loop, (request.param, pg_admin_url, free_port(), out_dir))
    return request.param, loop_config(request.param, BASE), result


@pytest.mark.lab
@pytest.mark.slow
def test_the_module_loaded_and_the_agent_wrote_the_policys_theta_into_it(run):
    name, cfg, r = run
    spec = datapath(name).spec
    load = r.guest["experiments"]["load"]
    assert load["insmod"]["rc"] == 0 and datapath(name).cc in load["available"], load
    assert load["params"] == spec.default()
    # the θ went into the namespace's own table, each reading a dump of it (a version the
    # module gave, the catch-all on the namespace's default)
    for label in ("search", "day-0"):
        table = r.readings[label]["tables"][name]
        assert table["version"] > 0 and {"0.0.0.0/0", "::/0"} <= {p for p, _ in table["rules"]}
        assert theta_for(table, "0.0.0.0") == table["sysctls"], table
    default_arm, tuned_arm = cfg.arms()
    assert (r.arms["day-0"], r.arms["day-1"]) == (tuned_arm, default_arm)
    reported = {spec.key(t["theta"]) for t in r.trials}
    (tuned,) = cfg.tuned
    lo, hi = search_bounds(cfg)[tuned]
    for label in ("search", "day-0"):
        theta = reading_params(r.readings[label], name)
        assert spec.key(theta) in reported, (label, theta, reported)
        assert lo <= theta[tuned] <= hi
    assert reading_params(r.readings["day-0"], name) in [i["theta"] for i in r.incumbents]


@pytest.mark.lab
@pytest.mark.slow
def test_every_flow_ran_the_datapaths_cc_and_came_back_as_its_trials(run):
    name, cfg, r = run
    cc = datapath(name).cc
    ran = r.guest["experiments"]["fleet"]["flows"]["lab-host-0"]
    assert ran.get(cc, 0) > 0 and set(ran) - {"failed"} == {cc}, ran
    assert all(reading["sysctl"] == cc for reading in r.readings.values())
    assert sum(t["flows"] for t in r.trials) > 0
    default_arm, tuned_arm = cfg.arms()
    assert r.phases[tuned_arm]["flows"] > 0 and r.phases[tuned_arm]["stray_flows"] == 0
    assert r.phases[default_arm]["flows"] > 0 and r.phases[default_arm]["stray_flows"] == 0


@pytest.mark.lab
@pytest.mark.slow
def test_the_default_arm_and_the_agents_exit_leave_the_spec_defaults_running(run):
    name, cfg, r = run
    defaults = datapath(name).spec.default()
    for label in ("day-1", "ended", "after-exit"):
        assert reading_params(r.readings[label], name) == defaults, label
    text = render(r, cfg, f"gemini-lab datapath-loop --datapath {name}")
    assert f"| {name}-tuned |" in text and "| after-exit |" in text
