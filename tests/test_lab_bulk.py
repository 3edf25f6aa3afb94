"""The lab's bulk flows end at their duration, whatever the path does to the socket buffer.

On loopback, no guest: a receiver whose sender stops delivering (as a window collapsed by a
timeout on the 800 ms path stops it) gives up ``drain_s`` after the duration and resets the
connection; a sender blocked in ``send()`` at its deadline stops writing. A flow that drains
in time is complete, every byte counted."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from gemini_lab import bulk

WAIT_S = 30  # generous: the checks are what ends, not how fast


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _receiver(port: int, duration_s: float, drain_s: float, out: dict) -> threading.Thread:
    def run() -> None:
        out.update(bulk.recv(port, 1, 0, duration_s, drain_s=drain_s))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    _wait_listening(port)
    return thread


def _wait_listening(port: int) -> None:
    """Until the receiver listens (the kernel's socket table, read without touching the port):
    a sender must not race it."""
    listen = f":{port:04X} 00000000:0000 0A"  # local port, no peer, state LISTEN
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if listen in Path("/proc/net/tcp").read_text():
            return
        time.sleep(0.01)
    raise AssertionError(f"the receiver never listened on port {port}")


def test_a_receiver_resets_a_flow_that_has_not_ended_by_the_drain_limit() -> None:
    port, out = _free_port(), {}
    thread = _receiver(port, duration_s=0.2, drain_s=0.2, out=out)
    sender = socket.create_connection(("127.0.0.1", port))
    sender.sendall(b"x" * 1000)  # ...and neither closes nor sends again
    thread.join(WAIT_S)
    assert not thread.is_alive()
    assert out["complete"] is False
    assert out["bytes_received"] == 1000
    sender.settimeout(WAIT_S)
    try:
        assert sender.recv(1) == b"", "the receiver closed without a reset"
        raise AssertionError("the receiver's close was a FIN, not a reset")
    except ConnectionResetError:
        pass
    finally:
        sender.close()


def test_a_flow_that_ends_in_time_is_complete() -> None:
    port, out = _free_port(), {}
    thread = _receiver(port, duration_s=5, drain_s=5, out=out)
    with socket.create_connection(("127.0.0.1", port)) as sender:
        sender.sendall(b"x" * 300_000)
    thread.join(WAIT_S)
    assert out["complete"] is True
    assert out["bytes_received"] == 300_000


def test_a_sender_blocked_in_send_stops_at_its_deadline() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        out: dict = {}
        addr, port = server.getsockname()
        sender = threading.Thread(
            target=lambda: out.update(bulk.send(addr, port, "reno", 1, 0.3)), daemon=True
        )
        sender.start()
        peer, _ = server.accept()  # accepted, never read: the sender's buffers fill
        sender.join(WAIT_S)
        assert not sender.is_alive(), "the sender is still blocked after its deadline"
        assert out["ports"]
        peer.settimeout(WAIT_S)
        received = 0
        while chunk := peer.recv(1 << 16):
            received += len(chunk)
        assert received > 0  # what it wrote before the deadline still arrives, then EOF
        peer.close()


def test_the_sender_reports_its_windows_course_every_half_second() -> None:
    port, out = _free_port(), {}
    thread = _receiver(port, duration_s=5, drain_s=5, out=out)
    sent = bulk.send("127.0.0.1", port, "reno", 1, 1.2)
    thread.join(WAIT_S)
    series = sent["window_series"]
    assert len(series) >= 2
    times = [t for t, _, _ in series]
    assert times == sorted(times) and times[0] < 0.5 <= times[-1]
    assert all(window >= 1 for _, window, _ in series)
    retransmits = [r for _, _, r in series]
    assert retransmits == sorted(retransmits)
    assert out["complete"] is True
