"""Guest side entry point: load Fusion, build the paths, run a plan of experiments, write JSON.

    python -m gemini_lab.guest PLAN.json RESULTS.json

The plan (written by the host, see gemini_lab.plans) lists the paths (scenarios) and the
experiments; each experiment's result, or its error, lands in RESULTS.json under its label.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gemini_api.aggregate import FlowStats
from gemini_api.datapaths import Datapath, registry
from gemini_api.fusion_genl import FusionError, FusionNetlink, Rule
from gemini_api.theta import load_spec
from gemini_lab import fleet
from gemini_lab.cubic_guest import exp_cubic_check
from gemini_lab.datapath_guest import (
    exp_datapath_flow,
    exp_datapath_incast,
    exp_datapath_load,
    exp_datapath_pair,
    load_module,
)
from gemini_lab.ecn import exp_ecn, exp_incast
from gemini_lab.experiment import (
    BASE_PORT,
    RecordCollector,
    finish_flow,
    read_sysctl,
    run_flow,
    set_default_theta,
    start_flow,
    unprivileged_record_listener,
)
from gemini_lab.fairness import exp_fairness
from gemini_lab.flowgen import FLOW_BYTES
from gemini_lab.gear_guest import exp_gear_flow, exp_gear_pair
from gemini_lab.netem import (
    SENDER_NS,
    RateSchedule,
    Topology,
    add_lab_host,
    enter_netns,
    out_of_order_segments,
    path_qdiscs,
    python_in,
    receiver_addr,
    receiver_ns,
    receiver_prefix,
    sh,
    wait_listening,
)
from gemini_lab.relay import start_relay
from gemini_lab.scenario import Scenario
from gemini_lab.shortflows import exp_shortflows
from gemini_lab.websearch import exp_convergence, exp_websearch

REPO = Path(__file__).resolve().parents[2]
MODULE = REPO / "fusion-kmod" / "tcp_fusion.ko"
# the running rate schedules by path index; a flow restarts its path's schedule (see RateSchedule)
SCHEDULES: dict[int, RateSchedule] = {}
BOOSTER_FROM_GUEST = "10.0.2.2"  # the host machine, as qemu's user-mode network shows it
POLL_S = 0.1  # how often a wait below looks again at what it waits for
AGENT_UP_S = 60.0  # the agent's first θ from Booster, on a busy host under qemu
AGENT_COUNTED_S = 30.0  # the last flows' records reaching the agent's count
RMMOD_S = 30.0  # the module's last users (closing sockets) letting it go


def until(done: Callable[[], bool], timeout_s: float) -> bool:
    """Poll ``done`` until it holds or ``timeout_s`` has passed; whether it held. The guest
    waits for what it needs to have happened, not a fixed time, so a slow host only waits
    longer (and a quick one not at all)."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_S)
    return True


def default_theta() -> dict[str, int]:
    return {p.name: p.default for p in load_spec().params}


def flow_table(cc: str) -> Datapath:
    """The table datapath whose θ a flow of ``cc`` runs (its module loaded, once per boot):
    the CC's own when it is one (Fusion, GEMINI, DC-Vegas), else Fusion's, whose θ the flow
    then ignores."""
    dp = registry().for_cc(cc)
    if dp is None or not dp.genl_family:
        return registry().default
    if dp != registry().default:
        load_module(dp.name)
    return dp


def exp_flow(e: dict, out: Path) -> dict:
    table = flow_table(e["cc"])
    set_default_theta({**table.spec.default(), **e.get("theta", {})}, table.name)
    records = out / f"records-{e['label'].replace('/', '-')}.jsonl"
    with RecordCollector(records, table.name) as rc:
        if e["path"] in SCHEDULES:
            SCHEDULES[e["path"]].restart()
            time.sleep(e.get("offset_s", 0))  # this far into the rate schedule
        result = run_flow(
            e["path"],
            e["cc"],
            e["duration_s"],
            parallel=e.get("parallel", 1),
            omit_s=e.get("omit_s", 0),
        )
        ports = set(result["ports"])
        if e["cc"] == table.cc:
            # the record comes when the socket closes, some round trips after the last byte:
            # on an 800 ms path after the flow's own measurement has ended
            rc.wait_for(lambda r: r["sport"] in ports, len(ports))
    result["records"] = [r for r in rc.records() if r["sport"] in ports]
    result["record_listener"] = rc.summary
    set_default_theta(table.spec.default(), table.name)
    return result


def exp_path_check(e: dict, out: Path) -> dict:
    """A path as the kernel holds it: its qdiscs read back, and a flow over it with the
    receiver's count of segments queued out of order before and after (issue #34: jitter that
    must not reorder, and jitter that does)."""
    before = out_of_order_segments(e["path"])
    flow = run_flow(e["path"], e["cc"], e["duration_s"])
    return {
        "qdiscs": path_qdiscs(e["path"]),
        "out_of_order": out_of_order_segments(e["path"]) - before,
        "flow": flow,
    }


def exp_profiles(e: dict, out: Path) -> dict:
    """Two destinations, two profiles, flows to both at the same time."""
    profiles = {i + 1: {**default_theta(), **theta} for i, theta in enumerate(e["thetas"])}
    pairs = zip(profiles, e["paths"], strict=True)
    rules = [Rule(receiver_prefix(path), pid) for pid, path in pairs]
    with FusionNetlink() as nl:
        version = nl.set_profiles(profiles, rules)
    flows = []
    with RecordCollector(out / f"records-{e['label'].replace('/', '-')}.jsonl") as rc:
        for i, path in enumerate(e["paths"]):
            flows.append(start_flow(path, "fusion", e["duration_s"], port=BASE_PORT + 10 + i))
        results = [finish_flow(s, c, e["duration_s"]) for s, c in flows]
        ports = {p for res in results for p in res["ports"]}
        rc.wait_for(lambda r: r["sport"] in ports, len(ports))  # each closes some RTTs later
    with FusionNetlink() as nl:
        nl.set_profiles({}, [])
    for path, res in zip(e["paths"], results, strict=True):
        res["records"] = [r for r in rc.records() if r["sport"] in set(res["ports"])]
        res["dst"] = receiver_addr(path)
    return {"version": version, "profiles": profiles, "flows": results}


def _try_sysctl(name: str, value: int) -> bool:
    return (
        subprocess.run(
            ["ip", "netns", "exec", SENDER_NS, "sysctl", "-qw", f"net.fusion.{name}={value}"],
            capture_output=True,
        ).returncode
        == 0
    )


def exp_rejects(e: dict, out: Path) -> dict:
    """Every out-of-range write is refused and leaves the old values."""
    spec = load_spec()
    sysctl_cases = []
    for p in spec.params:
        before = read_sysctl(f"net.fusion.{p.name}")
        version = read_sysctl("net.fusion.version")
        for bad in (p.wide[0] - 1, p.wide[1] + 1):
            if bad < 0:
                continue
            accepted = _try_sysctl(p.name, bad)
            sysctl_cases.append(
                {
                    "param": p.name,
                    "value": bad,
                    "accepted": accepted,
                    "kept": read_sysctl(f"net.fusion.{p.name}") == before,
                    "version_kept": read_sysctl("net.fusion.version") == version,
                }
            )
    good = {1: default_theta()}
    good_rules = [Rule("10.1.0.0/16", 1)]
    bad_tables = {
        "theta_out_of_region": ({1: {**default_theta(), "mult_decrease": 100}}, good_rules),
        "host_bits_set": (good, [Rule("10.1.0.1/16", 1)]),
        "prefix_too_long": (good, [Rule("10.1.0.0/33", 1)]),
        "unknown_profile": (good, [Rule("10.1.0.0/16", 7)]),
        "profile_id_zero": ({0: default_theta()}, []),
        "too_many_rules": (good, [Rule(f"10.{i // 256}.{i % 256}.0/24", 1) for i in range(4097)]),
    }
    table_cases = []
    with FusionNetlink() as nl:
        installed = nl.set_profiles(good, good_rules)
        reference = nl.get_profiles()
        for name, (profiles, rules) in bad_tables.items():
            try:
                nl.set_profiles(profiles, rules)
                error = None
            except (FusionError, ValueError) as exc:
                error = str(exc)
            kept = nl.get_profiles() == reference
            table_cases.append({"case": name, "error": error, "kept": kept})
        nl.set_profiles({}, [])
    return {"sysctl": sysctl_cases, "table": table_cases, "installed_version": installed}


def exp_cpu(e: dict, out: Path) -> dict:
    """Guest CPU per byte for each CC at several flow counts, in the same boot; the CCs take
    turns ``repeats`` times, so a drift in the emulator's speed falls on all of them."""
    rows = []
    for n in e["flow_counts"]:
        for _ in range(e.get("repeats", 1)):
            for cc in e["ccs"]:
                r = run_flow(e["path"], cc, e["duration_s"], parallel=n, port=BASE_PORT + 50)
                gbytes = r["bytes_received"] / 1e9
                rows.append(
                    {
                        "cc": cc,
                        "flows": n,
                        "cpu_busy_s": r["cpu_busy_s"],
                        "gbytes": gbytes,
                        "throughput_mbps": r["throughput_mbps"],
                        "cpu_s_per_gb": r["cpu_busy_s"] / gbytes if gbytes else None,
                    }
                )
    return {"rows": rows}


def _flowgen_receiver(path: int, mode: str, port: int) -> subprocess.Popen:
    """``gemini_lab.flowgen serve|hold`` in the path's receiver namespace."""
    server = subprocess.Popen(python_in(receiver_ns(path), "gemini_lab.flowgen", mode, str(port)))
    wait_listening(receiver_ns(path), port)
    return server


def _flowgen_send(mode: str, path: int, port: int, *args: object) -> dict:
    """``gemini_lab.flowgen send|burst`` from the sender namespace; its JSON summary."""
    return json.loads(
        sh(
            sys.executable,
            "-m",
            "gemini_lab.flowgen",
            mode,
            receiver_addr(path),
            str(port),
            *map(str, args),
            ns=SENDER_NS,
        )
    )


def exp_records(e: dict, out: Path) -> dict:
    """Short fusion flows as fast as the guest makes them (or all ended at once, ``burst``):
    is every record delivered, with the bytes the flow carried?"""
    port, path = BASE_PORT + 70, e["path"]
    sh("sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1", ns=SENDER_NS)
    mode, receiver = ("burst", "hold") if e.get("burst") else ("send", "serve")
    server = _flowgen_receiver(path, receiver, port)
    with FusionNetlink() as nl:
        before = nl.stats()
    with RecordCollector(out / f"records-{mode}.jsonl") as rc:
        sent = _flowgen_send(mode, path, port, e["flows"], e["workers"])
        rc.wait_for(lambda r: r["dport"] == port, sent["flows"])
    with FusionNetlink() as nl:
        after = nl.stats()
    server.kill()
    mine = [r for r in rc.records() if r["dport"] == port]
    return {
        **sent,
        "flows_per_s": sent["flows"] / sent["seconds"],
        "records_received": len(mine),
        "records_short_of_payload": sum(1 for r in mine if r["bytes_acked"] < FLOW_BYTES),
        "kernel_dropped": after["dropped"] - before["dropped"],
        "kernel_records": after["records"] - before["records"],
        "listener": rc.summary,
        "unprivileged_listener": unprivileged_record_listener(),
    }


def exp_writeback(e: dict, out: Path) -> dict:
    """The agent's write-back against the real module: a plan goes in whole (table and
    sysctls), a θ outside Θ′ from Booster changes nothing at all (not even its in-range
    parameters), and after the staleness limit the safe default replaces everything."""
    from gemini_agent.context import Place
    from gemini_agent.metrics import AgentMetrics
    from gemini_agent.writeback import Kernel, ThetaApplier
    from gemini_api.v1 import booster_pb2 as pb

    spec = load_spec()
    applier = ThetaApplier(Kernel(), AgentMetrics(), staleness_s=1.0, spec=spec)
    place = Place("sat", "isp")
    prefixes = [("10.9.0.0/16", place)]
    default = {**spec.default(), "mult_decrease": 80, "init_cwnd": 16}
    remote = {**spec.default(), "mult_decrease": 90, "loss_threshold": 10}

    def kernel_state() -> dict:
        with FusionNetlink() as nl:
            _, profiles, rules = nl.get_profiles()
        return {
            "sysctl": {p.name: read_sysctl(f"net.fusion.{p.name}") for p in spec.params},
            "rules": {r.prefix: profiles[r.profile_id] for r in rules},
        }

    def answer(default_theta: dict, theta: dict) -> pb.GetParametersResponse:
        return pb.GetParametersResponse(
            default_theta=pb.Theta(**default_theta),
            parameters=[pb.ContextParameters(theta=pb.Theta(**theta))],
        )

    applier.booster_answered()
    applier.apply(applier.plan_from(answer(default, remote), [place]), prefixes)
    installed = kernel_state()
    outside = {**default, "init_cwnd": 20, "mult_decrease": spec.param("mult_decrease").wide[1] + 5}
    applier.apply(applier.plan_from(answer(outside, outside), [place]), prefixes)
    after_refusal = kernel_state()

    def checked_until_fallen_back() -> bool:  # the agent's own check, until past staleness_s
        applier.check_staleness(prefixes)
        return applier.fell_back

    fell_back = until(checked_until_fallen_back, timeout_s=30 * applier.staleness_s)
    after_staleness = kernel_state()
    return {
        "default": default,
        "remote": remote,
        "safe": spec.default(),
        "installed": installed,
        "after_refusal": after_refusal,
        "after_staleness": after_staleness,
        "fell_back": fell_back,
        "refused": applier.metrics.registry.get_sample_value("gemini_agent_theta_refused_total"),
    }


BURST_PAUSE_S = 3.0  # the burst's sockets stay open this long, for several dumps to see them
EVENTS_WAIT_S = 30.0  # destroy events leave the kernel from a workqueue, late on a busy guest


def _gather(listener: Any, keep: Callable[[Any], bool], count: int) -> list:
    """Destroy events matching ``keep`` until ``count`` have come or EVENTS_WAIT_S has passed:
    the kernel broadcasts them from a workqueue, so a fixed sleep loses the last on a slow host."""
    got: list = []
    deadline = time.monotonic() + EVENTS_WAIT_S
    while len(got) < count and time.monotonic() < deadline:
        got += [f for f in listener.read() if keep(f)]
        time.sleep(POLL_S)
    return got + [f for f in listener.read() if keep(f)]


def exp_sockdiag(e: dict, out: Path) -> dict:
    """The agent's source for flows of other CCs (socket-diagnostics destroy events, completed
    from periodic dumps): a whole cubic flow's bytes against what the receiver got, and cubic
    connections closed abortively (which zeroes their counters) keeping their bytes."""
    import threading

    from gemini_agent.sockdiag import DestroyListener

    path, port = e["path"], BASE_PORT + 80
    stop = threading.Event()
    dumps: dict = {"count": 0, "sockets": 0, "error": None}
    with DestroyListener() as listener, DestroyListener() as raw:  # raw: never snapshotted

        def dump_often() -> None:
            while not stop.wait(0.3):
                try:
                    dumps["sockets"] = max(dumps["sockets"], listener.snapshots.refresh())
                    dumps["count"] += 1
                except Exception as exc:  # recorded: the test shows it
                    dumps["error"] = repr(exc)

        dumper = threading.Thread(target=dump_often, daemon=True)
        dumper.start()
        flow = run_flow(path, "cubic", e["duration_s"], port=port)
        whole = _gather(listener, lambda f: f.dport == port, len(flow["ports"]))
        server = _flowgen_receiver(path, "hold", port + 1)
        raw.read()  # what came before the burst
        sent = _flowgen_send("burst", path, port + 1, e["flows"], 2, "cubic", BURST_PAUSE_S)
        closed = _gather(listener, lambda f: f.dport == port + 1, sent["flows"])
        raw_zero = len(_gather(raw, lambda f: f.bytes_acked == 0 and f.dport == 0, sent["flows"]))
        stop.set()
        dumper.join()
        server.kill()
    data = max(whole, key=lambda f: f.bytes_acked) if whole else None
    return {
        "receiver_bytes": flow["bytes_received"],
        "data_flow": data.__dict__ if data else None,
        "burst_sent": sent["flows"],
        "burst_errors": sent["errors"],  # why a connection of the burst failed, by errno
        "burst_events": len(closed),
        "burst_with_bytes": sum(1 for f in closed if f.bytes_acked >= FLOW_BYTES),
        "burst_raw_events_zeroed": raw_zero,
        "burst_ccs": sorted({f.cc for f in closed}),
        "dumps": dumps,
    }


def _join_host_network() -> None:
    """Move qemu's user-mode NIC into the sender namespace: the host machine (Booster) is
    BOOSTER_FROM_GUEST."""
    # this process already lives in the sender namespace; the NIC is in PID 1's
    sh("nsenter", "-t", "1", "-n", "ip", "link", "set", "eth0", "netns", SENDER_NS)
    sh("ip", "addr", "add", "10.0.2.15/24", "dev", "eth0", ns=SENDER_NS)
    sh("ip", "link", "set", "eth0", "up", ns=SENDER_NS)


def _agent_metrics(port: int) -> dict[str, float]:
    from urllib.request import urlopen

    from prometheus_client.parser import text_string_to_metric_families

    text = urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def _agent_reading(agent: subprocess.Popen, port: int, name: str) -> float:
    """One of the running agent's metrics; infinite once the agent has exited (nothing more
    to wait for), zero while its metrics endpoint does not answer yet."""
    if agent.poll() is not None:
        return float("inf")
    try:
        return _agent_metrics(port).get(name, 0.0)
    except OSError:  # not listening yet
        return 0.0


def _flow_servers(paths: list[int]) -> list[subprocess.Popen]:
    """A ``gemini_lab.flowgen serve`` receiver for bulk flows in each path's namespace."""
    return [_flowgen_receiver(i, "serve", BASE_PORT) for i in paths]


def _bulk_flows(
    paths: list[int],
    flow_bytes: str,
    deadline: float,
    flows: int | None = None,
    stop: Path | None = None,
) -> dict[int, int]:
    """Back-to-back fusion flows of ``flow_bytes`` on each path, one at a time, until
    ``deadline`` (monotonic), ``flows`` flows per path, or until the file ``stop`` appears;
    returns flows completed per path. Paths do not wait for each other: a slow lossy flow must
    not starve the fast path of samples. (Two flows at a time fill the lossy path, and loss
    tolerance stops paying: see benchmarks/results/lab-loop.md.)"""
    done = dict.fromkeys(paths, 0)

    def loop(i: int) -> None:
        while (
            time.monotonic() < deadline
            and (flows is None or done[i] < flows)
            and not (stop and stop.exists())
        ):
            client = subprocess.Popen(
                python_in(
                    SENDER_NS,
                    "gemini_lab.bulk",
                    "put",
                    receiver_addr(i),
                    str(BASE_PORT),
                    "fusion",
                    flow_bytes,
                ),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                client.wait(timeout=60)
            except subprocess.TimeoutExpired:
                client.kill()
            done[i] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in paths]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done


def exp_landscape(e: dict, out: Path) -> dict:
    """Utility (eq. 9) of fixed θ on each path: where a search over the loop's region has
    something to find. Each θ is installed for all paths; flows of each path run back to back."""
    servers = _flow_servers(e["paths"])  # each listening when it returns
    sigma, spec = e["sigma"], load_spec()
    path_of = {receiver_addr(i): i for i in e["paths"]}
    with RecordCollector(out / "records-landscape.jsonl") as rc:
        ran = 0
        for theta in e["thetas"]:
            with FusionNetlink() as nl:
                nl.set_profiles(
                    {1: {**default_theta(), **theta}},
                    [Rule(receiver_prefix(i), 1) for i in e["paths"]],
                )
            done = _bulk_flows(
                e["paths"], e["flow_bytes"], time.monotonic() + e["max_s"], e["flows"]
            )
            ran += sum(done.values())
        rc.wait_for(lambda r: r["dst"] in path_of, ran)  # the last flows' records still closing
    for s in servers:
        s.terminate()
    cells: dict[tuple, list[float]] = {}
    for r in rc.records():
        path = path_of[r["dst"]]
        st = FlowStats(r["bytes_acked"], r["duration_us"], r["rtt_avg_us"], r["rtt_min_us"])
        if st.usable:
            cells.setdefault((spec.key(r["theta"]), path), []).append(
                st.throughput_mbps - sigma * st.queue_delay_ms
            )
    return {
        "cells": [
            {"theta": spec.from_key(k), "path": path, "utilities": u}
            for (k, path), u in sorted(cells.items())
        ]
    }


def exp_agent(e: dict, out: Path) -> dict:
    """The agent in the sender namespace, Booster on the host; bulk fusion flows to each path
    until the host writes {out}/stop (or the duration cap)."""
    _join_host_network()
    servers = _flow_servers(e["paths"])
    config = out / "agent.toml"
    config.write_text(e["agent_toml"].replace("{out}", str(out)))  # the share's path in here
    log = (out / "agent.log").open("w")
    agent = subprocess.Popen(
        python_in(SENDER_NS, "gemini_agent.cli", "run"),
        env={**os.environ, "GEMINI_AGENT_CONFIG": str(config)},
        stdout=log,
        stderr=log,
    )
    # flows start once the agent runs Booster's θ (or has exited: the result shows why)
    until(
        lambda: _agent_reading(agent, e["metrics_port"], "gemini_agent_theta_version") > 0,
        AGENT_UP_S,
    )
    flows = _bulk_flows(
        e["paths"], e["flow_bytes"], time.monotonic() + e["duration_s"], stop=out / "stop"
    )
    # the metrics are read once the agent has counted the last flows' records (sent when a
    # socket closes, after the client has exited); a flow that failed leaves none, hence a bound
    sent = sum(flows.values())
    flows_seen = "gemini_agent_flows_total{source=fusion}"
    until(lambda: _agent_reading(agent, e["metrics_port"], flows_seen) >= sent, AGENT_COUNTED_S)
    metrics = _agent_metrics(e["metrics_port"]) if agent.poll() is None else {}
    with FusionNetlink() as nl:
        version, profiles, rules = nl.get_profiles()
    agent.terminate()
    agent.wait(timeout=30)
    for s in servers:
        s.terminate()
    return {
        "flows": flows,
        "agent_rc": agent.returncode,
        "agent_metrics": metrics,
        "table": {
            "version": version,
            "profiles": profiles,
            "rules": [(r.prefix, r.profile_id) for r in rules],
        },
        "agent_log_tail": (out / "agent.log").read_text()[-3000:],
    }


def exp_fleet(e: dict, out: Path) -> dict:
    """Lab hosts, each its own namespace, agent and flows, with ``default_cc`` as their own CC;
    Booster on the host machine through a relay per host. Flows until {out}/stop; the host
    machine asks for kernel readings meanwhile (gemini_lab.fleet). After the agents exit (a
    clean exit restores a host), one more reading."""
    _join_host_network()
    allowed = " ".join(e["allowed_ccs"])  # the initial namespace's sysctl, for every namespace
    sh(
        "nsenter",
        "-t",
        "1",
        "-n",
        "sysctl",
        "-qw",
        f"net.ipv4.tcp_allowed_congestion_control={allowed}",
    )
    hosts = {h["id"]: add_lab_host(k, e["default_cc"]) for k, h in enumerate(e["hosts"])}
    relays = [
        start_relay(ns, e["relay_port"], (BOOSTER_FROM_GUEST, e["booster_port"]))
        for ns in hosts.values()
    ]
    servers = _flow_servers(sorted({p for h in e["hosts"] for p in h["paths"]}))
    prober = fleet.Prober(hosts, out)
    prober.start()
    agents = {}
    for h in e["hosts"]:
        config = out / f"agent-{h['id']}.toml"
        config.write_text(h["agent_toml"].replace("{out}", str(out)))
        agents[h["id"]] = fleet.start_agent(hosts[h["id"]], config, out / f"agent-{h['id']}.log")
    deadline = time.time() + e["duration_s"]
    flows: dict[str, list] = {}

    def send(h: dict) -> None:
        flows[h["id"]] = fleet.host_flows(
            hosts[h["id"]], h["paths"], e["flow_bytes"], deadline, out / "stop"
        )

    senders = [threading.Thread(target=send, args=(h,)) for h in e["hosts"]]
    for t in senders:
        t.start()
    for t in senders:
        t.join()
    for agent in agents.values():
        agent.terminate()
    for agent in agents.values():
        agent.wait(timeout=60)
    prober.stop()
    for r in relays:
        r.close()
    for s in servers:
        s.terminate()
    return {
        "flows": {h: fleet.flows_by_cc(f) for h, f in flows.items()},
        "flow_log": flows,
        "readings": prober.readings,
        "after_exit": {h: fleet.probe(ns) for h, ns in hosts.items()},
        "agent_rc": {h: a.returncode for h, a in agents.items()},
        "agent_log_tails": {h: (out / f"agent-{h}.log").read_text()[-3000:] for h in agents},
    }


EXPERIMENTS = {
    "flow": exp_flow,
    "path_check": exp_path_check,
    "profiles": exp_profiles,
    "rejects": exp_rejects,
    "cpu": exp_cpu,
    "records": exp_records,
    "agent": exp_agent,
    "landscape": exp_landscape,
    "writeback": exp_writeback,
    "sockdiag": exp_sockdiag,
    "fairness": exp_fairness,
    "fleet": exp_fleet,
    "cubic_check": exp_cubic_check,
    "ecn": exp_ecn,
    "incast": exp_incast,
    "datapath_flow": exp_datapath_flow,
    "datapath_load": exp_datapath_load,
    "datapath_pair": exp_datapath_pair,
    "datapath_incast": exp_datapath_incast,
    "gear_flow": exp_gear_flow,
    "gear_pair": exp_gear_pair,
    "shortflows": lambda e, out: exp_shortflows(e, out, SCHEDULES),
    "websearch": exp_websearch,
    "convergence": exp_convergence,
}


def _unload() -> dict:
    """rmmod tcp_fusion, again while the sockets that used it are still closing (each holds
    the module) until RMMOD_S has passed: the last attempt's outcome."""
    tries: list[subprocess.CompletedProcess] = []

    def unloaded() -> bool:
        tries.append(subprocess.run(["rmmod", "tcp_fusion"], capture_output=True, text=True))
        return tries[-1].returncode == 0

    until(unloaded, RMMOD_S)
    return {"rc": tries[-1].returncode, "err": tries[-1].stderr.strip(), "tries": len(tries)}


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    results_path = Path(sys.argv[2])
    out = results_path.parent
    results: dict = {"kernel": os.uname().release, "experiments": {}}
    module = plan.get("module", str(MODULE))  # the host names the build for this kernel
    load = subprocess.run(["insmod", module], capture_output=True, text=True)
    results["insmod"] = {"rc": load.returncode, "err": load.stderr.strip()}
    if load.returncode == 0:
        topo = Topology([Scenario(**p) for p in plan["paths"]])
        topo.build()
        schedules = topo.start_schedules()
        SCHEDULES.update({s.path: s for s in schedules})
        enter_netns(SENDER_NS)
        for e in plan["experiments"]:
            t0 = time.monotonic()
            try:
                res = EXPERIMENTS[e["kind"]](e, out)
            except Exception:
                res = {"error": traceback.format_exc()}
            res["elapsed_s"] = round(time.monotonic() - t0, 1)
            results["experiments"][e["label"]] = res
            results_path.write_text(json.dumps(results, indent=1))
        for s in schedules:
            s.stop()
        with FusionNetlink() as nl:
            results["stats"] = nl.stats()
        results["rmmod"] = _unload()
    results_path.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
