"""Guest side: bulk TCP flows with blocking sockets, measured like iperf3 measures them.

    python -m gemini_lab.bulk recv PORT FLOWS OMIT_S DURATION_S   one JSON line at the end
    python -m gemini_lab.bulk send ADDR PORT CC FLOWS DURATION_S  one JSON line at the end
    python -m gemini_lab.bulk put ADDR PORT CC BYTES   one transfer of BYTES (k/M/G suffixes) to
                                                        a ``gemini_lab.flowgen serve`` receiver;
                                                        CC ``-``: the host's (sysctl or route)
    python -m gemini_lab.bulk puts ADDR PORT CC BYTES STOP DEADLINE   back-to-back transfers
                                                        until the file STOP exists or the unix
                                                        time DEADLINE: a JSON line per flow

Why not iperf3: it waits in a loop of short select() timeouts, and on the UML lab's simulated
clock (gemini_lab.uml) every wake-up is work that lets no simulated time pass, so a flow runs at
1–3× real time; a sender that blocks in send() until the socket has room lets the clock jump
straight to the next packet's event and runs 16–400× faster.

The receiver counts the bytes that arrive between ``OMIT_S`` and ``DURATION_S`` after the first
byte (iperf3's ``-O``: slow start left out), and every byte until the senders close. The sender
samples each connection's ``struct tcp_info`` every 100 ms: the mean of the smoothed RTT over
the flow, the kernel's minimum RTT (the path's base RTT as the flow saw it), the
retransmitted segments at the end, and every 0.5 s the window and retransmits so far (what a
flow's course looked like: a slow start, a cut, a window that stopped growing).

A flow ends at its duration, not when its socket buffer has drained: the buffers hold several
BDPs of the satellite path, and a window that a timeout collapsed there takes minutes to
deliver them (a vegas flow and two of Booster's exploratory θ did not finish within a minute
of their end). So the sender stops writing at ``DURATION_S`` even inside a blocked send, and
the receiver reads to EOF for at most ``DRAIN_S`` more, then resets the connections (which
also ends the sender's orphaned socket at once, and with it Fusion's flow record). Its
``complete`` says whether every byte sent arrived; the figures are the window's either way.
"""

from __future__ import annotations

import json
import os
import selectors
import socket
import struct
import sys
import threading
import time
from typing import cast

CHUNK_BYTES = 256 * 1024
SAMPLE_S = 0.1
# struct tcp_info (include/uapi/linux/tcp.h): the fields read here and their offsets.
TCP_INFO_LEN = 152
TCPI_RTT_US_OFFSET = 68
TCPI_SND_CWND_OFFSET = 80
TCPI_TOTAL_RETRANS_OFFSET = 100
TCPI_MIN_RTT_US_OFFSET = 148
HOST_CC = "-"  # as a CC argument: set none, the kernel picks (route congctl, else the sysctl)
DRAIN_S = 30  # after the duration: the receiver reads to EOF this long at most, then resets
SEND_STEP_MIN_S = 0.001  # a blocked send is given at least this long before the deadline check
WINDOW_EVERY_SAMPLES = 5  # the window's time series: one point per 0.5 s of the flow


def tcp_info(s: socket.socket) -> dict[str, int]:
    """The smoothed and minimum RTT (µs), window (segments) and total retransmits of a socket."""
    raw = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_LEN)

    def u32(offset: int) -> int:
        return int(struct.unpack_from("I", raw, offset)[0])

    return {
        "rtt_us": u32(TCPI_RTT_US_OFFSET),
        "cwnd": u32(TCPI_SND_CWND_OFFSET),
        "total_retrans": u32(TCPI_TOTAL_RETRANS_OFFSET),
        "min_rtt_us": u32(TCPI_MIN_RTT_US_OFFSET),
    }


def _reset(conn: socket.socket) -> None:
    """Close with RST: the peer's socket, orphaned or not, ends at once."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


def recv(port: int, flows: int, omit_s: float, duration_s: float, drain_s: float = DRAIN_S) -> dict:
    """Accept ``flows`` connections and read them to EOF, or until ``drain_s`` after the
    duration (then reset them)."""
    lsock = socket.create_server(("0.0.0.0", port), backlog=flows)
    print("ready", flush=True)
    sel = selectors.DefaultSelector()
    for _ in range(flows):
        conn, _ = lsock.accept()
        sel.register(conn, selectors.EVENT_READ)
    lsock.close()
    total = in_window = 0
    first = 0.0
    buf = bytearray(CHUNK_BYTES)
    open_conns = flows
    while open_conns:
        give_up = first + duration_s + drain_s if first else None
        events = sel.select(None if give_up is None else max(give_up - time.monotonic(), 0))
        if not events:
            break  # the drain limit: what is still in flight is not the measurement's
        for key, _ in events:
            conn = cast(socket.socket, key.fileobj)  # only connections are registered
            n = conn.recv_into(buf)
            now = time.monotonic()
            if n == 0:
                sel.unregister(conn)
                conn.close()
                open_conns -= 1
                continue
            if not first:
                first = now
            total += n
            if omit_s <= now - first <= duration_s:
                in_window += n
    for key in list(sel.get_map().values()):
        _reset(cast(socket.socket, key.fileobj))
    window_s = duration_s - omit_s
    return {
        "bytes_received": total,
        "bytes_in_window": in_window,
        "window_s": window_s,
        "throughput_mbps": in_window * 8 / window_s / 1e6,
        "complete": open_conns == 0,
    }


def _pump(s: socket.socket, until: float) -> None:
    """Write until ``until``; a send still blocked then is cut short (what it wrote stays)."""
    payload = b"\0" * CHUNK_BYTES
    while (left := until - time.monotonic()) > 0:
        s.settimeout(max(left, SEND_STEP_MIN_S))
        try:
            s.sendall(payload)
        except TimeoutError:
            break
    s.settimeout(None)
    s.shutdown(socket.SHUT_WR)


def _window_point(t_s: float, infos: list[dict[str, int]]) -> list[float]:
    """[seconds since the start, window (segments), retransmitted segments so far], summed
    over the connections."""
    return [
        round(t_s, 2),
        sum(i["cwnd"] for i in infos),
        sum(i["total_retrans"] for i in infos),
    ]


def send(addr: str, port: int, cc: str, flows: int, duration_s: float) -> dict:
    """``flows`` connections with congestion control ``cc``, each sending for ``duration_s``."""
    conns = []
    for _ in range(flows):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
        s.connect((addr, port))
        conns.append(s)
    until = time.monotonic() + duration_s
    pumps = [threading.Thread(target=_pump, args=(s, until)) for s in conns]
    for t in pumps:
        t.start()
    rtts: list[int] = []
    window: list[list[float]] = []
    start, samples = time.monotonic(), 0
    while any(t.is_alive() for t in pumps):
        time.sleep(SAMPLE_S)
        infos = [tcp_info(s) for s in conns]
        rtts += [i["rtt_us"] for i in infos]
        if samples % WINDOW_EVERY_SAMPLES == 0:
            window.append(_window_point(time.monotonic() - start, infos))
        samples += 1
    for t in pumps:
        t.join()
    last = [tcp_info(s) for s in conns]
    ports = sorted(s.getsockname()[1] for s in conns)
    for s in conns:
        s.close()
    rtts = [r for r in rtts if r] or [0]
    return {
        "ports": ports,
        "retransmits": sum(i["total_retrans"] for i in last),
        "mean_rtt_us": sum(rtts) / len(rtts),
        "min_rtt_us": min(i["min_rtt_us"] for i in last),
        "cwnd_end": [i["cwnd"] for i in last],
        "window_series": window,
    }


SIZE_SUFFIXES = {"k": 1024, "m": 1024**2, "g": 1024**3}


def parse_size(text: str) -> int:
    """``3M`` → 3 MiB, as iperf3's ``-n`` reads it."""
    scale = SIZE_SUFFIXES.get(text[-1:].lower(), 1)
    return int(text[:-1] if scale > 1 else text) * scale


def put(addr: str, port: int, cc: str, size: int) -> dict:
    """Send ``size`` bytes and wait until the receiver has read them all and closed."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        if cc != HOST_CC:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
        s.connect((addr, port))
        left = size
        payload = b"\0" * CHUNK_BYTES
        while left > 0:
            left -= s.send(payload[: min(left, CHUNK_BYTES)])
        s.shutdown(socket.SHUT_WR)
        while s.recv(CHUNK_BYTES):
            pass  # the receiver closes once it has read to EOF
        cc_run = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)
        return {
            "bytes": size,
            "port": s.getsockname()[1],
            "cc": cc_run.rstrip(b"\0").decode(),
            **tcp_info(s),
        }


PUT_TIMEOUT_S = 120  # a transfer stalled this long is abandoned (and counted as failed)


def puts(addr: str, port: int, cc: str, size: int, stop: str, deadline: float) -> None:
    """Back-to-back ``put``s in this one process (a process per flow costs seconds of
    interpreter start-up under emulation): one line per flow, [start, end, the CC its
    socket ran or "failed"] in unix seconds."""
    socket.setdefaulttimeout(PUT_TIMEOUT_S)
    while time.time() < deadline and not os.path.exists(stop):
        start = time.time()
        try:
            cc_run = put(addr, port, cc, size)["cc"]
        except OSError:
            cc_run = "failed"
            time.sleep(1)  # the receiver is not up yet, or the path is down: not a busy loop
        print(json.dumps([start, time.time(), cc_run]), flush=True)


def main() -> None:
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "recv":
        result = recv(int(args[0]), int(args[1]), float(args[2]), float(args[3]))
    elif mode == "send":
        result = send(args[0], int(args[1]), args[2], int(args[3]), float(args[4]))
    elif mode == "put":
        result = put(args[0], int(args[1]), args[2], parse_size(args[3]))
    elif mode == "puts":
        puts(args[0], int(args[1]), args[2], parse_size(args[3]), args[4], float(args[5]))
        return
    else:
        raise SystemExit(f"unknown mode {mode!r}: recv, send, put or puts")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
