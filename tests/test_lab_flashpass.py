"""FlashPass's lab prototype in User-Mode Linux (issue #36): real data between the lab's
namespaces through the emulated switch port's qdiscs, with its credit loop checked against
what the kernel counted.

Two flows of 300 kB start together on a 10 Mbit/s, 20 ms path with a 16-packet data buffer.
Each starts emulating at the full emulation rate, so together they overrun the emulation
queue: emulation packets are lost there (and only there), Algorithm 2 cuts each flow's rate,
and the credits that come back are exactly the emulation packets the port sent on. Each data
packet leaves at its credit's emulation timestamp + T_wait (on UML's simulated clock a
user-space timer fires on time). About 60 s of wall time on a busy host.
"""

from __future__ import annotations

import json
import sys

import pytest

from gemini_lab.flashpass import wire
from gemini_lab.flashpass.switch import DATA_QDISC, EMULATION_QDISC
from gemini_lab.uml import run_in_uml

FLOW_BYTES = 300_000
T_WAIT_UNITS = 400  # 40 ms (the spec's default), twice the path's RTT
ON_TIME_NS = 1_000_000  # a data packet leaves within 1 ms of its credit's time + T_wait
PLAN = {
    "rate_kbit": 10_000,
    "data_buffer_packets": 16,
    "rtt_ms": 20,
    "flows": [{"flow": 1, "bytes": FLOW_BYTES}, {"flow": 2, "bytes": FLOW_BYTES}],
    "theta": {"min_target_loss": 10, "max_target_loss": 100, "t_wait": T_WAIT_UNITS},
}


def _by_handle(items: list[dict], handle: str) -> dict:
    (item,) = [i for i in items if i["handle"] == handle]
    return item


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("flashpass")
    (out / "plan.json").write_text(json.dumps(PLAN))
    command = (
        "python3 -m gemini_lab.flashpass.lab "
        '"$GEMINI_LAB_OUT/plan.json" "$GEMINI_LAB_OUT/result.json"'
    )
    guest = run_in_uml(command.replace("python3", sys.executable), out, timeout_s=600)
    result = out / "result.json"
    assert result.exists(), f"guest rc {guest.returncode}:\n{guest.console[-3000:]}"
    return json.loads(result.read_text())


def test_the_data_moves_whole_between_the_namespaces(run: dict) -> None:
    assert run["sender_rc"] == [0, 0]
    for sender in run["senders"]:
        assert sender["finished"], sender["flow"]
        got = run["receiver"][str(sender["flow"])]
        assert got["received"] == got["total"] == sender["packets"]
        assert got["bytes"] >= FLOW_BYTES and got["corrupt"] == 0


def test_credits_are_the_emulation_packets_the_port_let_through(run: dict) -> None:
    red = _by_handle(run["qdiscs"], EMULATION_QDISC)
    passed = red["packets"]
    sent = sum(s["emulation_out"] for s in run["senders"])
    credits = sum(len(s["credits"]) for s in run["senders"])
    arrived = sum(f["emulation_in"] for f in run["receiver"].values())
    assert credits == arrived == passed  # every credit is a surviving emulation packet
    assert sent - passed == red["drops"] > 0  # the rest died in the emulation queue
    for s in run["senders"]:  # and Algorithm 2 answered the loss by cutting the rate
        max_rate = wire.max_emulation_pps(PLAN["rate_kbit"] * 1000)
        assert min(rate for _, rate in s["rates"]) < 0.9 * max_rate


def test_each_data_packet_leaves_at_its_emulation_time_plus_t_wait(run: dict) -> None:
    for s in run["senders"]:
        assert s["t_wait_ns"] == T_WAIT_UNITS * 100_000
        late = [sent - (emu_ts + s["t_wait_ns"]) for sent, emu_ts, _ in s["data_sends"]]
        assert len(late) >= s["packets"]
        assert min(late) >= 0 and max(late) <= ON_TIME_NS
        credited = {emu_ts for _, emu_ts, _ in s["credits"]}
        assert {emu_ts for _, emu_ts, _ in s["data_sends"]} <= credited


def test_the_data_queue_drops_nothing(run: dict) -> None:
    """The paper's headline: data paced by the emulation does not overflow a shallow buffer."""
    data = _by_handle(run["qdiscs"], DATA_QDISC)
    assert data["drops"] == 0
    assert sum(s["retransmits"] for s in run["senders"]) == 0
