"""The whole loop in the lab: Booster here on real PostgreSQL, the agent and tcp_fusion in the
guest kernel, real fusion flows over two netem paths that an .mmdb maps to two regions.
Booster is stopped mid-run and restarted. Needs what the other lab tests need."""

from __future__ import annotations

import itertools

import pytest

from gemini_agent.table import CATCH_ALL
from gemini_api.theta import load_spec
from gemini_lab import cli
from gemini_lab.loop import PATHS, LoopConfig, landscape_table, run_loop
from gemini_lab.netem import receiver_prefix
from tests.conftest import AGENT, free_port, make_settings, new_database
from tests.labkit import guest_kernel

pytestmark = [pytest.mark.lab, pytest.mark.slow]


@pytest.fixture(scope="module")
def loop(tmp_path_factory, pg_admin_url):
    guest_kernel()
    db_url = new_database(pg_admin_url)
    cfg = LoopConfig(kill_after_reports=10, outage_s=20)
    return run_loop(
        lambda listen: make_settings(db_url, grpc_listen=listen, refit_interval_s=2),
        free_port(),
        AGENT,
        tmp_path_factory.mktemp("loop"),
        cfg,
    )


def _agent(loop) -> dict:
    exp = loop.guest["experiments"]["loop"]
    assert "error" not in exp, exp.get("error")
    return exp


def test_no_report_lost_or_doubled_across_a_booster_restart(loop):
    """Every flow the agent counted is stored exactly once: none lost with a report, none
    doubled by a retry. Stored intervals follow each other without overlapping; an interval in
    which no flow ended sends no report, so a gap between two of them is no loss (on a busy
    host a 3 MB flow under qemu can outlast an 8 s interval)."""
    m = _agent(loop)["agent_metrics"]
    assert m.get("gemini_agent_reports_total{outcome=failed}", 0) >= 1, "the outage was not felt"
    assert loop.duplicate_ids == 0
    assert len(loop.intervals) >= m["gemini_agent_reports_total{outcome=spooled}"] >= 12
    for (_, end), (start, _) in itertools.pairwise(loop.intervals):
        assert start >= end, "two stored intervals overlap"
    stored = sum(t["flows"] for rows in loop.trials.values() for t in rows)
    # The metrics are read before the agent stops and sends what its spool holds (its exit
    # drain), the trials after: the last interval's report may still be spooled at the read on
    # a busy host (seen: 1), so the spool gauge is no verdict; the trials holding every flow the
    # agent counted, once, is.
    assert stored == m["gemini_agent_flows_total{source=fusion}"], "flows lost or doubled"


def test_each_context_has_its_own_incumbent_and_only_its_prefix_a_rule(loop):
    """Each path's destination prefix is a context of its own, with an incumbent of its own, and
    the agent's table gives rules to those prefixes only. A prefix gets a rule only when its
    context's θ differs from the default: a context whose incumbent is the default θ rides the
    catch-all (gemini_agent.table.compile_table), and such a context's published incumbent was
    the default at some point of the run. Where the search ends is not asserted: under qemu's
    TCG on the wall clock host load enters the rounds (module comment below), and on a busy
    host no challenger may beat the default with confidence in either context, so both may end
    on it (a clean-clone CI run beside the PostgreSQL tier, 2026-11-29: both incumbents equal).
    The directions are what `gemini-lab loop` records."""
    assert set(loop.incumbents) == {"wired", "lossy"}, loop.incumbents
    table = _agent(loop)["table"]
    rules = dict(table["rules"])
    catch_all = {rules.get(prefix) for prefix in CATCH_ALL.values()}
    assert len(catch_all) == 1 and None not in catch_all, rules
    default = table["profiles"][str(catch_all.pop())]
    own = {receiver_prefix(i): path.scenario.name for i, path in enumerate(PATHS)}
    assert set(rules) - set(CATCH_ALL.values()) <= set(own), rules
    # loop.incumbents come from a refit after the run; the table holds the plans the agent
    # applied during it, so a context on the catch-all is checked against those
    spec = load_spec()
    for prefix, name in own.items():
        if prefix not in rules:
            published = {spec.key(p["incumbent"]) for p in loop.plans if p["region"] == name}
            assert spec.key(default) in published, (name, rules)


# What the loop finds (utility with exploration off against the first rounds, the tuned l on the
# lossy path) is a figure, not a verdict: the guest runs under qemu's TCG on the wall clock, so
# host load enters the rounds as RTT jitter, which is exactly what Fusion's delay signal reads.
# Asserted here it failed in two of three runs on a busy host (a wired path's rounds fell from
# 14.0 to 11.2 with the same θ policy). `gemini-lab loop` records those figures, with the
# command, in benchmarks/results/lab-loop.md; the tests keep to what load cannot change.


def test_convergence_plot_is_written(loop):
    assert loop.plot is not None and loop.plot.stat().st_size > 10_000


def test_landscape_table_gives_each_theta_per_path():
    default = load_spec().default()
    cells = [
        {"theta": {**default, "init_cwnd": 40}, "path": 0, "utilities": [10.0, 12.0]},
        {"theta": {**default, "init_cwnd": 40}, "path": 1, "utilities": [4.0]},
        {"theta": default, "path": 1, "utilities": [3.0, 5.0]},
    ]
    table = landscape_table({"experiments": {"landscape": {"cells": cells}}})
    assert "| init_cwnd 40 | 11.00 ± 1.41 (2) | 4.00 ± 0.00 (1) |" in table, table
    assert "| defaults | — | 4.00 ± 1.41 (2) |" in table, table


def test_landscape_refuses_a_name_that_is_not_a_theta_parameter():
    with pytest.raises(SystemExit, match="'omega' is not one of init_cwnd"):
        cli.main(["landscape", "--theta", "omega=3"])
