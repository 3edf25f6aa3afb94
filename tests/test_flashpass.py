"""FlashPass's prototype in parts (issue #36): Algorithm 2, the wire format, θ from the file the
agent writes (and refused outside Θ'), the switch port's tc commands, the receiver's answers,
and one flow over the host's loopback (real UDP sockets, no qdiscs: the lab test,
tests/test_lab_flashpass.py, puts the switch between them)."""

from __future__ import annotations

import argparse
import json
import socket
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
from gemini_lab.flashpass.sender import (
    ECT0,
    NOT_ECT,
    NS,
    Sender,
    append_record,
    flow_log,
    flow_record,
    payload,
)
from gemini_lab.flashpass.switch import DATA_WIRE, EMULATION_WIRE, SwitchPort
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
    done = r.handle(Packet(Kind.DATA, 1, 1, 777, 3, payload(1, 1)), tos=0)  # on a credit
    assert done == Packet(Kind.DONE, 1, 0)
    assert r.report()["1"] == {
        "total": 3,
        "received": 3,
        "bytes": 3 * wire.DATA_PAYLOAD,
        "emulation_in": 1,
        "emulation_ect": 1,
        "corrupt": 0,
        "duplicates": 0,
        "unscheduled_in": 2,  # data without an emulation timestamp (FlashPass*'s pre-credit)
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


def test_a_probe_names_every_packet_missing_when_none_of_the_flows_data_arrived() -> None:
    """FlashPass*'s unscheduled packets can all be dropped: the probe carries the flow's
    packet count, so the receiver's NACK names them all and they go again on credits."""
    r = Receiver.__new__(Receiver)
    r.flows = {}
    nack = r.handle(Packet(Kind.PROBE, 9, 0, 0, 3), tos=0)
    assert nack is not None and wire.nack_missing(nack.body) == [0, 1, 2]
    s = _pre_credit_sender(3 * wire.DATA_PAYLOAD)
    s._send_unscheduled(10 * s.line_ns, 0)  # all three sent unscheduled (and, here, lost)
    s._probe()
    s._handle(nack, 20 * s.line_ns)
    assert list(s.pending) == [0, 1, 2] and s.retransmits == 3 and s._emulating()


def test_the_pre_credit_probe_asks_only_about_the_packets_sent_before_it() -> None:
    r = Receiver.__new__(Receiver)
    r.flows = {}
    for seq in (0, 2, 5):
        r.handle(Packet(Kind.DATA, 6, seq, 0, 10, payload(6, seq)), tos=0)
    nack = r.handle(Packet(Kind.PROBE, 6, 4, 0, 10), tos=0)  # 4 sent unscheduled
    assert nack is not None and wire.nack_missing(nack.body) == [1, 3]
    r.handle(Packet(Kind.DATA, 6, 1, 0, 10, payload(6, 1)), tos=0)
    r.handle(Packet(Kind.DATA, 6, 3, 0, 10, payload(6, 3)), tos=0)
    assert r.handle(Packet(Kind.PROBE, 6, 4, 0, 10), tos=0) is None  # nothing missing below 4
    tail = r.handle(Packet(Kind.PROBE, 6, 0, 0, 10), tos=0)  # the tail probe asks about all
    assert tail is not None and wire.nack_missing(tail.body) == [4, 6, 7, 8, 9]


def test_flashpass_stars_data_queue_drops_unscheduled_data_above_two_packets() -> None:
    """FlashPass*: the data class is RED with ECN at the data's size, min 2 packets, max 3,
    the bfifo's limit, no ``nodrop``: non-ECT (unscheduled) data is dropped above the
    threshold, ECT (scheduled) data marked and kept; the rest of the port is unchanged."""
    plain = SwitchPort(10_000, 16).commands("d")
    star = SwitchPort(10_000, 16, selective_drop=True).commands("d")
    assert star[:5] == plain[:5] and star[6:] == plain[6:]
    args = star[5][star[5].index("red") + 1 :]
    pairs = dict(zip(args[:-1:2], args[1:-1:2], strict=True))
    assert pairs["limit"] == str(16 * DATA_WIRE) and pairs["min"] == str(2 * DATA_WIRE)
    assert pairs["max"] == str(3 * DATA_WIRE) and pairs["probability"] == "1.0"
    assert args[-1] == "ecn" and "nodrop" not in args
    with pytest.raises(ValueError, match="selectively"):
        SwitchPort(10_000, 16, data_ecn_k_packets=4, selective_drop=True)


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


def loopback_flow(
    theta: Theta, flow: int = 3, size: int = 100_000, pre_credit: bool = False
) -> tuple[dict, dict]:
    """One flow over the host's loopback: the sender's report and what the receiver counted."""
    receiver = Receiver()
    thread = threading.Thread(target=receiver.run)
    thread.start()
    try:
        report = Sender("127.0.0.1", flow, size, theta, 10e6, pre_credit).run()
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


# -- FlashPass*'s pre-credit phase (the sender's phase logic on a clock the test sets) --------
T_WAIT = Theta(0.01, 0.1, 0.040)  # 40 ms, the spec's default


def _data_tos(sender: Sender) -> int:
    return sender.data.getsockopt(socket.IPPROTO_IP, socket.IP_TOS)


def _pre_credit_sender(size: int) -> Sender:
    """A FlashPass* sender toward a port nobody listens on (its datagrams go nowhere)."""
    sender = Sender("127.0.0.1", 9, size, T_WAIT, 10e6, pre_credit=True)
    sender._set_data_tos(NOT_ECT)  # as run() does at T
    return sender


def test_the_pre_credit_phase_sends_at_line_rate_until_the_first_credit() -> None:
    s = _pre_credit_sender(100_000)
    assert s.line_ns == 1514 * 8 * NS // 10_000_000  # one data frame at 10 Mbit/s
    start = 1_000 * NS
    assert s._send_unscheduled(start + s.line_ns * 5 // 2, start) == start + 3 * s.line_ns
    assert [seq for _, seq in s.unscheduled] == [0, 1, 2]  # at T, T + 1 and T + 2 frames
    assert s.pending[0] == 3 and _data_tos(s) == NOT_ECT  # unscheduled: not ECN-capable
    s._handle(Packet(Kind.CREDIT, 9, 0, start), start + 3 * s.line_ns)  # the first credit
    assert s._send_unscheduled(start + 3 * s.line_ns, start) == 0  # the phase is over
    assert len(s.unscheduled) == 3 and s.pre_credit_end_ns == start + 3 * s.line_ns
    assert _data_tos(s) == ECT0  # from now on every data packet is scheduled
    assert s.probes == 1  # at once, behind the unscheduled packets: which of them arrived?
    # the credit schedules the next unsent packet at its emulation time + T_wait
    assert s.due == [(start + int(T_WAIT.t_wait_s * NS), start, 0)]
    s._send_due(start + int(T_WAIT.t_wait_s * NS))
    assert [seq for _, _, seq in s.sends] == [3]


def test_without_a_credit_the_phase_ends_at_t_plus_t_wait() -> None:
    s = _pre_credit_sender(1_000_000)
    start, t_wait = 0, int(T_WAIT.t_wait_s * NS)
    assert s._send_unscheduled(start + t_wait - 1, start) > 0
    assert s._send_unscheduled(start + t_wait, start) == 0
    assert len(s.unscheduled) == -(
        -t_wait // s.line_ns
    )  # one frame per interval in [T, T + T_wait)
    assert s.pre_credit_end_ns == start + t_wait and _data_tos(s) == ECT0


def test_a_short_flow_goes_whole_in_the_pre_credit_phase() -> None:
    s = _pre_credit_sender(5_000)  # 4 packets
    assert s._send_unscheduled(10 * s.line_ns, 0) == 0
    assert [seq for _, seq in s.unscheduled] == [0, 1, 2, 3] and not s.pending
    assert s.pre_credit_end_ns == 10 * s.line_ns and not s._emulating() and s.probes == 1


def test_a_lost_unscheduled_packet_is_resent_on_a_credit_not_unscheduled() -> None:
    """The tail-loss probe's answer puts it back on the send queue, after the phase: it waits
    for a credit and leaves at that credit's emulation time + T_wait, ECT."""
    s = _pre_credit_sender(5_000)
    s._send_unscheduled(10 * s.line_ns, 0)
    s._handle(Packet(Kind.NACK, 9, 0, body=wire.nack_body([2])), 20 * s.line_ns)
    assert list(s.pending) == [2] and s.retransmits == 1 and s._emulating()
    assert s._send_unscheduled(21 * s.line_ns, 0) == 0 and len(s.unscheduled) == 4
    emu_ts = 30 * s.line_ns
    s._handle(Packet(Kind.CREDIT, 9, 0, emu_ts), emu_ts + 1)
    s._send_due(emu_ts + int(T_WAIT.t_wait_s * NS))
    assert s.sends[-1][1:] == (emu_ts, 2) and _data_tos(s) == ECT0


def test_without_the_phase_no_data_leaves_before_a_credit() -> None:
    s = Sender("127.0.0.1", 9, 5_000, T_WAIT, 10e6)
    assert s._send_unscheduled(NS, 0) == 0 and not s.unscheduled and len(s.pending) == 4
    assert _data_tos(s) == NOT_ECT and s.pre_credit_end_ns == 0 and s.probes == 0


def test_a_pre_credit_flow_over_loopback_delivers_every_byte() -> None:
    """On loopback the first credit is back within microseconds: the phase ends after the
    first packet or few, and the rest goes on credits, each packet once."""
    report, got = loopback_flow(Theta(0.01, 0.1, 0.005), size=60_000, pre_credit=True)
    assert report["finished"] and got["received"] == got["total"] == report["packets"]
    assert got["corrupt"] == got["duplicates"] == 0
    unscheduled = [seq for _, seq in report["unscheduled_sends"]]
    scheduled = [seq for _, _, seq in report["data_sends"]]
    assert unscheduled and unscheduled == list(range(len(unscheduled)))
    assert sorted(unscheduled + scheduled) == list(range(report["packets"]))
    assert got["unscheduled_in"] == len(unscheduled) and report["pre_credit_end_ns"] > 0


def test_a_nack_carries_at_most_one_datagram_of_missing_packets_and_the_rest_on_a_later_probe() -> (
    None
):
    """A flow that lost more packets than one NACK can name (its access queue dropped 390 on
    the mix) gets the first MAX_NACK; the receiver does not fail on the rest."""
    missing = list(range(wire.MAX_NACK + 28))
    body = wire.nack_body(missing)
    assert wire.nack_missing(body) == missing[: wire.MAX_NACK]
    assert len(Packet(Kind.NACK, 1, 0, body=body).encode()) <= 1500 - 20 - 8
    r = Receiver()
    r.handle(Packet(Kind.PROBE, 5, 0, 0, len(missing)), 0)  # nothing of flow 5 arrived
    nack = r.handle(Packet(Kind.PROBE, 5, 0, 0, len(missing)), 0)
    assert nack is not None and wire.nack_missing(nack.body) == missing[: wire.MAX_NACK]
