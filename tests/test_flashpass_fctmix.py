"""FlashPass's flow-size-mix evaluation (issue #36) without a guest: the scaled web-search CDF,
the seed's schedule and senders on the N = 20 path, the size classes, a run's figures, and the
lab's completion times taken per flow (a flow that ends before an earlier-started one keeps
its own end)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import pytest

from gemini_lab.flashpass import evaluate, fctmix
from gemini_lab.flashpass.lab import _Completions
from gemini_lab.flashpass.switch import DATA_QDISC, DATA_WIRE, EMULATION_QDISC, SwitchPort
from gemini_lab.websearch import load_cdf, schedule


def test_the_scaled_cdf_keeps_the_fractions_and_divides_every_size() -> None:
    cdf, scaled = load_cdf(), fctmix.scaled_cdf(load_cdf())
    assert [p for _, p in scaled.points] == [p for _, p in cdf.points]
    assert scaled.mean() == pytest.approx(cdf.mean() / fctmix.SIZE_SCALE)
    assert scaled.fraction_below(10_000) == pytest.approx(cdf.fraction_below(100_000))


def test_a_seed_fixes_the_schedule_drawn_by_the_web_search_machinery_and_the_senders() -> None:
    flows = fctmix.mix_flows(1)
    assert flows == fctmix.mix_flows(1) != fctmix.mix_flows(2)
    assert len(flows) == fctmix.FLOWS
    cdf = fctmix.scaled_cdf(load_cdf())
    rate = fctmix.LOAD * evaluate.RATE_KBIT * 1000 / 8 / cdf.mean()
    drawn = schedule(cdf, fctmix.FLOWS, rate, 1)
    assert [f["bytes"] for f in flows] == [d.size for d in drawn]
    assert [f["start_ms"] for f in flows] == pytest.approx([1000 * d.at_s for d in drawn])
    assert {f["sender"] for f in flows} <= set(range(fctmix.SENDERS))
    assert len({f["sender"] for f in flows}) > fctmix.SENDERS // 2  # spread over the path's RTTs
    assert [f["flow"] for f in flows] == list(range(1, fctmix.FLOWS + 1))


def test_every_transport_runs_the_same_mix_on_the_n20_path_of_the_seed() -> None:
    runs = fctmix.mix_runs(3, flows=10, load=0.5)
    static = evaluate.seed_runs(3, None, 20, fctmix.TRANSPORTS)
    assert [r["transport"] for r in runs] == list(fctmix.TRANSPORTS)
    assert all(r["flows"] == runs[0]["flows"] for r in runs) and len(runs[0]["flows"]) == 10
    assert all(r["sender_delays_ms"] == static[0]["sender_delays_ms"] for r in runs)
    assert runs[0]["data_buffer_packets"] == evaluate.BUFFER_PACKETS
    assert runs[0]["theta"] == evaluate.THETA
    assert runs[3]["datapath"] == "gemini"


def test_flows_are_classed_by_their_size_before_scaling() -> None:
    small, mid, large = 0, 1, 3
    assert fctmix.size_class(1) == small
    assert fctmix.size_class(9_999) == small  # 99,990 bytes of the CDF: under 100 KB
    assert fctmix.size_class(10_000) == mid
    assert fctmix.size_class(999_999) == 2
    assert fctmix.size_class(1_000_000) == large


def _result(transport: str, fcts: dict[int, float], rc: dict[int, int]) -> dict:
    ids = sorted(fcts)
    qdiscs = [
        {"handle": DATA_QDISC, "packets": 990, "drops": 10},
        {"handle": EMULATION_QDISC, "packets": 75, "drops": 25},
    ]
    return {
        "transport": transport,
        "flow_ids": ids,
        "fct_s": [fcts[i] for i in ids],
        "sender_rc": [rc.get(i, 0) for i in ids],
        "makespan_s": 2.0,
        "qdiscs": qdiscs,
        "senders": [{"flow": i, "finished": rc.get(i, 0) == 0} for i in ids],
    }


def test_a_runs_figures_split_small_and_large_and_leave_unfinished_flows_out() -> None:
    flows = [
        {"flow": 1, "bytes": 5_000, "start_ms": 0.0},  # small
        {"flow": 2, "bytes": 2_000, "start_ms": 100.0},  # small
        {"flow": 3, "bytes": 1_500_000, "start_ms": 200.0},  # large
        {"flow": 4, "bytes": 8_000, "start_ms": 300.0},  # small, unfinished
    ]
    res = _result("flashpass", {1: 0.1, 2: 0.3, 3: 1.5, 4: 9.0}, {4: 1})
    f = fctmix.figures(res, flows)
    assert f.class_mean_ms[0] == pytest.approx(200.0)  # flows 1 and 2
    assert f.class_mean_ms[3] == pytest.approx(1500.0)
    assert math.isnan(f.class_mean_ms[1])
    assert f.class_flows == (3, 0, 0, 1)
    assert f.small_p99_ms == pytest.approx(300.0)
    assert (f.complete, f.flows) == (3, 4)
    assert f.utilisation == pytest.approx(1_507_000 * 8 / (10e6 * 2.0))
    assert f.data_loss == pytest.approx(0.01)
    assert f.emulation_loss == pytest.approx(0.25)
    assert fctmix.figures(_result("cubic", {1: 0.1}, {}), flows[:1]).emulation_loss is None


def test_the_percentile_is_the_nearest_rank() -> None:
    xs = list(range(1, 101))
    assert fctmix.percentile(xs, 0.99) == 99
    assert fctmix.percentile([5.0, 1.0], 0.99) == 5.0
    assert math.isnan(fctmix.percentile([], 0.99))


def test_the_report_keeps_the_held_out_seed_apart() -> None:
    flows: list[dict] = [
        {"flow": 1, "bytes": 5_000, "start_ms": 0.0},
        {"flow": 2, "bytes": 9, "start_ms": 9},
    ]

    def summary(seed: int, fp_ms: float) -> dict:
        runs = {
            t: {"figures": fctmix.figures(_result(t, {1: fp_ms, 2: 0.1}, {}), flows).__dict__}
            for t in fctmix.TRANSPORTS
        }
        return {"seed": seed, "runs": runs, "offered": 0.8}

    text = fctmix.report([summary(1, 0.2), summary(4, 0.7)], {4})
    main, held = text.split("Held-out seeds [4]")
    assert "Seeds [1]" in main and "| flashpass | 150 |" in main
    assert "| flashpass | 400 |" in held.split("FlashPass's change")[0]


def test_the_lab_takes_each_flows_completion_when_its_own_process_ends() -> None:
    """The first flow outlives the second: each keeps its own completion time."""
    done = _Completions()
    first = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)  # fmt: skip
    done.add(first, time.monotonic())
    second = subprocess.Popen([sys.executable, "-c", "pass"])
    done.add(second, time.monotonic())
    deadline = time.monotonic() + 60
    while done.fcts[1] == 0.0:  # the second's waiter has seen it end
        assert time.monotonic() < deadline, "the second flow's end was not taken"
        time.sleep(0.01)
    assert first.poll() is None
    assert first.stdin is not None
    first.stdin.close()
    fcts = done.wait()
    assert 0 < fcts[1] < fcts[0]


def test_a_flow_still_running_at_the_limit_is_killed_and_named() -> None:
    done = _Completions()
    stuck = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)  # fmt: skip
    done.add(stuck, time.monotonic())
    with pytest.raises(subprocess.TimeoutExpired):
        done.wait(timeout_s=0.0)
    assert stuck.wait(timeout=60) != 0  # killed


def test_dctcp_runs_the_mix_over_a_marking_data_queue_and_others_keep_the_bfifo() -> None:
    runs = {r["transport"]: r for r in fctmix.mix_runs(2, transports=("cubic", fctmix.DCTCP))}
    assert runs["dctcp"]["data_ecn_k_packets"] == fctmix.DCTCP_K
    assert runs["dctcp"]["receiver_cc"] == "dctcp"  # the listener echoes CE as DCTCP does
    assert "data_ecn_k_packets" not in runs["cubic"] and "receiver_cc" not in runs["cubic"]
    assert runs["dctcp"]["flows"] == runs["cubic"]["flows"]
    assert fctmix.DCTCP not in fctmix.TRANSPORTS  # an arm only when asked


def test_the_data_queue_is_red_marking_from_k_packets_only_when_k_is_given() -> None:
    plain = SwitchPort(10_000, 16).commands("d")
    assert plain[5][-3:] == ["bfifo", "limit", str(16 * DATA_WIRE)]
    red = SwitchPort(10_000, 16, data_ecn_k_packets=4).commands("d")
    assert red[:5] == plain[:5] and red[6:] == plain[6:]
    args = red[5][red[5].index("red") + 1 :]
    pairs = dict(zip(args[:-2:2], args[1:-2:2], strict=True))
    assert pairs["limit"] == str(16 * DATA_WIRE) and pairs["min"] == str(4 * DATA_WIRE)
    assert pairs["max"] == str(5 * DATA_WIRE) and args[-2:] == ["ecn", "nodrop"]


def test_the_table_gathers_a_seeds_arms_from_separate_boots() -> None:
    flows = [{"flow": 1, "bytes": 5_000, "start_ms": 0.0}]
    one = {"seed": 1, "flows_run": flows, "offered": 0.5, "runs": {"cubic": {"x": 1}}}
    two = {"seed": 1, "flows_run": flows, "offered": 0.5, "runs": {"dctcp": {"x": 2}}}
    (merged,) = fctmix.merge([one, two])
    assert set(merged["runs"]) == {"cubic", "dctcp"}
    with pytest.raises(ValueError, match="different mixes"):
        fctmix.merge([one, two | {"flows_run": flows * 2}])


def test_flashpass_star_is_an_arm_on_the_same_mix_at_the_theta_asked() -> None:
    runs = fctmix.mix_runs(2, transports=("flashpass", "flashpass-star", "cubic"))
    assert [r["transport"] for r in runs] == ["flashpass", "flashpass-star", "cubic"]
    assert runs[1]["flows"] == runs[0]["flows"] and runs[1]["theta"] == evaluate.THETA
    assert fctmix.FLASHPASS_STAR not in fctmix.TRANSPORTS  # an arm only when asked
    theta = evaluate.flashpass_theta([("t_wait", 450)])
    (star,) = fctmix.mix_runs(2, transports=("flashpass-star",), theta=theta)
    assert star["theta"] == evaluate.THETA | {"t_wait": 450}


def test_the_report_sets_flashpass_star_beside_flashpass_and_each_tcp() -> None:
    flows: list[dict] = [{"flow": 1, "bytes": 5_000, "start_ms": 0.0}]
    fcts = {"flashpass": 0.2, "flashpass-star": 0.1, "cubic": 0.4}
    runs = {
        t: {"figures": fctmix.figures(_result(t, {1: s}, {}), flows).__dict__}
        for t, s in fcts.items()
    }
    text = fctmix.report([{"seed": 1, "runs": runs, "offered": 0.8}], set())
    assert "| flashpass-star | 100 |" in text and "| flashpass | 200 |" in text
    assert "| 1 | cubic | -50 % |" in text  # FlashPass against cubic
    assert "| 1 | flashpass-star vs cubic | -75 % |" in text
    assert "| 1 | flashpass-star vs flashpass | -50 % |" in text


def test_an_access_ratio_gives_every_arm_the_same_access_link_and_none_is_the_old_path() -> None:
    old = fctmix.mix_runs(2, flows=5, transports=fctmix.ARMS)
    runs = fctmix.mix_runs(2, flows=5, transports=fctmix.ARMS, access_ratio=fctmix.ACCESS_RATIO)
    assert all("access_kbit" not in r for r in old)
    assert {r["access_kbit"] for r in runs} == {evaluate.RATE_KBIT // 10}
    assert {r["access_buffer_packets"] for r in runs} == {evaluate.BUFFER_PACKETS}
    link = ("access_kbit", "access_buffer_packets")
    assert [{k: v for k, v in r.items() if k not in link} for r in runs] == old


def test_a_shallower_buffer_moves_the_bottleneck_only_and_dctcp_marks_below_it() -> None:
    ratio = fctmix.ACCESS_RATIO
    deep = fctmix.mix_runs(2, flows=5, transports=fctmix.ARMS, access_ratio=ratio)
    runs = fctmix.mix_runs(2, flows=5, transports=fctmix.ARMS, access_ratio=ratio, buffer_packets=4)
    assert {r["data_buffer_packets"] for r in deep} == {evaluate.BUFFER_PACKETS}
    assert {r["data_buffer_packets"] for r in runs} == {4}
    assert {r["access_buffer_packets"] for r in runs} == {evaluate.BUFFER_PACKETS}
    (dctcp,) = [r for r in runs if r["transport"] == fctmix.DCTCP]
    assert dctcp["data_ecn_k_packets"] == 2  # half the buffer: a mark before the limit
    (deep_dctcp,) = [r for r in deep if r["transport"] == fctmix.DCTCP]
    assert deep_dctcp["data_ecn_k_packets"] == fctmix.DCTCP_K
    same = ("data_buffer_packets", "data_ecn_k_packets")
    assert [{k: v for k, v in r.items() if k not in same} for r in runs] == [
        {k: v for k, v in r.items() if k not in same} for r in deep
    ]
    with pytest.raises(ValueError, match="buffer_packets: 3 is below 4"):
        fctmix.mix_runs(2, flows=5, buffer_packets=3)


def test_the_table_refuses_to_join_boots_of_different_buffers() -> None:
    flows = fctmix.mix_flows(1, flows=3)
    one = {"seed": 1, "flows_run": flows, "runs": {"cubic": {}}}
    assert fctmix.buffer_of(one) == evaluate.BUFFER_PACKETS  # a summary from before --buffer
    (merged,) = fctmix.merge([one, {**one, "runs": {"bbr": {}}, "data_buffer_packets": 16}])
    assert set(merged["runs"]) == {"cubic", "bbr"}
    with pytest.raises(ValueError, match="different data buffers"):
        fctmix.merge([one, {**one, "data_buffer_packets": 4}])


def test_a_sender_s_egress_adds_its_access_link_to_its_delay() -> None:
    from gemini_lab.flashpass.lab import Access, access_of, sender_egress

    assert sender_egress(0, None) == []
    assert sender_egress(7.5, None) == ["delay", "7.5ms", "limit", "100000"]
    link = Access(1000, 16)
    assert sender_egress(0, link) == ["delay", "0ms", "rate", "1000kbit", "limit", "16"]
    assert access_of({"data_buffer_packets": 16}) is None
    assert access_of({"data_buffer_packets": 16, "access_kbit": 1000}) == link
    run = {"data_buffer_packets": 16, "access_kbit": 1000, "access_buffer_packets": 4}
    assert access_of(run) == Access(1000, 4)


def test_a_flashpass_sender_takes_its_access_link_as_its_line_rate() -> None:
    from pathlib import Path

    from gemini_lab.flashpass.lab import _flow_command

    flow = {"flow": 1, "bytes": 1000, "sender": 0}
    run = {"transport": "flashpass-star", "rate_kbit": 10_000, "data_buffer_packets": 16}
    line = _flow_command(run, flow, Path("/tmp"), None)
    assert line[line.index("--link-mbit") + 1] == "10.0"
    line = _flow_command(run | {"access_kbit": 1000}, flow, Path("/tmp"), None)
    assert line[line.index("--link-mbit") + 1] == "1.0"


def test_the_access_queues_loss_is_their_drops_over_the_packets_offered() -> None:
    assert fctmix.access_loss({}) is None
    qs = [{"drops": 1, "packets": 9}, {"drops": 0, "packets": 10}]
    assert fctmix.access_loss({"access_qdiscs": qs}) == pytest.approx(1 / 20)


def test_wan_rtts_give_each_sender_one_of_the_paper_s_round_trips_and_change_nothing_else() -> None:
    old = fctmix.mix_runs(2, flows=5, transports=fctmix.ARMS)
    runs = fctmix.mix_runs(2, flows=5, transports=fctmix.ARMS, wan_rtts=True)
    (delays,) = {tuple(r["sender_delays_ms"]) for r in runs}
    assert len(delays) == fctmix.SENDERS
    rtts = {d + r["return_ms"] for d in delays for r in runs}
    assert rtts == set(fctmix.WAN_RTTS_MS)  # all three drawn among 20 senders on this seed
    assert delays == tuple(fctmix.wan_delays(2)) != tuple(fctmix.wan_delays(3))
    assert [{**r, "sender_delays_ms": None} for r in runs] == [
        {**r, "sender_delays_ms": None} for r in old
    ]
    with pytest.raises(ValueError, match="without access links only"):
        fctmix.mix_runs(2, flows=5, wan_rtts=True, access_ratio=fctmix.ACCESS_RATIO)


def test_the_table_refuses_to_join_boots_of_different_delays() -> None:
    flows = fctmix.mix_flows(1, flows=3)
    one = {"seed": 1, "flows_run": flows, "runs": {"cubic": {}}, "delays_ms": [1.0, 2.0]}
    with pytest.raises(ValueError, match="different senders' delays"):
        fctmix.merge([one, {**one, "delays_ms": [50.0, 70.0]}])


def test_flashpass_s_data_losses_are_split_into_scheduled_and_unscheduled() -> None:
    res = _result(fctmix.FLASHPASS_STAR, {1: 0.1, 2: 0.2}, {})
    res["senders"][0] |= {"data_sends": [0] * 90, "unscheduled_sends": [0] * 10}
    res["senders"][1] |= {"data_sends": [0] * 10}  # no pre-credit phase
    res["receiver"] = {  # flow 1: 92 arrivals, 4 of them unscheduled; flow 2: 9 arrivals
        "1": {"received": 91, "duplicates": 1, "unscheduled_in": 4},
        "2": {"received": 9, "duplicates": 0, "unscheduled_in": 0},
    }
    flows = [{"flow": 1, "bytes": 5_000, "start_ms": 0.0}, {"flow": 2, "bytes": 5, "start_ms": 1}]
    f = fctmix.figures(res, flows)
    assert f.scheduled_loss == pytest.approx(3 / 100)  # 100 sent on credits, 88 + 9 arrived
    assert f.unscheduled_loss == pytest.approx(6 / 10)  # 10 sent before credits, 4 arrived
    cubic = fctmix.figures(_result("cubic", {1: 0.1}, {}) | {"receiver": {}}, flows[:1])
    assert cubic.scheduled_loss is None and cubic.unscheduled_loss is None
    idle = _result(fctmix.FLASHPASS, {1: 0.1}, {}) | {"receiver": {}}  # nothing sent on credits
    idle["senders"][0] |= {"data_sends": []}
    assert fctmix.figures(idle, flows[:1]).scheduled_loss is None


def test_the_table_makes_the_figures_again_from_the_boots_own_result(tmp_path) -> None:
    flows = [{"flow": 1, "bytes": 5_000, "start_ms": 0.0}]
    res = _result(fctmix.FLASHPASS_STAR, {1: 0.25}, {})
    res["senders"][0] |= {"data_sends": [0] * 8, "unscheduled_sends": [0] * 2}
    res["receiver"] = {"1": {"received": 9, "duplicates": 0, "unscheduled_in": 1}}
    stale = {"overall_mean_ms": 1.0}  # written by a boot before the figure existed
    summary = {"seed": 1, "runs": {fctmix.FLASHPASS_STAR: {"figures": stale}}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert fctmix.refigured(tmp_path) == summary  # nothing kept beside it: as written
    plan = {"runs": [{"transport": fctmix.FLASHPASS_STAR, "flows": flows}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "result.json").write_text(json.dumps([res]))
    f = fctmix.refigured(tmp_path)["runs"][fctmix.FLASHPASS_STAR]["figures"]
    assert f["overall_mean_ms"] == pytest.approx(250.0)
    assert (f["scheduled_loss"], f["unscheduled_loss"]) == (0.0, 0.5)
