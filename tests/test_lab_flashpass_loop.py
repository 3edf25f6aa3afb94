"""FlashPass as a Booster datapath, closed (issue #36): Booster (real, on PostgreSQL) with a policy
that tunes FlashPass; the agent (the daemon's own Agent: its GetParameters, its θ-file writer,
the flow sources of its make_sources, its report) writes Booster's θ to FlashPass's θ file;
FlashPass flows in the UML lab read it at their start and append their records to the flow log
beside it; the agent reads them back and reports them; Booster stores them as trials of the θ
they ran.

Where each part runs. The UML guest has no network to this machine, and its clock is simulated
(time travel: a guest waiting on Booster would see its deadlines pass in one jump), so Booster
and the agent run here, and FlashPass's hosts (senders, switch port, receiver) in the guest.
The two share the θ file and its flow log through the lab's output directory (hostfs), as the
agent and the transport share /etc/gemini on a host. The agent writes θ before the guest
boots, tails the log while the guest's flows append to it, and reports after the guest exits.

The policy's region keeps every parameter away from the spec's default (Booster's default for
it is then the spec's default moved into the region), so a flow that ran Booster's θ cannot
have run the file-less default by chance. About 60 s of wall time (one guest boot, three
100 kB flows), most of it the guest's Python starting under UML.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gemini_agent.config import AgentSettings
from gemini_agent.daemon import Agent
from gemini_agent.datapath import ConfigFile
from gemini_agent.flowlog import FlowLogSource
from gemini_agent.writeback import Kernel
from gemini_api.datapaths import datapath
from gemini_lab.flashpass.sender import flow_log
from gemini_lab.flashpass.theta import read_theta_file
from gemini_lab.uml import run_in_uml
from tests.conftest import AGENT, OPERATOR, auth, new_database, serve
from tests.labkit import skip_if_lab_missing
from tests.sysctls import fusion_sysctls

pytestmark = [pytest.mark.lab, pytest.mark.slow]

DP = datapath("flashpass")
POLICY = "flashpass-lab"
# every bound away from the spec's default (10, 100, 400): T_wait 50–60 ms (the path's RTT is
# 20 ms), the loss band 0.5–0.8 % to 15–20 %
BOUNDS = {"min_target_loss": [5, 8], "max_target_loss": [150, 200], "t_wait": [500, 600]}
FLOWS = 3
FLOW_BYTES = 100_000
PLAN = {
    "rate_kbit": 10_000,
    "data_buffer_packets": 16,
    "rtt_ms": 20,
    "flows": [{"flow": i + 1, "bytes": FLOW_BYTES, "start_ms": 50 * i} for i in range(FLOWS)],
    "theta_file": "flashpass.toml",
}
NS_PER_S = 1_000_000_000
DEADLINE_S = 60.0  # the agent's poll of the log, Booster's ingest: seconds at most, on a busy host


def until(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {DEADLINE_S:.0f} s")
        time.sleep(0.1)


@dataclass
class Loop:
    answered: dict[str, int]  # Booster's θ for the host, from its GetParameters answer
    file_theta: dict[str, int]  # what the θ file held when the guest booted
    file_version: int  # its mtime_ns
    records: list[dict]  # the flow log's lines
    result: dict  # the guest's run (gemini_lab.flashpass.lab)
    agent_flows: float  # gemini_agent_flows_total{source=flashpass}
    trials: list[dict]  # Booster's trials of the policy (REST)
    left: bool  # the θ file after the agent's exit: restored (absent)


# the agent's settings but for where Booster is and its own directories
AGENT_SETTINGS = {"host_id": "flashpass-lab-host", "policy": POLICY, "token": AGENT}
AGENT_SETTINGS |= {"rpc_deadline_s": 10, "staleness_s": 3600}


def _agent(tmp: Path, target: str, theta_file: Path) -> Agent:
    where = {"spool_dir": tmp / "spool", "sysctl_root": tmp / "net-fusion"}
    settings = AgentSettings(booster_address=target, **where, **AGENT_SETTINGS)
    kernel = Kernel(fusion_sysctls(tmp), use_netlink=False)  # Fusion is not run here
    return Agent(settings, kernel=kernel, module_params={DP.name: ConfigFile(DP.spec, theta_file)})


def _guest(out: Path) -> dict:
    (out / "plan.json").write_text(json.dumps(PLAN))
    command = (
        f"{sys.executable} -m gemini_lab.flashpass.lab "
        '"$GEMINI_LAB_OUT/plan.json" "$GEMINI_LAB_OUT/result.json"'
    )
    with skip_if_lab_missing():
        guest = run_in_uml(command, out, timeout_s=600)
    result = out / "result.json"
    assert result.exists(), f"guest rc {guest.returncode}:\n{guest.console[-3000:]}"
    return json.loads(result.read_text())


def _flows_seen(agent: Agent) -> float:
    value = agent.metrics.registry.get_sample_value("gemini_agent_flows_total", {"source": DP.name})
    return value or 0.0


def _run(tmp: Path, out: Path, pg_admin_url: str) -> Loop:
    theta_file = out / PLAN["theta_file"]
    with serve(new_database(pg_admin_url), refit_interval_s=2) as booster:
        body = {"name": POLICY, "datapath": DP.name, "region": "custom", "bounds": BOUNDS}
        r = booster.http.post("/v1/policies", json=body, headers=auth(OPERATOR))
        assert r.status_code == 201, r.text
        agent = _agent(tmp, booster.grpc_target, theta_file)
        agent.refresh_theta()  # Booster's θ into the file
        answered = dict(agent.aggregator.datapath_theta.values)  # type: ignore[union-attr]
        read = read_theta_file(theta_file)
        sources = agent.make_sources()
        assert any(isinstance(s, FlowLogSource) for s in sources)
        for s in sources:
            s.start()
        try:
            result = _guest(out)
            until(lambda: _flows_seen(agent) >= FLOWS, "the agent reading every flow's record")
        finally:
            for s in sources:
                s.stop()
        agent.tick()  # the interval's report to Booster
        trials_url = f"/v1/policies/{POLICY}/trials"

        def stored() -> list[dict]:
            return booster.http.get(trials_url, headers=auth(OPERATOR)).json()

        until(lambda: sum(t["flows"] for t in stored()) >= FLOWS, "Booster storing the trials")
        trials = stored()
        flows_seen = _flows_seen(agent)
        for params in agent.module_params.values():
            params.restore()  # as the agent's clean exit does
    records = [json.loads(line) for line in flow_log(theta_file).read_text().splitlines()]
    return Loop(
        answered,
        read.units,
        read.version,
        records,
        result,
        flows_seen,
        trials,
        not theta_file.exists(),
    )


@pytest.fixture(scope="module")
def loop(tmp_path_factory: pytest.TempPathFactory, pg_admin_url: str) -> Iterator[Loop]:
    tmp, out = tmp_path_factory.mktemp("agent"), tmp_path_factory.mktemp("flashpass-loop")
    yield _run(tmp, out, pg_admin_url)


def test_the_agent_wrote_boosters_theta_inside_the_policys_region(loop: Loop) -> None:
    assert loop.file_theta == loop.answered != DP.spec.default()
    for name, (lo, hi) in BOUNDS.items():
        assert lo <= loop.answered[name] <= hi, name


def test_every_flow_ran_the_files_theta_and_delivered_its_bytes(loop: Loop) -> None:
    assert loop.result["sender_rc"] == [0] * FLOWS
    assert len(loop.records) == FLOWS
    for rec in loop.records:
        assert rec["finished"] and rec["bytes_delivered"] == FLOW_BYTES
        assert rec["theta"] == loop.answered
        # the file the agent wrote, no other (hostfs shows the guest whole seconds of its time)
        assert rec["theta_version"] // NS_PER_S == loop.file_version // NS_PER_S > 0
        assert rec["duration_us"] >= loop.answered["t_wait"] * 100  # data waits T_wait
    for sender in loop.result["senders"]:  # the senders' own logs: they ran that T_wait
        assert sender["t_wait_ns"] == loop.answered["t_wait"] * 100_000


def test_the_agent_reported_them_and_booster_stored_them_as_trials_of_that_theta(
    loop: Loop,
) -> None:
    assert loop.agent_flows == FLOWS
    assert [(t["theta"], t["flows"]) for t in loop.trials] == [(loop.answered, FLOWS)]
    (trial,) = loop.trials
    assert trial["mean_throughput_mbps"] > 0


def test_the_agents_exit_takes_its_theta_file_back(loop: Loop) -> None:
    assert loop.left  # there was none before: the flows after it run the spec's default
