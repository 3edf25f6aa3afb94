"""The agent applies an experiment's arm to the real kernel, in a fresh network namespace
(``unshare -n``: the CC sysctl and the routes are per namespace, so the host's own are never
touched): host-wide through net.ipv4.tcp_congestion_control, per route through congctl; read
back from the sysctl, from ``ip route``, and from real TCP connections (``ss -ti``) over a veth
pair into a second namespace; a crossover switches, a stop restores, a CC the kernel does not
offer is refused with nothing changed.

Each test runs in a forked worker that entered its own namespace (its assertions travel back
as exceptions); this kernel has reno, bbr and cubic built in.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import pytest

from gemini_agent.congestion import ArmApplier, NetKernel, RouteLine
from gemini_agent.metrics import AgentMetrics
from gemini_api.v1 import booster_pb2 as pb

HERE, PEER = "10.77.0.1", "10.77.0.2"
SUBNET = "10.77.0.0/24"
PORT = 5001
CCS = ("reno", "bbr", "cubic")
CLONE_NEWNET = 0x40000000

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or os.geteuid() != 0, reason="needs root on Linux (unshare -n)"
)

# The far end, in a namespace of its own: configure the veth end the test moves in, then accept
# connections and hold them open until stdin closes.
PEER_SCRIPT = f"""
import socket, subprocess, sys, time
sys.stdin.readline()
for cmd in (["ip", "link", "set", "lo", "up"], ["ip", "addr", "add", "{PEER}/24", "dev", "v1"],
            ["ip", "link", "set", "v1", "up"]):
    subprocess.run(cmd, check=True)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("{PEER}", {PORT}))
s.listen(16)
print("ready", flush=True)
s.settimeout(0.2)
held = []
while True:
    try:
        held.append(s.accept()[0])
    except TimeoutError:
        pass
    import select
    if select.select([sys.stdin], [], [], 0)[0]:
        break
"""


def _enter_netns() -> None:
    if ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNET) != 0:  # os.unshare: 3.12+
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)


def in_netns(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a forked process inside a new network namespace; its result or error."""
    with ProcessPoolExecutor(1, mp_context=get_context("fork"), initializer=_enter_netns) as pool:
        return pool.submit(fn).result(timeout=120)


def arm(cc: str, name: str = "a", prefixes: tuple[str, ...] = ()) -> pb.ExperimentArm:
    return pb.ExperimentArm(
        experiment="exp",
        arm=name,
        cc=cc,
        params=pb.ExperimentArm.KERNEL_DEFAULT,
        destination_prefixes=list(prefixes),
    )


def sysctl_cc() -> str:
    with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
        return f.read().strip()


def route_congctl(prefix: str) -> str | None:
    out = subprocess.run(
        ["ip", "-o", "route", "show", "exact", prefix], capture_output=True, text=True, check=True
    ).stdout
    if not out.strip():
        return "absent"
    return RouteLine.parse(4, out).congctl()


class Peer:
    """A second namespace at the end of a veth pair (v0 here, v1 there)."""

    def __enter__(self) -> Peer:
        self.proc = subprocess.Popen(
            ["unshare", "-n", sys.executable, "-c", PEER_SCRIPT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        # the link is moved into the child's namespace by pid: wait until it has unshared
        ours, deadline = os.readlink("/proc/self/ns/net"), time.monotonic() + 30
        while os.readlink(f"/proc/{self.proc.pid}/ns/net") == ours:
            assert time.monotonic() < deadline, "the peer never left this namespace"
            time.sleep(0.01)
        run = lambda *a: subprocess.run(["ip", *a], check=True)  # noqa: E731
        run("link", "add", "v0", "type", "veth", "peer", "name", "v1")
        run("link", "set", "v1", "netns", str(self.proc.pid))
        run("addr", "add", f"{HERE}/24", "dev", "v0")
        run("link", "set", "v0", "up")
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ready"
        self.held: list[socket.socket] = []
        return self

    def connection_cc(self) -> str:
        """Open a TCP connection to the peer and read its CC from the kernel (ss -ti)."""
        s = socket.create_connection((PEER, PORT), timeout=10)
        self.held.append(s)
        port = s.getsockname()[1]
        out = subprocess.run(
            ["ss", "-tin", "state", "established", "sport", f"= :{port}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        found = re.findall(r"^\s+(" + "|".join(CCS) + r")\s", out, re.M)
        assert len(found) == 1, out
        return found[0]

    def __exit__(self, *exc: object) -> None:
        for s in self.held:
            s.close()
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


def _host_wide_crossover_and_stop() -> None:
    metrics = AgentMetrics()
    applier = ArmApplier(NetKernel(), metrics)
    with Peer() as peer:
        subprocess.run(["sysctl", "-qw", "net.ipv4.tcp_congestion_control=bbr"], check=True)
        assert peer.connection_cc() == "bbr"
        assert applier.apply(arm("reno", "control"))
        assert sysctl_cc() == "reno" and peer.connection_cc() == "reno"
        assert applier.apply(arm("bbr", "treatment"))  # the crossover: this host's arm swaps
        assert sysctl_cc() == "bbr" and peer.connection_cc() == "bbr"
        assert applier.apply(arm("bbr", "treatment"))  # the same arm again writes nothing new
        assert applier.apply(arm("reno", "control"))  # and back
        assert metrics.arms_applied._value.get() == 3
        assert metrics.arm_active._value.get() == 1
        assert applier.apply(None)  # the experiment stopped
        assert sysctl_cc() == "bbr" and peer.connection_cc() == "bbr"
        assert metrics.arm_active._value.get() == 0


def test_host_wide_arm_switches_at_crossover_and_stop_restores() -> None:
    in_netns(_host_wide_crossover_and_stop)


def _per_route_and_restore() -> None:
    applier = ArmApplier(NetKernel(), AgentMetrics())
    with Peer() as peer:
        subprocess.run(["sysctl", "-qw", "net.ipv4.tcp_congestion_control=reno"], check=True)
        # The connected route exists (its congctl is set); the /32 does not (it is added).
        assert applier.apply(arm("bbr", prefixes=(SUBNET,)))
        assert route_congctl(SUBNET) == "bbr" and sysctl_cc() == "reno"
        assert peer.connection_cc() == "bbr"
        assert applier.apply(arm("cubic", "b", prefixes=(f"{PEER}/32",)))
        assert route_congctl(SUBNET) is None  # the first arm's route is as it was
        assert route_congctl(f"{PEER}/32") == "cubic"
        assert peer.connection_cc() == "cubic"
        applier.restore()  # the agent exits cleanly
        assert route_congctl(f"{PEER}/32") == "absent" and route_congctl(SUBNET) is None
        assert peer.connection_cc() == "reno"


def test_per_route_arm_sets_congctl_and_restores_the_routes() -> None:
    in_netns(_per_route_and_restore)


def _refused(cc: str, reason: str) -> None:
    """``cc`` is refused for ``reason`` and the namespace's CC stays what it was."""
    metrics = AgentMetrics()
    applier = ArmApplier(NetKernel(), metrics)
    before = sysctl_cc()
    assert not applier.apply(arm(cc))
    assert sysctl_cc() == before
    assert metrics.registry.get_sample_value(
        "gemini_agent_experiment_arm_failures_total", {"reason": reason}
    )
    assert metrics.arm_active._value.get() == 0


def test_a_cc_the_kernel_does_not_offer_is_refused_and_nothing_changes() -> None:
    in_netns(functools.partial(_refused, "vegas", "unavailable_cc"))


def _not_allowed_in_this_namespace() -> None:
    with open("/proc/sys/net/ipv4/tcp_allowed_congestion_control") as f:
        allowed = f.read().split()
    _refused(next(cc for cc in CCS if cc not in allowed), "not_allowed")


def test_a_cc_not_allowed_in_a_network_namespace_is_refused_and_nothing_changes() -> None:
    """Outside the host's namespace the kernel takes only the CCs the host allowed (EPERM)."""
    with open("/proc/sys/net/ipv4/tcp_allowed_congestion_control") as f:
        if set(CCS) <= set(f.read().split()):
            pytest.skip("the host allows every built-in CC in namespaces")
    in_netns(_not_allowed_in_this_namespace)


def _half_applied_is_undone() -> None:
    metrics = AgentMetrics()
    applier = ArmApplier(NetKernel(), metrics)
    subprocess.run(["ip", "addr", "add", f"{HERE}/24", "dev", "lo"], check=True)
    subprocess.run(["ip", "route", "add", "10.88.0.0/24", "dev", "lo"], check=True)
    # The second prefix has no route covering it (no default route here): the first, already
    # set, must be undone.
    assert not applier.apply(arm("bbr", prefixes=("10.88.0.0/24", "192.0.2.0/24")))
    assert route_congctl("10.88.0.0/24") is None
    assert route_congctl("192.0.2.0/24") == "absent"
    assert metrics.registry.get_sample_value(
        "gemini_agent_experiment_arm_failures_total", {"reason": "kernel_error"}
    )


def test_a_failure_half_way_undoes_what_was_applied() -> None:
    in_netns(_half_applied_is_undone)


def test_route_lines_round_trip_through_ip_route_words() -> None:
    line = "10.0.0.0/24 dev eth0 proto kernel scope link src 10.0.0.1 linkdown congctl lock bbr"
    r = RouteLine.parse(4, line)
    assert r.congctl() == "bbr" and "linkdown" not in r.words
    assert r.without_congctl().words == tuple(
        ["10.0.0.0/24", "dev", "eth0", "proto", "kernel", "scope", "link", "src", "10.0.0.1"]
    )
    d = RouteLine.parse(4, "default via 10.0.0.254 dev eth0 metric 100")
    assert d.prefix_length() == 0
    assert d.with_dst("192.0.2.0/24").with_congctl("cubic").words == tuple(
        ["192.0.2.0/24", "via", "10.0.0.254", "dev", "eth0", "metric", "100", "congctl", "cubic"]
    )
    u = RouteLine.parse(4, "unreachable 198.51.100.0/24 metric 5")
    assert u.with_dst("198.51.100.7/32").words[:2] == ("unreachable", "198.51.100.7/32")


def _recovers_after_a_crash(journal: str) -> None:
    path = Path(journal)
    subprocess.run(["ip", "route", "add", "10.88.0.0/16", "dev", "lo"], check=True)
    before = sysctl_cc()
    for crashing in (arm("reno"), arm("cubic", "b", prefixes=("10.88.1.0/24", "10.88.0.0/16"))):
        crashed = ArmApplier(NetKernel(), AgentMetrics(), path)
        assert crashed.apply(crashing) and path.exists()
        assert sysctl_cc() != before or route_congctl("10.88.1.0/24") == "cubic"
        # The agent dies here, without restoring; the next run reads the journal.
        again = ArmApplier(NetKernel(), AgentMetrics(), path)
        again.recover()
        assert sysctl_cc() == before and not path.exists()
        assert route_congctl("10.88.1.0/24") == "absent" and route_congctl("10.88.0.0/16") is None
        again.recover()  # nothing left to do
        assert sysctl_cc() == before


def test_an_agent_that_died_with_an_arm_applied_restores_the_host_when_it_starts(
    tmp_path,
) -> None:
    in_netns(functools.partial(_recovers_after_a_crash, str(tmp_path / "arm.json")))
