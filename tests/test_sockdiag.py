"""The agent's socket-diagnostics source on this machine's own kernel: loopback TCP flows of
the system's congestion control, one closed abortively, each counted once under its CC and
handed to the aggregator as a baseline flow (its CC, no θ) with the bytes it sent."""

from __future__ import annotations

import socket
import struct
import threading
import time
from pathlib import Path

from gemini_agent.aggregator import Flow
from gemini_agent.metrics import AgentMetrics
from gemini_agent.sources import SockDiagSource

PAYLOAD = 200_000


def _slow_reader(sock: socket.socket, n: int) -> None:
    """Drain ``n`` bytes in small bites: the sender stays window-limited long enough for the
    kernel's busy-time clock (jiffy resolution) to measure it, as on a real path."""
    got = 0
    while got < n:
        got += len(sock.recv(8192))
        time.sleep(0.002)


def _flow(abortive: bool) -> None:
    with socket.create_server(("127.0.0.1", 0)) as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)  # inherited by accepted
        c = socket.create_connection(srv.getsockname())
        peer, _ = srv.accept()
        reader = threading.Thread(target=_slow_reader, args=(peer, PAYLOAD))
        reader.start()
        c.sendall(b"x" * PAYLOAD)
        reader.join()
        time.sleep(0.5)  # a dump sees the socket with its counters
        if abortive:
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        c.close()
        peer.close()


def test_flows_of_other_ccs_are_counted_by_cc_even_when_reset():
    cc = Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    metrics = AgentMetrics()
    flows: list[Flow] = []
    source = SockDiagSource(flows.append, metrics, dump_s=0.1)
    source.start()
    try:
        _flow(abortive=False)
        _flow(abortive=True)
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
    # two connections, two sockets each (client and accepted peer), all under the system's CC
    assert metrics.registry.get_sample_value("gemini_agent_other_cc_flows_total", {"cc": cc}) == 4
    assert (
        metrics.registry.get_sample_value("gemini_agent_flows_total", {"source": "sockdiag"}) == 4
    )
    # the aggregator gets the two senders' flows with their bytes (the reset one too), not the
    # receiving sockets, which sent nothing
    senders = flows
    assert len(senders) == 2 and all(f.stats.bytes_acked >= PAYLOAD for f in senders), flows
    # time with data to send was measured, so each has a throughput for the comparison
    assert all(f.stats.usable and 0 < f.stats.throughput_mbps < 1e4 for f in senders), senders
    assert all(f.cc == cc and f.theta == {} and f.dst == "127.0.0.1" for f in flows)


def test_the_agents_own_booster_connection_is_not_a_flow():
    metrics = AgentMetrics()
    with socket.create_server(("127.0.0.1", 0)) as srv:
        port = srv.getsockname()[1]
        flows: list[Flow] = []
        source = SockDiagSource(
            flows.append, metrics, dump_s=0.1, skip=frozenset({("127.0.0.1", port)})
        )
        source.start()
        try:
            c = socket.create_connection(("127.0.0.1", port))
            peer, _ = srv.accept()
            peer.sendall(b"y" * PAYLOAD)  # the accepted side sends: its peer port is not Booster's
            got = 0
            while got < PAYLOAD:
                got += len(c.recv(65536))
            c.sendall(b"x" * 1000)
            peer.recv(1000)
            time.sleep(0.3)
            c.close()
            peer.close()
            deadline = time.monotonic() + 10
            while len(flows) < 1:
                assert time.monotonic() < deadline, "destroy events did not arrive"
                time.sleep(0.1)
            time.sleep(0.5)
        finally:
            source.stop()
            source.join(timeout=5)
    # only the accepted socket (toward the client's ephemeral port) is a flow
    assert [f.stats.bytes_acked >= PAYLOAD for f in flows] == [True], flows
