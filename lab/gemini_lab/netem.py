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
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass

from gemini_lab.scenario import Scenario

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


def tbf_args(rate_kbit: int) -> list[str]:
    burst = max(TBF_BURST_MIN_BYTES, int(rate_kbit * 1000 / 8 * TBF_BURST_S))
    return ["rate", f"{rate_kbit}kbit", "burst", str(burst), "latency", "1s"]


def bottleneck_args(s: Scenario) -> list[str]:
    args = ["limit", str(s.queue_limit())]
    if s.loss_percent:
        args += ["loss", "random", f"{s.loss_percent}%"]
    return args


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
            rcv = receiver_ns(i)
            _veth(ROUTER_NS, f"path{i}", f"10.{i + 1}.0.1", rcv, "veth0", receiver_addr(i))
            sh("ip", "route", "add", "default", "via", f"10.{i + 1}.0.1", ns=rcv)
            rate = scenario.schedule()[0][1]
            sh(
                "tc",
                "qdisc",
                "add",
                "dev",
                f"path{i}",
                "root",
                "handle",
                "1:",
                "tbf",
                *tbf_args(rate),
                ns=ROUTER_NS,
            )
            sh(
                "tc",
                "qdisc",
                "add",
                "dev",
                f"path{i}",
                "parent",
                "1:1",
                "handle",
                "10:",
                "netem",
                *bottleneck_args(scenario),
                ns=ROUTER_NS,
            )
            sh(
                "tc",
                "qdisc",
                "add",
                "dev",
                "veth0",
                "root",
                "netem",
                "delay",
                f"{scenario.rtt_ms}ms",
                "limit",
                str(DELAY_LIMIT),
                ns=rcv,
            )
        # Segmentation offloads off where data enters the network: netem must see, delay and
        # drop wire-sized packets, not 64 KB super-packets.
        sh("ethtool", "-K", "veth0", "tso", "off", "gso", "off", ns=SENDER_NS)

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
            *tbf_args(rate),
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
