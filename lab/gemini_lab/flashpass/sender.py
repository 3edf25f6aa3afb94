"""FlashPass's sender: one flow, from its arrival at T until the receiver has every packet.

Three things happen on one thread, each at its own simulated instant (the lab's clock is
UML's, so waiting in select until the next instant costs no guest time and keeps exact
timing):
  - emulation: 84-byte packets at the flow's emulation rate, ECT while the credits expected
    (eq. 4.2: unused credits + emulation in flight · (1 − max_target_loss)) fall short of the
    data still to send, non-ECT beyond that (over-provisioning: the switch drops these first);
  - data: each credit carries its emulation packet's send time e; the sender sends one data
    packet at e + T_wait, the next unsent (or retransmitted) one; a credit with nothing left
    to send is wasted;
  - control: once per RTT, Algorithm 2 (gemini_lab.flashpass.control).
When everything has been sent, a tail-loss probe after two RTTs asks the receiver what is
missing; the answer's packets go back on the send queue and wait for credits like new data.

FlashPass* (``pre_credit``; the paper's Aeolus-enhanced variant, §4.2.3, whose FCTs Figs. 4.12
and 4.13 report) adds a pre-credit phase: from the arrival at T the sender also sends data
unscheduled, at the link's rate, until the first credit comes back, T + T_wait passes, or no
data is left, whichever comes first. The first credit ends it because the paper's phase is
"the first RTT before receiving any credit"; T_wait bounds it because it is the sender's RTT
estimate until a credit measures one (the RTT it starts Algorithm 2 with) and the instant the
first scheduled packet may leave (e₀ + T_wait), so if the first emulation packets are all lost
the phase still ends after a round trip's worth of data and never overlaps scheduled data.
Unscheduled data goes non-ECT and scheduled data ECT, so the switch's data queue
(gemini_lab.flashpass.switch, ``selective_drop``) drops the unscheduled first; an unscheduled
packet carries no emulation timestamp (0). Emulation starts at T as without the phase and
asks credits for the data not yet sent. When the phase ends the sender probes at once, ECT, so
the probe is not dropped selectively and arrives behind the unscheduled packets (Aeolus's
first-RTT recovery, the paper's "tail loss probing"): the receiver's NACK names the
unscheduled packets missing, and they wait for credits like new data (credit-scheduled
retransmission). The probe after the last packet still runs as without the phase.

When the flow ends, the sender appends its record to the flow log beside the θ file
(``records = "flow_log"``: ``flashpass.flows`` beside ``flashpass.toml``), one JSON line with
what a kernel flow record carries: destination, bytes delivered, duration (the FCT), the RTT's
mean and minimum as the sender measures them (each credit's arrival less its emulation
packet's send time), retransmissions and emulation losses, the θ it ran with its version
(gemini_lab.flashpass.theta), and the end time. The agent tails that log
(gemini_agent.flowlog) and reports each line as a trial of its θ.

Usage (in the sender's namespace):
    python -m gemini_lab.flashpass.sender ADDR --flow 1 --bytes 300000 --link-mbit 10 \
        --theta /etc/gemini/flashpass.toml --log flow1.json
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import json
import os
import selectors
import socket
import time
from collections import deque
from dataclasses import asdict
from pathlib import Path

from gemini_lab.flashpass import wire
from gemini_lab.flashpass.control import EmulationRate
from gemini_lab.flashpass.theta import Theta, ThetaRead, read_theta_file
from gemini_lab.flashpass.wire import Kind, Packet

NS = 1_000_000_000
ECT0 = 0x02  # the IP header's ECN field: ECN-capable transport (0)
NOT_ECT = 0x00
# Algorithm 2 judges, once per RTT, the emulation packets whose credits are surely back: those
# sent more than an RTT plus a full emulation queue's wait ago, so loss is not read early.
PROBE_RTTS = 2  # a tail-loss probe waits this many RTTs after the last data packet
GIVE_UP_S = 180.0  # a flow that has not finished by then is reported as failed (a 3 MB flow
# takes 27 s alone behind a 1 Mbit/s access link: gemini_lab.flashpass.fctmix, --access-ratio)
FLOW_LOG_SUFFIX = ".flows"  # the flow log: beside the θ file, its suffix replaced
US = 1000  # ns per µs


def payload(flow: int, seq: int) -> bytes:
    """The data a packet carries: derived from its flow and sequence number, so the receiver
    can check every byte that arrived is the byte that was sent."""
    word = flow.to_bytes(4, "big") + seq.to_bytes(4, "big")
    return (word * (wire.DATA_PAYLOAD // len(word) + 1))[: wire.DATA_PAYLOAD]


class Sender:
    def __init__(
        self,
        addr: str,
        flow: int,
        size_bytes: int,
        theta: Theta,
        link_bps: float,
        pre_credit: bool = False,
    ) -> None:
        self.addr, self.flow, self.theta, self.size_bytes = addr, flow, theta, size_bytes
        self.pre_credit = pre_credit
        self.line_ns = int(wire.DATA_FRAME * 8 * NS / link_bps)  # one data frame at line rate
        self.unscheduled: list[tuple[int, int]] = []  # (send time, data seq), pre-credit
        self.pre_credit_end_ns = 0  # when the pre-credit phase ended (0: not yet, or none)
        self.total = max(1, -(-size_bytes // wire.DATA_PAYLOAD))
        max_rate = wire.max_emulation_pps(link_bps)
        self.rate = EmulationRate(max_rate, theta.min_target_loss, theta.max_target_loss)
        self.emu = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.data = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sel = selectors.SelectSelector()  # select's timeout is in µs, epoll's in ms
        for s in (self.emu, self.data):
            s.setblocking(False)
            self.sel.register(s, selectors.EVENT_READ)
        self.tos = -1
        self.pending: deque[int] = deque(range(self.total))  # data waiting for a credit
        self.due: list[tuple[int, int, int]] = []  # (send at, emulation ts, credit seq)
        self.emu_sent: deque[int] = deque()  # send times of the last RTT's emulation
        self.rtt_ns = int(theta.t_wait_s * NS)  # until the first credit measures it
        self.log: dict = {"flow": flow, "packets": self.total, "theta": asdict(theta)}
        self.credits: list[tuple[int, int, int]] = []  # (emulation seq, its ts, arrival)
        self.sends: list[tuple[int, int, int]] = []  # (send time, emulation ts, data seq)
        self.rates: list[tuple[int, float]] = []
        self.emu_out = self.emu_ect = self.wasted = self.retransmits = self.probes = 0
        self.answered: set[int] = set()  # emulation seqs a credit came back for
        self.emu_times: list[int] = []  # each emulation packet's send time, by seq
        self.judged = 0  # emulation seqs before this one have been through Algorithm 2
        self.queue_wait_ns = int(wire.EMULATION_BUFFER_PACKETS * NS / max_rate)
        self.done_ns = 0

    # -- emulation ------------------------------------------------------------------------
    def _in_flight(self, now: int) -> int:
        while self.emu_sent and self.emu_sent[0] < now - self.rtt_ns:
            self.emu_sent.popleft()
        return len(self.emu_sent)

    def _emulate(self, now: int) -> None:
        """One emulation packet, ECT unless the credits expected already cover the demand."""
        expected = len(self.due) + self._in_flight(now) * (1 - self.theta.max_target_loss)
        tos = ECT0 if expected < len(self.pending) else NOT_ECT
        if tos != self.tos:
            self.emu.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
            self.tos = tos
        packet = wire.emulation(self.flow, self.emu_out, now)
        self.emu.sendto(packet, (self.addr, wire.EMULATION_PORT))
        self.emu_out += 1
        self.emu_ect += tos == ECT0
        self.emu_sent.append(now)
        self.emu_times.append(now)

    def _emulating(self) -> bool:
        return bool(self.pending) and len(self.due) < len(self.pending)

    # -- data -----------------------------------------------------------------------------
    def _set_data_tos(self, tos: int) -> None:
        self.data.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)

    def _in_pre_credit(self, now: int, start: int) -> bool:
        """Whether the pre-credit phase still runs at ``now``: until the first credit, T + T_wait
        or the last packet, whichever comes first (the module's notes say why)."""
        if not self.pre_credit or self.pre_credit_end_ns:
            return False
        if self.credits or not self.pending or now >= start + int(self.theta.t_wait_s * NS):
            self.pre_credit_end_ns = now
            self._set_data_tos(ECT0)  # from here on every data packet is scheduled
            if self.unscheduled:  # right behind them: which of them arrived?
                self._probe(len(self.unscheduled))
            return False
        return True

    def _send_unscheduled(self, now: int, start: int) -> int:
        """The pre-credit phase's data due by ``now``, one packet per line-rate interval from
        T; the next send time (0 once the phase is over)."""
        while self._in_pre_credit(now, start):
            at = start + len(self.unscheduled) * self.line_ns
            if at > now:
                return at
            seq = self.pending.popleft()
            packet = Packet(Kind.DATA, self.flow, seq, 0, self.total, payload(self.flow, seq))
            self.data.sendto(packet.encode(), (self.addr, wire.DATA_PORT))
            self.unscheduled.append((time.monotonic_ns(), seq))
        return 0

    def _send_due(self, now: int) -> None:
        while self.due and self.due[0][0] <= now:
            _, emu_ts, _ = heapq.heappop(self.due)
            if not self.pending:
                self.wasted += 1
                continue
            seq = self.pending.popleft()
            packet = Packet(Kind.DATA, self.flow, seq, emu_ts, self.total, payload(self.flow, seq))
            self.data.sendto(packet.encode(), (self.addr, wire.DATA_PORT))
            self.sends.append((time.monotonic_ns(), emu_ts, seq))

    def _receive(self, now: int) -> None:
        for key, _ in self.sel.select(0):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            while True:
                try:
                    raw = sock.recv(2048)
                except BlockingIOError:
                    break
                self._handle(Packet.decode(raw), time.monotonic_ns())

    def _handle(self, p: Packet, now: int) -> None:
        if p.flow != self.flow:
            return
        if p.kind is Kind.CREDIT:
            self.credits.append((p.seq, p.emu_ts_ns, now))
            self.answered.add(p.seq)
            self.rtt_ns = min(self.rtt_ns, now - p.emu_ts_ns)
            send_at = p.emu_ts_ns + int(self.theta.t_wait_s * NS)
            heapq.heappush(self.due, (send_at, p.emu_ts_ns, p.seq))
        elif p.kind is Kind.NACK:
            missing = [s for s in wire.nack_missing(p.body) if s not in self.pending]
            self.pending.extend(missing)
            self.retransmits += len(missing)
        elif p.kind is Kind.DONE:
            self.done_ns = now

    def _control(self, now: int, start: int) -> None:
        """Algorithm 2 on the emulation sent since the last step whose credits are due back."""
        horizon = now - self.rtt_ns - self.queue_wait_ns
        end = bisect.bisect_right(self.emu_times, horizon)
        if end > self.judged:
            got = sum(s in self.answered for s in range(self.judged, end))
            floor = NS / self.rtt_ns  # one emulation packet per RTT
            self.rates.append((now - start, self.rate.update(end - self.judged, got, floor)))
            self.judged = end

    def _probe(self, upto: int = 0) -> None:
        """The tail-loss probe carries the flow's packet count: a receiver that got none of its
        data (FlashPass*'s pre-credit packets can all be dropped) then knows what is missing.
        ``upto`` > 0 asks only about the packets before it (the pre-credit phase's probe)."""
        probe = Packet(Kind.PROBE, self.flow, upto, 0, self.total)
        self.data.sendto(probe.encode(), (self.addr, wire.DATA_PORT))
        self.probes += 1

    # -- the loop -------------------------------------------------------------------------
    def run(self) -> dict:
        start = time.monotonic_ns()
        next_emu = next_control = start
        next_probe = next_unscheduled = 0
        deadline = start + int(GIVE_UP_S * NS)
        if self.pre_credit:
            self._set_data_tos(NOT_ECT)  # unscheduled until the pre-credit phase ends
        while not self.done_ns and time.monotonic_ns() < deadline:
            now = time.monotonic_ns()
            if self._emulating() and now >= next_emu:
                self._emulate(now)
            next_unscheduled = self._send_unscheduled(now, start)
            # the next emulation packet one interval after the last, at the rate now in force
            if self.emu_times:
                next_emu = self.emu_times[-1] + int(NS / self.rate.rate_pps)
            self._send_due(now)
            if now >= next_control:
                self._control(now, start)
                next_control = now + self.rtt_ns
            idle = not self.pending and not self.due
            if idle and not next_probe:
                next_probe = now + PROBE_RTTS * self.rtt_ns
            elif not idle:
                next_probe = 0
            if next_probe and now >= next_probe:
                self._probe()
                next_probe = now + PROBE_RTTS * self.rtt_ns
            wakes = [next_control, deadline] + ([next_emu] if self._emulating() else [])
            wakes += [self.due[0][0]] if self.due else []
            wakes += [next_probe] if next_probe else []
            wakes += [next_unscheduled] if next_unscheduled else []
            self.sel.select(max(0, min(wakes) - time.monotonic_ns()) / NS)
            self._receive(now)
        return self._report(start)

    def _report(self, start: int) -> dict:
        return self.log | {
            "dst": self.addr,
            "bytes": self.size_bytes,
            "start_ns": start,
            "duration_ns": time.monotonic_ns() - start,
            "end_unix_ns": time.time_ns(),
            "finished": bool(self.done_ns),
            "fct_s": (self.done_ns - start) / NS if self.done_ns else None,
            "emulation_out": self.emu_out,
            "emulation_ect": self.emu_ect,
            "credits": self.credits,
            "data_sends": self.sends,
            "pre_credit": self.pre_credit,
            "unscheduled_sends": self.unscheduled,
            "pre_credit_end_ns": self.pre_credit_end_ns,
            "rates": self.rates,
            "wasted_credits": self.wasted,
            "retransmits": self.retransmits,
            "probes": self.probes,
            "t_wait_ns": int(self.theta.t_wait_s * NS),
        }


def flow_record(report: dict, theta: ThetaRead) -> dict:
    """The flow's line in the flow log: what the agent reports it by (see the module's notes).
    A flow that did not finish delivered no byte the sender knows of."""
    rtts_ns = [arrival - emu_ts for _, emu_ts, arrival in report["credits"]]
    return {
        "flow": report["flow"],
        "dst": report["dst"],
        "finished": report["finished"],
        "bytes_delivered": report["bytes"] if report["finished"] else 0,
        "duration_us": report["duration_ns"] // US,
        "rtt_avg_us": sum(rtts_ns) // len(rtts_ns) // US if rtts_ns else 0,
        "rtt_min_us": min(rtts_ns) // US if rtts_ns else 0,
        "retransmits": report["retransmits"],
        "emulation_lost": report["emulation_out"] - len(report["credits"]),
        "theta": theta.units,
        "theta_version": theta.version,
        "end_unix_ns": report["end_unix_ns"],
    }


def flow_log(theta_file: Path) -> Path:
    return theta_file.with_suffix(FLOW_LOG_SUFFIX)


def append_record(log: Path, record: dict) -> None:
    """One line in one write(2) on an O_APPEND descriptor: lines of senders finishing together
    never interleave, and a reader sees each line whole or not yet (a file system that splits
    the write, as hostfs does by page, may show it partly: the agent waits for its newline)."""
    line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("addr")
    ap.add_argument("--flow", type=int, required=True)
    ap.add_argument("--bytes", type=int, required=True)
    ap.add_argument("--link-mbit", type=float, required=True)
    ap.add_argument("--theta", type=Path, help="θ file (the spec's default when absent)")
    ap.add_argument("--log", type=Path, required=True)
    ap.add_argument(
        "--pre-credit", action="store_true", help="FlashPass*: unscheduled data in the first RTT"
    )
    a = ap.parse_args()
    theta = read_theta_file(a.theta)
    sender = Sender(a.addr, a.flow, a.bytes, theta.theta, a.link_mbit * 1e6, a.pre_credit)
    report = sender.run()
    a.log.write_text(json.dumps(report))
    if a.theta is not None:  # the flow's record, with the θ it ran (records = "flow_log")
        append_record(flow_log(a.theta), flow_record(report, theta))


if __name__ == "__main__":
    main()
