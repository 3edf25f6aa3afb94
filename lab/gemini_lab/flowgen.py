"""Guest side: many short TCP flows, to load the flow-record path.

    python -m gemini_lab.flowgen serve PORT            accept, read to EOF, close; forever
    python -m gemini_lab.flowgen hold PORT             accept and keep, never read; forever
    python -m gemini_lab.flowgen send ADDR PORT N W    N fusion flows of 1 KB from W processes
    python -m gemini_lab.flowgen burst ADDR PORT N W [CC [PAUSE]]
                                                       N flows opened, then all ended at once

`send` prints one JSON line: flows completed, failures, seconds. `burst` opens N fusion
connections from W processes, sends 1 KB on each and waits for it to be acknowledged, then all
processes close their connections together with an abortive close (SO_LINGER 0, which frees
the socket inside close()), so N flows end within a short window; it prints the flows ended and
the window's length. Connection setup, which is what limits `send` under emulation, happens
before the window opens.
"""

from __future__ import annotations

import errno
import json
import multiprocessing
import resource
import selectors
import socket
import struct
import sys
import time
from typing import cast

FLOW_BYTES = 1024
BACKLOG = 4096


ABORT = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets and frees the socket
ACK_WAIT_S = 10


FD_LIMIT = 65536  # each side of a burst holds every connection open at once


def _raise_fd_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = max(hard, FD_LIMIT)  # raising the hard limit needs root, which the lab guest is
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


def _accept_all(lsock: socket.socket, sel: selectors.BaseSelector) -> None:
    """Empty the accept queue: under a burst of connections one accept per wake-up lets it
    overflow, and the dropped SYNs cost the clients seconds of retransmission."""
    while True:
        try:
            conn, _ = lsock.accept()
        except BlockingIOError:
            return
        conn.setblocking(False)
        sel.register(conn, selectors.EVENT_READ)


def hold(port: int) -> None:
    """The receiver for a burst: the kernel acknowledges the data and handles the resets, and
    no user-space work competes with the senders for the guest's CPUs while flows end."""
    _raise_fd_limit()
    lsock = socket.create_server(("0.0.0.0", port), backlog=BACKLOG, reuse_port=True)
    kept = []
    while True:
        kept.append(lsock.accept()[0])


def serve(port: int) -> None:
    _raise_fd_limit()
    sel = selectors.DefaultSelector()
    lsock = socket.create_server(("0.0.0.0", port), backlog=BACKLOG, reuse_port=True)
    lsock.setblocking(False)
    sel.register(lsock, selectors.EVENT_READ)
    while True:
        for key, _ in sel.select():
            if key.fileobj is lsock:
                _accept_all(lsock, sel)
                continue
            conn = cast(socket.socket, key.fileobj)
            try:
                data = conn.recv(65536)
            except BlockingIOError:
                continue
            except ConnectionError:
                data = b""
            if not data:
                sel.unregister(conn)
                conn.close()


def _shares(flows: int, workers: int) -> list[int]:
    return [flows // workers + (1 if i < flows % workers else 0) for i in range(workers)]


def _open_flow(addr: str, port: int, cc: str, payload: bytes, timeout_s: float) -> socket.socket:
    """A connection under ``cc`` with ``payload`` sent; closed again if any step fails."""
    s = socket.socket()
    try:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
        s.settimeout(timeout_s)
        s.connect((addr, port))
        s.sendall(payload)
    except OSError:
        s.close()
        raise
    return s


def _worker(args: tuple[str, int, int, str]) -> tuple[int, int]:
    addr, port, n, cc = args
    payload = b"x" * FLOW_BYTES
    done = failed = 0
    for _ in range(n):
        try:
            with _open_flow(addr, port, cc, payload, 10) as s:
                s.shutdown(socket.SHUT_WR)
                while s.recv(4096):
                    pass
            done += 1
        except OSError:
            failed += 1
    return done, failed


def send(addr: str, port: int, flows: int, workers: int, cc: str = "fusion") -> None:
    t0 = time.monotonic()
    with multiprocessing.Pool(workers) as pool:
        results = pool.map(_worker, [(addr, port, n, cc) for n in _shares(flows, workers)])
    elapsed = time.monotonic() - t0
    print(
        json.dumps(
            {
                "flows": sum(r[0] for r in results),
                "failed": sum(r[1] for r in results),
                "seconds": elapsed,
            }
        )
    )


def _acked(s: socket.socket) -> bool:
    """Nothing unacknowledged in flight (tcpi_unacked, at offset 24 of struct tcp_info)."""
    info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    return struct.unpack_from("I", info, 24)[0] == 0


def _burst_worker(args: tuple) -> tuple[int, dict[str, int], float, float]:
    addr, port, n, cc, pause_s, barrier = args
    _raise_fd_limit()
    payload = b"x" * FLOW_BYTES
    socks: list[socket.socket] = []
    failed: dict[str, int] = {}
    for _ in range(n):
        try:
            socks.append(_open_flow(addr, port, cc, payload, 30))
        except OSError as e:
            name = type(e).__name__ if e.errno is None else errno.errorcode.get(e.errno, "?")
            failed[name] = failed.get(name, 0) + 1
    deadline = time.monotonic() + ACK_WAIT_S
    while time.monotonic() < deadline and not all(_acked(s) for s in socks):
        time.sleep(0.05)
    for s in socks:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, ABORT)
    time.sleep(pause_s)
    barrier.wait()
    t0 = time.monotonic()
    for s in socks:
        s.close()
    return len(socks), failed, t0, time.monotonic()


def burst(
    addr: str, port: int, flows: int, workers: int, cc: str = "fusion", pause_s: float = 0.0
) -> None:
    with multiprocessing.Manager() as manager:
        barrier = manager.Barrier(workers)
        with multiprocessing.Pool(workers) as pool:
            results = pool.map(
                _burst_worker,
                [(addr, port, n, cc, pause_s, barrier) for n in _shares(flows, workers)],
            )
    start, end = min(r[2] for r in results), max(r[3] for r in results)
    errors: dict[str, int] = {}
    for r in results:
        for name, count in r[1].items():
            errors[name] = errors.get(name, 0) + count
    print(
        json.dumps(
            {
                "flows": sum(r[0] for r in results),
                "failed": sum(errors.values()),
                "errors": errors,
                "seconds": end - start,
            }
        )
    )


def main() -> None:
    if sys.argv[1] in ("serve", "hold"):
        (serve if sys.argv[1] == "serve" else hold)(int(sys.argv[2]))
    else:
        addr, port = sys.argv[2], int(sys.argv[3])
        flows, workers = int(sys.argv[4]), int(sys.argv[5])
        if sys.argv[1] == "burst":  # optional: the CC, and seconds to wait before the closes
            cc = sys.argv[6] if len(sys.argv) > 6 else "fusion"
            pause_s = float(sys.argv[7]) if len(sys.argv) > 7 else 0.0
            burst(addr, port, flows, workers, cc, pause_s)
        else:
            send(addr, port, flows, workers)


if __name__ == "__main__":
    main()
