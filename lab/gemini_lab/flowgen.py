"""Guest side: many short TCP flows, to load the flow-record path.

    python -m gemini_lab.flowgen serve PORT            accept, read to EOF, close; forever
    python -m gemini_lab.flowgen send ADDR PORT N W    N fusion flows of 1 KB from W processes

`send` prints one JSON line: flows completed, failures, seconds.
"""

from __future__ import annotations

import json
import multiprocessing
import selectors
import socket
import sys
import time

FLOW_BYTES = 1024
BACKLOG = 4096


def serve(port: int) -> None:
    sel = selectors.DefaultSelector()
    lsock = socket.create_server(("0.0.0.0", port), backlog=BACKLOG, reuse_port=True)
    lsock.setblocking(False)
    sel.register(lsock, selectors.EVENT_READ)
    while True:
        for key, _ in sel.select():
            if key.fileobj is lsock:
                try:
                    conn, _ = lsock.accept()
                except BlockingIOError:
                    continue
                conn.setblocking(False)
                sel.register(conn, selectors.EVENT_READ)
                continue
            conn = key.fileobj
            try:
                data = conn.recv(65536)
            except BlockingIOError:
                continue
            except ConnectionError:
                data = b""
            if not data:
                sel.unregister(conn)
                conn.close()


def _worker(args: tuple[str, int, int, str]) -> tuple[int, int]:
    addr, port, n, cc = args
    payload = b"x" * FLOW_BYTES
    done = failed = 0
    for _ in range(n):
        try:
            with socket.socket() as s:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
                s.settimeout(10)
                s.connect((addr, port))
                s.sendall(payload)
                s.shutdown(socket.SHUT_WR)
                while s.recv(4096):
                    pass
            done += 1
        except OSError:
            failed += 1
    return done, failed


def send(addr: str, port: int, flows: int, workers: int, cc: str = "fusion") -> None:
    share = [flows // workers + (1 if i < flows % workers else 0) for i in range(workers)]
    t0 = time.monotonic()
    with multiprocessing.Pool(workers) as pool:
        results = pool.map(_worker, [(addr, port, n, cc) for n in share])
    elapsed = time.monotonic() - t0
    print(json.dumps({"flows": sum(r[0] for r in results), "failed": sum(r[1] for r in results),
                      "seconds": elapsed}))


def main() -> None:
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    else:
        send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))


if __name__ == "__main__":
    main()
