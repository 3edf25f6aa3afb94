"""Guest side of the datapaths' lab checks (issue #31): any ``module_params`` datapath's module
loaded, its parameters written and read back through its spec's target, and one flow of its CC
sampled on the guest clock.

``exp_datapath_flow`` (experiment kind ``datapath_flow``) loads the datapath's module (built
for this kernel beside tcp_fusion.ko: Kbuild builds every module, and the plan names that
build), writes ``theta`` (spec names) and ``module_extra`` (its non-θ parameters, GEMINI's
``capacity_mbit``) into /sys/module/<module>/parameters, optionally turns the path's netem into
a random CE marker (``ce_percent``: netem's random loss with ``ecn``, which marks an
ECN-capable packet CE where it would have dropped it, so a known fraction of the data is
marked whatever the queue), and runs one bulk flow of the datapath's CC. While it runs, every
``sample_s`` of guest time it reads the flow through sock_diag: struct tcp_info (window, CA
state, retransmits, delivered and delivered-CE packets, RTTs), the CC's DCTCP-format record
(α in 1/1024, asked for with VEGASINFO as ss does) and, where the module answers it, the
BBR-format record GEMINI fills with RTT_base, the last round's RTT_min, F, h and its cuts by
signal; and the bottleneck queue of each hop in ``hops``. The parameters read back before the
flow, the flow's figures, both ends' ECN counters and the queues' marks come back too; the
module's parameters are put back to what they were.

No sleeps stand for "let it happen": the samples are taken at fixed points of the guest's own
clock (simulated under UML's time travel), and the assertions read what the kernel reported.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from gemini_api.datapaths import datapath
from gemini_lab.ecn import NETSTAT_COUNTERS, netstat
from gemini_lab.experiment import BASE_PORT, finish_flow, start_flow
from gemini_lab.netem import (
    ROUTER_NS,
    SENDER_NS,
    bottleneck_args,
    qdisc_stats,
    receiver_ns,
    sh,
)
from gemini_lab.scenario import Scenario

FLOW_PORT = BASE_PORT + 120
INET_DIAG_INFO, INET_DIAG_VEGASINFO, INET_DIAG_CONG = 2, 3, 4
TCP_FIELDS = (
    "tcpi_snd_cwnd",
    "tcpi_ca_state",
    "tcpi_total_retrans",
    "tcpi_delivered",
    "tcpi_delivered_ce",
    "tcpi_rtt",
    "tcpi_min_rtt",
    "tcpi_options",
    "tcpi_snd_ssthresh",
)
DCTCP_FIELDS = ("dctcp_enabled", "dctcp_ce_state", "dctcp_alpha", "dctcp_ab_ecn", "dctcp_ab_tot")
BBR_FIELDS = ("bbr_bw_lo", "bbr_bw_hi", "bbr_min_rtt", "bbr_pacing_gain", "bbr_cwnd_gain")
QUEUE_COUNTERS = ("marked", "drops", "packets")
TCP_ESTABLISHED_ONLY = 1 << 1  # idiag_states: this flow's socket, not an earlier one closing


def module_dir() -> Path:
    """Where the guest's modules were built: the plan this guest runs (argv[1] of
    gemini_lab.guest) names tcp_fusion.ko there, and Kbuild builds every module beside it."""
    plan = json.loads(Path(sys.argv[1]).read_text())
    return Path(plan["module"]).parent


def load_module(name: str) -> dict:
    """The datapath's module loaded (once per boot); what insmod said."""
    dp = datapath(name)
    if Path(f"/sys/module/{dp.module}").is_dir():
        return {"rc": 0, "err": "already loaded"}
    p = subprocess.run(
        ["insmod", str(module_dir() / f"{dp.module}.ko")], capture_output=True, text=True
    )
    return {"rc": p.returncode, "err": p.stderr.strip()}


def params_dir(name: str) -> Path:
    return Path(datapath(name).spec.target)


def read_params(name: str, extra: tuple[str, ...] = ()) -> dict[str, int]:
    """Every θ parameter of the datapath's spec (and ``extra`` ones), read from sysfs."""
    root = params_dir(name)
    if not root.is_dir():
        return {}
    return {n: int((root / n).read_text().strip()) for n in (*datapath(name).spec.names, *extra)}


def write_params(name: str, values: dict[str, int]) -> None:
    root = params_dir(name)
    for key, value in values.items():
        (root / key).write_text(f"{value}\n")


def mark_ce(path: int, s: Scenario, percent: float | None) -> None:
    """Path ``path``'s netem bottleneck as a random marker: ``percent`` of the ECN-capable
    packets CE-marked (None: back to its own loss, no marking)."""
    (link,) = s.links()
    args = ["limit", str(link.queue_limit)]
    args += ["loss", "random", f"{percent}%", "ecn"] if percent else bottleneck_args(link)[2:]
    dev = f"path{path}"
    sh(
        "tc",
        "qdisc",
        "change",
        "dev",
        dev,
        "parent",
        "1:1",
        "handle",
        "10:",
        "netem",
        *args,
        ns=ROUTER_NS,
    )


def _diag(cc: str, port: int) -> dict | None:
    """One sock_diag reading of the sender's socket to ``port`` running ``cc`` (the last, if
    parallel connections share the port)."""
    socks = _diag_sockets(cc, port)
    return {k: v for k, v in socks[-1].items() if k != "sport"} if socks else None


def exp_datapath_flow(e: dict, out: Path) -> dict:
    """One flow of datapath ``e["datapath"]`` at θ ``e["theta"]`` (or, with ``e["cc"]`` and no
    datapath, of a kernel CC as it is: a baseline measured the same way)."""
    name = e.get("datapath")
    if name is None:
        return _flow_of(e["cc"], None, e, {"rc": 0, "err": "kernel CC"})
    loaded = load_module(name)
    if loaded["rc"] != 0:
        return {"insmod": loaded}
    return _flow_of(datapath(name).cc, name, e, loaded)


def _flow_of(cc: str, name: str | None, e: dict, loaded: dict) -> dict:
    path, duration_s = e["path"], e["duration_s"]
    sample_s, hops = e.get("sample_s", 0.1), e.get("hops", [])
    extra = e.get("module_extra", {})
    before = read_params(name, tuple(extra)) if name else {}
    scen = Scenario(**e["scenario"]) if e.get("ce_percent") else None
    port = FLOW_PORT + e.get("port_offset", 0)  # each flow its own port: no earlier socket
    rcv = receiver_ns(path)
    try:
        if name:
            write_params(name, {**e.get("theta", {}), **extra})
        ran = read_params(name, tuple(extra)) if name else {}
        if scen is not None:
            mark_ce(path, scen, e["ce_percent"])
        q_before = {h: qdisc_stats(path, h) for h in hops}
        net_before = {"sender": netstat(SENDER_NS), "receiver": netstat(rcv)}
        server, client = start_flow(
            path,
            cc,
            duration_s,
            port=port,
            parallel=e.get("parallel", 1),
            omit_s=e.get("omit_s", 0),
        )
        t0 = time.monotonic()
        samples: list[dict] = []
        queues: dict[int, list[int]] = {h: [] for h in hops}
        ss = ""
        while client.poll() is None and time.monotonic() - t0 < duration_s:
            d = _diag(cc, port)
            if d is not None:
                samples.append({"t": round(time.monotonic() - t0, 4), **d})
            for h in hops:
                queues[h].append(int(qdisc_stats(path, h).get("qlen", 0)))
            if not ss and time.monotonic() - t0 >= duration_s / 2:
                ss = sh("ss", "-Htin", f"dport = :{port}", ns=SENDER_NS, check=False)
            time.sleep(sample_s)
        flow = finish_flow(server, client, duration_s)
        q_after = {h: qdisc_stats(path, h) for h in hops}
        net_after = {"sender": netstat(SENDER_NS), "receiver": netstat(rcv)}
    finally:
        if scen is not None:
            mark_ce(path, scen, None)
        if name:
            write_params(name, before)
    return {
        **flow,
        "insmod": loaded,
        "params_before": before,
        "params_ran": ran,
        "params_after": read_params(name, tuple(extra)) if name else {},
        "samples": samples,
        "ss": ss,
        "queues": {
            str(h): {
                **{
                    c: int(q_after[h].get(c, 0)) - int(q_before[h].get(c, 0))
                    for c in QUEUE_COUNTERS
                },
                "mean_qlen": sum(queues[h]) / len(queues[h]) if queues[h] else None,
                "max_qlen": max(queues[h]) if queues[h] else None,
                "qlen_series": queues[h],
            }
            for h in hops
        },
        "netstat": {
            end: {c: net_after[end].get(c, 0) - net_before[end].get(c, 0) for c in NETSTAT_COUNTERS}
            for end in net_before
        },
    }


def exp_datapath_load(e: dict, out: Path) -> dict:
    """The datapath's module loaded before what follows uses its CC (a lab host's default CC,
    say): ours from the build beside tcp_fusion.ko, one of the kernel's through modprobe, none
    for a CC built in. Its parameters read back."""
    name = e["datapath"]
    dp = datapath(name)
    if Path(f"/sys/module/{dp.module}").is_dir():
        loaded = {"rc": 0, "err": "already loaded"}
    elif (module_dir() / f"{dp.module}.ko").is_file():
        loaded = load_module(name)
    else:
        p = subprocess.run(["modprobe", dp.module], capture_output=True, text=True)
        loaded = {"rc": p.returncode, "err": p.stderr.strip()}
    available = Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()
    return {"insmod": loaded, "available": available, "params": read_params(name)}


def _diag_in(ns: str, cc: str, port: int) -> list[dict]:
    """Every ``cc`` socket to ``port`` in namespace ``ns``, read through sock_diag from a thread
    that enters ``ns`` (setns moves only the calling thread; the guest's own stays put)."""
    from gemini_lab.netem import enter_netns

    found: list[dict] = []

    def read() -> None:
        enter_netns(ns)
        found.extend(_diag_sockets(cc, port))

    t = threading.Thread(target=read)
    t.start()
    t.join()
    return found


def _diag_sockets(cc: str, port: int) -> list[dict]:
    """One sock_diag reading per ``cc`` socket to ``port`` (several: parallel connections)."""
    from pyroute2 import DiagSocket

    socks: dict[int, dict] = {}
    with DiagSocket() as ds:
        ds.bind()
        for ext, record, fields in (
            (INET_DIAG_VEGASINFO, "INET_DIAG_DCTCPINFO", DCTCP_FIELDS),
            (INET_DIAG_CONG, "INET_DIAG_BBRINFO", BBR_FIELDS),
        ):
            mask = 1 << (INET_DIAG_INFO - 1) | 1 << (ext - 1) | 1 << (INET_DIAG_CONG - 1)
            for m in ds.get_sock_stats(
                family=socket.AF_INET, states=TCP_ESTABLISHED_ONLY, extensions=mask
            ):
                if m["idiag_dport"] != port or m.get_attr("INET_DIAG_CONG") != cc:
                    continue
                info, rec = m.get_attr("INET_DIAG_INFO"), m.get_attr(record)
                if info is None:
                    continue
                d = socks.setdefault(m["idiag_sport"], {"sport": m["idiag_sport"]})
                d.update({k: info.get(k) for k in TCP_FIELDS})
                if rec is not None:
                    d.update({k: rec.get(k) for k in fields})
    return list(socks.values())


PAIR_BURST_PACKETS = 2  # the pair's shapers (switch, WAN limit): a larger burst hides a queue


def wan_limit(wan: dict | None, add: bool) -> None:
    """The WAN bottleneck of Gear's 7:3 test on flow ``wan["flow"]``'s own link: a tbf at
    ``rate_kbit`` with ``queue_packets`` of buffer on its sender's egress (the pair topology of
    gemini_lab.fairness has no hop that only one flow crosses after the switch; docs/gear.md).
    ``add`` False takes it off again; no ``wan``, nothing."""
    from gemini_lab import fairness as fx
    from gemini_lab.netem import WIRE_PACKET_BYTES

    if not wan:
        return
    i = wan["flow"]
    dev, ns = f"up{i}", fx.SENDERS[i]
    sh("tc", "qdisc", "del", "dev", dev, "root", ns=ns, check=False)
    if add:
        limit = str(wan["queue_packets"] * WIRE_PACKET_BYTES)
        burst = str(PAIR_BURST_PACKETS * WIRE_PACKET_BYTES)
        rate = f"{wan['rate_kbit']}kbit"
        sh("tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", burst,
           "limit", limit, ns=ns)  # fmt: skip


def exp_datapath_pair(e: dict, out: Path) -> dict:
    """Groups of flows of one CC with different RTTs (``e["rtts_ms"]``, ``e["parallel"]``
    connections each) started together through one bottleneck that marks ECN from K packets
    (gemini_lab.fairness' shared-bottleneck namespaces, with RED as the datacenter switch in
    place of its netem queue; receiver dctcp, for DCTCP's exact CE echo). The datapath's θ as
    in ``exp_datapath_flow``. Every ``sample_s`` of guest time each sender's sockets are read
    through sock_diag (window, RTTs, α, and GEMINI's F, h and cuts), so a share that is off
    can be traced to the signal or the growth that made it. ``wan`` adds a WAN bottleneck on
    one flow's link (``wan_limit``), as in Gear's 7:3 test."""
    from gemini_lab import fairness as fx
    from gemini_lab.experiment import _bulk
    from gemini_lab.netem import link_qdisc_commands
    from gemini_lab.scenario import Link

    name = e.get("datapath")
    cc = datapath(name).cc if name else e["cc"]
    extra = e.get("module_extra", {})
    if name:
        loaded = load_module(name)
        if loaded["rc"] != 0:
            return {"insmod": loaded}
    before = read_params(name, tuple(extra)) if name else {}
    fx._ensure_topology()
    link = Link(
        rate_kbit=e["rate_kbit"],
        queue_limit=e["queue_packets"],
        ecn_threshold_packets=e["ecn_k"],
        burst_packets=PAIR_BURST_PACKETS,
    )
    sh("tc", "qdisc", "del", "dev", fx.BOTTLENECK_IF, "root", ns=fx.ROUTER, check=False)
    for cmd in link_qdisc_commands(fx.BOTTLENECK_IF, link):
        sh(*cmd, ns=fx.ROUTER)
    for i, rtt in enumerate(e["rtts_ms"]):
        sh("tc", "qdisc", "del", "dev", f"s{i}", "root", ns=fx.ROUTER, check=False)
        sh("tc", "qdisc", "add", "dev", f"s{i}", "root", "netem", "delay", f"{rtt}ms",
           "limit", "100000", ns=fx.ROUTER)  # fmt: skip
    sh("sysctl", "-qw", "net.ipv4.tcp_congestion_control=dctcp", ns=fx.RECEIVER)
    duration_s, omit_s = e["duration_s"], e.get("omit_s", 0)
    parallel, sample_s = e.get("parallel", 1), e.get("sample_s", 0.2)
    ports = [fx.FAIR_PORT + i for i in range(len(e["rtts_ms"]))]
    samples: list[list[dict]] = [[] for _ in ports]
    try:
        wan_limit(e.get("wan"), add=True)
        if name:
            write_params(name, {**e.get("theta", {}), **extra})
        ran = read_params(name, tuple(extra)) if name else {}
        servers = []
        for port in ports:
            server = _bulk(fx.RECEIVER, "recv", port, parallel, omit_s, duration_s)
            assert server.stdout is not None
            if server.stdout.readline().strip() != "ready":
                raise RuntimeError(f"receiver on port {port} did not start")
            servers.append(server)
        clients = [
            _bulk(fx.SENDERS[i], "send", fx.RECEIVER_ADDR, port, cc, parallel, duration_s)
            for i, port in enumerate(ports)
        ]
        t0 = time.monotonic()
        while any(c.poll() is None for c in clients) and time.monotonic() - t0 < duration_s:
            t = round(time.monotonic() - t0, 4)
            for i, port in enumerate(ports):
                samples[i] += [{"t": t, **d} for d in _diag_in(fx.SENDERS[i], cc, port)]
            time.sleep(sample_s)
        flows = [
            {"rtt_ms": rtt, "samples": smp, **finish_flow(srv, cli, duration_s)}
            for rtt, smp, srv, cli in zip(e["rtts_ms"], samples, servers, clients, strict=True)
        ]
        marked = qdisc_of(fx.ROUTER, fx.BOTTLENECK_IF).get("marked", 0)
    finally:
        wan_limit(e.get("wan"), add=False)
        if name:
            write_params(name, before)
    return {
        "cc": cc,
        "flows": flows,
        "marked": marked,
        "parallel": parallel,
        "params_ran": ran or {**e.get("theta", {})},
    }


def qdisc_of(ns: str, dev: str) -> dict:
    """``tc -s`` of the bottleneck queue (handle 10:) on ``dev`` in ``ns``."""
    for q in json.loads(sh("tc", "-s", "-j", "qdisc", "show", "dev", dev, ns=ns)):
        if q.get("handle") == "10:":
            return dict(q)
    return {}


def exp_datapath_incast(e: dict, out: Path) -> dict:
    """gemini_lab.ecn's incast with the datapath's θ written first (put back after), or a
    kernel CC's."""
    from gemini_lab.ecn import exp_incast

    name = e.get("datapath")
    if name is None:
        return exp_incast(e, out)
    loaded = load_module(name)
    if loaded["rc"] != 0:
        return {"insmod": loaded}
    extra = e.get("module_extra", {})
    before = read_params(name, tuple(extra))
    try:
        write_params(name, {**e.get("theta", {}), **extra})
        ran = read_params(name, tuple(extra))
        return {**exp_incast({**e, "cc": datapath(name).cc}, out), "params_ran": ran}
    finally:
        write_params(name, before)
