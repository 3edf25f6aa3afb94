"""FlashPass's packets on the wire: one UDP datagram each, a fixed header in network order.

The sizes are the paper's in IP bytes, scaled to the lab's MTU: an emulation packet is 84
bytes, a data packet 1500 (the paper's 1538 is an Ethernet frame with preamble and gap,
which veth does not carry). The emulation rate's share of the link is in the units the link's
rate limiter counts, as the paper's 84/(84+1538) is in wire bytes: on veth each packet is
charged with its 14-byte Ethernet header, so the share is 98/(98+1514) = 6.1%. One emulation
packet per 1612 bytes of the link then buys exactly one data frame's worth; the IP bytes'
84/1584 = 5.3% bought credits for only 8.2 of 10 Mbit/s (benchmarks/results/flashpass.md).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

DATA_PORT = 47000  # the receiver's ports: data, probes
EMULATION_PORT = 47001  # emulation packets (the switch classifies them by it)
# The switch's emulation queue (gemini_lab.flashpass.switch); the sender bounds a credit's
# return by it: an RTT plus this many emulation packets' wait.
EMULATION_BUFFER_PACKETS = 8
IP_UDP_HEADER = 28  # IPv4 (20) + UDP (8): what the kernel adds to each datagram
EMULATION_IP_BYTES = 84
DATA_IP_BYTES = 1500
ETHERNET_HEADER = 14  # what veth adds, and what HTB and RED count of each packet
EMULATION_FRAME = EMULATION_IP_BYTES + ETHERNET_HEADER
DATA_FRAME = DATA_IP_BYTES + ETHERNET_HEADER
EMULATION_SHARE = EMULATION_FRAME / (EMULATION_FRAME + DATA_FRAME)
# kind, flow id, sequence number, emulation timestamp (ns), total data packets of the flow
HEADER = struct.Struct("!BIIqI")
DATA_PAYLOAD = DATA_IP_BYTES - IP_UDP_HEADER - HEADER.size
EMULATION_PAD = EMULATION_IP_BYTES - IP_UDP_HEADER - HEADER.size
MAX_NACK = (DATA_PAYLOAD) // 4  # missing sequence numbers one nack carries


class Kind(IntEnum):
    """What a datagram is; each kind has its own handling at both ends."""

    EMULATION = 1  # sender → receiver through the emulation class
    CREDIT = 2  # receiver → sender: one per emulation packet that arrived
    DATA = 3  # sender → receiver through the data class
    PROBE = 4  # sender → receiver: the tail-loss probe, "what is missing?" (below seq if > 0)
    NACK = 5  # receiver → sender: the missing data sequence numbers
    DONE = 6  # receiver → sender: every data packet of the flow has arrived


class WireError(ValueError):
    """A datagram that is not a FlashPass packet."""


@dataclass(frozen=True)
class Packet:
    kind: Kind
    flow: int
    seq: int
    emu_ts_ns: int = 0  # the emulation packet's send time (emulation, credit, data)
    total: int = 0  # the flow's data packets (data), so the receiver knows when it is done
    body: bytes = b""

    def encode(self) -> bytes:
        head = HEADER.pack(self.kind, self.flow, self.seq, self.emu_ts_ns, self.total)
        return head + self.body

    @classmethod
    def decode(cls, raw: bytes) -> Packet:
        if len(raw) < HEADER.size:
            raise WireError(f"datagram of {len(raw)} bytes, shorter than the header")
        kind, flow, seq, ts, total = HEADER.unpack_from(raw)
        try:
            return cls(Kind(kind), flow, seq, ts, total, raw[HEADER.size :])
        except ValueError:
            raise WireError(f"unknown packet kind {kind}") from None


def max_emulation_pps(link_bps: float) -> float:
    """The emulation class's rate in packets per second: one per data frame the link carries
    beside it (a flow's Algorithm 2 starts here and never exceeds it)."""
    return link_bps * EMULATION_SHARE / (EMULATION_FRAME * 8)


def emulation(flow: int, seq: int, ts_ns: int) -> bytes:
    return Packet(Kind.EMULATION, flow, seq, ts_ns, body=bytes(EMULATION_PAD)).encode()


def nack_body(missing: list[int]) -> bytes:
    """The first MAX_NACK of ``missing`` (one datagram's worth; the sender's next probe asks
    for the rest)."""
    first = missing[:MAX_NACK]
    return struct.pack(f"!{len(first)}I", *first)


def nack_missing(body: bytes) -> list[int]:
    return list(struct.unpack(f"!{len(body) // 4}I", body[: len(body) // 4 * 4]))
