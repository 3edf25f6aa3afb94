"""Gear is a datapath like GEMINI and DC-Vegas (issue #36, acceptance "both run as
datapaths"): its spec loads as a host-wide module_params datapath of tcp_gear, a policy
targets it and Booster plans in its own θ space, an experiment runs it against DCTCP, and the
agent writes its θ into the module's parameters, refuses one outside Θ' and restores the
module's values. The three checks are test_new_datapaths' (GEMINI's and DC-Vegas's), run for
"gear"; the lab's INT readings are unit-checked on hand-made samples.
"""

from __future__ import annotations

import pytest

from gemini_api.datapaths import Apply, registry
from gemini_lab import gear, gear_tune
from gemini_lab.host import REPO

from . import test_new_datapaths as nd

GEAR = "gear"


def test_gear_is_a_host_wide_module_params_datapath() -> None:
    dp = registry().get(GEAR)
    assert (dp.cc, dp.module, dp.apply) == ("gear", "tcp_gear", Apply.MODULE_PARAMS)
    assert dp.spec.target == "/sys/module/tcp_gear/parameters"
    assert dp.spec.names == ("target_util", "class_rtt_ratio", "ai_step_bdp", "max_stage")
    assert dp.spec.default()["target_util"] == 95  # the paper's η


def test_a_version_1_theta_in_packets_is_refused_not_read_as_a_fraction_of_the_bdp() -> None:
    # W_AI became a fraction of the BDP in spec version 2 and changed its name with its unit:
    # a θ a policy kept from version 1 (ai_step, hundredths of a packet) names what is wrong.
    spec = registry().get(GEAR).spec
    assert spec.version == 2
    old = {"target_util": 95, "class_rtt_ratio": 100, "ai_step": 100, "max_stage": 5}
    problems = spec.violations(old, spec.limits)
    assert problems == ["ai_step: unknown parameter", "ai_step_bdp: missing"]


def test_the_default_step_is_one_packet_at_the_tuning_port() -> None:
    # The IntCC prototype's 1 packet at the port Booster tunes on: bw · IRTT in 1448-byte packets.
    path, mss = gear_tune.TUNE_PAIR, 1448
    bdp_pkts = path.rate_mbit * 1e6 * path.rtts_ms[0] / 1e3 / 8 / mss
    step = registry().get(GEAR).spec.param("ai_step_bdp")
    assert step.default / step.scale * bdp_pkts == pytest.approx(1.0, abs=0.01)


def test_booster_plans_and_learns_gear_in_its_own_space(booster) -> None:
    nd.test_booster_plans_and_learns_a_new_datapath_in_its_own_space(booster, GEAR)


def test_an_experiment_sets_dctcp_against_gear_tuned(booster) -> None:
    nd.test_an_experiment_sets_dctcp_at_defaults_against_the_datapath_tuned(booster, GEAR)


def test_the_agent_writes_reports_and_restores_gears_theta(tmp_path, monkeypatch) -> None:
    nd.test_the_agent_writes_reports_and_restores_a_new_datapaths_theta(tmp_path, monkeypatch, GEAR)


def _sample(t_us: int, backlog: int, read: tuple[int, int, int] | None = None) -> dict:
    s = {"t": t_us / 1e6, "now_us": t_us, "backlog": backlog, "qlen": backlog // 1514}
    if read:
        n, ts, ql = read
        s |= {"bbr_cwnd_gain": n, "bbr_bw_lo": ts, "bbr_bw_hi": ql, "bbr_min_rtt": 1 << 16}
    return s


def test_a_read_is_judged_against_tc_s_samples_around_its_time() -> None:
    # tc at 0 and 3000 µs (10 and 40 packets); the sender's read of a record at 1000 µs
    p = 1514
    good = {"samples": [_sample(0, 10 * p), _sample(3000, 40 * p, (1, 1000, 20 * p))]}
    (pair,) = gear.telemetry_pairs(good)
    assert (pair["before"], pair["after"], pair["dt_us"]) == (10 * p, 40 * p, 3000)
    assert pair["interp"] == pytest.approx(20 * p)
    assert gear.within(pair)
    # 3 ms of line drain (25 packets) + 2 packets of slack above the bracket's top: a miss
    far = {"samples": [_sample(0, 10 * p), _sample(3000, 40 * p, (1, 1000, 68 * p))]}
    assert not gear.within(gear.telemetry_pairs(far)[0])


def test_reads_count_each_record_once_and_unwrap_the_clock() -> None:
    wrap = 1 << 32
    s = [
        _sample(wrap - 10, 0, (1, wrap - 20, 0)),
        _sample(wrap + 5, 0, (1, wrap - 20, 0)),
        _sample(wrap + 50, 0, (2, 30, 1514)),
    ]
    for x in s:
        x["now_us"] %= wrap
    assert [r["n"] for r in gear.reads({"samples": s})] == [1, 2]
    assert gear.unwrap(30, wrap - 10) == wrap + 30


# --- Booster-tuned Gear: the objective and the held-out comparison (gemini_lab.gear_tune) -------


def _pair(intra: float, cross: float, delay_ms: float = 2.0) -> dict:
    flow = {"queue_delay_ms": delay_ms, "retransmits": 0}
    return {"flows": [{**flow, "throughput_mbps": intra}, {**flow, "throughput_mbps": cross}]}


def test_fair_goodput_rewards_an_even_share_and_a_full_link() -> None:
    starved, lopsided, even = _pair(90, 2), _pair(60, 30), _pair(45, 45)
    fair = [gear_tune.fair_goodput(r) for r in (starved, lopsided, even)]
    assert fair == [4, 60, 90]  # same 90-92 Mbit/s in all three: only the share differs
    assert gear_tune.fair_goodput(_pair(30, 30)) < fair[2]  # even but half the link: less
    row = gear_tune.pair_row(lopsided)
    assert (row["share"], row["total_mbps"], row["queue_ms"]) == (2.0, 90, 2.0)


def test_the_held_out_boot_runs_defaults_and_tuned_on_a_port_not_tuned_on() -> None:
    tuned = {"target_util": 90, "class_rtt_ratio": 10, "ai_step_bdp": 1500, "max_stage": 3}
    plan = gear_tune.heldout_plan(tuned)
    ex = plan["experiments"]
    assert {e["rate_kbit"] for e in ex} == {gear_tune.HELDOUT_PAIR.rate_mbit * 1000}
    assert gear_tune.HELDOUT_PAIR != gear_tune.TUNE_PAIR
    assert [e["theta"] for e in ex] == [gear_tune.default_theta()] * 3 + [tuned] * 3
    assert gear_tune.default_theta() == {
        **registry().get(GEAR).spec.default(),
        "class_rtt_ratio": 10,
    }
    runs = {(e["duration_s"], e["starts_s"][1]) for e in ex}
    assert len(runs) == len(gear_tune.HELDOUT_RUNS) >= 3  # the runs differ


def test_the_held_out_verdict_is_a_tie_where_the_spans_overlap() -> None:
    assert gear_tune.verdict({"default": (50, 60), "tuned": (58, 70)}).startswith("A tie")
    assert gear_tune.verdict({"default": (50, 60), "tuned": (61, 70)}).startswith("Tuned better")
    assert gear_tune.verdict({"default": (50, 60), "tuned": (40, 49)}).startswith("Tuned worse")
    held = {"experiments": {"p/default/12s": _pair(60, 30), "p/tuned/12s": _pair(45, 44),
                            "p/tuned/15s": {"error": "boom"}}}  # fmt: skip
    table = gear_tune.heldout_table(held, {}, 0.1)
    assert "| default | 1 | 2.00–2.00 | 60.0–60.0 |" in table
    assert "| tuned | 1 | 1.02–1.02 | 88.0–88.0 |" in table and "Tuned better" in table


def test_a_gear_run_replaces_only_its_own_section_of_the_record() -> None:
    b, e = gear.SECTION_BEGIN, gear.SECTION_END
    record = f"# Gear\n{b}\nold table\n{e}\n## Hand-written\nanalysis\n"
    assert gear.with_section(record, "new table\n") == (
        f"# Gear\n{b}\nnew table\n{e}\n## Hand-written\nanalysis\n"
    )
    for broken in ("# Gear\nanalysis\n", f"{b}\n{b}\n{e}\n", f"{e}\n{b}\n"):
        with pytest.raises(ValueError, match="hand-written text would be lost"):
            gear.with_section(broken, "new table\n")


def test_the_committed_gear_record_can_take_a_run_and_keep_its_analysis() -> None:
    text = (REPO / "benchmarks" / "results" / gear.RESULTS_NAME).read_text()
    kept = text.split(gear.SECTION_END)[1]
    assert "## What this shows" in kept
    assert gear.with_section(text, "x").endswith(kept)


def test_a_gear_run_keeps_its_raw_results_only_in_an_empty_work_directory(tmp_path, capsys):
    """``--work DIR`` keeps the boot's results; without it they go to a temporary directory.
    A DIR holding anything is refused with one line before any boot, so an earlier run's
    results are never mixed in."""
    assert gear.work_dir([]) is None
    assert gear.work_dir(["--work", str(tmp_path / "new")]) == tmp_path / "new"
    assert gear.work_dir(["--work", str(tmp_path)]) == tmp_path  # exists, empty
    (tmp_path / "run0").mkdir()
    with pytest.raises(SystemExit):
        gear.work_dir(["--work", str(tmp_path)])
    assert "exists and is not an empty directory" in capsys.readouterr().err


def test_the_baselines_run_on_the_held_out_port_as_the_pair_benchmark_runs_them() -> None:
    plan = gear_tune.baselines_plan()
    held = gear_tune.HELDOUT_PAIR
    ex = {e["label"]: e for e in plan["experiments"]}
    assert set(ex) == {
        f"{held.name}/{cc}/{d}s" for cc in ("gemini", "dctcp") for d, _ in gear_tune.HELDOUT_RUNS
    }
    for e in ex.values():
        assert (e["rate_kbit"], e["queue_packets"]) == (held.rate_mbit * 1000, held.queue_packets)
        assert e["rtts_ms"] == list(held.rtts_ms) and e["ecn_k"] == gear.PAIR_ECN_K
    gemini = ex[f"{held.name}/gemini/12s"]
    assert gemini["module_extra"] == {"capacity_mbit": held.rate_mbit}  # C is this port's rate
    assert plan["paths"][0]["receiver_cc"] == "dctcp"  # dctcp echoes CE exactly
    results = {"experiments": {f"{held.name}/gemini/12s": _pair(40, 20)}}
    table = gear_tune.baselines_table(results)
    assert "| gemini | 1 | 2.00–2.00 | 40.0–40.0 |" in table and "| dctcp | 0 | error |" in table


def test_the_wan_test_runs_every_cc_three_times_through_the_cross_flows_wan_limit() -> None:
    plan = gear.wan_plan_experiments()
    assert len(plan) == len(gear.WAN_CCS) * len(gear.WAN_DURATIONS_S) == 15
    assert set(gear.WAN_CCS) == {"gear", "gemini", "dctcp", "cubic", "bbr"}
    wan = {"flow": 1, "rate_kbit": 30_000, "queue_packets": gear.WAN_QUEUE}
    for e in plan:
        assert e["wan"] == wan and e["sample_s"] == gear.WAN_SAMPLE_S
        assert e["rtts_ms"] == gear.PAIR_RTTS_MS
        cc = e["label"].split("/")[1]
        # Gear behind its INT switch on drop-tail; the baselines marking at K as in the pair
        assert e["kind"] == ("gear_pair" if cc == "gear" else "datapath_pair")
        assert ("ecn_k" in e) == (cc != "gear")


def test_delivered_packets_are_read_from_both_experiment_kinds_samples() -> None:
    gear_pair = {
        "samples": [
            {"t": 0.1, "flows": [{"tcpi_delivered": 10}, {"tcpi_delivered": 4}]},
            {"t": 0.2, "flows": [{"tcpi_delivered": 30}, {}]},  # the cross socket unread
            {"t": 0.3, "flows": [{"tcpi_delivered": 50}]},
        ]
    }
    assert gear.delivered_ticks(gear_pair) == [(0.1, 10, 4)]
    datapath_pair = {
        "flows": [
            {"samples": [{"t": 0.1, "tcpi_delivered": 10}, {"t": 0.2, "tcpi_delivered": 20}]},
            {"samples": [{"t": 0.2, "tcpi_delivered": 9}]},
        ]
    }
    assert gear.delivered_ticks(datapath_pair) == [(0.2, 20, 9)]


def test_the_share_is_taken_over_the_window_behind_each_tick() -> None:
    ticks = [(0.0, 0, 0), (0.5, 70, 30), (1.0, 100, 60), (1.5, 100, 60)]
    shares = gear.window_shares(ticks, 0.5)
    assert shares[0] == (0.5, pytest.approx(70 / 30))
    assert shares[1] == (1.0, pytest.approx(30 / 30))
    assert shares[2] == (1.5, float("inf"))  # the cross flow delivered nothing
    assert gear.window_shares(ticks[:1], 0.5) == []  # no full window yet


def test_convergence_is_the_start_of_the_last_stretch_inside_the_band() -> None:
    ideal = 7 / 3
    inside, outside = ideal, ideal * 1.5
    assert gear.convergence_s([(0.5, inside), (1.0, inside)]) == 0.5
    # left the band and came back: converged only from the return
    shares = [(0.5, inside), (1.0, outside), (1.5, inside), (2.0, inside)]
    assert gear.convergence_s(shares) == 1.5
    assert gear.convergence_s([(0.5, inside), (1.0, outside)]) is None  # ended outside: never
    assert gear.convergence_s([(0.5, ideal / 1.2), (1.0, ideal * 1.2)]) == 0.5  # the edges
    assert gear.convergence_s([(0.5, float("inf"))]) is None
