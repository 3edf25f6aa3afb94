"""FlashPass's prototype in parts (issue #36): Algorithm 2, the wire format, θ from the file the
agent writes (and refused outside Θ'), the switch port's tc commands, the receiver's answers,
and one flow over the host's loopback (real UDP sockets, no qdiscs: the lab test,
tests/test_lab_flashpass.py, puts the switch between them)."""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import pytest

from gemini_agent.daemon import host_datapaths
from gemini_agent.datapath import ConfigFile, ModuleParams, host_writer
from gemini_api.datapaths import Apply, Records, datapath
from gemini_api.theta import ThetaError
from gemini_lab.flashpass import evaluate, wire
from gemini_lab.flashpass.control import EmulationRate
from gemini_lab.flashpass.receiver import Receiver
from gemini_lab.flashpass.sender import Sender, append_record, flow_log, flow_record, payload
from gemini_lab.flashpass.switch import EMULATION_WIRE, SwitchPort
from gemini_lab.flashpass.theta import Theta, read_theta, read_theta_file
from gemini_lab.flashpass.wire import Kind, Packet, WireError

DP = datapath("flashpass")


def _rate() -> EmulationRate:
    return EmulationRate(1000.0, min_target_loss=0.01, max_target_loss=0.10)


def test_algorithm_2_cuts_to_what_survived_above_the_band() -> None:
    r = _rate()
    assert r.rate_pps == 1000.0  # starts at the maximum
    assert r.update(100, 60, 1.0) == pytest.approx(1000 * 0.6 * 1.01)


def test_algorithm_2_grows_below_the_band_up_to_the_maximum_and_holds_inside_it() -> None:
    r = _rate()
    r.update(100, 50, 1.0)
    held = r.rate_pps
    assert r.update(100, 95, 1.0) == held  # 5 % loss: inside [1 %, 10 %]
    assert r.update(100, 100, 1.0) == pytest.approx(held * 1.1)
    for _ in range(20):
        r.update(100, 100, 1.0)
    assert r.rate_pps == 1000.0
    assert r.update(0, 0, 1.0) == 1000.0  # nothing sent: nothing learnt
    assert r.update(2, 0, 50.0) == 50.0  # all lost: the floor, one packet per RTT


def test_algorithm_2_refuses_a_band_upside_down() -> None:
    with pytest.raises(ValueError, match="min < max"):
        EmulationRate(1000.0, min_target_loss=0.2, max_target_loss=0.1)


def test_packets_round_trip_and_a_foreign_datagram_is_named() -> None:
    p = Packet(Kind.DATA, 7, 42, 123_456, 99, payload(7, 42))
    assert Packet.decode(p.encode()) == p
    assert len(p.encode()) + wire.IP_UDP_HEADER == wire.DATA_IP_BYTES
    assert len(wire.emulation(1, 2, 3)) + wire.IP_UDP_HEADER == wire.EMULATION_IP_BYTES
    with pytest.raises(WireError, match="shorter than the header"):
        Packet.decode(b"\x01\x02")
    with pytest.raises(WireError, match="unknown packet kind 9"):
        Packet.decode(bytes([9]) + bytes(wire.HEADER.size - 1))


def test_the_receiver_credits_each_emulation_packet_and_answers_probes() -> None:
    r = Receiver.__new__(Receiver)
    r.flows = {}
    credit = r.handle(Packet(Kind.EMULATION, 1, 5, 777), tos=0x02)
    assert credit == Packet(Kind.CREDIT, 1, 5, 777)
    for seq in (0, 2):
        assert r.handle(Packet(Kind.DATA, 1, seq, 0, 3, payload(1, seq)), tos=0) is None
    nack = r.handle(Packet(Kind.PROBE, 1, 0), tos=0)
    assert nack is not None and wire.nack_missing(nack.body) == [1]
    done = r.handle(Packet(Kind.DATA, 1, 1, 0, 3, payload(1, 1)), tos=0)
    assert done == Packet(Kind.DONE, 1, 0)
    assert r.report()["1"] == {
        "total": 3,
        "received": 3,
        "bytes": 3 * wire.DATA_PAYLOAD,
        "emulation_in": 1,
        "emulation_ect": 1,
        "corrupt": 0,
        "duplicates": 0,
    }


def test_the_switch_port_is_an_emulation_class_of_its_share_with_single_threshold_red() -> None:
    port = SwitchPort(rate_kbit=10_000, data_buffer_packets=16)
    # the share in the bytes HTB charges (frames with their Ethernet header): 98/(98+1514)
    assert port.emulation_kbit == round(10_000 * 98 / 1612) == 608
    # at that rate the class passes one emulation packet per data frame the rest carries
    pps = port.emulation_kbit * 1000 / (EMULATION_WIRE * 8)
    assert pps * (EMULATION_WIRE + 1514) * 8 == pytest.approx(10e6, rel=1e-3)
    assert wire.max_emulation_pps(10e6) == pytest.approx(pps, rel=1e-3)
    red = port.red_args()
    assert red[red.index("limit") + 1] == str(8 * EMULATION_WIRE)
    assert red[red.index("min") + 1] == str(2 * EMULATION_WIRE)
    assert red[red.index("max") + 1] == str(3 * EMULATION_WIRE)
    assert "ecn" in red and "nodrop" not in red  # non-ECT above the threshold is dropped
    cmds = [" ".join(c) for c in port.commands("eth0")]
    assert any("classid 1:10 htb rate 608kbit ceil 608kbit" in c for c in cmds)
    assert any(f"dport {wire.EMULATION_PORT} 0xffff flowid 1:10" in c for c in cmds)


def test_flashpass_is_a_host_datapath_applied_through_a_config_file() -> None:
    assert (DP.apply, DP.records, DP.spec.scope) == (Apply.CONFIG_FILE, Records.FLOW_LOG, "host")
    for bounds in ("production", "wide"):  # every θ of Θ' has min < max, as Algorithm 2 needs
        b = DP.spec.region_bounds(bounds)
        assert b["min_target_loss"][1] < b["max_target_loss"][0]
    assert Theta.default() == Theta(0.01, 0.10, 0.040)  # the paper's defaults
    assert DP.module == ""  # a user-space transport: no kernel module to load


def test_the_agent_daemon_holds_a_config_file_writer_for_flashpass() -> None:
    """The daemon picks each host-wide datapath's writer by its apply kind, so a policy
    targeting FlashPass reaches the prototype's θ file (and CUBIC's reaches its module)."""
    writers = host_datapaths()
    assert isinstance(writers[DP.name], ConfigFile)
    assert isinstance(writers["cubic"], ModuleParams)
    assert "fusion" not in writers  # the profile table's datapath is applied per context


def test_the_agent_writes_theta_the_prototype_reads_and_restores_the_file(tmp_path: Path) -> None:
    path = tmp_path / "flashpass.toml"
    writer = host_writer(DP)
    assert isinstance(writer, ConfigFile)
    params = ConfigFile(DP.spec, path)
    assert params.available() and params.read() == DP.spec.default()
    params.write({"min_target_loss": 5, "max_target_loss": 200, "t_wait": 1200})
    assert read_theta(path) == Theta(0.005, 0.20, 0.120)
    assert [p.name for p in tmp_path.iterdir()] == ["flashpass.toml"]  # no temporary left
    params.restore()
    assert not path.exists() and read_theta(path) == Theta.default()


def test_a_theta_outside_the_region_is_refused_and_the_file_kept(tmp_path: Path) -> None:
    path = tmp_path / "flashpass.toml"
    params = ConfigFile(DP.spec, path)
    params.write(DP.spec.default())
    before = path.read_text()
    with pytest.raises(ThetaError, match="max_target_loss"):
        params.write({"min_target_loss": 10, "max_target_loss": 950, "t_wait": 400})
    assert path.read_text() == before


def test_the_prototype_refuses_a_theta_file_outside_the_region(tmp_path: Path) -> None:
    path = tmp_path / "flashpass.toml"
    path.write_text("min_target_loss = 10\nmax_target_loss = 100\nt_wait = 0\n")
    with pytest.raises(ThetaError, match="t_wait"):
        read_theta(path)
    path.write_text("min_target_loss = 10\nmax_target_loss = 100\n")
    with pytest.raises(ThetaError, match="t_wait: missing"):
        read_theta(path)
    path.write_text("min_target_loss = [\n")
    with pytest.raises(ThetaError, match=str(path)):
        read_theta(path)


def loopback_flow(theta: Theta, flow: int = 3, size: int = 100_000) -> tuple[dict, dict]:
    """One flow over the host's loopback: the sender's report and what the receiver counted."""
    receiver = Receiver()
    thread = threading.Thread(target=receiver.run)
    thread.start()
    try:
        report = Sender("127.0.0.1", flow, size, theta, 10e6).run()
    finally:
        receiver.stopped = True
        thread.join()
        receiver.close()
    return report, receiver.report()[str(flow)]


def test_a_flow_over_loopback_delivers_every_byte_one_data_packet_per_credit() -> None:
    report, got = loopback_flow(Theta(0.01, 0.1, 0.005))
    assert report["finished"] and got["received"] == got["total"] == report["packets"]
    assert got["corrupt"] == 0
    assert len(report["credits"]) == got["emulation_in"]
    assert len(report["data_sends"]) + report["wasted_credits"] <= len(report["credits"])


def test_a_finished_flows_record_carries_what_a_trial_needs(tmp_path: Path) -> None:
    """The line a flow appends to the flow log: destination, bytes, FCT, the credit round
    trips' mean and minimum, losses, and the θ it read with the file's version."""
    path = tmp_path / "flashpass.toml"
    units = {"min_target_loss": 10, "max_target_loss": 100, "t_wait": 50}  # T_wait 5 ms
    ConfigFile(DP.spec, path).write(units)
    read = read_theta_file(path)
    assert read.units == units and read.version == path.stat().st_mtime_ns > 0
    before = time.time_ns()
    report, got = loopback_flow(read.theta, size=60_000)
    append_record(flow_log(path), flow_record(report, read))
    (line,) = (tmp_path / "flashpass.flows").read_text().splitlines()
    rec = json.loads(line)
    assert (rec["dst"], rec["finished"], rec["bytes_delivered"]) == ("127.0.0.1", True, 60_000)
    assert got["received"] == got["total"]
    assert rec["duration_us"] >= units["t_wait"] * 100  # the first data leaves at T + T_wait
    assert 0 < rec["rtt_min_us"] <= rec["rtt_avg_us"] < rec["duration_us"]
    assert rec["retransmits"] == 0
    assert rec["emulation_lost"] == report["emulation_out"] - len(report["credits"]) >= 0
    assert (rec["theta"], rec["theta_version"]) == (units, read.version)
    assert before <= rec["end_unix_ns"] <= time.time_ns()


def test_without_a_theta_file_a_flow_runs_the_default_at_version_0(tmp_path: Path) -> None:
    read = read_theta_file(tmp_path / "absent.toml")
    assert (read.theta, read.units, read.version) == (Theta.default(), DP.spec.default(), 0)


def test_the_evaluation_runs_the_papers_theta_with_the_settings_asked_and_refuses_others() -> None:
    ap = argparse.ArgumentParser()
    evaluate.options(ap)
    a = ap.parse_args(["--theta", "max_target_loss=200"])
    assert evaluate.flashpass_theta(a.theta) == evaluate.THETA | {"max_target_loss": 200}
    assert evaluate.flashpass_theta([]) == evaluate.THETA == DP.spec.default()
    with pytest.raises(ThetaError, match="max_target_loss"):
        evaluate.flashpass_theta([("max_target_loss", 950)])  # outside Θ'
    with pytest.raises(ThetaError, match="no FlashPass parameter"):
        evaluate.flashpass_theta([("t_wiat", 400)])
    with pytest.raises(SystemExit):
        ap.parse_args(["--theta", "t_wait"])


def test_the_n20_evaluation_draws_20_senders_and_runs_gemini_at_its_scaled_defaults() -> None:
    runs = evaluate.seed_runs(1, senders=20, transports=evaluate.ALL_TRANSPORTS)
    assert [r["transport"] for r in runs] == ["flashpass", "cubic", "bbr", "gemini"]
    assert all(len(r["sender_delays_ms"]) == len(r["flows"]) == 20 for r in runs)
    assert len({json.dumps(r["flows"]) for r in runs}) == 1  # every arm on the same draw
    (gem,) = [r for r in runs if r["transport"] == "gemini"]
    assert gem["datapath"] == datapath("gemini").cc == "gemini"
    assert gem["module_extra"] == {"capacity_mbit": evaluate.RATE_KBIT // 1000}
    assert (
        gem["gemini_theta"]["delay_threshold_us"]
        == 10 * datapath("gemini").spec.default()["delay_threshold_us"]
    )
    assert "datapath" not in runs[1]
    # the record's N = 4 draw is unchanged by the new options
    assert evaluate.seed_runs(1) == evaluate.seed_runs(1, senders=4)[:3]
