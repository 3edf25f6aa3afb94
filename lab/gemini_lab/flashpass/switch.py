"""The emulated FlashPass switch port as real qdiscs at the bottleneck's egress (§4.4 of the
paper: a separate, rate-limited emulation queue with single-threshold ECN, and the data queue).

    htb 1:  ── 1:1  the link (rate = ceil = the link)
                ├─ 1:10 emulation: rate = ceil = 98/(98+1514) of the link, never borrows
                │    └─ red 10:  limit 8 packets, marks ECT / drops non-ECT above 2 packets
                └─ 1:20 data (default): the rest, may borrow the emulation's idle share
                     └─ bfifo 20:  the shallow data buffer
    u32 on the emulation port → 1:10   (the emulation class's burst: one packet)

RED with ``ecn`` (and without ``nodrop``) is the paper's selective drop: above its threshold an
ECN-capable packet is marked CE and one that is not is dropped, so the over-provisioned
(non-ECT) emulation packets are the first to go. min = 2 packets, max = 3, probability 1: a
single threshold, as the lab's DCTCP marking (gemini_lab.netem.red_args) sets one; ``burst`` 2
is the smallest tc takes (averaging weight 1/2). Packet sizes as HTB and RED count them
include the 14-byte Ethernet header; so does the emulation share (gemini_lab.flashpass.wire).

For a DCTCP arm (``data_ecn_k_packets`` = K) the data queue is instead RED as the lab's DCTCP
marking switch (gemini_lab.netem.red_args): the same byte limit, an ECN-capable packet marked CE
from K packets on, nothing dropped early (``nodrop``), every packet dropped at the limit.

For FlashPass* (``selective_drop``: the pre-credit phase, gemini_lab.flashpass.sender) the data
queue is the emulation class's selective drop at the data's size: RED with ``ecn`` and without
``nodrop``, min = 2 packets, max = 3, probability 1, the same byte limit as the bfifo. The
sender sends its scheduled data ECT and its unscheduled (pre-credit) data non-ECT, so above 2
packets an unscheduled packet is dropped and a scheduled one marked CE and kept (the receiver
ignores the mark); at the limit both are dropped, as by the bfifo. The paper's threshold for
Aeolus's selective drop is the over-provisioning's, 2 packets (§4.3.1).
"""

from __future__ import annotations

from dataclasses import dataclass

from gemini_lab.flashpass import wire

EMULATION_WIRE = wire.EMULATION_FRAME
DATA_WIRE = wire.DATA_FRAME
MARK_THRESHOLD_PACKETS = 2  # the paper's single threshold (§4.3.4)
# The emulation class's token bucket: one packet, so it sends at its rate and never in a burst
# (HTB's default burst, rate/HZ + an MTU, is some twenty emulation packets back to back, and
# every burst of survivors becomes a burst of data at the shallow data queue).
EMULATION_BURST_PACKETS = 1
EMULATION_CLASS = "1:10"
DATA_CLASS = "1:20"
EMULATION_QDISC = "10:"
DATA_QDISC = "20:"


def red_marking(limit_bytes: int, k: int, wire_bytes: int, kbit: int) -> list[str]:
    """RED's arguments for a queue of ``limit_bytes`` that marks ECN on every packet once
    ``k`` packets of ``wire_bytes`` wait (min = K, max = K + 1, probability 1: DCTCP's step
    marking), drained at ``kbit``."""
    return [
        "limit", str(limit_bytes),
        "min", str(k * wire_bytes),
        "max", str((k + 1) * wire_bytes),
        "avpkt", str(wire_bytes),
        "burst", str(k),
        "probability", "1.0",
        "bandwidth", f"{kbit}kbit",
        "ecn",
    ]  # fmt: skip


@dataclass(frozen=True)
class SwitchPort:
    """One emulated switch port: its link rate and the data queue's depth."""

    rate_kbit: int
    data_buffer_packets: int
    emulation_kbit: int = 0  # the emulation class's rate: the link's emulation share
    data_ecn_k_packets: int | None = None  # DCTCP's marking threshold K; None: a plain bfifo
    selective_drop: bool = False  # FlashPass*: drop non-ECT (unscheduled) data above 2 packets

    def __post_init__(self) -> None:
        share = max(1, round(self.rate_kbit * wire.EMULATION_SHARE))
        object.__setattr__(self, "emulation_kbit", self.emulation_kbit or share)
        if self.selective_drop and self.data_ecn_k_packets is not None:
            raise ValueError("a data queue either marks for DCTCP or drops selectively")

    def red_args(self) -> list[str]:
        limit = wire.EMULATION_BUFFER_PACKETS * EMULATION_WIRE
        return red_marking(limit, MARK_THRESHOLD_PACKETS, EMULATION_WIRE, self.emulation_kbit)

    def data_queue_args(self) -> list[str]:
        """The data class's leaf: the shallow bfifo, RED marking ECN from K packets on, or RED
        dropping unscheduled (non-ECT) data above 2 packets."""
        limit = self.data_buffer_packets * DATA_WIRE
        if self.selective_drop:
            return ["red", *red_marking(limit, MARK_THRESHOLD_PACKETS, DATA_WIRE, self.rate_kbit)]
        k = self.data_ecn_k_packets
        if k is None:
            return ["bfifo", "limit", str(limit)]
        return ["red", *red_marking(limit, k, DATA_WIRE, self.rate_kbit), "nodrop"]

    def commands(self, dev: str) -> list[list[str]]:
        """The tc commands that make ``dev``'s egress this port."""
        tc = ["tc"]
        rate, emu = f"{self.rate_kbit}kbit", f"{self.emulation_kbit}kbit"
        data = f"{self.rate_kbit - self.emulation_kbit}kbit"
        burst = f"{EMULATION_BURST_PACKETS * EMULATION_WIRE}b"
        cls = [*tc, "class", "add", "dev", dev, "parent"]
        qd = [*tc, "qdisc", "add", "dev", dev, "parent"]
        return [
            [*tc, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "20"],
            [*cls, "1:", "classid", "1:1", "htb", "rate", rate, "ceil", rate],
            [*cls, "1:1", "classid", EMULATION_CLASS, "htb", "rate", emu, "ceil", emu,
             "burst", burst, "cburst", burst],
            [*cls, "1:1", "classid", DATA_CLASS, "htb", "rate", data, "ceil", rate],
            [*qd, EMULATION_CLASS, "handle", EMULATION_QDISC, "red", *self.red_args()],
            [*qd, DATA_CLASS, "handle", DATA_QDISC, *self.data_queue_args()],
            [*tc, "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1",
             "u32", "match", "ip", "dport", str(wire.EMULATION_PORT), "0xffff",
             "flowid", EMULATION_CLASS],
        ]  # fmt: skip
