"""The agent's flow-log source (gemini_agent.flowlog, issue #36): a user-space transport's log of
finished flows (FlashPass's prototype, ``records = "flow_log"``) tailed from real files, each
line the prototype's own writer wrote (gemini_lab.flashpass.sender.flow_record/append_record)
turned into a flow of its datapath, and the aggregator's report of those flows: FlashPass's
trials in its DatapathTheta when the policy tunes FlashPass, baselines of its CC otherwise."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gemini_agent.aggregator import Aggregator, Flow
from gemini_agent.config import AgentSettings
from gemini_agent.context import ContextResolver, Place
from gemini_agent.daemon import Agent
from gemini_agent.datapath import ConfigFile
from gemini_agent.flowlog import MALFORMED, FlowLogSource, flow_from_line
from gemini_agent.metrics import AgentMetrics
from gemini_agent.writeback import Kernel
from gemini_api.datapaths import datapath
from gemini_api.fusion_genl import FusionError
from gemini_lab.flashpass.sender import append_record, flow_log, flow_record
from gemini_lab.flashpass.theta import read_theta_file
from tests.sysctls import fusion_sysctls

DP = datapath("flashpass")
TUNED = {"min_target_loss": 5, "max_target_loss": 200, "t_wait": 600}
DST = "10.61.0.2"
FLOW_BYTES = 300_000
DEADLINE_S = 10.0


def sender_report(flow: int, *, finished: bool = True) -> dict:
    """What gemini_lab.flashpass.sender.Sender.run returns, for the fields a record takes:
    credits (emulation seq, its send time, arrival) 20–30 ms apart, 3 emulation packets lost."""
    credits = [(i, i * 1_000_000, i * 1_000_000 + 20_000_000 + i * 1_000_000) for i in range(11)]
    return {
        "flow": flow,
        "dst": DST,
        "bytes": FLOW_BYTES,
        "finished": finished,
        "duration_ns": 450_000_000,
        "end_unix_ns": time.time_ns(),
        "credits": credits,
        "retransmits": 1,
        "emulation_out": 14,
    }


@pytest.fixture
def theta_file(tmp_path: Path) -> Path:
    """The θ file as the agent's writer leaves it, in a directory of its own."""
    path = tmp_path / "etc" / "flashpass.toml"
    path.parent.mkdir()
    ConfigFile(DP.spec, path).write(TUNED)
    return path


def append(theta_file: Path, flow: int, **kw: bool) -> None:
    """One finished flow's line, as the sender appends it after running the file's θ."""
    append_record(flow_log(theta_file), flow_record(sender_report(flow, **kw), read(theta_file)))


def read(theta_file: Path):
    return read_theta_file(theta_file)


def source(theta_file: Path, log_every_s: float = 60.0) -> tuple[FlowLogSource, list[Flow]]:
    got: list[Flow] = []
    src = FlowLogSource(got.append, AgentMetrics(), DP, flow_log(theta_file), log_every_s)
    return src, got


def dropped(src: FlowLogSource) -> float:
    value = src.metrics.registry.get_sample_value(
        "gemini_agent_records_dropped_total", {"where": MALFORMED}
    )
    return value or 0.0


def test_a_record_becomes_a_flow_of_flashpass_with_the_theta_and_version_it_ran(
    theta_file: Path,
) -> None:
    append(theta_file, 7)
    (line,) = flow_log(theta_file).read_text().splitlines()
    flow = flow_from_line(line, DP)
    assert (flow.datapath, flow.cc, flow.dst) == ("flashpass", "", DST)
    assert flow.theta == TUNED and flow.theta_version == theta_file.stat().st_mtime_ns
    assert flow.stats.bytes_acked == FLOW_BYTES and flow.stats.duration_us == 450_000
    # credit round trips of 20..30 ms: mean 25, min 20
    assert (flow.stats.rtt_avg_us, flow.stats.rtt_min_us) == (25_000, 20_000)
    assert abs(flow.ended - dt.datetime.now(dt.UTC)) < dt.timedelta(seconds=60)
    record = json.loads(line)
    assert (record["retransmits"], record["emulation_lost"]) == (1, 3)


def test_the_log_is_read_from_its_end_at_start_then_each_new_line_once(theta_file: Path) -> None:
    append(theta_file, 1)  # a previous agent's to report
    src, got = source(theta_file)
    src.poll()
    assert got == []
    append(theta_file, 2)
    append(theta_file, 3)
    src.poll()
    src.poll()
    assert len(got) == 2 and all(f.theta == TUNED for f in got)


def test_a_log_that_appears_later_is_read_from_its_start(theta_file: Path) -> None:
    src, got = source(theta_file)
    src.poll()
    append(theta_file, 1)
    src.poll()
    assert len(got) == 1


def test_a_partial_last_line_waits_for_its_newline(theta_file: Path) -> None:
    src, got = source(theta_file)
    append(theta_file, 1)
    log = flow_log(theta_file)
    whole = log.read_bytes()
    log.write_bytes(whole[:40])  # a write the file system split: its first part only
    src.poll()
    assert got == [] and dropped(src) == 0
    with log.open("ab") as f:
        f.write(whole[40:])
    src.poll()
    assert len(got) == 1 and dropped(src) == 0


def test_a_rotated_log_is_read_to_its_end_then_the_new_one_from_its_start(
    theta_file: Path,
) -> None:
    src, got = source(theta_file)
    append(theta_file, 1)
    src.poll()
    append(theta_file, 2)  # after the last poll, before the rotation
    log = flow_log(theta_file)
    log.rename(log.with_suffix(".flows.1"))
    append(theta_file, 3)  # the new file
    src.poll()
    assert len(got) == 3


def test_a_truncated_log_is_read_again_from_its_start(theta_file: Path) -> None:
    src, got = source(theta_file)
    for flow in (1, 2):
        append(theta_file, flow)
    src.poll()
    os.truncate(flow_log(theta_file), 0)
    append(theta_file, 3)  # shorter than what was read
    src.poll()
    assert len(got) == 3


def test_a_line_that_is_no_record_is_counted_and_logged_once_per_interval(
    theta_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = flow_log(theta_file)
    src, got = source(theta_file, log_every_s=3600)
    good = flow_record(sender_report(1), read(theta_file))
    bad = [
        "not json",
        "[1, 2]",
        json.dumps({k: v for k, v in good.items() if k != "duration_us"}),
        json.dumps(good | {"theta": TUNED | {"max_target_loss": 950}}),  # outside Θ'
        json.dumps(good | {"dst": "somewhere"}),
        json.dumps(good | {"bytes_delivered": True}),
    ]
    with caplog.at_level(logging.WARNING, logger="gemini_agent.flowlog"):
        with log.open("a") as f:
            f.write("\n".join(bad) + "\n")
        append(theta_file, 2)
        src.poll()
        assert dropped(src) == len(bad) and len(got) == 1  # the good line still gets through
        (warning,) = caplog.records
        assert f"{len(bad)} line(s)" in warning.getMessage() and "not JSON" in warning.getMessage()
        with log.open("a") as f:
            f.write("more garbage\n")
        src.poll()
        assert dropped(src) == len(bad) + 1 and len(caplog.records) == 1  # not again this interval


def test_the_aggregator_reports_flashpass_flows_as_its_trials_when_the_policy_tunes_it(
    theta_file: Path,
) -> None:
    src, got = source(theta_file)
    append(theta_file, 1)
    append(theta_file, 2)
    append(theta_file, 3, finished=False)  # gave up: no bytes it knows of
    src.poll()
    agg = Aggregator(ContextResolver(Place("lab", "isp"), None), "h", "fp")
    agg.tuned = DP.name
    for flow in got:
        agg.add(flow)
    report = agg.close_interval(0, 1)
    assert report is not None and agg.skipped == 1
    (a,) = report.aggregates
    assert a.cc == "" and a.datapath_theta.datapath == "flashpass"
    assert dict(a.datapath_theta.values) == TUNED
    assert a.theta_version == theta_file.stat().st_mtime_ns and a.flow_count == 2


def test_under_a_policy_of_another_datapath_flashpass_flows_are_its_ccs_baseline(
    theta_file: Path,
) -> None:
    src, got = source(theta_file)
    append(theta_file, 1)
    src.poll()
    agg = Aggregator(ContextResolver(Place("lab", "isp"), None), "h", "fusion-policy")
    agg.add(got[0])  # the policy tunes Fusion, the default
    report = agg.close_interval(0, 1)
    assert report is not None
    (a,) = report.aggregates
    assert a.cc == DP.cc and not a.HasField("datapath_theta") and not a.HasField("theta")


def _agent(tmp_path: Path, theta_file: Path) -> Agent:
    settings = AgentSettings(
        host_id="h", policy="fp", spool_dir=tmp_path / "spool", sysctl_root=tmp_path / "x"
    )
    kernel = Kernel(fusion_sysctls(tmp_path), use_netlink=False)
    return Agent(settings, kernel=kernel, module_params={DP.name: ConfigFile(DP.spec, theta_file)})


def test_the_agent_tails_the_log_beside_the_file_it_writes_theta_to(
    tmp_path: Path, theta_file: Path
) -> None:
    """With FlashPass installed (its θ file's directory there), its log is a flow source, also
    on a host without Fusion's module (this machine); without it, nothing changes."""
    agent = _agent(tmp_path, theta_file)
    (src,) = [s for s in agent.make_sources() if isinstance(s, FlowLogSource)]
    assert src.tail.path == theta_file.parent / "flashpass.flows"
    assert src.log_every_s == agent.s.interval_s
    other = tmp_path / "other-host"
    other.mkdir()
    agent = _agent(other, other / "not-installed" / "flashpass.toml")
    with pytest.raises(FusionError, match="sockdiag"):  # no source at all: it stops, as before
        agent.make_sources()


def until(done: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + DEADLINE_S
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_the_source_thread_hands_each_flow_to_the_aggregator_and_stops(theta_file: Path) -> None:
    got: list[Flow] = []
    src = FlowLogSource(got.append, AgentMetrics(), DP, flow_log(theta_file), 60, poll_s=0.01)
    src.start()
    try:
        append(theta_file, 1)
        assert until(lambda: len(got) == 1)
    finally:
        src.stop()
        src.join(timeout=DEADLINE_S)
    assert not src.is_alive()
    value = src.metrics.registry.get_sample_value(
        "gemini_agent_flows_total", {"source": "flashpass"}
    )
    assert value == 1
