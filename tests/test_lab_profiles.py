"""The module's destination table in a real kernel: longest-prefix match, and the agent facing
the module's limits.

One qemu boot of Debian's stock kernel (the lab's, gemini_lab.vm) runs this file's guest half
(`python -m tests.test_lab_profiles GUEST OUT MODULE`): it loads tcp_fusion, installs tables
over netlink, opens real fusion connections to addresses on the guest's loopback device and
reads which profile each flow got from the module's own flow records. The host half asserts on
what the guest wrote:
  - more-specific beats less-specific, in IPv4 and IPv6, whatever the order the rules came in;
    an IPv4-mapped peer of an IPv6 socket matches IPv4 rules; no match runs the default;
  - a table of FUSION_MAX_RULES random prefixes agrees with a brute-force match;
  - a prefix given twice is refused and the installed table kept;
  - the agent, told the module takes more rules than it does, has its table refused by the
    module itself and falls back to the catch-all default (counted), then, with the module's
    real limits, installs what fits and leaves the rest on the catch-all.
Needs what tests/test_lab_fusion.py needs (qemu-system-x86_64, Debian's linux-image-amd64 and
linux-headers-amd64, busybox-static); without it the tests skip and say what is missing.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PORT = 5301
FLOW_BYTES = 64 * 1024
RECORD_WAIT_S = 60.0  # an upper bound: the wait ends when every record is in
FULL_TABLE_PROBES = 40
ANY = ("0.0.0.0/0", "::/0")

# Nested prefixes, sent least specific in the middle: the order of rules must not matter.
NESTED_RULES = [
    ("10.20.1.128/25", 3),
    ("10.20.0.0/16", 1),
    ("10.20.1.0/24", 2),
    ("2001:db8:1::/48", 2),
    ("2001:db8::/32", 1),
    ("2001:db8:1:8000::/49", 3),
]
# destination → the profile id its flow must run (0: the default, no rule matches)
NESTED_EXPECTED = {
    "10.20.5.5": 1,
    "10.20.1.5": 2,
    "10.20.1.200": 3,
    "10.99.0.1": 0,
    "2001:db8:5::1": 1,
    "2001:db8:1::1": 2,
    "2001:db8:1:8000::1": 3,
    "2001:db9::1": 0,
    "::ffff:10.20.1.6": 2,  # an IPv6 socket to an IPv4-mapped peer
}


# ---- guest half ----------------------------------------------------------------------------


def _sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True)


def _add_local(addr: str) -> None:
    ip = ipaddress.ip_address(addr)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.version == 4:
        _sh("ip", "addr", "add", f"{ip}/32", "dev", "lo")
    else:
        _sh("ip", "-6", "addr", "add", f"{ip}/128", "dev", "lo", "nodad")


@contextlib.contextmanager
def _serving() -> Iterator[None]:
    """A sink on PORT for the probes' flows, gone (port free) when the block ends.

    The accept thread is joined before the listener closes: a thread waiting in poll() holds a
    reference to the socket, so a listener closed under it stays bound until that poll returns,
    and the next part's bind could meet EADDRINUSE.
    """
    stop = threading.Event()
    srv = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    srv.bind(("::", PORT))
    srv.listen(128)
    srv.settimeout(0.2)

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            with conn:
                while conn.recv(65536):
                    pass

    acceptor = threading.Thread(target=loop, daemon=True)
    acceptor.start()
    try:
        yield
    finally:
        stop.set()
        acceptor.join()
        srv.close()


def _flows_to(dests: list[str]) -> dict[str, dict]:
    """One fusion flow to each destination; its record (profile id, θ) by destination."""
    from gemini_api.fusion_genl import FlowRecordListener

    listener = FlowRecordListener()
    got: dict[str, dict] = {}
    try:
        with _serving():
            for dst in dests:
                ip = ipaddress.ip_address(dst)
                family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
                with socket.socket(family, socket.SOCK_STREAM) as s:
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"fusion")
                    s.connect((dst, PORT))
                    s.sendall(b"x" * FLOW_BYTES)
            wanted = {_record_dst(d) for d in dests}
            deadline = time.monotonic() + RECORD_WAIT_S
            while wanted - set(got) and time.monotonic() < deadline:
                for rec in listener.receive():
                    got[rec.dst] = {"profile_id": rec.profile_id, "theta": rec.theta}
                time.sleep(0.05)
    finally:
        listener.close()
    return {d: got.get(_record_dst(d), {}) for d in dests}


def _record_dst(dst: str) -> str:
    ip = ipaddress.ip_address(dst)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def _thetas(n: int) -> dict[int, dict[str, int]]:
    from gemini_api.theta import load_spec

    default = load_spec().default()
    return {pid: default | {"mult_decrease": 20 + 8 * pid} for pid in range(1, n + 1)}


def _guest_nested() -> dict:
    from gemini_api.fusion_genl import FusionNetlink, Rule

    for dst in NESTED_EXPECTED:
        _add_local(dst)
    with FusionNetlink() as nl:
        nl.set_profiles(_thetas(3), [Rule(p, pid) for p, pid in NESTED_RULES])
    return _flows_to(list(NESTED_EXPECTED))


def _lpm(rules: list[tuple[ipaddress.IPv4Network, int]], addr: str) -> int:
    """The brute-force answer: every rule tried, the longest match wins (0: none)."""
    ip = ipaddress.ip_address(addr)
    best, best_len = 0, -1
    for net, pid in rules:
        if ip in net and net.prefixlen > best_len:
            best, best_len = pid, net.prefixlen
    return best


def _guest_full_table() -> dict:
    """FUSION_MAX_RULES random prefixes inside 10.64.0.0/10, probed at addresses chosen to
    fall inside some of them; the brute-force answer is worked out here too."""
    from gemini_api.fusion_genl import MAX_RULES, FusionNetlink, Rule

    rng = random.Random(13)
    base = int(ipaddress.ip_address("10.64.0.0"))
    rules: dict[str, int] = {}
    while len(rules) < MAX_RULES:
        length = rng.randint(12, 32)  # all inside 10.64.0.0/10
        start = (base + rng.getrandbits(22)) & ~((1 << (32 - length)) - 1)
        prefix = str(ipaddress.ip_network((start, length)))
        rules.setdefault(prefix, rng.randint(1, 8))
    table = list(rules.items())
    probes = []
    for prefix, _ in rng.sample(table, FULL_TABLE_PROBES):
        net = ipaddress.ip_network(prefix)
        probes.append(str(net.network_address + rng.randrange(net.num_addresses)))
    probes = sorted(set(probes))
    for dst in probes:
        _add_local(dst)
    with FusionNetlink() as nl:
        version = nl.set_profiles(_thetas(8), [Rule(p, pid) for p, pid in table])
        _, _, installed = nl.get_profiles()
    flows = _flows_to(probes)
    nets = [(ipaddress.IPv4Network(p), pid) for p, pid in table]
    return {
        "version": version,
        "rules_installed": len(installed),
        "probes": {d: {"got": flows[d].get("profile_id"), "want": _lpm(nets, d)} for d in probes},
    }


def _guest_duplicate() -> dict:
    from gemini_api.fusion_genl import FusionError, FusionNetlink, Rule

    with FusionNetlink() as nl:
        before = nl.get_profiles()
        try:
            nl.set_profiles(_thetas(2), [Rule("10.20.0.0/16", 1), Rule("10.20.0.0/16", 2)])
            refusal = None
        except FusionError as exc:
            refusal = str(exc)
        after = nl.get_profiles()
    return {"refusal": refusal, "kept": before == after}


def _guest_agent() -> dict:
    """The agent's write-back against the module's own limits."""
    from gemini_agent.context import Network, Place
    from gemini_agent.metrics import AgentMetrics
    from gemini_agent.table import Destinations, Limits
    from gemini_agent.writeback import Kernel, Plan, ThetaApplier
    from gemini_api.fusion_genl import MAX_RULES, FusionNetlink
    from gemini_api.theta import load_spec

    spec = load_spec()
    scattered, block = Place("far", "isp-s"), Place("near", "isp-b")
    first = int(ipaddress.ip_address("10.40.0.0"))
    # every other address: nothing merges, one rule each, more than the module takes
    networks = [Network(4, first + 2 * i, 32, scattered) for i in range(MAX_RULES + 1000)]
    near = int(ipaddress.ip_address("10.50.0.0"))
    networks += [Network(4, near + (i << 8), 24, block) for i in range(256)]  # one /16
    dest = Destinations(networks)
    tuned = {scattered: spec.default() | {"mult_decrease": 55}}
    tuned[block] = spec.default() | {"mult_decrease": 65}
    plan = Plan(spec.default() | {"mult_decrease": 75}, tuned)
    probes = ["10.40.0.2", "10.50.3.3"]
    for dst in probes:
        _add_local(dst)

    def state() -> dict:
        with FusionNetlink() as nl:
            _, profiles, rules = nl.get_profiles()
        return {
            "rules": len(rules),
            "catch_alls": {
                r.prefix: profiles[r.profile_id] for r in rules if r.prefix[-2:] == "/0"
            },
            "block_rule": [profiles[r.profile_id] for r in rules if r.prefix == "10.50.0.0/16"],
        }

    def sample(metrics: AgentMetrics, name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(name, labels)

    out: dict = {"plan_default": plan.default, "tuned": {p.region: t for p, t in tuned.items()}}
    # an agent that believes the module takes more rules than it does
    metrics = AgentMetrics()
    believer = ThetaApplier(Kernel(), metrics, 60.0, spec, Limits(max_rules=10 * MAX_RULES))
    believer.apply(plan, dest, [block, scattered])
    out["refused"] = {
        "state": state(),
        "tables_refused": sample(metrics, "gemini_agent_tables_refused_total"),
        "fallbacks": sample(metrics, "gemini_agent_fallbacks_total", reason="table_refused"),
        "on_catch_all": sample(metrics, "gemini_agent_contexts_on_catch_all", reason="refused"),
        "flows": _flows_to(probes),
    }
    metrics = AgentMetrics()
    agent = ThetaApplier(Kernel(), metrics, 60.0, spec)
    table = agent.apply(plan, dest, [block, scattered])
    out["within_limits"] = {
        "state": state(),
        "installed": sorted(p.region for p in table.installed),
        "tables_refused": sample(metrics, "gemini_agent_tables_refused_total"),
        "on_catch_all": sample(metrics, "gemini_agent_contexts_on_catch_all", reason="rules"),
        "flows": _flows_to(probes),
    }
    return out


GUEST_PARTS = {
    "nested": _guest_nested,
    "full_table": _guest_full_table,
    "duplicate": _guest_duplicate,
    "agent": _guest_agent,
}


def _unload(module: str, seconds: float = 30.0) -> dict:
    """rmmod, polled until a deadline: sockets the parts closed may still hold the module
    for a moment while they are torn down."""
    deadline = time.monotonic() + seconds
    while True:
        r = subprocess.run(["rmmod", module], capture_output=True, text=True)
        if r.returncode == 0 or time.monotonic() > deadline:
            return {"rc": r.returncode, "err": r.stderr.strip()}
        time.sleep(0.1)


def guest_main(out: Path, module: Path) -> None:
    results: dict = {"kernel": os.uname().release}
    load = subprocess.run(["insmod", str(module)], capture_output=True, text=True)
    results["insmod"] = {"rc": load.returncode, "err": load.stderr.strip()}
    if load.returncode == 0:
        for name, part in GUEST_PARTS.items():
            try:
                results[name] = part()
            except Exception:
                results[name] = {"error": traceback.format_exc()}
            (out / "results.json").write_text(json.dumps(results, indent=1))
        results["rmmod"] = _unload("tcp_fusion")
    (out / "results.json").write_text(json.dumps(results, indent=1))


# ---- host half -----------------------------------------------------------------------------

pytestmark = [pytest.mark.lab, pytest.mark.slow]


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> dict:
    from gemini_lab.host import kernel_problems, module_for
    from gemini_lab.vm import find_kernel, run_in_guest
    from tests.labkit import skip_if_lab_missing

    out = tmp_path_factory.mktemp("lab-profiles")
    with skip_if_lab_missing("no guest kernel"):
        kernel = find_kernel()
        module = module_for(kernel)
        run = run_in_guest(
            f'cd {REPO} && {sys.executable} -m tests.test_lab_profiles GUEST "$GEMINI_LAB_OUT" '
            f"{module}",
            out,
            kernel=kernel,
            timeout_s=1200,
        )
    path = out / "results.json"
    if not path.exists():
        log = (out / "job.log").read_text() if (out / "job.log").exists() else ""
        raise AssertionError(f"guest wrote no results (rc {run.returncode}):\n{log[-4000:]}")
    results = json.loads(path.read_text())
    results["kernel_problems"] = kernel_problems(run.dmesg + "\n" + run.console)
    return results


def _part(lab: dict, name: str) -> dict:
    assert lab["insmod"]["rc"] == 0, lab["insmod"]
    assert "error" not in lab[name], lab[name].get("error")
    return lab[name]


def test_more_specific_prefix_wins_in_ipv4_and_ipv6_and_no_match_runs_the_default(lab):
    flows = _part(lab, "nested")
    thetas = _thetas(3)
    for dst, want in NESTED_EXPECTED.items():
        assert flows[dst], f"no record for the flow to {dst}"
        assert flows[dst]["profile_id"] == want, (dst, flows[dst])
        if want:
            assert flows[dst]["theta"] == thetas[want], dst


def test_a_full_size_table_matches_like_a_brute_force_scan(lab):
    from gemini_api.fusion_genl import MAX_RULES

    full = _part(lab, "full_table")
    assert full["rules_installed"] == MAX_RULES
    assert len(full["probes"]) >= FULL_TABLE_PROBES // 2
    for dst, probe in full["probes"].items():
        assert probe["got"] == probe["want"], dst


def test_a_prefix_given_twice_is_refused_and_the_table_kept(lab):
    dup = _part(lab, "duplicate")
    assert dup["refusal"] is not None and "rule prefix given twice" in dup["refusal"]
    assert dup["kept"]


def test_the_agent_survives_a_table_the_module_refuses_and_then_stays_within_its_limits(lab):
    from gemini_api.fusion_genl import MAX_RULES

    agent = _part(lab, "agent")
    default, tuned = agent["plan_default"], agent["tuned"]
    refused = agent["refused"]
    assert refused["tables_refused"] == 1 and refused["fallbacks"] == 1
    assert refused["on_catch_all"] == 2
    catch_alls = refused["state"]["catch_alls"]
    assert refused["state"]["rules"] == 2 and sorted(catch_alls) == ["0.0.0.0/0", "::/0"]
    assert all(theta == default for theta in catch_alls.values())
    for flow in refused["flows"].values():
        assert flow["theta"] == default
    within = agent["within_limits"]
    assert within["tables_refused"] is not None and within["tables_refused"] == 0
    assert within["state"]["rules"] <= MAX_RULES
    assert within["installed"] == ["near"] and within["on_catch_all"] == 1
    assert within["state"]["block_rule"] == [tuned["near"]]
    assert within["flows"]["10.50.3.3"]["theta"] == tuned["near"]
    assert within["flows"]["10.40.0.2"]["theta"] == default  # "far" did not fit: catch-all


def test_the_kernel_logged_no_problem(lab):
    assert lab["kernel_problems"] == [], lab["kernel_problems"]
    assert lab["rmmod"]["rc"] == 0, lab["rmmod"]


if __name__ == "__main__" and sys.argv[1:2] == ["GUEST"]:
    guest_main(Path(sys.argv[2]), Path(sys.argv[3]))
