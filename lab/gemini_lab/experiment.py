"""Guest side: run real TCP flows over the lab's paths and measure them.

Flows are gemini_lab.bulk (blocking sockets; sender in the sender namespace, a one-shot
receiver per flow in the path's namespace). θ for the flows of a table datapath (Fusion,
GEMINI, DC-Vegas) is the sender namespace's default profile (its net.<name>.* sysctls) or a
destination profile installed over netlink. The module's own flow records are collected by a
listener started before the first flow.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from gemini_api.datapaths import DEFAULT_DATAPATH
from gemini_lab.netem import SENDER_NS, python_in, receiver_addr, receiver_ns, sh

BASE_PORT = 5201
FLOW_GRACE_S = 60
PROC_STAT_BUSY = (0, 1, 2, 5, 6, 7)  # user nice system irq softirq steal
CLK_TCK = 100


NOBODY = "65534"  # an unprivileged user: no capabilities at all
JOIN_RECORDS = "from gemini_api.fusion_genl import FlowRecordListener; FlowRecordListener()"


def unprivileged_record_listener() -> str:
    """Try to join the flow-record group as 'nobody' in the sender namespace: 'refused' (the
    kernel said EPERM), 'joined', or what else went wrong."""
    as_nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    python = [sys.executable, "-c", JOIN_RECORDS]
    done = subprocess.run(
        ["ip", "netns", "exec", SENDER_NS, *as_nobody, "--inh-caps=-all", *python],
        capture_output=True,
        text=True,
    )
    if done.returncode == 0:
        return "joined"
    if "Operation not permitted" in done.stderr or "PermissionError" in done.stderr:
        return "refused"
    last = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
    return f"failed: {last[0]}"


def set_default_theta(theta: dict[str, int], datapath: str = DEFAULT_DATAPATH) -> None:
    """The sender namespace's default profile of table datapath ``datapath``."""
    for name, value in theta.items():
        sh("sysctl", "-qw", f"net.{datapath}.{name}={value}", ns=SENDER_NS)


def read_sysctl(name: str, ns: str = SENDER_NS) -> int:
    return int(sh("sysctl", "-n", name, ns=ns).strip())


class RecordCollector:
    """`python -m gemini_lab.records` in the sender namespace, for the duration of a block: the
    records of table datapath ``datapath`` (Fusion's by default)."""

    def __init__(self, out: Path, datapath: str = DEFAULT_DATAPATH) -> None:
        self.out, self.datapath = out, datapath
        self.proc: subprocess.Popen | None = None
        self.summary: dict = {}

    def __enter__(self) -> RecordCollector:
        self.proc = subprocess.Popen(
            python_in(SENDER_NS, "gemini_lab.records", str(self.out), self.datapath),
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"record listener did not start: {line!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        """Stops the listener: a caller that needs the records of flows that just closed
        waits for them first (``wait_for``), as no fixed pause could on a busy host."""
        assert self.proc is not None and self.proc.stdout is not None
        self.proc.terminate()
        tail = self.proc.stdout.read().strip().splitlines()
        self.proc.wait(timeout=30)
        self.summary = json.loads(tail[-1]) if tail else {}

    def wait_for(self, keep: Callable[[dict], bool], count: int, timeout_s: float = 30.0) -> None:
        """Until ``count`` records matching ``keep`` are written (or ``timeout_s`` passes): a
        fixed wait would lose the last records of a burst on a busy host."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.out.read_text() if self.out.exists() else ""
            written = text[: text.rfind("\n") + 1].splitlines()  # not a line still being written
            if sum(1 for line in written if keep(json.loads(line))) >= count:
                return
            time.sleep(0.2)

    def records(self) -> list[dict]:
        if not self.out.exists():
            return []
        return [json.loads(line) for line in self.out.read_text().splitlines() if line]


def cpu_busy_seconds() -> float:
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    return sum(int(fields[i]) for i in PROC_STAT_BUSY) / CLK_TCK


def _bulk(ns: str, *args: object) -> subprocess.Popen:
    return subprocess.Popen(
        python_in(ns, "gemini_lab.bulk", *map(str, args)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def start_flow(
    path: int, cc: str, duration_s: float, *, port: int, parallel: int = 1, omit_s: int = 0
) -> tuple[subprocess.Popen, subprocess.Popen]:
    """A receiver in the path's namespace, then ``parallel`` connections from the sender."""
    server = _bulk(receiver_ns(path), "recv", port, parallel, omit_s, duration_s)
    assert server.stdout is not None
    ready = server.stdout.readline().strip()
    if ready != "ready":
        server.kill()
        err = server.stderr.read()[-500:] if server.stderr else ""
        raise RuntimeError(f"flow receiver did not start: {ready!r} {err}")
    client = _bulk(SENDER_NS, "send", receiver_addr(path), port, cc, parallel, duration_s)
    return server, client


def finish_flow(server: subprocess.Popen, client: subprocess.Popen, duration_s: float) -> dict:
    """The flow's figures; a flow that outlives its duration by a minute is killed and reported."""
    try:
        c_out, c_err = client.communicate(timeout=duration_s + FLOW_GRACE_S)
        s_out, s_err = server.communicate(timeout=FLOW_GRACE_S)
    except subprocess.TimeoutExpired as exc:
        client.kill()
        server.kill()
        raise RuntimeError(f"flow still running {FLOW_GRACE_S} s after its end") from exc
    if client.returncode != 0:
        raise RuntimeError(f"flow sender failed: {c_err.strip()[-500:] or c_out[-500:]}")
    if server.returncode != 0:
        raise RuntimeError(f"flow receiver failed: {s_err.strip()[-500:]}")
    return summarize(json.loads(c_out), json.loads(s_out))


def summarize(sender: dict, receiver: dict) -> dict:
    """Throughput as the receiver got it after the omitted start; RTT and retransmissions as
    the sender saw them; queueing delay = mean smoothed RTT − the kernel's minimum RTT."""
    return {
        "throughput_mbps": receiver["throughput_mbps"],
        "bytes_received": receiver["bytes_received"],
        "retransmits": sender["retransmits"],
        "mean_rtt_ms": sender["mean_rtt_us"] / 1000,
        "min_rtt_ms": sender["min_rtt_us"] / 1000,
        "queue_delay_ms": (sender["mean_rtt_us"] - sender["min_rtt_us"]) / 1000,
        "cwnd_end": sender["cwnd_end"],
        "window_series": sender["window_series"],
        "ports": sender["ports"],
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
