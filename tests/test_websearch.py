"""gemini_lab.websearch without a guest: the web-search flow sizes and Poisson arrivals G9 runs,
the plans it boots and the figures it reads from a guest's results (the boots themselves are
benchmarks, benchmarks/results/datapaths-eval.md)."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from gemini_lab import websearch as ws

DRAWS = 20_000


@pytest.fixture(scope="module")
def cdf() -> ws.SizeCdf:
    return ws.load_cdf()


def test_the_shipped_table_is_dctcps_web_search_distribution(cdf: ws.SizeCdf) -> None:
    assert cdf.points[0] == (0, 0) and cdf.points[-1] == (30_000_000, 1.0)
    assert cdf.mean() == pytest.approx(1_711_250)
    assert cdf.fraction_below(ws.SMALL_BYTES) == pytest.approx(0.53 + 0.07 * 20 / 120)
    assert 1 - cdf.fraction_below(ws.LARGE_BYTES) == pytest.approx(0.03)


def test_quantile_inverts_the_cdf_between_its_points(cdf: ws.SizeCdf) -> None:
    assert cdf.quantile(0.0) == 0 and cdf.quantile(1.0) == 30_000_000
    assert cdf.quantile(0.15) == 10_000
    assert cdf.quantile(0.175) == pytest.approx(15_000)  # halfway between 10 KB and 20 KB
    for u in (0.01, 0.3, 0.55, 0.9, 0.985):
        assert cdf.fraction_below(cdf.quantile(u)) == pytest.approx(u)


def test_drawn_sizes_follow_the_cdf(cdf: ws.SizeCdf) -> None:
    flows = ws.schedule(cdf, DRAWS, 5.0, seed=7)
    sizes = [f.size for f in flows]
    assert min(sizes) >= 1 and max(sizes) <= 30_000_000
    for x, p in cdf.points[1:-1]:
        got = sum(s <= x for s in sizes) / DRAWS
        assert got == pytest.approx(p, abs=4 * math.sqrt(p * (1 - p) / DRAWS)), x
    # the mean of a heavy tail: within 4 standard errors of the table's
    assert statistics.fmean(sizes) == pytest.approx(
        cdf.mean(), abs=4 * statistics.stdev(sizes) / math.sqrt(DRAWS)
    )


def test_arrivals_are_poisson_at_the_rate_that_offers_the_load(cdf: ws.SizeCdf) -> None:
    rate = ws.arrival_rate(0.9, 80, cdf.mean())
    assert rate == pytest.approx(0.9 * 80e6 / 8 / 1_711_250)  # 5.26 flows/s
    flows = ws.schedule(cdf, DRAWS, rate, seed=3)
    gaps = [b.at_s - a.at_s for a, b in itertools.pairwise(flows)]
    assert all(g >= 0 for g in gaps)
    assert 1 / statistics.fmean(gaps) == pytest.approx(rate, rel=4 / math.sqrt(DRAWS))
    # exponential gaps: the standard deviation equals the mean, P(gap > mean) = 1/e
    assert statistics.stdev(gaps) == pytest.approx(statistics.fmean(gaps), rel=0.05)
    above = sum(g > 1 / rate for g in gaps) / len(gaps)
    assert above == pytest.approx(math.exp(-1), abs=0.02)


def test_a_seed_fixes_the_schedule(cdf: ws.SizeCdf) -> None:
    assert ws.schedule(cdf, 50, 5.0, seed=1) == ws.schedule(cdf, 50, 5.0, seed=1)
    assert ws.schedule(cdf, 50, 5.0, seed=1) != ws.schedule(cdf, 50, 5.0, seed=2)


def test_a_cdf_that_does_not_rise_is_refused() -> None:
    with pytest.raises(ValueError):
        ws.SizeCdf(((0, 0), (10, 0.6), (5, 1.0)))
    with pytest.raises(ValueError):
        ws.SizeCdf(((0, 0), (10, 0.6)))


def test_the_g9_plan_runs_one_schedule_under_every_arm() -> None:
    flows = ws.workload(20, 0.9, seed=1)
    plan = ws.g9_plan(flows)
    runs = [e for e in plan["experiments"] if e["kind"] == "websearch"]
    assert [e["label"] for e in runs] == [f"g9/{a}" for a in ws.ARMS]
    assert all(e["flows"] == [[f.at_s, f.size] for f in flows] for e in runs)
    assert all(e["hops"] == [0, 1] for e in runs)  # the datacenter hop and the WAN hop
    assert len({e["port_offset"] for e in runs}) == len(runs)
    gemini = next(e for e in runs if e["label"] == "g9/gemini")
    assert gemini["datapath"] == "gemini" and gemini["theta"]["delay_threshold_us"] == 50_000
    assert {"label": "load/gemini", "kind": "datapath_load", "datapath": "gemini"} in plan[
        "experiments"
    ]


def _arm_result(fcts: dict[int, float | None], drops: int = 0) -> dict:
    """A guest's websearch result: flows of the given sizes with these FCTs (None: unfinished)."""
    per_flow = []
    for i, (size, fct) in enumerate(fcts.items()):
        row: dict = {"i": i, "at_s": float(i), "size": size, "retransmits": 1}
        if fct is not None:
            row["fct_ms"] = fct
        else:
            row["aborted"] = True
        per_flow.append(row)
    queues = {
        "0": {"packets": 1000, "drops": 0, "marked": 5, "mean_qlen": 1.0, "max_qlen": 3},
        "1": {"packets": 1000, "drops": drops, "marked": 0, "mean_qlen": 9.0, "max_qlen": 20},
    }
    return {
        "per_flow": per_flow,
        "queues": queues,
        "netstat": {"TCPTimeouts": 2},
        "aborted": sum(f is None for f in fcts.values()),
    }


def test_figures_split_flows_by_the_papers_size_classes() -> None:
    r = _arm_result({50_000: 200.0, 90_000: 400.0, 20_000_000: 3000.0, 11_000_000: None}, 10)
    f = ws.arm_figures(r)
    assert (f.small.flows, f.small.done, f.small.mean_ms) == (2, 2, 300.0)
    assert (f.large.flows, f.large.done, f.large.mean_ms) == (2, 1, 3000.0)
    assert f.overall.mean_ms == pytest.approx((200 + 400 + 3000) / 3)
    assert f.aborted == 1 and f.retransmits == 4 and f.timeouts == 2
    assert f.loss == (0.0, pytest.approx(10 / 1010)) and f.marked == 5  # drops / offered


def test_the_table_gives_min_max_over_seeds_and_gemini_against_each_baseline() -> None:
    def boot(gemini: float, cubic: float) -> dict:
        arms = {"gemini": gemini, "cubic": cubic}
        return {
            "experiments": {
                f"g9/{a}": _arm_result({50_000: v, 20_000_000: 10 * v}) for a, v in arms.items()
            }
        }

    runs = {1: boot(200.0, 400.0), 2: boot(300.0, 300.0)}
    table = ws.g9_table(runs, ("gemini", "cubic"))
    assert "| gemini | 200–300 |" in table and "| cubic | 300–400 |" in table
    against = ws.g9_against(runs, ("gemini", "cubic"))
    assert "| cubic | -50 %, +0 % |" in against
    assert "1; 1, 1; 1" in against  # GEMINI first, then tied first


def test_convergence_shares_are_each_flows_delivered_rate_in_the_window() -> None:
    def sample(t: float, g0: int, g1: int | None) -> dict:
        return {"t": t, "groups": [{"1": g0, "2": g0}, {} if g1 is None else {"3": g1}]}

    r = {
        "end_s": 60.0,
        "groups": [{"start_s": 0.0}, {"start_s": 40.0}],
        "samples": [
            sample(30, 0, None),
            sample(40, 1000, 0),
            sample(50, 2000, 2000),
            sample(60, 3000, 4000),
        ],
    }
    flows, groups = ws.convergence_shares(r)  # from the last group's start to the end
    per_pkt = ws.MSS * 8 / 1e6
    assert flows == pytest.approx([100 * per_pkt, 100 * per_pkt, 200 * per_pkt])
    assert groups == pytest.approx([200 * per_pkt, 200 * per_pkt])
    assert ws.jain(groups) == pytest.approx(1.0)
    assert ws.jain(flows) == pytest.approx(16 / 18)


def test_the_g7_plan_joins_three_groups_a_phase_apart() -> None:
    plan = ws.g7_plan(("gemini", "cubic"), runs=2, phase_s=20)
    runs = [e for e in plan["experiments"] if e["kind"] == "convergence"]
    assert [e["label"] for e in runs] == ["g7/gemini#0", "g7/cubic#0", "g7/gemini#1", "g7/cubic#1"]
    assert all(e["starts_s"] == [0, 20, 40] and e["end_s"] == 60 for e in runs)
    assert all(e["flows"] == 10 for e in runs)
    assert len({e["port_offset"] for e in runs}) == len(runs)
