"""Guest side: run real TCP flows over the lab's paths and measure them.

Flows are iperf3 (sender in the sender namespace, a one-shot server per flow in the path's
receiver namespace). θ for fusion flows is the sender namespace's default profile (sysctl) or a
destination profile installed over netlink. The module's own flow records are collected by a
listener started before the first flow.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from gemini_lab.netem import SENDER_NS, receiver_addr, receiver_ns, sh

BASE_PORT = 5201
FLOW_GRACE_S = 60
PROC_STAT_BUSY = (0, 1, 2, 5, 6, 7)  # user nice system irq softirq steal
CLK_TCK = 100


def set_default_theta(theta: dict[str, int]) -> None:
    for name, value in theta.items():
        sh("sysctl", "-qw", f"net.fusion.{name}={value}", ns=SENDER_NS)


def read_sysctl(name: str, ns: str = SENDER_NS) -> int:
    return int(sh("sysctl", "-n", name, ns=ns).strip())


class RecordCollector:
    """`python -m gemini_lab.records` in the sender namespace, for the duration of a block."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.proc: subprocess.Popen | None = None
        self.summary: dict = {}

    def __enter__(self) -> RecordCollector:
        self.proc = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                SENDER_NS,
                sys.executable,
                "-m",
                "gemini_lab.records",
                str(self.out),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"record listener did not start: {line!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        time.sleep(0.5)  # records of flows that just closed are still in flight
        self.proc.terminate()
        tail = self.proc.stdout.read().strip().splitlines()
        self.proc.wait(timeout=30)
        self.summary = json.loads(tail[-1]) if tail else {}

    def records(self) -> list[dict]:
        if not self.out.exists():
            return []
        return [json.loads(line) for line in self.out.read_text().splitlines() if line]


def cpu_busy_seconds() -> float:
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    return sum(int(fields[i]) for i in PROC_STAT_BUSY) / CLK_TCK


def start_flow(
    path: int, cc: str, duration_s: float, *, port: int, parallel: int = 1, omit_s: int = 0
) -> tuple[subprocess.Popen, subprocess.Popen]:
    server = subprocess.Popen(
        ["ip", "netns", "exec", receiver_ns(path), "iperf3", "-s", "-1", "-p", str(port), "-J"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.3)
    client = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            SENDER_NS,
            "iperf3",
            "-c",
            receiver_addr(path),
            "-p",
            str(port),
            "-t",
            str(duration_s),
            "-O",
            str(omit_s),
            "-P",
            str(parallel),
            "-C",
            cc,
            "-J",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return server, client


def finish_flow(server: subprocess.Popen, client: subprocess.Popen, duration_s: float) -> dict:
    """iperf3's results; a flow that outlives its duration by a minute is killed and reported."""
    try:
        c_out, c_err = client.communicate(timeout=duration_s + FLOW_GRACE_S)
        s_out, _ = server.communicate(timeout=FLOW_GRACE_S)
    except subprocess.TimeoutExpired as exc:
        client.kill()
        server.kill()
        raise RuntimeError(f"iperf3 flow still running {FLOW_GRACE_S} s after its end") from exc
    if client.returncode != 0:
        raise RuntimeError(f"iperf3 client failed: {c_err.strip() or c_out[-500:]}")
    return summarize(json.loads(c_out), json.loads(s_out))


def summarize(client: dict, server: dict) -> dict:
    """Throughput, RTT and retransmissions as the sender saw them; bytes as the receiver got."""
    end = client["end"]
    streams = [s["sender"] for s in end["streams"]]
    n = len(streams)
    mean_rtt = sum(s.get("mean_rtt", 0) for s in streams) / n
    min_rtt = min(s.get("min_rtt", 0) for s in streams)
    return {
        "throughput_mbps": end["sum_received"]["bits_per_second"] / 1e6,
        "bytes_received": server["end"]["sum_received"]["bytes"],
        "retransmits": end["sum_sent"].get("retransmits", 0),
        "mean_rtt_ms": mean_rtt / 1000,
        "min_rtt_ms": min_rtt / 1000,
        "queue_delay_ms": (mean_rtt - min_rtt) / 1000,
        "ports": sorted(c["local_port"] for c in client["start"]["connected"]),
    }


def run_flow(
    path: int,
    cc: str,
    duration_s: float,
    *,
    port: int = BASE_PORT,
    parallel: int = 1,
    omit_s: int = 0,
) -> dict:
    busy0, wall0 = cpu_busy_seconds(), time.monotonic()
    server, client = start_flow(path, cc, duration_s, port=port, parallel=parallel, omit_s=omit_s)
    ss = ""
    if cc == "fusion":
        time.sleep(min(3.0, duration_s / 2))
        ss = sh("ss", "-tin", "dst", receiver_addr(path), ns=SENDER_NS, check=False)
    result = finish_flow(server, client, duration_s)
    result["cpu_busy_s"] = cpu_busy_seconds() - busy0
    result["wall_s"] = time.monotonic() - wall0
    if ss:
        result["ss"] = ss
    return result
