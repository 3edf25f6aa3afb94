"""FlashPass* in User-Mode Linux (issue #36): the pre-credit phase of the paper's
Aeolus-enhanced variant, through the emulated switch port whose data queue drops unscheduled
data above 2 packets (gemini_lab.flashpass.switch, ``selective_drop``).

One 10 Mbit/s, 20 ms path with a 16-packet data buffer and T_wait = 40 ms. A 4-packet flow
starts alone: it goes whole in its pre-credit phase and finishes before T + T_wait. A 1 MB
flow starts at 100 ms; once its data runs on credits, a 60 kB flow starts at 500 ms and sends
its first round trip unscheduled at line rate into the 1 MB flow's scheduled data: the data
queue passes 2 packets and drops unscheduled packets only. The probe sent as the phase ends
finds them (the receiver NACKs the unscheduled packets missing); they are resent on credits,
at their emulation time + T_wait, and every byte arrives.
About 60 s of wall time on a busy host.
"""

from __future__ import annotations

import json
import sys

import pytest

from gemini_lab.flashpass.switch import DATA_QDISC
from gemini_lab.uml import run_in_uml

T_WAIT_UNITS = 400  # 40 ms (the spec's default), twice the path's RTT
T_WAIT_NS = T_WAIT_UNITS * 100_000
ON_TIME_NS = 1_000_000  # a data packet leaves within 1 ms of its credit's time + T_wait
SHORT, LONG, LATE = 1, 2, 3
PLAN = {
    "transport": "flashpass-star",
    "rate_kbit": 10_000,
    "data_buffer_packets": 16,
    "rtt_ms": 20,
    "flows": [
        {"flow": SHORT, "bytes": 5_000, "start_ms": 0},
        {"flow": LONG, "bytes": 1_000_000, "start_ms": 100},
        {"flow": LATE, "bytes": 60_000, "start_ms": 500},
    ],
    "theta": {"min_target_loss": 10, "max_target_loss": 100, "t_wait": T_WAIT_UNITS},
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("flashpass-star")
    (out / "plan.json").write_text(json.dumps(PLAN))
    command = (
        f"{sys.executable} -m gemini_lab.flashpass.lab "
        '"$GEMINI_LAB_OUT/plan.json" "$GEMINI_LAB_OUT/result.json"'
    )
    guest = run_in_uml(command, out, timeout_s=600)
    result = out / "result.json"
    assert result.exists(), f"guest rc {guest.returncode}:\n{guest.console[-3000:]}"
    return json.loads(result.read_text())


def _sender(run: dict, flow: int) -> dict:
    (s,) = [s for s in run["senders"] if s["flow"] == flow]
    return s


def test_every_byte_of_every_flow_arrives(run: dict) -> None:
    assert run["transport"] == "flashpass-star" and run["sender_rc"] == [0, 0, 0]
    for s in run["senders"]:
        got = run["receiver"][str(s["flow"])]
        assert s["finished"] and s["pre_credit"], s["flow"]
        assert got["received"] == got["total"] == s["packets"] and got["corrupt"] == 0


def test_a_short_flow_finishes_in_its_pre_credit_phase_before_t_plus_t_wait(run: dict) -> None:
    s = _sender(run, SHORT)
    assert [seq for _, seq in s["unscheduled_sends"]] == list(range(s["packets"]))
    assert s["data_sends"] == [] and s["retransmits"] == 0
    assert s["fct_s"] < T_WAIT_NS / 1e9  # DONE back before the first credit's data could leave
    assert run["receiver"][str(SHORT)]["unscheduled_in"] == s["packets"]


def test_the_data_queue_drops_only_unscheduled_packets(run: dict) -> None:
    (data,) = [q for q in run["qdiscs"] if q["handle"] == DATA_QDISC]
    assert data["kind"] == "red"
    sent = sum(len(s["unscheduled_sends"]) for s in run["senders"])
    arrived = sum(f["unscheduled_in"] for f in run["receiver"].values())
    assert data["drops"] == sent - arrived > 0  # every drop an unscheduled packet


def test_a_dropped_unscheduled_packet_is_resent_on_a_credit(run: dict) -> None:
    s = _sender(run, LATE)
    got = run["receiver"][str(LATE)]
    lost = len(s["unscheduled_sends"]) - got["unscheduled_in"]
    assert lost > 0 and s["retransmits"] >= lost and s["probes"] >= 1
    unscheduled = {seq for _, seq in s["unscheduled_sends"]}
    resent = [seq for _, _, seq in s["data_sends"] if seq in unscheduled]
    assert len(resent) >= lost  # each lost one went again, on a credit (scheduled)


def test_scheduled_data_still_leaves_at_its_emulation_time_plus_t_wait(run: dict) -> None:
    for s in (_sender(run, LONG), _sender(run, LATE)):
        assert s["t_wait_ns"] == T_WAIT_NS and s["data_sends"]
        late = [sent - (emu_ts + T_WAIT_NS) for sent, emu_ts, _ in s["data_sends"]]
        assert min(late) >= 0 and max(late) <= ON_TIME_NS
        credited = {emu_ts for _, emu_ts, _ in s["credits"]}
        assert {emu_ts for _, emu_ts, _ in s["data_sends"]} <= credited
        # the pre-credit phase ended before the first scheduled packet left
        assert 0 < s["pre_credit_end_ns"] <= min(sent for sent, _, _ in s["data_sends"])
        assert max(t for t, _ in s["unscheduled_sends"]) < s["pre_credit_end_ns"]
