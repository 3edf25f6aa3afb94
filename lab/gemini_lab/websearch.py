"""The GEMINI paper's web-search FCT experiment (G9, reduced) and its convergence test (G7),
scaled by s = 10, in the UML lab on its simulated clock (issue #31, item 5).

    python -m gemini_lab.websearch g9 --out DIR [--seed N ...] [--flows N] [--load F]
    python -m gemini_lab.websearch g9-table DIR ... [--heldout-seed N ...]
    python -m gemini_lab.websearch g7 --out DIR [--runs N]

**G9** (DATAPATHS-SPEC.md 1.6/1.7, the paper's Figs. 12–15, pattern 1: every flow inter-DC).
Flow sizes are drawn from the DCTCP web-search distribution (``workloads/websearch.cdf``, the
table in alibaba-edu/High-Precision-Congestion-Control, sizes between its points uniform),
arrivals are Poisson at ``load`` of the cross-dc path's WAN hop (80 Mbit/s): λ = load · C /
mean size. A seed fixes the schedule (each flow's arrival time and size); every arm runs the
same schedule, one after another in one boot per seed, each flow a fresh connection from the
lab's one sender namespace to the cross-dc receiver (the datacenter hop marking at 50 packets,
then the WAN hop with 10 000 packets of buffer, 100 ms). Flows overlap as they arrive: a thread
per flow connects at its arrival time, writes its bytes, half-closes and waits for the
receiver's close. Its completion time is the guest's clock (the same simulated clock in every
namespace) from just before ``connect()`` to the receiver reading its last byte, the handshake
included (as ``gemini_lab.shortflows`` measures). A flow not done ``drain_s`` after the last
arrival is aborted and counted as unfinished. Per arm: each flow's FCT and retransmitted
segments, the sender namespace's retransmission timeouts, and each hop's packets, drops and CE
marks (loss rate per hop, the paper's PLR), with the hops' queue lengths sampled.

**G7**: three groups of ``CONV_FLOWS`` long flows join the cross-dc path at 0, 20 and 40 s (the
paper's 50 s phases scaled to ≈ 200 inter-DC RTTs, DATAPATHS-SPEC.md 1.7) and all end at 60 s;
each flow's throughput over 40–60 s (when all groups run) from the sender's delivered packets
(sock_diag every second), and Jain's index over the flows and over the groups.

Arms: GEMINI at the paper's defaults scaled (``gemini_lab.datapath_eval._arm``: T = 50 ms,
C = 100 Mbit/s, K = 50, β = 0.2, H = 120) beside cubic, dctcp and bbr.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import itertools
import json
import math
import random
import selectors
import shlex
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gemini_lab import scenario

GUEST_MODULE = "gemini_lab.websearch"  # the receiver runs as ``python -m`` of this module
CDF_PATH = Path(__file__).resolve().parent / "workloads" / "websearch.cdf"
WEB_PORT = 5701  # gemini_lab.experiment.BASE_PORT + 500: clear of the other experiments' ports
CONV_PORT = 5801
CHUNK_BYTES = 256 * 1024
BACKLOG = 1024
WARM_UP_BYTES = 64
SAMPLE_S = 0.5  # the hops' queue lengths, on the guest clock
DRAIN_S = 60.0  # after the last arrival: flows still running then are aborted
QUIET_S = 30.0  # before an arm: the previous one's packets leave the queues
ABORT = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets
QUEUE_COUNTERS = ("packets", "drops", "marked")
NETSTAT = (
    "TCPTimeouts",
    "TCPSynRetrans",
    "TCPLossProbes",
    "TCPFastRetrans",
    "TCPSlowStartRetrans",
    "TCPSpuriousRTOs",
    "TCPDeliveredCE",
    "InCEPkts",
)
THREAD_STACK_BYTES = 512 * 1024  # a thread per flow, hundreds at once in the guest's memory

# the experiment's setup (DATAPATHS-SPEC.md 1.7, scaled by s = 10)
PATH = "cross-dc"
WAN_MBIT = 80.0  # the cross-dc path's WAN hop, its bottleneck
LOAD = 0.9  # the paper's pattern 1: the WAN at about 90 %
FLOWS = 300
SEEDS = (1, 2, 3)
HELDOUT_SEEDS = (4,)
ARMS = ("gemini", "cubic", "dctcp", "bbr")
SMALL_BYTES = 100_000  # the paper's small flows: < 100 KB
LARGE_BYTES = 10_000_000  # and large: > 10 MB
# size classes reported (bytes, upper bound exclusive) with their labels
CLASSES = (
    ("< 100 KB", 0, SMALL_BYTES),
    ("100 KB–1 MB", SMALL_BYTES, 1_000_000),
    ("1–10 MB", 1_000_000, LARGE_BYTES),
    ("> 10 MB", LARGE_BYTES, math.inf),
)
CONV_FLOWS = 10  # per group, as the paper's
CONV_GROUPS = 3
CONV_PHASE_S = 20.0  # groups join at 0, 20 and 40 s; all end at 60 s
RUN_TIMEOUT_S = 4 * 3600  # of host time for one boot (the guest's clock is simulated)
MSS = 1448


# --- the workload (host side, no guest) ---------------------------------------------------------


@dataclass(frozen=True)
class SizeCdf:
    """A flow-size CDF as points (bytes, cumulative fraction), sizes between two points drawn
    uniformly (the CDF interpolated linearly)."""

    points: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        xs, ps = [x for x, _ in self.points], [p for _, p in self.points]
        if len(xs) < 2 or xs != sorted(xs) or ps != sorted(ps) or ps[0] != 0 or ps[-1] != 1:
            raise ValueError("a CDF's points rise from fraction 0 to 1 with sizes not falling")

    def quantile(self, u: float) -> float:
        """The size at cumulative fraction ``u`` ∈ [0, 1]."""
        ps = [p for _, p in self.points]
        i = min(max(bisect.bisect_left(ps, u), 1), len(ps) - 1)
        (x0, p0), (x1, p1) = self.points[i - 1], self.points[i]
        return x1 if p1 == p0 else x0 + (x1 - x0) * (u - p0) / (p1 - p0)

    def fraction_below(self, size: float) -> float:
        """The CDF at ``size``."""
        for (x0, p0), (x1, p1) in itertools.pairwise(self.points):
            if size <= x1:
                return p0 if x1 == x0 else p0 + (p1 - p0) * (size - x0) / (x1 - x0)
        return 1.0

    def mean(self) -> float:
        """Mean size: each segment's midpoint weighted by its probability."""
        return sum(
            (x0 + x1) / 2 * (p1 - p0) for (x0, p0), (x1, p1) in itertools.pairwise(self.points)
        )


def load_cdf(path: Path = CDF_PATH) -> SizeCdf:
    """A CDF file: one ``bytes percent`` pair a line, ``#`` comments."""
    points = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            size, percent = line.split()
            points.append((float(size), float(percent) / 100))
    return SizeCdf(tuple(points))


@dataclass(frozen=True)
class Flow:
    at_s: float  # arrival, seconds after the arm's start
    size: int  # bytes


def arrival_rate(load: float, capacity_mbit: float, mean_bytes: float) -> float:
    """Flows per second that offer ``load`` of ``capacity_mbit`` at ``mean_bytes`` a flow."""
    return load * capacity_mbit * 1e6 / 8 / mean_bytes


def schedule(cdf: SizeCdf, flows: int, rate_per_s: float, seed: int) -> list[Flow]:
    """``flows`` Poisson arrivals at ``rate_per_s``, sizes drawn from ``cdf`` (at least one
    byte), both from one generator seeded with ``seed``: the same schedule for every arm."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(flows):
        t += rng.expovariate(rate_per_s)
        out.append(Flow(round(t, 6), max(1, int(cdf.quantile(rng.random())))))
    return out


# --- guest side: the receiver --------------------------------------------------------------------


def serve(port: int) -> None:
    """Every connection read to its EOF, then closed; one JSON line per connection: the peer's
    port, the bytes and the guest-clock time its last byte was read."""
    lsock = socket.create_server(("0.0.0.0", port), backlog=BACKLOG)
    lsock.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(lsock, selectors.EVENT_READ, None)
    buf = bytearray(CHUNK_BYTES)
    print("ready", flush=True)
    while True:
        for key, _ in sel.select():
            if key.data is None:
                while True:
                    try:
                        conn, peer = lsock.accept()
                    except BlockingIOError:
                        break
                    conn.setblocking(False)
                    sel.register(conn, selectors.EVENT_READ, [peer[1], 0, None])
                continue
            peer_conn, st = key.fileobj, key.data
            assert isinstance(peer_conn, socket.socket)
            try:
                k = peer_conn.recv_into(buf)
            except BlockingIOError:
                continue
            except ConnectionError:
                k = -1
            if k > 0:
                st[1] += k
                st[2] = time.monotonic()
                continue
            sel.unregister(peer_conn)
            peer_conn.close()
            line = {"port": st[0], "bytes": st[1], "done_at": st[2], "reset": k < 0}
            print(json.dumps(line), flush=True)


# --- guest side: one arm of G9 -------------------------------------------------------------------


class _Lines(threading.Thread):
    """The receiver's lines, by the peer's port."""

    def __init__(self, server: subprocess.Popen) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.by_port: dict[int, dict] = {}

    def run(self) -> None:
        assert self.server.stdout is not None
        for line in self.server.stdout:
            got = json.loads(line)
            self.by_port[got["port"]] = got


class _QueueSampler(threading.Thread):
    """Each hop's queue length (packets) every SAMPLE_S of the guest clock until stopped."""

    def __init__(self, path: int, hops: Sequence[int]) -> None:
        super().__init__(daemon=True)
        self.path, self.hops = path, list(hops)
        self.series: dict[int, list[int]] = {h: [] for h in self.hops}
        self.done = threading.Event()

    def run(self) -> None:
        from gemini_lab.netem import qdisc_stats

        while not self.done.wait(SAMPLE_S):
            for h in self.hops:
                self.series[h].append(int(qdisc_stats(self.path, h).get("qlen", 0)))


def _quiet(path: int, hops: Sequence[int], timeout_s: float = QUIET_S) -> bool:
    """Until every hop's queue is empty (what an earlier arm left has drained)."""
    from gemini_lab.netem import qdisc_stats

    deadline = time.monotonic() + timeout_s
    while any(int(qdisc_stats(path, h).get("qlen", 0)) for h in hops):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


ZEROS = memoryview(bytes(CHUNK_BYTES))


def _transfer(addr: str, port: int, cc: str, size: int, rec: dict, socks: dict, i: int) -> None:
    """One flow of ``size`` bytes on a fresh connection; its figures into ``rec``."""
    from gemini_lab.bulk import tcp_info

    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    socks[i] = s
    try:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rec["started"] = time.monotonic()
        s.connect((addr, port))
        rec["port"] = s.getsockname()[1]
        left = size
        while left > 0:
            k = min(left, CHUNK_BYTES)
            s.sendall(ZEROS[:k])
            left -= k
        s.shutdown(socket.SHUT_WR)
        while s.recv(4096):
            pass
        rec["sender_done"] = time.monotonic()
        info = tcp_info(s)
        rec["retransmits"] = info["total_retrans"]
        rec["min_rtt_ms"] = info["min_rtt_us"] / 1000
    except OSError as exc:
        rec["error"] = repr(exc)
        with contextlib.suppress(OSError):
            rec["retransmits"] = tcp_info(s)["total_retrans"]
    finally:
        s.close()


def _abort(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, ABORT)
        s.shutdown(socket.SHUT_RDWR)


def _arm_setup(e: dict) -> tuple[str, str | None, dict]:
    """The arm's CC, its datapath (None for a kernel CC) and its parameters as read back
    after writing them; the caller puts ``e['_before']`` back."""
    from gemini_api.datapaths import datapath
    from gemini_lab.datapath_guest import load_module, read_params, write_params

    name = e.get("datapath")
    if name is None:
        return e["cc"], None, {}
    loaded = load_module(name)
    if loaded["rc"] != 0:
        raise RuntimeError(f"insmod {name}: {loaded['err']}")
    extra = tuple(e.get("module_extra", {}))
    e["_before"] = read_params(name, extra)
    write_params(name, {**e.get("theta", {}), **e.get("module_extra", {})})
    return datapath(name).cc, name, read_params(name, extra)


def _arm_restore(e: dict, name: str | None) -> None:
    from gemini_lab.datapath_guest import write_params

    if name and "_before" in e:
        write_params(name, e.pop("_before"))


def exp_websearch(e: dict, out: Path) -> dict:
    """One arm of G9: ``e["flows"]`` ([arrival s, bytes] pairs) on path ``e["path"]`` under
    ``e["cc"]`` or datapath ``e["datapath"]`` at θ ``e["theta"]``."""
    from gemini_lab.ecn import netstat
    from gemini_lab.netem import SENDER_NS, python_in, qdisc_stats, receiver_addr, receiver_ns

    path, hops = e["path"], e.get("hops", [0])
    port = WEB_PORT + e.get("port_offset", 0)
    drain_s = e.get("drain_s", DRAIN_S)
    quiet = _quiet(path, hops)
    cc, name, ran = _arm_setup(e)
    stack = threading.stack_size(THREAD_STACK_BYTES)
    server = subprocess.Popen(
        python_in(receiver_ns(path), GUEST_MODULE, "serve", str(port)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        if (ready := server.stdout.readline().strip()) != "ready":
            raise RuntimeError(f"web-search receiver did not start: {ready!r}")
        lines = _Lines(server)
        lines.start()
        addr = receiver_addr(path)
        warm: dict = {}
        _transfer(addr, port, cc, WARM_UP_BYTES, warm, {}, -1)  # ARP and the like, not counted
        flows = [(float(at), int(size)) for at, size in e["flows"]]
        recs: list[dict] = [{} for _ in flows]
        socks: dict[int, socket.socket] = {}
        q_before = {h: qdisc_stats(path, h) for h in hops}
        net_before = netstat(SENDER_NS)
        sampler = _QueueSampler(path, hops)
        sampler.start()
        t0 = time.monotonic()
        threads = []
        for i, (at, size) in enumerate(flows):
            wait = t0 + at - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            t = threading.Thread(
                target=_transfer, args=(addr, port, cc, size, recs[i], socks, i), daemon=True
            )
            t.start()
            threads.append(t)
        deadline = t0 + flows[-1][0] + drain_s
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        aborted = [i for i, t in enumerate(threads) if t.is_alive()]
        for i in aborted:
            recs[i]["aborted"] = True
            if i in socks:
                _abort(socks[i])
        for t in threads:
            t.join(10)
        t_end = time.monotonic() - t0
        sampler.done.set()
        sampler.join()
        q_after = {h: qdisc_stats(path, h) for h in hops}
        net_after = netstat(SENDER_NS)
        ends = time.monotonic() + 5  # the receiver's last lines
        while time.monotonic() < ends and any(
            r.get("port") not in lines.by_port for r in recs if "sender_done" in r
        ):
            time.sleep(0.1)
    finally:
        server.kill()
        server.wait()
        threading.stack_size(stack)
        _arm_restore(e, name)
    per_flow = []
    for i, ((at, size), r) in enumerate(zip(flows, recs, strict=True)):
        got = lines.by_port.get(r.get("port", -1), {})
        row: dict = {"i": i, "at_s": at, "size": size, "retransmits": r.get("retransmits", 0)}
        if "started" in r:
            row["start_lag_ms"] = (r["started"] - t0 - at) * 1000
        if got.get("bytes") == size and got.get("done_at") is not None and "started" in r:
            row["fct_ms"] = (got["done_at"] - r["started"]) * 1000
        if "sender_done" in r:
            row["sender_ms"] = (r["sender_done"] - r["started"]) * 1000
            row["min_rtt_ms"] = r["min_rtt_ms"]
        for k in ("error", "aborted"):
            if k in r:
                row[k] = r[k]
        per_flow.append(row)
    return {
        "cc": cc,
        "params_ran": ran,
        "quiet_before": quiet,
        "warm_up": {k: v for k, v in warm.items() if k in ("error", "retransmits")},
        "t_end_s": t_end,
        "aborted": len(aborted),
        "per_flow": per_flow,
        "queues": {
            str(h): {
                **{
                    c: int(q_after[h].get(c, 0)) - int(q_before[h].get(c, 0))
                    for c in QUEUE_COUNTERS
                },
                "mean_qlen": _mean(sampler.series[h]),
                "max_qlen": max(sampler.series[h], default=None),
            }
            for h in hops
        },
        "netstat": {c: net_after.get(c, 0) - net_before.get(c, 0) for c in NETSTAT},
    }


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


# --- guest side: one arm of G7 -------------------------------------------------------------------


def exp_convergence(e: dict, out: Path) -> dict:
    """Groups of long flows joining path ``e["path"]`` at ``e["starts_s"]``, ``e["flows"]``
    connections each, all ending at ``e["end_s"]``; each connection's delivered packets read
    through sock_diag every ``e["sample_s"]`` of the guest clock."""
    from gemini_lab.datapath_guest import _diag_sockets
    from gemini_lab.experiment import _bulk, finish_flow
    from gemini_lab.netem import SENDER_NS, receiver_addr, receiver_ns

    path, n, end_s = e["path"], e["flows"], e["end_s"]
    starts, sample_s = [float(s) for s in e["starts_s"]], e.get("sample_s", 1.0)
    base = CONV_PORT + 4 * e.get("port_offset", 0)
    ports = [base + g for g in range(len(starts))]
    hops = e.get("hops", [0])
    quiet = _quiet(path, hops)
    cc, name, ran = _arm_setup(e)
    servers: list[subprocess.Popen] = []
    clients: list[subprocess.Popen | None] = [None] * len(starts)
    samples: list[dict] = []
    try:
        for port, start in zip(ports, starts, strict=True):
            srv = _bulk(receiver_ns(path), "recv", port, n, 0, end_s - start)
            assert srv.stdout is not None
            if srv.stdout.readline().strip() != "ready":
                raise RuntimeError(f"receiver on port {port} did not start")
            servers.append(srv)
        t0 = time.monotonic()
        next_sample = 0.0
        while True:
            now = time.monotonic() - t0
            for g, start in enumerate(starts):
                if clients[g] is None and now >= start:
                    clients[g] = _bulk(
                        SENDER_NS, "send", receiver_addr(path), ports[g], cc, n, end_s - start
                    )
            if now >= next_sample:
                groups = [_diag_sockets(cc, port) for port in ports]
                samples.append(
                    {
                        "t": round(now, 4),
                        "groups": [
                            {str(d["sport"]): d.get("tcpi_delivered") for d in socks}
                            for socks in groups
                        ],
                    }
                )
                next_sample += sample_s
            if now >= end_s:
                break
            pending = [s for g, s in enumerate(starts) if clients[g] is None]
            wake = min([next_sample, end_s, *pending])
            time.sleep(max(0.0, wake - (time.monotonic() - t0)))
        results = []
        for g, (srv, cli) in enumerate(zip(servers, clients, strict=True)):
            assert cli is not None
            results.append({"start_s": starts[g], **finish_flow(srv, cli, end_s - starts[g])})
    finally:
        for p in [*servers, *(c for c in clients if c is not None)]:
            if p.poll() is None:
                p.kill()
                p.wait()
        _arm_restore(e, name)
    for r in results:
        r.pop("window_series", None)
    return {
        "cc": cc,
        "params_ran": ran,
        "quiet_before": quiet,
        "end_s": end_s,
        "groups": results,
        "samples": samples,
    }


# --- host side: plans ----------------------------------------------------------------------------


def _arms(names: Iterable[str]) -> dict[str, dict]:
    from gemini_lab.datapath_eval import _arm

    return {a: _arm(a) for a in names}


def _load_steps(arms: dict[str, dict]) -> list[dict]:
    return [
        {"label": f"load/{a['datapath']}", "kind": "datapath_load", "datapath": a["datapath"]}
        for a in arms.values()
        if "datapath" in a
    ]


def g9_plan(flows: Sequence[Flow], arms: Sequence[str] = ARMS, drain_s: float = DRAIN_S) -> dict:
    """One boot: the schedule under each arm, one after another."""
    path = scenario.load(PATH)
    hops = list(range(len(path.hops))) or [0]
    by_arm = _arms(arms)
    ex = _load_steps(by_arm)
    for i, (a, arm) in enumerate(by_arm.items()):
        ex.append(
            {
                "label": f"g9/{a}",
                "kind": "websearch",
                "path": 0,
                "hops": hops,
                "flows": [[f.at_s, f.size] for f in flows],
                "drain_s": drain_s,
                "port_offset": i,
                **arm,
            }
        )
    return {"paths": [path.to_dict()], "experiments": ex}


def g7_plan(arms: Sequence[str] = ARMS, runs: int = 1, phase_s: float = CONV_PHASE_S) -> dict:
    """One boot: each arm's three groups joining ``phase_s`` apart (all ending ``phase_s``
    after the last joined), ``runs`` times in a row."""
    path = scenario.load(PATH)
    hops = list(range(len(path.hops))) or [0]
    by_arm = _arms(arms)
    ex = _load_steps(by_arm)
    k = 0
    for run in range(runs):
        for a, arm in by_arm.items():
            ex.append(
                {
                    "label": f"g7/{a}#{run}",
                    "kind": "convergence",
                    "path": 0,
                    "hops": hops,
                    "flows": CONV_FLOWS,
                    "starts_s": [g * phase_s for g in range(CONV_GROUPS)],
                    "end_s": CONV_GROUPS * phase_s,
                    "sample_s": 1.0,
                    "port_offset": k,
                    **arm,
                }
            )
            k += 1
    return {"paths": [path.to_dict()], "experiments": ex}


# --- host side: figures --------------------------------------------------------------------------


@dataclass(frozen=True)
class ClassFct:
    flows: int  # scheduled in the class
    done: int  # completed
    mean_ms: float  # over the completed ones (nan: none)


def class_fct(per_flow: Sequence[dict], lo: float, hi: float) -> ClassFct:
    rows = [f for f in per_flow if lo <= f["size"] < hi]
    fcts = [f["fct_ms"] for f in rows if "fct_ms" in f]
    return ClassFct(len(rows), len(fcts), sum(fcts) / len(fcts) if fcts else math.nan)


@dataclass(frozen=True)
class ArmFigures:
    small: ClassFct
    large: ClassFct
    overall: ClassFct
    classes: tuple[ClassFct, ...]
    small_p99_ms: float
    retransmits: int
    timeouts: int
    loss: tuple[float, ...]  # per hop, drops / packets
    marked: int  # at the datacenter hop
    mean_queue: tuple[float | None, ...]  # packets, per hop
    max_queue: tuple[int, ...]
    aborted: int


def _p(xs: Sequence[float], q: float) -> float:
    if not xs:
        return math.nan
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def arm_figures(r: dict) -> ArmFigures:
    pf = r["per_flow"]
    queues = [r["queues"][h] for h in sorted(r["queues"], key=int)]
    small = [f["fct_ms"] for f in pf if f["size"] < SMALL_BYTES and "fct_ms" in f]
    return ArmFigures(
        small=class_fct(pf, 0, SMALL_BYTES),
        large=class_fct(pf, LARGE_BYTES, math.inf),
        overall=class_fct(pf, 0, math.inf),
        classes=tuple(class_fct(pf, lo, hi) for _, lo, hi in CLASSES),
        small_p99_ms=_p(small, 0.99),
        retransmits=sum(f.get("retransmits", 0) for f in pf),
        timeouts=int(r["netstat"].get("TCPTimeouts", 0)),
        loss=tuple(
            q["drops"] / (q["packets"] + q["drops"]) if q["packets"] else 0.0 for q in queues
        ),
        marked=int(queues[0].get("marked", 0)),
        mean_queue=tuple(q["mean_qlen"] for q in queues),
        max_queue=tuple(q["max_qlen"] or 0 for q in queues),
        aborted=int(r["aborted"]),
    )


def _span(xs: Sequence[float], fmt: str = ".0f") -> str:
    xs = [x for x in xs if not math.isnan(x)]
    if not xs:
        return "—"
    lo, hi = min(xs), max(xs)
    return f"{lo:{fmt}}" if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{lo:{fmt}}–{hi:{fmt}}"


def _queue(fs: Sequence[ArmFigures], hop: int) -> str:
    means = [q for f in fs if (q := f.mean_queue[hop]) is not None]
    return f"{_span(means)}; {_span([f.max_queue[hop] for f in fs])}"


def g9_table(runs: dict[int, dict], arms: Sequence[str] = ARMS) -> str:
    """One row per arm over the seeds in ``runs`` (seed → a boot's results): min–max."""
    figs = {
        a: [
            arm_figures(r["experiments"][f"g9/{a}"])
            for r in runs.values()
            if "error" not in r["experiments"].get(f"g9/{a}", {"error": 1})
        ]
        for a in arms
    }
    lines = [
        "| arm | small < 100 KB: mean FCT ms | p99 ms | large > 10 MB: mean FCT ms | "
        "1–10 MB: mean ms | overall mean ms | unfinished | retransmits | timeouts | "
        "DC hop loss ×10⁻⁵ | WAN loss ×10⁻⁵ | DC hop CE marks | DC hop queue pkts (mean; max) | "
        "WAN queue pkts (mean; max) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for a, fs in figs.items():
        if not fs:
            lines.append(f"| {a} | error |")
            continue
        lines.append(
            f"| {a} | {_span([f.small.mean_ms for f in fs])} | "
            f"{_span([f.small_p99_ms for f in fs])} | {_span([f.large.mean_ms for f in fs])} | "
            f"{_span([f.classes[2].mean_ms for f in fs])} | "
            f"{_span([f.overall.mean_ms for f in fs])} | "
            f"{_span([f.aborted for f in fs])} | {_span([f.retransmits for f in fs])} | "
            f"{_span([f.timeouts for f in fs])} | {_span([f.loss[0] * 1e5 for f in fs], '.1f')} | "
            f"{_span([f.loss[-1] * 1e5 for f in fs], '.1f')} | {_span([f.marked for f in fs])} | "
            f"{_queue(fs, 0)} | {_queue(fs, -1)} |"
        )
    return "\n".join(lines) + "\n"


def offered_mbit(per_flow: Sequence[dict]) -> float:
    """The schedule's offered load: all its bits over its arrivals' span."""
    span = max(f["at_s"] for f in per_flow)
    return sum(f["size"] for f in per_flow) * 8 / span / 1e6 if span > 0 else math.nan


def g9_per_seed(runs: dict[int, dict], arms: Sequence[str] = ARMS) -> str:
    """Each seed's class means per arm (flows in the class in brackets)."""
    lines = [
        "| seed | offered Mbit/s | arm | "
        + " | ".join(f"{c} ms" for c, _, _ in CLASSES)
        + " | overall ms |",
        "|---:|---:|---|" + "---:|" * (len(CLASSES) + 1),
    ]
    for seed, r in runs.items():
        for a in arms:
            x = r["experiments"].get(f"g9/{a}")
            if not x or "error" in x:
                continue
            f = arm_figures(x)
            cells = [
                f"{c.mean_ms:.0f} ({c.done}/{c.flows})" if c.done else f"— (0/{c.flows})"
                for c in f.classes
            ]
            load = offered_mbit(x["per_flow"])
            lines.append(
                f"| {seed} | {load:.1f} | {a} | "
                + " | ".join(cells)
                + f" | {f.overall.mean_ms:.0f} |"
            )
    return "\n".join(lines) + "\n"


def g9_against(runs: dict[int, dict], arms: Sequence[str] = ARMS, ref: str = "gemini") -> str:
    """GEMINI's mean FCT against each baseline's, per seed: (ref − other) / other."""
    lines = [
        "| against | small: GEMINI's change per seed | large | overall | GEMINI's rank "
        "(small; large) per seed |",
        "|---|---|---|---|---|",
    ]
    figs = {
        s: {
            a: arm_figures(r["experiments"][f"g9/{a}"])
            for a in arms
            if "error" not in r["experiments"].get(f"g9/{a}", {"error": 1})
        }
        for s, r in runs.items()
    }

    def pct(x: float, y: float) -> str:
        return "—" if math.isnan(x) or math.isnan(y) else f"{100 * (x - y) / y:+.0f} %"

    def rank(fs: dict[str, ArmFigures], key: str) -> str:
        vals = {a: getattr(f, key).mean_ms for a, f in fs.items()}
        if ref not in vals or math.isnan(vals[ref]):
            return "—"
        return str(1 + sum(v < vals[ref] for v in vals.values() if not math.isnan(v)))

    for a in arms:
        if a == ref:
            continue
        cols = []
        for key in ("small", "large", "overall"):
            cols.append(
                ", ".join(
                    pct(getattr(fs[ref], key).mean_ms, getattr(fs[a], key).mean_ms)
                    if ref in fs and a in fs
                    else "—"
                    for fs in figs.values()
                )
            )
        ranks = ", ".join(f"{rank(fs, 'small')}; {rank(fs, 'large')}" for fs in figs.values())
        lines.append(f"| {a} | " + " | ".join(cols) + f" | {ranks} |")
    return "\n".join(lines) + "\n"


def jain(xs: Sequence[float]) -> float:
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)) if any(xs) else math.nan


def convergence_shares(
    r: dict, window: tuple[float, float] | None = None
) -> tuple[list[float], list[float]]:
    """Each flow's throughput (Mbit/s) over ``window`` (default: from the last group's start
    to the end, when all groups run) from its delivered packets, and each group's (the sum of
    its flows)."""
    last_start = max(g["start_s"] for g in r["groups"])
    lo, hi = window or (last_start, r.get("end_s", r["samples"][-1]["t"]))
    inside = [s for s in r["samples"] if lo <= s["t"] <= hi]
    flows: list[float] = []
    groups: list[float] = []
    for g in range(len(r["groups"])):
        seen: dict[str, list[tuple[float, int]]] = {}
        for s in inside:
            for sport, delivered in s["groups"][g].items():
                if delivered is not None:
                    seen.setdefault(sport, []).append((s["t"], delivered))
        rates = []
        for xs in seen.values():
            (t0, d0), (t1, d1) = xs[0], xs[-1]
            rates.append((d1 - d0) * MSS * 8 / (t1 - t0) / 1e6 if t1 > t0 else 0.0)
        flows += rates
        groups.append(sum(rates))
    return flows, groups


def g7_table(results: dict, arms: Sequence[str] = ARMS) -> str:
    exps = results["experiments"]
    lines = [
        "| arm | runs | Jain, flows | Jain, groups | group Mbit/s (1st, 2nd, 3rd) | flows seen |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for a in arms:
        rs = [v for k, v in exps.items() if k.startswith(f"g7/{a}#") and "error" not in v]
        if not rs:
            lines.append(f"| {a} | error |")
            continue
        shares = [convergence_shares(r) for r in rs]
        per_group = [_span([g[i] for _, g in shares], ".1f") for i in range(len(shares[0][1]))]
        lines.append(
            f"| {a} | {len(rs)} | {_span([jain(f) for f, _ in shares], '.3f')} | "
            f"{_span([jain(g) for _, g in shares], '.3f')} | {', '.join(per_group)} | "
            f"{_span([len(f) for f, _ in shares])} |"
        )
    return "\n".join(lines) + "\n"


# --- entry ---------------------------------------------------------------------------------------


def _run(plan: dict, out: Path) -> dict:
    from gemini_lab.host import run_plan

    def progress(label: str, r: dict) -> None:
        print(f"  {label}: {r.get('elapsed_s')} s {r.get('error', '')[-300:]}", flush=True)

    return run_plan(plan, out, backend="uml", progress=progress, timeout_s=RUN_TIMEOUT_S)


def workload(flows: int, load: float, seed: int) -> list[Flow]:
    cdf = load_cdf()
    return schedule(cdf, flows, arrival_rate(load, WAN_MBIT, cdf.mean()), seed)


def cmd_g9(args: argparse.Namespace) -> None:
    for seed in args.seed or SEEDS:
        flows = workload(args.flows, args.load, seed)
        res = _run(g9_plan(flows, args.arm or ARMS, args.drain), args.out / f"seed-{seed}")
        res["workload"] = {"seed": seed, "flows": args.flows, "load": args.load}
        (args.out / f"seed-{seed}.json").write_text(json.dumps(res, indent=1))
        print(g9_table({seed: res}, args.arm or ARMS), flush=True)


def _results(dirs: Sequence[Path]) -> dict[int, dict]:
    runs = {}
    for d in dirs:
        for p in sorted(d.glob("seed-*.json")):
            runs[int(p.stem.split("-")[1])] = json.loads(p.read_text())
    return dict(sorted(runs.items()))


def cmd_g9_table(args: argparse.Namespace) -> None:
    runs = _results(args.dirs)
    held = set(args.heldout_seed or HELDOUT_SEEDS)
    arms = args.arm or ARMS
    main = {s: r for s, r in runs.items() if s not in held}
    out = [
        f"Seeds {', '.join(map(str, main))} (min–max over seeds):",
        "",
        g9_table(main, arms),
        "GEMINI's mean FCT against each baseline's, per seed:",
        "",
        g9_against(main, arms),
    ]
    for s in sorted(held & set(runs)):
        out += [
            f"Held-out seed {s}:",
            "",
            g9_table({s: runs[s]}, arms),
            g9_against({s: runs[s]}, arms),
        ]
    out += ["Per seed and size class (completed / scheduled):", "", g9_per_seed(runs, arms)]
    print("\n".join(out))


def cmd_g7(args: argparse.Namespace) -> None:
    res = _run(g7_plan(args.arm or ARMS, args.runs, args.phase), args.out / "g7")
    (args.out / "g7.json").write_text(json.dumps(res, indent=1))
    print(g7_table(res, args.arm or ARMS))


def main(argv: list[str] | None = None) -> None:
    if (argv or sys.argv[1:])[:1] == ["serve"]:  # the guest's receiver
        serve(int((argv or sys.argv[1:])[1]))
        return
    p = argparse.ArgumentParser(
        prog="python -m gemini_lab.websearch",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    g9 = sub.add_parser("g9", help="run G9: one boot per seed")
    g9.add_argument("--out", type=Path, required=True)
    g9.add_argument("--seed", type=int, action="append")
    g9.add_argument("--flows", type=int, default=FLOWS)
    g9.add_argument("--load", type=float, default=LOAD)
    g9.add_argument("--drain", type=float, default=DRAIN_S)
    g9.add_argument("--arm", action="append")
    tab = sub.add_parser("g9-table", help="G9's tables from the seeds' results")
    tab.add_argument("dirs", type=Path, nargs="+")
    tab.add_argument("--heldout-seed", type=int, action="append")
    tab.add_argument("--arm", action="append")
    g7 = sub.add_parser("g7", help="run G7: one boot")
    g7.add_argument("--out", type=Path, required=True)
    g7.add_argument("--runs", type=int, default=1)
    g7.add_argument("--phase", type=float, default=CONV_PHASE_S)
    g7.add_argument("--arm", action="append")
    args = p.parse_args(argv)
    if hasattr(args, "out"):
        args.out.mkdir(parents=True, exist_ok=True)
        print("command: python -m gemini_lab.websearch " + shlex.join(argv or sys.argv[1:]))
    {"g9": cmd_g9, "g9-table": cmd_g9_table, "g7": cmd_g7}[args.cmd](args)


if __name__ == "__main__":
    main()
