"""Guest side: lab hosts as a small fleet, each a network namespace with its own agent.

An experiment across hosts needs hosts that each run their own congestion control: every lab
host (``netem.add_lab_host``) has its own ``net.ipv4.tcp_congestion_control`` and routes (both
per namespace), its own Fusion profile table (tcp_fusion keeps θ per namespace), its own agent
with its own identity and token, and sends its own flows. The flows ask for no CC: the kernel
gives each the one the host runs (the route's ``congctl``, else the namespace's sysctl), which
is what an agent applying an experiment's arm changes.

What the kernel runs is read from the kernel, never from the agent: the namespace's sysctl, the
``congctl`` of its routes, the CC that ``ss -ti`` shows for its live connections, and the CC each
finished flow's socket reported (``TCP_CONGESTION``), with when the flow ran. The host machine
asks for a reading by writing ``probe-<label>`` into the shared directory; the reading lands
under that label with the guest's time, so the host decides when (mid-day, after a stop) and
can place the flows on the experiment's days by the readings' guest times, without trusting
the two clocks to agree.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from gemini_lab.bulk import HOST_CC
from gemini_lab.cubic_guest import cubic_params, loaded_module_params, loaded_tables
from gemini_lab.experiment import BASE_PORT
from gemini_lab.netem import python_in, receiver_addr, sh

PROBE_PREFIX = "probe-"
PROBE_POLL_S = 0.5
# The CC name that `ss -ti` prints first on a connection's info line (e.g. "cubic wscale:…").
SS_CC_FIELD = 0


def parse_ss_ccs(text: str, skip_peer: str = "127.0.0.1") -> list[str]:
    """The CC of each connection in ``ss -tin`` output (``-n``: numeric), but those whose peer
    is ``skip_peer`` (the agent's own connection to Booster, through the relay)."""
    out: list[str] = []
    peer = None
    for line in text.splitlines():
        if not line.strip() or line.startswith("State") or line.startswith("Recv-Q"):
            continue
        if not line[0].isspace():  # a connection: Recv-Q Send-Q Local Peer (state filtered)
            words = line.split()
            # an IPv4 peer of a dual-stack socket (gRPC's) prints as [::ffff:127.0.0.1]:port
            peer = (
                words[-1].rsplit(":", 1)[0].strip("[]").removeprefix("::ffff:") if words else None
            )
            continue
        words = line.split()
        if peer is not None and peer != skip_peer and words:
            out.append(words[SS_CC_FIELD])
        peer = None
    return out


SEPARATOR = "@@"
# One process per reading (each costs seconds under emulation): the CC sysctl, the live
# connections with their CC, and the routes.
READING_SCRIPT = (
    f"cat /proc/sys/net/ipv4/tcp_congestion_control; echo {SEPARATOR}; "
    f"ss -tin state established; echo {SEPARATOR}; ip -o route show"
)


def probe(ns: str, requested: float | None = None) -> dict:
    """What the kernel runs in lab host ``ns`` now (``requested``: when it was asked for), with
    CUBIC's module parameters (the whole guest's: they are not per namespace)."""
    sysctl, ss, routes = sh("sh", "-c", READING_SCRIPT, ns=ns).split(SEPARATOR)
    return {
        "sysctl": sysctl.strip(),
        "cubic": cubic_params(),
        "module_params": loaded_module_params(),  # every loaded module_params datapath's
        "tables": loaded_tables(ns),  # the namespace's θ tables of GEMINI, DC-Vegas if loaded
        "connections": parse_ss_ccs(ss),
        "ss": ss.strip(),
        "congctl_routes": [r.strip() for r in routes.splitlines() if " congctl " in f" {r} "],
        "requested": requested,
        "t": time.time(),
    }


class Prober(threading.Thread):
    """Probes every lab host each time the host machine writes ``probe-<label>`` in ``out``."""

    def __init__(self, hosts: dict[str, str], out: Path) -> None:
        super().__init__(daemon=True)
        self.hosts, self.out = hosts, out  # host id → namespace
        self.readings: dict[str, dict[str, dict]] = {}
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(PROBE_POLL_S):
            for request in sorted(self.out.glob(f"{PROBE_PREFIX}*")):
                label = request.name.removeprefix(PROBE_PREFIX)
                if label in self.readings:
                    continue
                asked = time.time()
                self.readings[label] = {h: probe(ns, asked) for h, ns in self.hosts.items()}
                # written aside and renamed: the host never reads half a reading
                part = self.out / f".reading-{label}.part"
                part.write_text(json.dumps(self.readings[label]))
                part.replace(self.out / f"reading-{label}.json")

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=30)


def start_agent(ns: str, config: Path, log: Path) -> subprocess.Popen:
    """The agent of lab host ``ns`` (as root, in that namespace, with its own config)."""
    out = log.open("w")
    return subprocess.Popen(
        python_in(ns, "gemini_agent.cli", "run"),
        env={**os.environ, "GEMINI_AGENT_CONFIG": str(config)},
        stdout=out,
        stderr=out,
    )


def host_flows(ns: str, paths: list[int], flow_bytes: str, deadline: float, stop: Path) -> list:
    """Back-to-back flows from lab host ``ns`` on each of its paths (one at a time per path,
    one sender process per path) until ``deadline`` (unix time) or ``stop`` exists: each
    finished flow as [start (guest wall clock, s), end, the CC its socket ran, or "failed"]."""
    senders = [
        subprocess.Popen(
            [
                *("ip", "netns", "exec", ns, sys.executable, "-m", "gemini_lab.bulk", "puts"),
                *(receiver_addr(p), str(BASE_PORT), HOST_CC, flow_bytes, str(stop), str(deadline)),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for p in paths
    ]
    flows = []
    for sender in senders:
        out, _ = sender.communicate()
        flows += [json.loads(line) for line in out.splitlines() if line.startswith("[")]
    return sorted(flows)


def flows_by_cc(flows: list) -> dict[str, int]:
    out: dict[str, int] = {}
    for _, _, cc in flows:
        out[cc] = out.get(cc, 0) + 1
    return out
