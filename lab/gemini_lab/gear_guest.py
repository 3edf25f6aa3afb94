"""Guest side of Gear's lab checks (issue #36): the INT switch attached at a path's bottleneck,
one Gear flow (optionally beside a competing flow of a kernel CC), and both the queue and what
the Gear sender read from the switch, sampled on the guest clock.

``exp_gear_flow`` (experiment kind ``gear_flow``) loads gear_int.ko and tcp_gear.ko (built for
this kernel beside tcp_fusion.ko), attaches the switch to the egress device of hop 0 of
``path`` by writing its name to /sys/module/gear_int/parameters/dev from inside the router's
namespace (the module looks the name up in the writer's namespace), writes Gear's θ and its
configuration, tries the out-of-region writes in ``refuse`` (each must fail), and runs the
flows. Every ``sample_s`` of guest time it reads, at one instant of the simulated clock (CPU
work takes no simulated time under UML's time travel): the bottleneck qdisc's backlog (tc) and
the Gear socket through sock_diag (the INT record it last read: its time and queue; u, w^c,
the window). Everything is put back and the switch detached afterwards.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from gemini_lab.datapath_guest import (
    PAIR_BURST_PACKETS,
    _diag,
    load_module,
    module_dir,
    read_params,
    write_params,
)
from gemini_lab.experiment import BASE_PORT, finish_flow, start_flow
from gemini_lab.netem import ROUTER_NS, link_device, qdisc_stats, sh

GEAR, GEAR_CC = "gear", "gear"
INT_PARAMS = Path("/sys/module/gear_int/parameters")
GEAR_PORT = BASE_PORT + 160
US_WRAP = 1 << 32  # the sender reports the record's time in µs, low 32 bits


def _load_int() -> dict:
    if INT_PARAMS.is_dir():
        return {"rc": 0, "err": "already loaded"}
    p = subprocess.run(
        ["insmod", str(module_dir() / "gear_int.ko")], capture_output=True, text=True
    )
    return {"rc": p.returncode, "err": p.stderr.strip()}


def attach(path: int, rate_mbit: int) -> str:
    """The switch on hop 0 of ``path``: its device named from the router's namespace."""
    ns, dev = link_device(path, 0)
    (INT_PARAMS / "rate_mbit").write_text(f"{rate_mbit}\n")
    sh("sh", "-c", f"echo {dev} > {INT_PARAMS / 'dev'}", ns=ns)
    return (INT_PARAMS / "dev").read_text().strip()


def detach() -> None:
    sh("sh", "-c", f"echo > {INT_PARAMS / 'dev'}", ns=ROUTER_NS)


def refused(values: dict[str, int]) -> dict[str, bool]:
    """Each out-of-region write tried alone: True where the module refused it."""
    root = Path("/sys/module/tcp_gear/parameters")
    out = {}
    for name, value in values.items():
        try:
            (root / name).write_text(f"{value}\n")
            out[name] = False
        except OSError:
            out[name] = True
    return out


def _sample(path: int, port: int, t0: float) -> dict:
    """One instant: the queue and the Gear sender's reading."""
    q = qdisc_stats(path, 0)
    now = time.monotonic()
    d = _diag(GEAR_CC, port) or {}
    return {
        "t": round(now - t0, 6),
        "now_us": int(now * 1e6) % US_WRAP,
        "backlog": int(q.get("backlog", 0)),
        "qlen": int(q.get("qlen", 0)),
        **d,
    }


def exp_gear_flow(e: dict, out: Path) -> dict:
    path, duration_s, sample_s = e["path"], e["duration_s"], e.get("sample_s", 0.002)
    loaded = {"int": _load_int()}
    if loaded["int"]["rc"] == 0:
        loaded["gear"] = load_module(GEAR)
    if any(v["rc"] != 0 for v in loaded.values()):
        return {"insmod": loaded}
    extra = {"dc_base_rtt_us": e.get("dc_base_rtt_us", 2000)}
    before = read_params(GEAR, tuple(extra))
    port = GEAR_PORT + 2 * e.get("port_offset", 0)
    samples: list[dict] = []
    competitor = None
    try:
        attached = attach(path, e["rate_mbit"])
        write_params(GEAR, {**e.get("theta", {}), **extra})
        ran = read_params(GEAR, tuple(extra))
        refusals = refused(e.get("refuse", {}))
        if e.get("competitor_cc"):
            competitor = start_flow(path, e["competitor_cc"], duration_s, port=port + 1)
        server, client = start_flow(path, GEAR_CC, duration_s, port=port)
        t0 = time.monotonic()
        while client.poll() is None and time.monotonic() - t0 < duration_s:
            samples.append(_sample(path, port, t0))
            time.sleep(sample_s)
        flow = finish_flow(server, client, duration_s)
        other = finish_flow(*competitor, duration_s) if competitor else None
        records = int((INT_PARAMS / "records").read_text())
    finally:
        detach()
        write_params(GEAR, before)
    return {
        **flow,
        "competitor": other,
        "insmod": loaded,
        "attached": attached,
        "params_ran": ran,
        "refused": refusals,
        "int_records": records,
        "samples": samples,
    }


def _pair_sample(cc: str, ports: list[int], t0: float) -> dict:
    """Each flow's sender state at one instant of the guest clock (Gear's: u, w^c, records
    and the others' share in BBR's record; see tcp_gear.c's get_info)."""
    from gemini_lab import fairness as fx
    from gemini_lab.datapath_guest import _diag_in

    flows = []
    for ns, port in zip(fx.SENDERS, ports, strict=False):
        socks = _diag_in(ns, cc, port)
        flows.append({k: socks[-1].get(k) for k in PAIR_SAMPLE_FIELDS} if socks else {})
    return {"t": round(time.monotonic() - t0, 3), "flows": flows}


# the window, Gear's state (u, w^c, records: tcp_gear.c's get_info) and the packets delivered,
# whose differences give each flow's rate between two samples (the 7:3 test's convergence)
PAIR_SAMPLE_FIELDS = (
    "tcpi_snd_cwnd",
    "tcpi_delivered",
    "bbr_min_rtt",
    "bbr_pacing_gain",
    "bbr_cwnd_gain",
)


def exp_gear_pair(e: dict, out: Path) -> dict:
    """Gear's micro-benchmark at the lab's scale: flows with different RTTs (``rtts_ms``: an
    intra-DC and a cross-DC one) through one bottleneck with the INT switch on it, in
    gemini_lab.fairness' shared-bottleneck namespaces (the same ones ``datapath_pair`` runs
    GEMINI and DCTCP in, there with RED marking). Flow i starts ``starts_s[i]`` after the
    first; each flow's goodput over the run comes back, and with ``sample_s`` each sender's
    state every ``sample_s``. ``cc`` (default gear) runs a kernel CC through the same drop-tail
    queue instead; ``wan`` adds a WAN bottleneck on one flow's link (``wan_limit``)."""
    from gemini_lab import fairness as fx
    from gemini_lab.datapath_guest import wan_limit
    from gemini_lab.experiment import _bulk
    from gemini_lab.netem import tbf_args

    loaded = {"int": _load_int()}
    if loaded["int"]["rc"] == 0:
        loaded["gear"] = load_module(GEAR)
    if any(v["rc"] != 0 for v in loaded.values()):
        return {"insmod": loaded}
    fx._ensure_topology()
    fx._configure(e["rate_kbit"], e["queue_packets"], e["rtts_ms"])
    # a shaper burst of 2 packets, not the lab's 2 ms of tokens, which would hide the DC queue
    tbf = tbf_args(e["rate_kbit"], PAIR_BURST_PACKETS)
    sh("tc", "qdisc", "change", "dev", fx.BOTTLENECK_IF, "root", "handle", "1:", "tbf", *tbf,
       ns=fx.ROUTER)  # fmt: skip
    extra = {"dc_base_rtt_us": e["dc_base_rtt_us"]}
    before = read_params(GEAR, tuple(extra))
    duration_s, cc = e["duration_s"], e.get("cc", GEAR_CC)
    ports = [fx.FAIR_PORT + 10 + i for i in range(len(e["rtts_ms"]))]
    samples: list[dict] = []
    try:
        wan_limit(e.get("wan"), add=True)
        (INT_PARAMS / "rate_mbit").write_text(f"{e['rate_kbit'] // 1000}\n")
        sh("sh", "-c", f"echo {fx.BOTTLENECK_IF} > {INT_PARAMS / 'dev'}", ns=fx.ROUTER)
        write_params(GEAR, {**e.get("theta", {}), **extra})
        ran = read_params(GEAR, tuple(extra))
        servers = []
        for port in ports:
            server = _bulk(fx.RECEIVER, "recv", port, 1, 0, duration_s)
            assert server.stdout is not None
            if server.stdout.readline().strip() != "ready":
                raise RuntimeError(f"receiver on port {port} did not start")
            servers.append(server)
        t0, clients = time.monotonic(), []
        for i, port in enumerate(ports):
            time.sleep(max(0.0, t0 + e["starts_s"][i] - time.monotonic()))
            length = duration_s - e["starts_s"][i]
            clients.append(_bulk(fx.SENDERS[i], "send", fx.RECEIVER_ADDR, port, cc, 1, length))
        while e.get("sample_s") and any(c.poll() is None for c in clients):
            samples.append(_pair_sample(cc, ports, t0))
            time.sleep(e["sample_s"])
        flows = [
            {"rtt_ms": rtt, **finish_flow(srv, cli, duration_s)}
            for rtt, srv, cli in zip(e["rtts_ms"], servers, clients, strict=True)
        ]
    finally:
        wan_limit(e.get("wan"), add=False)
        sh("sh", "-c", f"echo > {INT_PARAMS / 'dev'}", ns=fx.ROUTER)
        write_params(GEAR, before)
    return {"cc": cc, "flows": flows, "params_ran": ran, "insmod": loaded, "samples": samples}
