"""Short flows in the UML lab (gemini_lab.shortflows): the mechanics that host load cannot
change. Every transfer delivers exactly its size on a fresh connection, under the CC asked for
(read back from the kernel) and Fusion's θ as set (read back from the namespace's sysctls),
with no cached metrics; its completion time is at least what the path allows (the handshake's
round trip, then the payload beyond the shaper's bucket at the link's rate); the size mix is
the seeded list. No figure of which CC is faster is asserted: those are measurements
(benchmarks/results/short-flows.md).

The UML part needs Debian's linux-source-6.1, flex and bison (lab/install-deps.sh); it skips
with the lab's reason when they are missing."""

from __future__ import annotations

import statistics

import pytest

from gemini_api.theta import load_spec
from gemini_lab import shortflows
from gemini_lab.netem import tbf_args
from tests.labkit import lab_plan

PATH = "ethernet"
TUNED = {"init_cwnd": 11, "mult_decrease": 61}
SEED = 7
CFG = shortflows.ShortConfig(
    scenarios=(PATH,),
    tuned_theta=TUNED,
    only=("fusion-tuned", "cubic"),
    transfers=2,
    mix=4,
    seed=SEED,
)
ASKED = {"fusion-tuned": "fusion", "cubic": "cubic"}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    return lab_plan(shortflows.build_plan(CFG), tmp_path_factory.mktemp("shortflows"), "uml")


def _series(results: dict, name: str, workload: str) -> dict:
    series = results["experiments"][f"{PATH}/{name}/{workload}"]
    assert "error" not in series, series.get("error")
    return series


@pytest.mark.lab
@pytest.mark.slow
@pytest.mark.parametrize("workload", shortflows.WORKLOADS)
@pytest.mark.parametrize("name", sorted(ASKED))
def test_each_transfer_delivers_its_size_under_the_cc_asked_for(results, name, workload):
    series = _series(results, name, workload)
    sizes = [t["size"] for t in series["transfers"]]
    expected = [shortflows.ONE_MB] * 2 if workload == "1mb" else shortflows.size_mix(4, SEED)
    assert sizes == expected
    for t in series["transfers"]:
        assert t["bytes_received"] == t["size"]
        assert t["cc_in_kernel"] == ASKED[name]
    assert series["no_metrics_save"] == 1  # each connection starts cold


@pytest.mark.lab
@pytest.mark.slow
def test_fusion_ran_the_theta_asked_for(results):
    series = _series(results, "fusion-tuned", "1mb")
    assert series["theta_in_kernel"] == {**load_spec().default(), **TUNED}


@pytest.mark.lab
@pytest.mark.slow
@pytest.mark.parametrize("workload", shortflows.WORKLOADS)
@pytest.mark.parametrize("name", sorted(ASKED))
def test_completion_takes_at_least_what_the_path_allows(results, name, workload):
    path = shortflows.load_path(PATH)
    assert path.rate_mbit is not None
    tbf = tbf_args(round(path.rate_mbit * 1000))
    bucket = int(tbf[tbf.index("burst") + 1])  # bytes the shaper lets through at once
    for t in _series(results, name, workload)["transfers"]:
        # the handshake's round trip, then the payload beyond the shaper's bucket at its rate
        floor_s = path.rtt_ms / 1000 + max(0, t["size"] - bucket) * 8 / (path.rate_mbit * 1e6)
        assert t["completion_s"] >= floor_s, t
        assert t["reply_s"] >= t["completion_s"]  # the reply comes after the last byte
        assert t["min_rtt_ms"] >= path.rtt_ms
        assert t["throughput_mbps"] == pytest.approx(t["size"] * 8 / t["completion_s"] / 1e6)


SAME_S = 0.002  # timer granularity on the simulated clock


@pytest.mark.lab
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ASKED))
def test_every_transfer_starts_cold(results, name):
    """On a path without loss or a rate schedule, transfers of one size are the same
    transfer: nothing of one connection (cached metrics, the path's first ARP resolution)
    reaches the next."""
    times = [t["completion_s"] for t in _series(results, name, "1mb")["transfers"]]
    assert max(times) - min(times) <= SAME_S, times


@pytest.mark.lab
@pytest.mark.slow
def test_the_kernel_stayed_healthy(results):
    assert results["backend"] == "uml" and results["kernel_problems"] == []
    assert results["insmod"]["rc"] == 0 and results["rmmod"]["rc"] == 0


def test_the_size_mix_is_seeded_and_holds_its_tail():
    sizes = shortflows.size_mix(100, seed=3)
    assert sizes == shortflows.size_mix(100, seed=3)
    assert sizes != shortflows.size_mix(100, seed=4)
    assert sorted(sizes) == sorted(shortflows.size_mix(100, seed=4))  # same sizes, other order
    assert sum(1 for s in sizes if s > shortflows.MIX_TAIL_K) == 3  # the quantiles above 96.8 %
    assert statistics.median(sizes) == pytest.approx(11_600, rel=0.05)  # e^9.357 bytes
    assert all(shortflows.MIX_MIN_BYTES <= s <= shortflows.MIX_MAX_BYTES for s in sizes)


def test_the_plan_gives_every_cc_the_same_transfers():
    plan = shortflows.build_plan(
        shortflows.ShortConfig(scenarios=("cellular", "satellite"), fewer=(("satellite", 3, 5),))
    )
    by_label = {e["label"]: e for e in plan["experiments"]}
    cellular = [e for label, e in by_label.items() if label.startswith("cellular/")]
    for workload in shortflows.WORKLOADS:
        series = [e for e in cellular if e["label"].endswith(f"/{workload}")]
        assert len(series) == len(shortflows.BASELINES) + 1
        # same sizes at the same trace points for every CC
        assert len({(tuple(e["sizes"]), tuple(e["offsets_s"])) for e in series}) == 1
    steps = by_label["cellular/bbr/mix"]["offsets_s"][:3]
    assert steps == [0.0, shortflows.TRACE_STEP_S, 2 * shortflows.TRACE_STEP_S]
    assert len(by_label["satellite/cubic/1mb"]["sizes"]) == 3
    assert set(by_label["satellite/cubic/mix"]["offsets_s"]) == {0.0}  # a fixed-rate path
    assert "satellite/fusion-tuned/1mb" not in by_label  # no tuned θ given


def test_a_series_summary_is_its_transfers_figures():
    times = [1.0, 2.0, 3.0, 10.0]
    series = {
        "transfers": [
            {"size": 10**6, "completion_s": s, "throughput_mbps": 8 / s, "retransmits": 2}
            | {"cc_in_kernel": "bbr"}
            for s in times
        ]
    }
    s = shortflows.summary(series)
    assert (s["mean_s"], s["median_s"], s["transfers"]) == (4.0, 2.5, 4)
    assert s["p95_s"] == pytest.approx(8.95)  # inclusive: 3 + 0.85 · 7
    assert s["mean_mbps"] == pytest.approx(statistics.fmean(8 / t for t in times))
    assert s["retransmits"] == 2 and s["ccs_in_kernel"] == ["bbr"]


def test_bad_fewer_is_named():
    assert shortflows.parse_fewer("satellite=5,10") == ("satellite", 5, 10)
    with pytest.raises(ValueError, match="PATH=N_1MB,N_MIX"):
        shortflows.parse_fewer("satellite=5")
