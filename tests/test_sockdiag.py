"""The agent's socket-diagnostics source on this machine's own kernel: loopback TCP flows of
the system's congestion control, one closed abortively, each counted once under its CC."""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path

from gemini_agent.metrics import AgentMetrics
from gemini_agent.sources import SockDiagSource

PAYLOAD = 200_000


def _flow(abortive: bool) -> None:
    with socket.create_server(("127.0.0.1", 0)) as srv:
        c = socket.create_connection(srv.getsockname())
        peer, _ = srv.accept()
        c.sendall(b"x" * PAYLOAD)
        got = 0
        while got < PAYLOAD:
            got += len(peer.recv(65536))
        time.sleep(0.5)  # a dump sees the socket with its counters
        if abortive:
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        c.close()
        peer.close()


def test_flows_of_other_ccs_are_counted_by_cc_even_when_reset():
    cc = Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    metrics = AgentMetrics()
    source = SockDiagSource(metrics, dump_s=0.1)
    source.start()
    try:
        _flow(abortive=False)
        _flow(abortive=True)
        deadline = time.monotonic() + 10
        while metrics.registry.get_sample_value(
            "gemini_agent_other_cc_flows_total", {"cc": cc}
        ) is None or metrics.registry.get_sample_value(
            "gemini_agent_other_cc_flows_total", {"cc": cc}
        ) < 4:
            assert time.monotonic() < deadline, "destroy events did not arrive"
            time.sleep(0.1)
    finally:
        source.stop()
        source.join(timeout=5)
    # two connections, two sockets each (client and accepted peer), all under the system's CC
    assert metrics.registry.get_sample_value("gemini_agent_other_cc_flows_total", {"cc": cc}) == 4
    assert metrics.registry.get_sample_value(
        "gemini_agent_flows_total", {"source": "sockdiag"}) == 4
