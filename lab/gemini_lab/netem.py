"""Guest side: network namespaces joined by veth, links shaped by the kernel's netem.

    snd  (10.0.0.2)   ──┬── rtr ──┬─ path 0 ── rcv0 (10.1.0.2)
    hst0 (10.100.0.2) ──┤         ├─ path 1 ── rcv1 (10.2.0.2)
    hst1 (10.100.1.2) ──┘         └─ ...

The lab hosts hst<k> (optional, ``add_lab_host``) are further senders, one per fleet host of an
experiment across hosts; each has its own veth to the router.

Each path's scenario shapes the router's egress toward its receiver, the direction data flows:
a tbf sets the rate and a netem below it drops at random and holds the bottleneck queue. The
round-trip delay is a netem on the receiver's egress, so it delays the ACKs: the sender's own
qdisc stays unshaped (shaping at the sender would throttle TCP through its small-queue limits
instead of through the network). Rate schedules are replayed by a thread that changes the tbf
rate at each bin boundary; tbf applies a new rate to the packets already queued, where a netem
rate would keep the departure times it gave them on arrival.

A path of several hops (``Scenario.hops``) puts a forwarding namespace p<i>n<j> at the sending
end of each hop after the first, each hop shaped there the same way; where a link marks ECN
(``ecn_threshold_packets``) its queue is RED instead of netem (``red_args``). A scenario's
``receiver_cc`` becomes its receiver namespace's default congestion control.

A scenario's delay variation (``jitter_ms``, ``jitter_reorder``, ``ack_burst_ms``) is drawn by
the same netem qdiscs, from the lab's fixed seed: on the return path's delay line
(``delay_line_args``) where it must not reorder, or at the bottleneck where it reorders data
(``bottleneck_args``).
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from gemini_lab.scenario import Link, Scenario

SENDER_NS = "snd"
ROUTER_NS = "rtr"
SENDER_ADDR = "10.0.0.2"
# Socket buffers that hold the satellite BDP (45 Mbit/s x 800 ms = 4.5 MB) several times over.
TCP_MEM = "4096 262144 67108864"


CLONE_NEWNET = 0x40000000


def enter_netns(name: str) -> None:
    """Move the calling thread into a named network namespace (the process, while it has one
    thread): sockets it opens later live there, and threads it starts later start there."""
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {name}")
    finally:
        os.close(fd)


def python_in(ns: str, module: str, *args: str) -> list[str]:
    """The command line that runs ``python -m module args`` (this interpreter, so the lab's own
    packages) in network namespace ``ns``."""
    return ["ip", "netns", "exec", ns, sys.executable, "-m", module, *args]


def sh(*args: str, ns: str | None = None, check: bool = True) -> str:
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    out = subprocess.run(cmd, capture_output=True, text=True)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {out.stderr.strip()}")
    return out.stdout


RECEIVER_WAIT_S = 60  # a receiver's interpreter starts slowly under emulation on a busy host


def wait_listening(ns: str, port: int, timeout_s: float = RECEIVER_WAIT_S) -> None:
    """Until a socket listens on ``port`` in namespace ``ns``. Read from the socket table, not
    by connecting: a probe connection would be one more flow for the receiver (and for a
    listener counting the flows that end). A fixed sleep before the first connect was not
    enough on a busy host: a burst's first connections were refused."""
    deadline = time.monotonic() + timeout_s
    while not sh("ss", "-Hltn", f"sport = :{port}", ns=ns).strip():
        if time.monotonic() > deadline:
            raise RuntimeError(f"nothing listens on port {port} in {ns} after {timeout_s:.0f} s")
        time.sleep(0.2)


def receiver_ns(path: int) -> str:
    return f"rcv{path}"


def receiver_addr(path: int) -> str:
    return f"10.{path + 1}.0.2"


def receiver_prefix(path: int) -> str:
    """The destination prefix behind path ``path``: one context of its own in the loop's .mmdb
    and one rule in a profile table."""
    return f"10.{path + 1}.0.0/16"


def _tune_tcp(ns: str) -> None:
    sh("sysctl", "-qw", f"net.ipv4.tcp_rmem={TCP_MEM}", ns=ns)
    sh("sysctl", "-qw", f"net.ipv4.tcp_wmem={TCP_MEM}", ns=ns)
    sh("sysctl", "-qw", "net.ipv4.tcp_no_metrics_save=1", ns=ns)


def _mac(ns: str, ifname: str) -> str:
    return str(json.loads(sh("ip", "-j", "link", "show", ifname, ns=ns))[0]["address"])


def _veth(a_ns: str, a_if: str, a_addr: str, b_ns: str, b_if: str, b_addr: str) -> None:
    """A veth pair whose ends know each other's address for good. Without the permanent
    neighbour entries each end re-probes ARP at a randomised reachable time, and a probe
    through a lossy netem queue takes one of its loss draws: the flow's later packets then meet
    other draws, by the guest's random generator and not by the experiment."""
    sh("ip", "link", "add", a_if, "netns", a_ns, "type", "veth", "peer", b_if, "netns", b_ns)
    sh("ip", "addr", "add", f"{a_addr}/24", "dev", a_if, ns=a_ns)
    sh("ip", "addr", "add", f"{b_addr}/24", "dev", b_if, ns=b_ns)
    a_mac, b_mac = _mac(a_ns, a_if), _mac(b_ns, b_if)
    for ns, ifname, peer, mac in ((a_ns, a_if, b_addr, b_mac), (b_ns, b_if, a_addr, a_mac)):
        sh("ip", "neigh", "replace", peer, "lladdr", mac, "dev", ifname, "nud", "permanent", ns=ns)
    sh("ip", "link", "set", a_if, "up", ns=a_ns)
    sh("ip", "link", "set", b_if, "up", ns=b_ns)


def lab_host_ns(k: int) -> str:
    return f"hst{k}"


def lab_host_addr(k: int) -> str:
    return f"10.100.{k}.2"


def add_lab_host(k: int, default_cc: str) -> str:
    """A further sender: namespace hst<k> (10.100.<k>.2) behind the router, so its flows take
    the same shaped paths as the sender's, with ``default_cc`` as its own congestion control.
    Each lab host is a host of the fleet to Booster: its own agent, identity, CC and Fusion
    profile table (Fusion keeps θ per network namespace). The CC must be one a namespace may
    choose (``tcp_allowed_congestion_control``, set in the initial namespace)."""
    ns = lab_host_ns(k)
    sh("ip", "netns", "add", ns)
    sh("ip", "link", "set", "lo", "up", ns=ns)
    _tune_tcp(ns)
    # names unique in the caller's namespace too, where `ip link add` makes the pair first
    uplink = f"up{k}"
    _veth(ns, uplink, lab_host_addr(k), ROUTER_NS, ns, f"10.100.{k}.1")
    sh("ip", "route", "add", "default", "via", f"10.100.{k}.1", ns=ns)
    sh("ethtool", "-K", uplink, "tso", "off", "gso", "off", ns=ns)
    sh("sysctl", "-qw", f"net.ipv4.tcp_congestion_control={default_cc}", ns=ns)
    return ns


TBF_BURST_MIN_BYTES = 4 * 1514
TBF_BURST_S = 0.002  # a couple of milliseconds of tokens: smooth, yet not timer-bound
DELAY_LIMIT = 100_000  # the ACK-path delay line never drops
WIRE_PACKET_BYTES = 1514  # a full-sized segment as a qdisc counts it (Ethernet header included)
BOTTLENECK_HANDLE = "10:"  # the queue under each link's tbf: netem, or RED where it marks ECN


def tbf_args(rate_kbit: int, burst_packets: int | None = None) -> list[str]:
    """The shaper: ``burst_packets`` full-sized packets of tokens, else the lab's default (a
    couple of milliseconds, at least 4 packets)."""
    if burst_packets is not None:
        burst = burst_packets * WIRE_PACKET_BYTES
    else:
        burst = max(TBF_BURST_MIN_BYTES, int(rate_kbit * 1000 / 8 * TBF_BURST_S))
    return ["rate", f"{rate_kbit}kbit", "burst", str(burst), "latency", "1s"]


NO_REORDER_RATE = "10gbit"  # netem's own rate, only so that no packet overtakes another
MS = 1000.0


def bottleneck_args(s: Scenario | Link) -> list[str]:
    """netem as the bottleneck queue: its limit in packets, its random loss and, where the
    path reorders, a delay of 0 to 2 J per data packet drawn independently (netem's delay
    queue is ordered by departure time, so a short draw overtakes a long one). Packets held
    by that delay count against netem's limit too, so the limit grows by what the link
    carries in 2 J: the queue left for queueing stays ``queue_limit``."""
    link = s.links()[0] if isinstance(s, Scenario) else s
    limit = link.queue_limit
    if link.jitter_ms:
        limit += math.ceil(link.rate_kbit * 2 * link.jitter_ms / (WIRE_PACKET_BYTES * 8))
    args = ["limit", str(limit)]
    if link.jitter_ms:
        args += ["delay", f"{link.jitter_ms:g}ms", f"{link.jitter_ms:g}ms"]
    if link.loss_percent:
        args += ["loss", "random", f"{link.loss_percent}%"]
    return args


def delay_line_args(s: Scenario) -> list[str]:
    """The return path's netem (on the receiver's egress): the round trip's delay, and the
    variation that does not reorder: a uniform draw of ± J per ACK with netem's ``rate`` set
    (far above any ACK stream's), under which netem sends each packet no earlier than the one
    before it; and ``slot`` A, A: ACKs wait for the next of the slots, A ms apart, and leave
    together (min = max: no random slot lengths)."""
    args = ["delay", f"{s.return_delay_ms():g}ms"]
    if s.jitter_ms and not s.jitter_reorder:
        args += [f"{s.jitter_ms:g}ms", "rate", NO_REORDER_RATE]
    args += ["limit", str(DELAY_LIMIT)]
    if s.ack_burst_ms:
        args += ["slot", f"{s.ack_burst_ms:g}ms", f"{s.ack_burst_ms:g}ms"]
    return args


def red_args(link: Link) -> list[str]:
    """RED as DCTCP's marking switch (the usual DCTCP testbed setup): min K packets and max
    K + 1, probability 1, so an ECN-capable packet that arrives to a queue of K or more
    packets is marked CE (between min and max with a probability rising to 1 over one packet,
    above max always); ``burst`` K is the smallest tc accepts (it must reach min/avpkt) and
    gives the smallest averaging tc can set (weight 1/2, so the average follows the
    instantaneous queue within a packet or so). ``nodrop``: a packet that is not ECN-capable
    is queued, not dropped early, so a flow without ECN meets a plain tail-drop queue of
    ``limit``; every packet is dropped at the limit. fq_codel's ce_threshold would mark on
    sojourn time at dequeue and put each flow in its own queue; RED keeps one FIFO and counts
    its marks (``tc -s qdisc``: marked)."""
    k = link.ecn_threshold_packets
    assert k is not None, "red_args: a link without ecn_threshold_packets"
    return [
        "limit",
        str(link.queue_limit * WIRE_PACKET_BYTES),
        "min",
        str(k * WIRE_PACKET_BYTES),
        "max",
        str((k + 1) * WIRE_PACKET_BYTES),
        "avpkt",
        str(WIRE_PACKET_BYTES),
        "burst",
        str(k),
        "probability",
        "1.0",
        "bandwidth",
        f"{link.rate_kbit}kbit",
        "ecn",
        "nodrop",
    ]


def link_qdisc_commands(dev: str, link: Link) -> list[list[str]]:
    """The tc commands that shape one link at ``dev``, its sending end: a tbf for the rate with
    the bottleneck queue below it (netem, or RED where the link marks ECN)."""
    tbf = ["tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "tbf"]
    child = ["tc", "qdisc", "add", "dev", dev, "parent", "1:1", "handle", BOTTLENECK_HANDLE]
    if link.ecn_threshold_packets is not None:
        queue = ["red", *red_args(link)]
    else:
        queue = ["netem", *bottleneck_args(link)]
    return [[*tbf, *tbf_args(link.rate_kbit, link.burst_packets)], [*child, *queue]]


def hop_ns(path: int, hop: int) -> str:
    """The namespace at the sending end of hop ``hop`` >= 1 of path ``path`` (hop 0 leaves
    the router)."""
    return f"p{path}n{hop}"


def link_device(path: int, hop: int) -> tuple[str, str]:
    """(namespace, interface) where hop ``hop`` of path ``path`` is shaped: its qdiscs and
    their counters (``qdisc_stats``)."""
    return (ROUTER_NS, f"path{path}") if hop == 0 else (hop_ns(path, hop), f"p{path}h{hop}")


def _link_addr(path: int, hop: int, hops: int, end: int) -> str:
    """Address of ``end`` (1: sending, 2: receiving) of hop ``hop`` of a path of ``hops``:
    the last hop is 10.<path+1>.0.0/24, as a single-link path's, so the receiver keeps its
    address; the ones before count up from there toward the router."""
    return f"10.{path + 1}.{hops - 1 - hop}.{end}"


def receiver_gateway(path: int) -> str:
    """The receiver's next hop (its default route): the sending end of the path's last hop."""
    return f"10.{path + 1}.0.1"


def qdisc_stats(path: int, hop: int = 0) -> dict:
    """``tc -s`` of the bottleneck queue of one hop (netem or RED, handle 10:) as tc's JSON:
    backlog (bytes), qlen (packets), drops, and RED's marked, early and pdrop."""
    ns, dev = link_device(path, hop)
    for q in json.loads(sh("tc", "-s", "-j", "qdisc", "show", "dev", dev, ns=ns)):
        if q.get("handle") == BOTTLENECK_HANDLE:
            return dict(q)
    raise RuntimeError(f"no qdisc {BOTTLENECK_HANDLE} on {dev} in {ns}")


def path_qdiscs(path: int) -> dict:
    """What the kernel holds for path ``path`` (tc's JSON): ``data``, the qdiscs at the
    sending end of its first hop (tbf, and netem or RED below it), and ``return``, the delay
    line on the receiver's egress. The lab test reads a scenario's jitter and ACK bursts back
    from these."""
    data_ns, data_dev = link_device(path, 0)
    return {
        "data": json.loads(sh("tc", "-j", "qdisc", "show", "dev", data_dev, ns=data_ns)),
        "return": json.loads(sh("tc", "-j", "qdisc", "show", "dev", "veth0", ns=receiver_ns(path))),
    }


def out_of_order_segments(path: int) -> int:
    """Segments path ``path``'s receiver has queued out of order so far (TcpExtTCPOFOQueue):
    data that arrived after a later segment, through reordering or a loss's hole."""
    out = sh("nstat", "-az", "TcpExtTCPOFOQueue", ns=receiver_ns(path))
    for line in out.splitlines():
        fields = line.split()
        if fields and fields[0] == "TcpExtTCPOFOQueue":
            return int(fields[1])
    raise RuntimeError(f"nstat in {receiver_ns(path)}: no TcpExtTCPOFOQueue in {out!r}")


def allow_cc(cc: str) -> None:
    """Let a namespace choose ``cc`` as its default: the initial namespace's allowed list (a
    non-initial namespace may only pick an allowed CC). Call from the initial namespace."""
    allowed = sh("sysctl", "-n", "net.ipv4.tcp_allowed_congestion_control").split()
    if cc not in allowed:
        # the list takes only registered CCs (ENOENT otherwise): Debian's kernel under qemu
        # has dctcp as a module that nothing has loaded yet (UML's is built in: a no-op there)
        sh("modprobe", f"tcp_{cc}", check=False)
        value = " ".join([*allowed, cc])
        sh("sysctl", "-qw", f"net.ipv4.tcp_allowed_congestion_control={value}")


@dataclass
class Topology:
    paths: list[Scenario]

    def build(self) -> None:
        sh("sysctl", "-qw", "net.core.rmem_max=67108864")
        sh("sysctl", "-qw", "net.core.wmem_max=67108864")
        for ns in (SENDER_NS, ROUTER_NS, *(receiver_ns(i) for i in range(len(self.paths)))):
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "set", "lo", "up", ns=ns)
            _tune_tcp(ns)
        # "veth0", not "eth0": the guest's own NIC is eth0 and may join the sender namespace
        _veth(SENDER_NS, "veth0", SENDER_ADDR, ROUTER_NS, "snd", "10.0.0.1")
        sh("ip", "route", "add", "default", "via", "10.0.0.1", ns=SENDER_NS)
        sh("sysctl", "-qw", "net.ipv4.ip_forward=1", ns=ROUTER_NS)
        for i, scenario in enumerate(self.paths):
            self._build_path(i, scenario)
        # Segmentation offloads off where data enters the network: netem must see, delay and
        # drop wire-sized packets, not 64 KB super-packets.
        sh("ethtool", "-K", "veth0", "tso", "off", "gso", "off", ns=SENDER_NS)

    def _build_path(self, i: int, scenario: Scenario) -> None:
        """Router, a forwarding namespace per further hop, receiver; each hop shaped at its
        sending end. The whole round trip's delay (every hop's, both ways) is one netem on the
        receiver's egress, as for a single link: with fixed delays and every flow entering at
        the router, where a delay sits along the path changes no flow's dynamics, and the
        hops' queues see the data as it leaves the one before."""
        rcv, links = receiver_ns(i), scenario.links()
        n = len(links)
        for j in range(1, n):
            sh("ip", "netns", "add", hop_ns(i, j))
            sh("ip", "link", "set", "lo", "up", ns=hop_ns(i, j))
            sh("sysctl", "-qw", "net.ipv4.ip_forward=1", ns=hop_ns(i, j))
        for j, link in enumerate(links):
            up_ns, up_if = link_device(i, j)
            down_ns, down_if = (rcv, "veth0") if j == n - 1 else (hop_ns(i, j + 1), f"p{i}d{j}")
            up_addr, down_addr = _link_addr(i, j, n, 1), _link_addr(i, j, n, 2)
            _veth(up_ns, up_if, up_addr, down_ns, down_if, down_addr)
            if j < n - 1:  # onward to the receiver's subnet through the next hop
                sh("ip", "route", "add", f"10.{i + 1}.0.0/16", "via", down_addr, ns=up_ns)
            if j > 0:  # back toward the router (the ACKs)
                sh("ip", "route", "add", "default", "via", _link_addr(i, j - 1, n, 1), ns=up_ns)
            for cmd in link_qdisc_commands(up_if, link):
                sh(*cmd, ns=up_ns)
        sh("ip", "route", "add", "default", "via", receiver_gateway(i), ns=rcv)
        sh(
            "tc",
            "qdisc",
            "add",
            "dev",
            "veth0",
            "root",
            "netem",
            *delay_line_args(scenario),
            ns=rcv,
        )
        if scenario.receiver_cc:
            # a listener's CC decides whether it takes an ECN-capable SYN and how it echoes CE
            allow_cc(scenario.receiver_cc)
            cc = scenario.receiver_cc
            sh("sysctl", "-qw", f"net.ipv4.tcp_congestion_control={cc}", ns=rcv)

    def start_schedules(self) -> list[RateSchedule]:
        threads = []
        for i, scenario in enumerate(self.paths):
            if len(scenario.schedule()) > 1:
                t = RateSchedule(i, scenario)
                t.start()
                threads.append(t)
        return threads


class RateSchedule(threading.Thread):
    """Replays a scenario's rate schedule on its path's netem qdisc, looping.

    A flow's figures depend on where in the schedule it starts (a flow that meets the first
    rise after 1 s and one that meets it after 3.9 s see different paths), so ``restart``
    puts the schedule back at its first row just before a flow starts: every flow on the path,
    whatever ran before it, sees the same capacity sequence from its first packet."""

    def __init__(self, path: int, scenario: Scenario) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.scenario = scenario
        self.stopped = threading.Event()
        self._wake = threading.Event()  # stop or restart: leave the current replay
        self._at_start = threading.Event()  # the first row of a fresh replay is applied

    def run(self) -> None:
        rows = self.scenario.schedule()
        period = rows[-1][0] + (rows[1][0] - rows[0][0])
        while not self.stopped.is_set():
            self._wake.clear()
            self._replay(rows, period, time.monotonic())

    def _replay(self, rows: list[tuple[float, int]], period: float, start: float) -> None:
        """Apply the rows at their times from ``start`` on, looping, until woken."""
        fresh = True
        while True:
            for at, rate in rows:
                delay = start + at - time.monotonic()
                if delay > 0 and self._wake.wait(delay):
                    return
                if self._wake.is_set():
                    return
                self._apply(rate)
                if fresh:
                    self._at_start.set()
                    fresh = False
            start += period

    def _apply(self, rate: int) -> None:
        sh(
            "tc",
            "qdisc",
            "change",
            "dev",
            f"path{self.path}",
            "root",
            "handle",
            "1:",
            "tbf",
            *tbf_args(rate, self.scenario.burst_packets),
            ns=ROUTER_NS,
            check=False,
        )

    def restart(self, timeout_s: float = 5.0) -> None:
        """Back to the schedule's first row; returns once that row's rate is in force."""
        self._at_start.clear()
        self._wake.set()
        if not self._at_start.wait(timeout_s):
            raise RuntimeError(f"path{self.path}: rate schedule did not restart")

    def stop(self) -> None:
        self.stopped.set()
        self._wake.set()
