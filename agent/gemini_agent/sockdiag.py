"""Finished TCP flows of every congestion control, from the kernel's socket diagnostics.

Fusion's own records say exactly which θ a flow ran; flows of other congestion controls (the
other arm of an A/B comparison) come from here. The kernel announces every TCP socket it frees
on the NETLINK_SOCK_DIAG multicast groups SKNLGRP_INET{,6}_TCP_DESTROY, with its tcp_info.

Two things need care:

- An abortive close (RST, SO_LINGER 0) runs tcp_disconnect(), which zeroes the counters and the
  destination port before the socket is freed, so its destroy event reads 0 bytes. A periodic
  dump of open sockets keeps each socket's last counters, addresses and congestion control by
  its cookie (stable for the socket's life), and an event is completed from it.
- The destroy event names no congestion control; the dump asks for it (INET_DIAG_CONG). A flow
  that opened and closed between two dumps keeps cc "unknown".

Messages are read from a raw socket and unpacked with struct: at thousands of closes a second a
generic netlink decoder costs more than the rest of the agent.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
SKNLGRP_INET_TCP_DESTROY, SKNLGRP_INET6_TCP_DESTROY = 1, 3
INET_DIAG_INFO, INET_DIAG_CONG = 2, 4
SOL_NETLINK, NETLINK_ADD_MEMBERSHIP = 270, 1
SO_RCVBUFFORCE = 33
RCVBUF_BYTES = 32 << 20
GRACE_S = 30.0  # how long a vanished socket's last snapshot waits for its destroy event
# TCP states worth a snapshot: those in which data may still be acknowledged
OPEN_STATES = sum(1 << s for s in (1, 4, 5, 8, 9, 11))  # ESTABLISHED, FIN_WAIT1/2, CLOSE_WAIT…

_NLMSG = struct.Struct("=IHHII")
_DIAG_MSG = struct.Struct("=BBBBHH16s16sIQIIIII")  # struct inet_diag_msg, 72 bytes
_NLA = struct.Struct("=HH")
_REQ_V2 = struct.Struct("=BBBxIHH16s16sIQ")  # struct inet_diag_req_v2, 56 bytes
# struct tcp_info fields, by offset (include/uapi/linux/tcp.h)
TCPI_RTT, TCPI_TOTAL_RETRANS, TCPI_BYTES_ACKED = 68, 100, 120
TCPI_MIN_RTT, TCPI_BUSY_TIME, TCPI_MIN_LEN = 148, 168, 192


@dataclass(frozen=True)
class ClosedFlow:
    cookie: int
    family: int
    saddr: str
    daddr: str
    sport: int
    dport: int
    bytes_acked: int
    busy_us: int  # time the flow had data to send (busy, receive-window and buffer limited)
    rtt_us: int
    min_rtt_us: int
    retrans: int
    cc: str = "unknown"


def _address(family: int, raw: bytes) -> str:
    """Dotted IPv4 also for a dual-stack socket's v4-mapped peer: contexts key on it."""
    addr = ipaddress.ip_address(raw[:4] if family == socket.AF_INET else raw)
    return str(getattr(addr, "ipv4_mapped", None) or addr)


def _attrs(data: bytes, start: int, end: int) -> dict[int, bytes]:
    out, off = {}, start
    while off + 4 <= end:
        length, kind = _NLA.unpack_from(data, off)
        if length < 4:
            break
        out[kind & 0x3FFF] = data[off + 4 : off + length]
        off += (length + 3) & ~3
    return out


def _flow(data: bytes, start: int, end: int) -> ClosedFlow | None:
    (family, _state, _timer, _retrans, sport, dport, src, dst, _if, cookie, *_rest) = (
        _DIAG_MSG.unpack_from(data, start)
    )
    attrs = _attrs(data, start + _DIAG_MSG.size, end)
    info = attrs.get(INET_DIAG_INFO, b"")
    if len(info) < TCPI_MIN_LEN:
        return None
    cc = attrs.get(INET_DIAG_CONG, b"unknown").split(b"\0", 1)[0].decode() or "unknown"
    (busy, rwnd, sndbuf) = struct.unpack_from("=QQQ", info, TCPI_BUSY_TIME)
    return ClosedFlow(
        cookie=cookie,
        family=family,
        saddr=_address(family, src),
        daddr=_address(family, dst),
        sport=socket.ntohs(sport),
        dport=socket.ntohs(dport),
        bytes_acked=struct.unpack_from("=Q", info, TCPI_BYTES_ACKED)[0],
        busy_us=busy + rwnd + sndbuf,
        rtt_us=struct.unpack_from("=I", info, TCPI_RTT)[0],
        min_rtt_us=struct.unpack_from("=I", info, TCPI_MIN_RTT)[0],
        retrans=struct.unpack_from("=I", info, TCPI_TOTAL_RETRANS)[0],
        cc=cc,
    )


def parse(data: bytes) -> Iterator[ClosedFlow | int]:
    """Flows in a netlink datagram; NLMSG_DONE and errors yield their message type."""
    off = 0
    while off + _NLMSG.size <= len(data):
        length, kind, _flags, _seq, _pid = _NLMSG.unpack_from(data, off)
        if length < _NLMSG.size:
            return
        if kind == SOCK_DIAG_BY_FAMILY:
            flow = _flow(data, off + _NLMSG.size, off + length)
            if flow is not None:
                yield flow
        elif kind in (NLMSG_DONE, NLMSG_ERROR):
            yield kind
        off += (length + 3) & ~3


def _open_socket() -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF_BYTES)
    except PermissionError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)
    sock.bind((0, 0))
    return sock


class Snapshots:
    """The last counters of every open TCP socket, by cookie, from a dump."""

    def __init__(self, grace_s: float = GRACE_S) -> None:
        self.by_cookie: dict[int, ClosedFlow] = {}
        self.grace_s = grace_s
        self._seen_at: dict[int, float] = {}

    def refresh(self) -> int:
        seen: dict[int, ClosedFlow] = {}
        with _open_socket() as sock:
            for family in (socket.AF_INET, socket.AF_INET6):
                ext = (1 << (INET_DIAG_INFO - 1)) | (1 << (INET_DIAG_CONG - 1))
                req = _REQ_V2.pack(
                    family, socket.IPPROTO_TCP, ext, OPEN_STATES, 0, 0, bytes(16), bytes(16), 0, 0
                )
                sock.send(
                    _NLMSG.pack(
                        _NLMSG.size + len(req),
                        SOCK_DIAG_BY_FAMILY,
                        NLM_F_REQUEST | NLM_F_DUMP,
                        1,
                        0,
                    )
                    + req
                )
                done = False
                while not done:
                    for item in parse(sock.recv(1 << 20)):
                        if isinstance(item, int):
                            done = True
                        else:
                            seen[item.cookie] = item
        # A socket gone from the dump keeps its entry for grace_s, for its destroy event to
        # find; by then the event was read (and the entry popped) or lost.
        now = time.monotonic()
        self._seen_at.update(dict.fromkeys(seen, now))
        stale = [k for k, t in self._seen_at.items() if now - t > self.grace_s]
        for k in stale:
            del self._seen_at[k]
            self.by_cookie.pop(k, None)
        self.by_cookie.update(seen)
        return len(seen)

    def complete(self, flow: ClosedFlow) -> ClosedFlow:
        """The destroy event, with what the last dump knew where the close erased it."""
        last = self.by_cookie.pop(flow.cookie, None)
        self._seen_at.pop(flow.cookie, None)
        if last is None:
            return flow
        if flow.bytes_acked >= last.bytes_acked and flow.dport:
            return replace(flow, cc=last.cc)
        return replace(
            last, busy_us=max(flow.busy_us, last.busy_us), retrans=max(flow.retrans, last.retrans)
        )


class DestroyListener:
    """Every TCP socket the kernel frees in this network namespace, as a ClosedFlow."""

    def __init__(self, snapshots: Snapshots | None = None) -> None:
        self.snapshots = snapshots or Snapshots()
        self._sock = _open_socket()
        for group in (SKNLGRP_INET_TCP_DESTROY, SKNLGRP_INET6_TCP_DESTROY):
            self._sock.setsockopt(SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, group)
        self._sock.setblocking(False)

    def fileno(self) -> int:
        return self._sock.fileno()

    def read(self) -> list[ClosedFlow]:
        out: list[ClosedFlow] = []
        while True:
            try:
                data = self._sock.recv(1 << 20)
            except BlockingIOError:
                return out
            out += [self.snapshots.complete(f) for f in parse(data) if not isinstance(f, int)]

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> DestroyListener:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
