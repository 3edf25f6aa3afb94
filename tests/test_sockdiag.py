"""The agent's socket-diagnostics source on this machine's own kernel: loopback TCP flows of a
CC other than Fusion, one closed abortively, each counted once under its CC and handed to the
aggregator as a baseline flow (its CC, no θ) with the bytes it sent."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from pathlib import Path

import pytest

from gemini_agent.aggregator import Flow
from gemini_agent.metrics import AgentMetrics
from gemini_agent.sources import SockDiagSource

PAYLOAD = 200_000
# Loopback addresses of these tests' own (the whole of 127/8 is loopback): the source sees every
# TCP socket of the host, and other programs' flows to 127.0.0.1 must not count as these.
SERVER, CLIENT, BARRIER = "127.77.0.1", "127.77.0.2", "127.77.0.3"
SYSCTL = Path("/proc/sys/net/ipv4")


def _own_cc() -> str:
    """A CC other than the system's default, for these tests' sockets: the source counts every
    socket of the host by CC, and other programs' sockets run the default."""
    default = (SYSCTL / "tcp_congestion_control").read_text().strip()
    which = "available" if os.geteuid() == 0 else "allowed"
    settable = (SYSCTL / f"tcp_{which}_congestion_control").read_text().split()
    for cc in ("reno", "cubic"):
        if cc in settable and cc != default:
            return cc
    pytest.skip(f"neither reno nor cubic can be set here besides the default {default}")


def _slow_reader(sock: socket.socket, n: int) -> None:
    """Drain ``n`` bytes in small bites: the sender stays window-limited long enough for the
    kernel's busy-time clock (jiffy resolution) to measure it, as on a real path."""
    got = 0
    while got < n:
        got += len(sock.recv(8192))
        time.sleep(0.002)


def _dumped(source: SockDiagSource, sock: socket.socket, sent: int) -> bool:
    """True once the source's last dump holds ``sock`` with all it sent acknowledged."""
    port = sock.getsockname()[1]
    seen = list(source.listener.snapshots.by_cookie.values())
    return any(f.sport == port and f.bytes_acked >= sent for f in seen)


def _flow(
    source: SockDiagSource, payload: int, abortive: bool, host: str = SERVER, cc: str = ""
) -> None:
    with socket.create_server((host, 0)) as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)  # inherited by accepted
        c = socket.socket()
        if cc:  # else the system's default
            srv.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())  # likewise
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
        c.bind((CLIENT, 0))
        c.connect(srv.getsockname())
        peer, _ = srv.accept()
        reader = threading.Thread(target=_slow_reader, args=(peer, payload))
        reader.start()
        c.sendall(b"x" * payload)
        reader.join()
        deadline = time.monotonic() + 10  # a dump sees the socket with its counters
        while not _dumped(source, c, payload):
            assert time.monotonic() < deadline, "no dump saw the connection"
            time.sleep(0.02)
        if abortive:
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        c.close()
        if abortive:  # it was reset, not closed: the peer hears of it as such
            with pytest.raises(ConnectionResetError):
                peer.recv(1)
        peer.close()


def test_flows_of_other_ccs_are_counted_by_cc_even_when_reset():
    cc = _own_cc()
    metrics = AgentMetrics()
    flows: list[Flow] = []
    source = SockDiagSource(flows.append, metrics, dump_s=0.1)
    source.start()
    try:
        _flow(source, PAYLOAD, abortive=False, cc=cc)
        _flow(source, 2 * PAYLOAD, abortive=True, cc=cc)
        deadline = time.monotonic() + 10
        while (
            metrics.registry.get_sample_value("gemini_agent_other_cc_flows_total", {"cc": cc})
            is None
            or metrics.registry.get_sample_value("gemini_agent_other_cc_flows_total", {"cc": cc})
            < 4
        ):
            assert time.monotonic() < deadline, "destroy events did not arrive"
            time.sleep(0.1)
    finally:
        source.stop()
        source.join(timeout=5)
    # two connections, two sockets each (client and accepted peer), all under their CC
    assert metrics.registry.get_sample_value("gemini_agent_other_cc_flows_total", {"cc": cc}) == 4
    # and each flow of the host once in the total, whatever its CC (other programs' too)
    by_cc = [
        sample.value
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.name == "gemini_agent_other_cc_flows_total"
    ]
    total = metrics.registry.get_sample_value("gemini_agent_flows_total", {"source": "sockdiag"})
    assert total == sum(by_cc) >= 4, (total, by_cc)
    # the aggregator gets the two senders' flows, each with the bytes it sent: the closed one
    # PAYLOAD, the reset one twice that, although the reset erased its counters on the socket;
    # not the receiving sockets, which sent nothing
    senders = [f for f in flows if f.dst in (SERVER, CLIENT)]
    assert [f.dst for f in senders] == [SERVER, SERVER], flows
    sent = sorted(f.stats.bytes_acked for f in senders)
    assert PAYLOAD <= sent[0] < 2 * PAYLOAD <= sent[1], flows
    # time with data to send was measured, so each has a throughput for the comparison
    assert all(f.stats.usable and 0 < f.stats.throughput_mbps < 1e4 for f in senders), senders
    assert all(f.cc == cc and f.theta == {} for f in senders)


def test_the_agents_own_booster_connection_is_not_a_flow():
    metrics = AgentMetrics()
    with socket.create_server((SERVER, 0)) as srv:
        port = srv.getsockname()[1]
        flows: list[Flow] = []
        source = SockDiagSource(flows.append, metrics, dump_s=0.1, skip=frozenset({(SERVER, port)}))
        source.start()
        try:
            c = socket.create_connection((SERVER, port), source_address=(CLIENT, 0))
            peer, _ = srv.accept()
            peer.sendall(b"y" * PAYLOAD)  # the accepted side sends: its peer port is not Booster's
            got = 0
            while got < PAYLOAD:
                got += len(c.recv(65536))
            c.sendall(b"x" * 1000)
            peer.recv(1000)
            deadline = time.monotonic() + 10
            while not (_dumped(source, c, 1000) and _dumped(source, peer, PAYLOAD)):
                assert time.monotonic() < deadline, "no dump saw the connection"
                time.sleep(0.02)
            c.close()
            peer.close()
            # a barrier: a flow that begins after both sockets closed; once its destroy event is
            # in, an event of the Booster connection, destroyed before, would be in too
            _flow(source, PAYLOAD, abortive=False, host=BARRIER)
            while not any(f.dst == BARRIER for f in flows):
                assert time.monotonic() < deadline, "destroy events did not arrive"
                time.sleep(0.02)
        finally:
            source.stop()
            source.join(timeout=5)
    # only the accepted socket (toward the client's ephemeral port) is a flow, not the client's
    # connection to Booster (it sent 1,000 bytes, and would be here if it were not skipped)
    ours = [f for f in flows if f.dst in (SERVER, CLIENT)]
    assert [(f.dst, f.stats.bytes_acked >= PAYLOAD) for f in ours] == [(CLIENT, True)], flows
