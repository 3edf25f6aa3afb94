"""Guest side: a TCP relay from a lab host's namespace to Booster on the lab's host machine.

Only the sender namespace holds the guest's link to the host machine (qemu's user-mode NIC:
Booster is 10.0.2.2 there). A lab host's agent dials 127.0.0.1:<port> in its own namespace;
the relay accepts there and dials Booster from the sender namespace. A socket lives in the
network namespace of the thread that created it, and ``setns`` moves only the calling thread:
the listening socket is made by a thread that enters the lab host's namespace for that one call,
and every outgoing socket by threads that stay in the sender namespace.
"""

from __future__ import annotations

import contextlib
import socket
import threading

from gemini_lab.netem import enter_netns

CHUNK_BYTES = 64 * 1024
BACKLOG = 16


def listen_in(ns: str, port: int) -> socket.socket:
    """A listening socket on 127.0.0.1:``port`` of namespace ``ns``, made by a thread of its own
    (this thread's namespace is left as it is)."""
    box: dict[str, object] = {}

    def make() -> None:
        try:
            enter_netns(ns)  # this short-lived thread only
            box["sock"] = socket.create_server(("127.0.0.1", port), backlog=BACKLOG)
        except OSError as exc:
            box["error"] = exc

    t = threading.Thread(target=make)
    t.start()
    t.join()
    if "error" in box:
        raise OSError(f"relay listen in {ns}:{port}: {box['error']}")
    sock = box["sock"]
    assert isinstance(sock, socket.socket)
    return sock


def _pump(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(CHUNK_BYTES):
            dst.sendall(data)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


def _serve(listener: socket.socket, target: tuple[str, int]) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return  # closed: the relay is stopped
        try:
            upstream = socket.create_connection(target, timeout=10)
            upstream.settimeout(None)
        except OSError:
            client.close()  # Booster is away: the agent retries, as it would on its own
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def start_relay(ns: str, port: int, target: tuple[str, int]) -> socket.socket:
    """Relay connections to 127.0.0.1:``port`` in ``ns`` to ``target`` (dialled from this
    thread's namespace). Closing the returned socket stops accepting."""
    listener = listen_in(ns, port)
    threading.Thread(target=_serve, args=(listener, target), daemon=True).start()
    return listener
