"""A FlashPass run in the lab guest: sender, switch and receiver namespaces, the switch port's
qdiscs, the receiver and one process per flow, and what each side and the qdiscs counted.

    fps0 (10.60.0.1) ──┐
    fps1 (10.60.1.1) ──┼── fpw (switch; its egress to fpr is the FlashPass port) ── fpr
    ...                ┘                                                   (10.61.0.2)

Each sender's own delay to the switch is a netem on its egress (the paper's one-way delay to
the bottleneck, mixed RTTs); the return delay is a netem on the receiver's egress (credits,
DONE, NACK and TCP's ACKs wait there), as the lab's other paths delay their ACKs. The same
topology carries TCP flows (``transport`` cubic or bbr: gemini_lab.bulk put to a
gemini_lab.flowgen receiver) for the comparison; their data meets the same shallow data queue.
``transport`` flashpass-star is FlashPass* (the paper's Aeolus-enhanced variant): each sender
adds the pre-credit phase (``--pre-credit``, gemini_lab.flashpass.sender) and the data queue
drops unscheduled data selectively (gemini_lab.flashpass.switch, ``selective_drop``).
Runs as root in the guest:
    python -m gemini_lab.flashpass.lab PLAN.json RESULT.json
PLAN: {"runs": [{"transport", "rate_kbit", "data_buffer_packets", "return_ms",
"sender_delays_ms": [...], "flows": [{"flow", "bytes", "sender", "start_ms"}], "theta"}]};
a TCP run may add ``data_ecn_k_packets`` (the data queue marks ECN from K packets on:
gemini_lab.flashpass.switch) and ``receiver_cc`` (the receiver's default CC, e.g. dctcp);
any run may add ``access_kbit`` (each sender's own link at that rate, its egress queue
``access_buffer_packets`` deep, the data queue's depth unless given; FlashPass's senders then
take it as their line rate: the pre-credit phase's pace and the emulation's maximum); a plan
without "runs" is one run of FlashPass. ``theta`` is written to the run's θ file
before its flows start; ``theta_file`` instead names a θ file in the output directory that
someone else writes (the agent, on the lab's host machine: tests/test_lab_flashpass_loop.py).
Either way each flow reads θ from the file at its start and appends its record to the flow
log beside it (gemini_lab.flashpass.sender).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gemini_lab.flashpass.switch import SwitchPort
from gemini_lab.netem import _veth, allow_cc, python_in, sh

SWITCH_NS, RECEIVER_NS = "fpw", "fpr"
RECEIVER_ADDR = "10.61.0.2"
PORT_DEV = "fpw-r"  # the switch's interface toward the receiver: the FlashPass port
TCP_PORT = 5201
FLASHPASS = "flashpass"
FLASHPASS_STAR = "flashpass-star"  # FlashPass*: the pre-credit phase and its selective drop
FLASHPASS_ARMS = (FLASHPASS, FLASHPASS_STAR)
READY_S = 120.0  # the receiver's interpreter starting under emulation
POLL_S = 0.05
RUN_S = 300.0  # every flow done or given up (senders give up after sender.GIVE_UP_S)


def sender_ns(i: int) -> str:
    return f"fps{i}"


@dataclass(frozen=True)
class Access:
    """Each sender's own link to the switch (the paper's hosts: 1 Gbit/s links into a
    10 Gbit/s WAN): ``kbit`` its rate, ``buffer_packets`` the packets its egress queue holds
    (those still in its delay included)."""

    kbit: int
    buffer_packets: int


def sender_egress(delay_ms: float, access: Access | None) -> list[str]:
    """The netem arguments of a sender's egress: its one-way delay, and with an access link
    that link's rate and queue; [] when it has neither."""
    if access is None:
        return ["delay", f"{delay_ms:g}ms", "limit", "100000"] if delay_ms else []
    return ["delay", f"{delay_ms:g}ms", "rate", f"{access.kbit}kbit",
            "limit", str(access.buffer_packets)]  # fmt: skip


def access_of(run: dict) -> Access | None:
    """The run's access link (``access_kbit``, ``access_buffer_packets``: the data queue's
    depth unless given), None without one (the senders' links then never limit)."""
    if not run.get("access_kbit"):
        return None
    depth = run.get("access_buffer_packets", run["data_buffer_packets"])
    return Access(int(run["access_kbit"]), int(depth))


def build(
    port: SwitchPort,
    return_ms: float,
    sender_delays_ms: list[float],
    access: Access | None = None,
) -> None:
    for ns in (SWITCH_NS, RECEIVER_NS, *map(sender_ns, range(len(sender_delays_ms)))):
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "set", "lo", "up", ns=ns)
    _veth(SWITCH_NS, PORT_DEV, "10.61.0.1", RECEIVER_NS, "fpr-w", RECEIVER_ADDR)
    sh("ip", "route", "add", "default", "via", "10.61.0.1", ns=RECEIVER_NS)
    for i, delay in enumerate(sender_delays_ms):
        ns = sender_ns(i)
        _veth(ns, "w", f"10.60.{i}.1", SWITCH_NS, f"fpw-s{i}", f"10.60.{i}.2")
        sh("ip", "route", "add", "default", "via", f"10.60.{i}.2", ns=ns)
        if egress := sender_egress(delay, access):
            sh("tc", "qdisc", "add", "dev", "w", "root", "netem", *egress, ns=ns)
    sh("sysctl", "-qw", "net.ipv4.ip_forward=1", ns=SWITCH_NS)
    for cmd in port.commands(PORT_DEV):
        sh(*cmd, ns=SWITCH_NS)
    sh("tc", "qdisc", "add", "dev", "fpr-w", "root", "netem", "delay", f"{return_ms:g}ms",
       "limit", "100000", ns=RECEIVER_NS)  # fmt: skip


def teardown(senders: int) -> None:
    for ns in (SWITCH_NS, RECEIVER_NS, *map(sender_ns, range(senders))):
        sh("ip", "netns", "del", ns, check=False)


def _until(done: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout_s:.0f} s")
        time.sleep(POLL_S)


def access_stats(senders: int) -> list[dict]:
    """Each sender's egress qdisc (its delay, and its access link when the run has one)."""
    return [
        json.loads(sh("tc", "-s", "-j", "qdisc", "show", "dev", "w", ns=sender_ns(i)))[0]
        for i in range(senders)
    ]


def port_stats() -> list[dict]:
    """The switch port's qdiscs as the kernel counts them (each class's leaf counts what the
    class sent and dropped)."""
    return json.loads(sh("tc", "-s", "-j", "qdisc", "show", "dev", PORT_DEV, ns=SWITCH_NS))


def _flow_command(run: dict, f: dict, out: Path, theta_file: Path | None) -> list[str]:
    ns = sender_ns(int(f.get("sender", 0)))
    if run.get("transport", FLASHPASS) not in FLASHPASS_ARMS:
        args = [RECEIVER_ADDR, str(TCP_PORT), run["transport"], str(f["bytes"])]
        return python_in(ns, "gemini_lab.bulk", "put", *args)
    args = [RECEIVER_ADDR, "--flow", str(f["flow"]), "--bytes", str(f["bytes"])]
    access = access_of(run)  # the sender's line rate: its own link's, else the bottleneck's
    args += [
        "--link-mbit",
        str((access.kbit if access else run["rate_kbit"]) / 1000),
        "--log",
        str(out / f"flow{f['flow']}.json"),
    ]
    args += ["--theta", str(theta_file)] if theta_file else []
    args += ["--pre-credit"] if run.get("transport") == FLASHPASS_STAR else []
    return python_in(ns, "gemini_lab.flashpass.sender", *args)


def _load_datapath(run: dict) -> dict[str, int]:
    """A run on a datapath module (``datapath``: GEMINI): the module loaded from the plan's
    ``module`` build, its θ (``gemini_theta``) and ``module_extra`` written; what it reads back.
    The module's CC is the run's ``transport``."""
    from gemini_lab.datapath_guest import load_module, read_params, write_params

    name = run["datapath"]
    loaded = load_module(name)
    if loaded["rc"] != 0:
        raise RuntimeError(f"insmod {name}: {loaded['err']}")
    extra = run.get("module_extra", {})
    write_params(name, {**run.get("gemini_theta", {}), **extra})
    return read_params(name, tuple(extra))


def _start_receiver(run: dict, out: Path) -> subprocess.Popen:
    if run.get("transport", FLASHPASS) not in FLASHPASS_ARMS:
        allow_cc(run["transport"])
        if run.get("receiver_cc"):  # a listener's CC decides how it takes ECN and echoes CE
            allow_cc(run["receiver_cc"])
            cc = run["receiver_cc"]
            sh("sysctl", "-qw", f"net.ipv4.tcp_congestion_control={cc}", ns=RECEIVER_NS)
        cmd = python_in(RECEIVER_NS, "gemini_lab.flowgen", "serve", str(TCP_PORT))
        proc = subprocess.Popen(cmd)
        _until(lambda: f":{TCP_PORT}" in sh("ss", "-ltn", ns=RECEIVER_NS), READY_S, "tcp rcv")
        return proc
    rlog = out / "receiver.json"
    proc = subprocess.Popen(
        python_in(RECEIVER_NS, "gemini_lab.flashpass.receiver", "--log", str(rlog))
    )
    _until(rlog.with_suffix(".ready").exists, READY_S, "the receiver listening")
    return proc


class _Completions:
    """Each flow's completion time: from its start to its own process's exit, taken by a
    thread per process that waits from the flow's start, blocked in waitpid(2) (waiting for
    the processes in turn would give a flow that ends before an earlier-started one that
    one's end; Popen.wait with a timeout polls, at intervals growing to 50 ms)."""

    def __init__(self) -> None:
        self.fcts: list[float] = []
        self.procs: list[subprocess.Popen] = []
        self.waiters: list[threading.Thread] = []

    def add(self, proc: subprocess.Popen, began: float) -> None:
        i = len(self.fcts)
        self.fcts.append(0.0)
        self.procs.append(proc)

        def wait() -> None:
            proc.wait()
            self.fcts[i] = time.monotonic() - began

        self.waiters.append(threading.Thread(target=wait, daemon=True))
        self.waiters[-1].start()

    def wait(self, timeout_s: float = RUN_S) -> list[float]:
        """The completion times once every flow has ended; TimeoutExpired (every flow
        still running killed) when some has not ended ``timeout_s`` after the last start."""
        deadline = time.monotonic() + timeout_s
        for w in self.waiters:
            w.join(max(0.0, deadline - time.monotonic()))
        late = [p for p, w in zip(self.procs, self.waiters, strict=True) if w.is_alive()]
        for p in late:
            p.kill()
        if late:
            raise subprocess.TimeoutExpired(late[0].args, timeout_s)
        return self.fcts


def run_one(run: dict, out: Path) -> dict:
    """One run: the topology built, every flow started at its offset, waited for, counted."""
    out.mkdir(parents=True, exist_ok=True)
    delays = [float(d) for d in run.get("sender_delays_ms", [0])]
    k = run.get("data_ecn_k_packets")  # a marking data queue (the DCTCP arm), else a bfifo
    star = run.get("transport") == FLASHPASS_STAR  # unscheduled data dropped above 2 packets
    port = SwitchPort(int(run["rate_kbit"]), int(run["data_buffer_packets"]), 0, k, star)
    access = access_of(run)
    build(port, float(run.get("return_ms", run.get("rtt_ms", 0))), delays, access)
    theta_file = None
    if run.get("theta_file"):  # written by an agent, beside the plan (the output directory)
        theta_file = out / run["theta_file"]
    elif run.get("theta") is not None:
        theta_file = out / "flashpass.toml"
        theta_file.write_text("".join(f"{k} = {v}\n" for k, v in run["theta"].items()))
    params = _load_datapath(run) if run.get("datapath") else None
    receiver = _start_receiver(run, out)
    flows = sorted(run["flows"], key=lambda f: f.get("start_ms", 0))
    start = time.monotonic()
    done = _Completions()
    for f in flows:
        time.sleep(max(0.0, start + f.get("start_ms", 0) / 1000 - time.monotonic()))
        cmd = _flow_command(run, f, out, theta_file)
        done.add(subprocess.Popen(cmd, stdout=subprocess.DEVNULL), time.monotonic())
    fcts = done.wait()
    makespan = time.monotonic() - start
    receiver.send_signal(signal.SIGTERM)
    receiver.wait(timeout=READY_S)
    result = {
        "transport": run.get("transport", FLASHPASS),
        "qdiscs": port_stats(),
        "fct_s": fcts,
        "flow_ids": [f["flow"] for f in flows],  # fct_s's order (the flows by start)
        "makespan_s": makespan,
        "sender_rc": [p.returncode for p in done.procs],
    }
    if access is not None:
        result["access_qdiscs"] = access_stats(len(delays))
    if params is not None:
        result["module_params"] = params
    if result["transport"] in FLASHPASS_ARMS:
        result["receiver"] = json.loads((out / "receiver.json").read_text())
        result["senders"] = [json.loads((out / f"flow{f['flow']}.json").read_text()) for f in flows]
    teardown(len(delays))
    return result


def main() -> None:
    plan_path, result_path = Path(sys.argv[1]), Path(sys.argv[2])
    plan = json.loads(plan_path.read_text())
    out = result_path.parent
    if "runs" not in plan:
        result_path.write_text(json.dumps(run_one(plan, out)))
        return
    results = []
    for i, run in enumerate(plan["runs"]):
        try:
            results.append(run_one(run, out / f"run{i}"))
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            teardown(len(run.get("sender_delays_ms", [0])))
            results.append({"transport": run.get("transport"), "error": str(exc)})
        result_path.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
