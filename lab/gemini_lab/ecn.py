"""The ECN-capable lab's checks (issue #31, item 4): one flow on a marking path, measured where
the marks happen.

``exp_ecn`` (guest side, experiment kind ``ecn``) runs one bulk flow and, while it runs, reads
the bottleneck queue of each hop named in ``hops`` every ``sample_s`` of the guest's clock (its
length in packets, from ``tc -s``), takes one ``ss -tin`` of the flow on both ends halfway, and
reports what the flow changed: the queue's counters (RED's marked, early and tail drops; as
``steady_<counter>`` also from the end of the first ``omit_s`` on, its start left out), the
kernels' ECN counters on both ends (IpExt InECT0Pkts / InCEPkts, TcpExt TCPDeliveredCE) and the
flow's own figures. ``window_packets`` caps what the receiver advertises (a ``window`` metric
on its route back, which sets a passive socket's window clamp, with receive-buffer autotuning
off in its namespace for the flow, since autotuning would raise the clamp), so the flow's
standing queue is window − BDP packets: how a check keeps a flow below K or just above it. (A
locked ``cwnd`` on the sender's route would not do: the kernel reads it only from a cached
per-destination metrics entry, which the lab's tcp_no_metrics_save never creates.)

``ecn_plan`` (host side) is the plan the lab tests run: the shipped datacenter and cross-dc
paths, dctcp and cubic flows on them; and an incast of 40 flows on the dc-incast path
(``exp_incast``, kind ``incast``).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from gemini_lab import scenario
from gemini_lab.bulk import tcp_info
from gemini_lab.experiment import BASE_PORT, finish_flow, start_flow
from gemini_lab.netem import (
    SENDER_NS,
    qdisc_stats,
    receiver_addr,
    receiver_gateway,
    receiver_ns,
    sh,
    wait_listening,
)

ECN_PORT = BASE_PORT + 90
SAMPLE_S = 0.05
QDISC_COUNTERS = ("marked", "early", "pdrop", "drops", "packets", "bytes")
NETSTAT_COUNTERS = (
    "InECT0Pkts",
    "InECT1Pkts",
    "InCEPkts",
    "InNoECTPkts",
    "TCPDeliveredCE",
    "TCPTimeouts",
)
INCAST_PORT = ECN_PORT + 1
INCAST_FLOWS = 40
INCAST_BYTES = 1_000_000  # the DC-Vegas paper's 1 MB answer, split over the senders
INCAST_WAIT_S = 120  # a flow of the incast stalled this long is counted as failed


def netstat(ns: str) -> dict[str, int]:
    """The namespace's /proc/net/netstat (TcpExt, IpExt, ...) as name → value."""
    lines = sh("cat", "/proc/net/netstat", ns=ns).splitlines()
    out: dict[str, int] = {}
    for names, values in zip(lines[::2], lines[1::2], strict=True):
        for name, value in zip(names.split()[1:], values.split()[1:], strict=True):
            out[name] = int(value)
    return out


def _counters(stats: dict) -> dict[str, int]:
    return {c: int(stats.get(c, 0)) for c in QDISC_COUNTERS}


MSS_BYTES = 1448  # a full-sized segment's payload with timestamps, as the window counts it


def _cap_window(path: int, packets: int | None) -> None:
    """The receiver's advertised window capped at ``packets`` segments (None: uncapped)."""
    rcv, gw = receiver_ns(path), receiver_gateway(path)
    if packets:
        sh("sysctl", "-qw", "net.ipv4.tcp_moderate_rcvbuf=0", ns=rcv)
        window = ("window", str(packets * MSS_BYTES))
        sh("ip", "route", "replace", "default", "via", gw, *window, ns=rcv)
    else:
        sh("ip", "route", "replace", "default", "via", gw, ns=rcv)
        sh("sysctl", "-qw", "net.ipv4.tcp_moderate_rcvbuf=1", ns=rcv)


def exp_ecn(e: dict, out: Path) -> dict:
    path, cc, duration_s = e["path"], e["cc"], e["duration_s"]
    omit_s, sample_s = e.get("omit_s", 1.0), e.get("sample_s", SAMPLE_S)
    hops, window = e.get("hops", [0]), e.get("window_packets")
    port = ECN_PORT
    if window:
        _cap_window(path, window)
    rcv = receiver_ns(path)
    before = {h: _counters(qdisc_stats(path, h)) for h in hops}
    net_before = {"sender": netstat(SENDER_NS), "receiver": netstat(rcv)}
    try:
        server, client = start_flow(path, cc, duration_s, port=port)
        t0 = time.monotonic()
        samples: dict[int, list[int]] = {h: [] for h in hops}
        ss: dict[str, str] = {}
        time.sleep(omit_s)
        steady = {h: _counters(qdisc_stats(path, h)) for h in hops}  # slow start left out
        while client.poll() is None and time.monotonic() - t0 < duration_s:
            for h in hops:
                samples[h].append(int(qdisc_stats(path, h).get("qlen", 0)))
            if not ss and time.monotonic() - t0 >= (omit_s + duration_s) / 2:
                ss = {
                    "sender": sh("ss", "-Htin", f"dport = :{port}", ns=SENDER_NS, check=False),
                    "receiver": sh("ss", "-Htin", f"sport = :{port}", ns=rcv, check=False),
                }
            time.sleep(sample_s)
        flow = finish_flow(server, client, duration_s)
    finally:
        if window:
            _cap_window(path, None)
    after = {h: _counters(qdisc_stats(path, h)) for h in hops}
    net_after = {"sender": netstat(SENDER_NS), "receiver": netstat(rcv)}
    queues = {}
    for h in hops:
        q = samples[h]
        queues[str(h)] = {
            **{c: after[h][c] - before[h][c] for c in QDISC_COUNTERS},
            **{f"steady_{c}": after[h][c] - steady[h][c] for c in QDISC_COUNTERS},
            "samples": len(q),
            "mean_qlen": sum(q) / len(q) if q else None,
            "max_qlen": max(q) if q else None,
            "qlen_series": q,
        }
    return {
        **flow,
        "dst": receiver_addr(path),
        "window_packets": window,
        "queues": queues,
        "ss": ss,
        "netstat": {
            end: {c: net_after[end].get(c, 0) - net_before[end].get(c, 0) for c in NETSTAT_COUNTERS}
            for end in net_before
        },
    }


def exp_incast(e: dict, out: Path) -> dict:
    """Incast: ``flows`` connections to one receiver, opened first, then all writing their
    share of ``total_bytes`` at once (a partition/aggregate query's answers). Per flow: its
    completion time on the guest clock and retransmits; for all: the bottleneck queue's marks
    and drops, and the sender's retransmission timeouts (TcpExt TCPTimeouts)."""
    path, cc, n = e["path"], e["cc"], e["flows"]
    size = e["total_bytes"] // n
    rcv, addr = receiver_ns(path), receiver_addr(path)
    serve = [sys.executable, "-m", "gemini_lab.flowgen", "serve", str(INCAST_PORT)]
    server = subprocess.Popen(["ip", "netns", "exec", rcv, *serve])
    try:
        wait_listening(rcv, INCAST_PORT)
        before, net_before = _counters(qdisc_stats(path)), netstat(SENDER_NS)
        go = threading.Barrier(n)
        flows: list[dict] = [{"failed": "did not run"} for _ in range(n)]

        def one(i: int) -> None:
            # this process lives in the sender namespace (guest.main), and so do its sockets
            try:
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
                    s.settimeout(INCAST_WAIT_S)
                    s.connect((addr, INCAST_PORT))
                    go.wait()
                    t0 = time.monotonic()
                    s.sendall(b"\0" * size)
                    s.shutdown(socket.SHUT_WR)
                    while s.recv(65536):
                        pass  # the receiver closes once it has read to EOF
                    fct = time.monotonic() - t0
                    flows[i] = {"fct_ms": fct * 1000, **tcp_info(s)}
            except (OSError, threading.BrokenBarrierError) as exc:
                go.abort()
                flows[i] = {"failed": repr(exc)}

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        after, net_after = _counters(qdisc_stats(path)), netstat(SENDER_NS)
    finally:
        server.kill()
        server.wait()
    done = [f for f in flows if "fct_ms" in f]
    return {
        "flows": n,
        "bytes_each": size,
        "completed": len(done),
        "failures": [f["failed"] for f in flows if "failed" in f],
        "fct_ms_max": max((f["fct_ms"] for f in done), default=None),
        "fct_ms_mean": sum(f["fct_ms"] for f in done) / len(done) if done else None,
        "retransmits": sum(f["total_retrans"] for f in done),
        "timeouts": net_after["TCPTimeouts"] - net_before.get("TCPTimeouts", 0),
        "queue": {c: after[c] - before[c] for c in QDISC_COUNTERS},
        "per_flow": flows,
    }


def ecn_plan(duration_s: float = 8.0) -> dict:
    """The lab tests' plan: on the datacenter path (path 0), an unclamped dctcp flow and a
    cubic one (no ECN), and dctcp flows whose window stands the queue a few packets below and
    above K;
    on the cross-dc path (path 1), a cubic flow across both hops (dctcp there would take a
    minute to grow back from its first cut on a 100 ms path: the WAN weakness GEMINI is for)."""
    dc, cross = scenario.load("datacenter"), scenario.load("cross-dc")
    incast = scenario.load("dc-incast")
    (link,) = dc.links()
    k = link.ecn_threshold_packets
    assert k is not None
    bdp = dc.bdp_packets()

    def flow(label: str, path: int, cc: str, **extra: object) -> dict:
        return {
            "label": label,
            "kind": "ecn",
            "path": path,
            "cc": cc,
            "duration_s": duration_s,
            **extra,
        }

    return {
        "paths": [dc.to_dict(), cross.to_dict(), incast.to_dict()],
        "experiments": [
            flow("datacenter/dctcp", 0, "dctcp"),
            flow("datacenter/cubic", 0, "cubic"),
            flow("datacenter/dctcp-below-k", 0, "dctcp", window_packets=bdp + k - 6),
            flow("datacenter/dctcp-above-k", 0, "dctcp", window_packets=bdp + k + 8),
            {**flow("cross-dc/cubic", 1, "cubic", hops=[0, 1], omit_s=2.0), "duration_s": 12},
            *(
                {
                    "label": f"dc-incast/{cc}",
                    "kind": "incast",
                    "path": 2,
                    "cc": cc,
                    "flows": INCAST_FLOWS,
                    "total_bytes": INCAST_BYTES,
                }
                for cc in ("dctcp", "cubic")
            ),
        ],
        "k": k,
        "bdp_packets": bdp,
    }
