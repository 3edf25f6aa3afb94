"""A FlashPass run in the lab guest: sender, switch and receiver namespaces, the switch port's
qdiscs, the receiver and one sender process per flow, and what each side and the qdiscs
counted.

    fps (10.60.0.1) ── fpw (switch; its egress to fpr is the FlashPass port) ── fpr (10.61.0.2)

The round trip's delay is a netem on the receiver's egress (credits, DONE and NACK wait
there), as the lab's other paths delay their ACKs. Runs as root in the guest:
    python -m gemini_lab.flashpass.lab PLAN.json RESULT.json
with PLAN {"rate_kbit", "data_buffer_packets", "rtt_ms", "flows": [{"flow", "bytes"}],
"theta": {units} or absent}.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from gemini_lab.flashpass.switch import SwitchPort
from gemini_lab.netem import _veth, python_in, sh

SENDER_NS, SWITCH_NS, RECEIVER_NS = "fps", "fpw", "fpr"
RECEIVER_ADDR = "10.61.0.2"
PORT_DEV = "fpw-r"  # the switch's interface toward the receiver: the FlashPass port
READY_S = 120.0  # the receiver's interpreter starting under emulation
POLL_S = 0.05
RUN_S = 300.0  # every flow done or given up (senders give up after sender.GIVE_UP_S)


def build(port: SwitchPort, rtt_ms: float) -> None:
    for ns in (SENDER_NS, SWITCH_NS, RECEIVER_NS):
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "set", "lo", "up", ns=ns)
    _veth(SENDER_NS, "fps-w", "10.60.0.1", SWITCH_NS, "fpw-s", "10.60.0.2")
    _veth(SWITCH_NS, PORT_DEV, "10.61.0.1", RECEIVER_NS, "fpr-w", RECEIVER_ADDR)
    sh("ip", "route", "add", "default", "via", "10.60.0.2", ns=SENDER_NS)
    sh("ip", "route", "add", "default", "via", "10.61.0.1", ns=RECEIVER_NS)
    sh("sysctl", "-qw", "net.ipv4.ip_forward=1", ns=SWITCH_NS)
    for cmd in port.commands(PORT_DEV):
        sh(*cmd, ns=SWITCH_NS)
    sh("tc", "qdisc", "add", "dev", "fpr-w", "root", "netem", "delay", f"{rtt_ms:g}ms",
       "limit", "100000", ns=RECEIVER_NS)  # fmt: skip


def _until(done: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout_s:.0f} s")
        time.sleep(POLL_S)


def port_stats() -> dict:
    """The switch port's qdiscs as the kernel counts them (each class's leaf counts what the
    class sent and dropped)."""
    return json.loads(sh("tc", "-s", "-j", "qdisc", "show", "dev", PORT_DEV, ns=SWITCH_NS))


def run(plan: dict, out: Path) -> dict:
    port = SwitchPort(int(plan["rate_kbit"]), int(plan["data_buffer_packets"]))
    build(port, float(plan["rtt_ms"]))
    theta_file = None
    if plan.get("theta") is not None:
        theta_file = out / "flashpass.toml"
        theta_file.write_text("".join(f"{k} = {v}\n" for k, v in plan["theta"].items()))
    rlog = out / "receiver.json"
    receiver = subprocess.Popen(
        python_in(RECEIVER_NS, "gemini_lab.flashpass.receiver", "--log", str(rlog))
    )
    _until(rlog.with_suffix(".ready").exists, READY_S, "the receiver listening")
    senders = []
    for f in plan["flows"]:
        args = [RECEIVER_ADDR, "--flow", str(f["flow"]), "--bytes", str(f["bytes"])]
        log = out / f"flow{f['flow']}.json"
        args += ["--link-mbit", str(port.rate_kbit / 1000), "--log", str(log)]
        args += ["--theta", str(theta_file)] if theta_file else []
        senders.append(subprocess.Popen(python_in(SENDER_NS, "gemini_lab.flashpass.sender", *args)))
    for s in senders:
        s.wait(timeout=RUN_S)
    receiver.send_signal(signal.SIGTERM)
    receiver.wait(timeout=READY_S)
    return {
        "qdiscs": port_stats(),
        "receiver": json.loads(rlog.read_text()),
        "senders": [json.loads((out / f"flow{f['flow']}.json").read_text()) for f in plan["flows"]],
        "sender_rc": [s.returncode for s in senders],
    }


def main() -> None:
    plan_path, result_path = Path(sys.argv[1]), Path(sys.argv[2])
    result = run(json.loads(plan_path.read_text()), result_path.parent)
    result_path.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
