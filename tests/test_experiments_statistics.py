"""Experiment statistics: 95 % intervals that cover a known difference in 93–97 % of 1,000
simulated experiments (hosts with random effects, flows with noise; parallel and crossover),
where an interval from the per-flow variance would not; point estimates exact from the sums;
and the guardrail stopping a harmful arm but not a harmless one."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, date, datetime, timedelta

import numpy as np
import pytest

from gemini_api.sums import Objective
from gemini_booster.domain import FlowSums
from gemini_booster.experiments import statistics as st
from gemini_booster.experiments.assignment import initial_groups
from gemini_booster.experiments.domain import (
    ArmSpec,
    ArmStop,
    Experiment,
    GuardrailSpec,
    Member,
)
from gemini_booster.experiments.guardrail import decide
from gemini_booster.experiments.statistics import HostDay

EXPERIMENTS = 1000
HOSTS_PER_ARM = 30
SIGMA = 0.5
# Per flow: throughput x (Mbit/s) and queueing delay d (ms), each = base + arm effect + host
# effect + flow noise. The host effects make flows of one host correlated.
BASE_X, BASE_D = 50.0, 20.0
DX, DD = 2.0, 1.0  # the arm's true effect on x and d
TRUE_DIFFERENCE = DX - SIGMA * DD  # on utility x − σ·d
HOST_SD_X, HOST_SD_D = 4.0, 2.0
FLOW_SD_X, FLOW_SD_D = 10.0, 5.0
MEAN_FLOWS = 20  # per host (per period): 1 + Poisson(Exponential(20)), very unequal hosts
PERIOD_EFFECT_X = 3.0  # the second period is better for everyone (crossover only)
COVERAGE = (0.93, 0.97)


def host_sizes(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return 1 + rng.poisson(rng.exponential(MEAN_FLOWS, shape))


def flow_sums(
    rng: np.random.Generator, flows: np.ndarray, mean_x: np.ndarray, mean_d: np.ndarray
) -> dict[str, np.ndarray]:
    """Per-host FlowSums columns (shape of ``flows``) from per-flow draws around each host's
    means: every flow is drawn, so the sums are exactly those of real flows."""
    owner = np.repeat(np.arange(flows.size), flows.ravel())
    x = mean_x.ravel()[owner] + rng.normal(0, FLOW_SD_X, owner.size)
    d = mean_d.ravel()[owner] + rng.normal(0, FLOW_SD_D, owner.size)

    def total(v: np.ndarray) -> np.ndarray:
        return np.bincount(owner, weights=v, minlength=flows.size).reshape(flows.shape)

    return {
        "n": flows.astype(float),
        "x": total(x),
        "xx": total(x * x),
        "d": total(d),
        "dd": total(d * d),
        "xd": total(x * d),
    }


def utility(s: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per-host Σu and Σu² for u = x − σ·d, from the sums alone."""
    u = s["x"] - SIGMA * s["d"]
    uu = s["xx"] - 2 * SIGMA * s["xd"] + SIGMA**2 * s["dd"]
    return u, uu


@pytest.fixture(scope="module")
def parallel() -> dict[str, np.ndarray]:
    """1,000 experiments; in each, HOSTS_PER_ARM hosts per arm, the arm's hosts last."""
    rng = np.random.default_rng(20261123)
    shape = (EXPERIMENTS, 2 * HOSTS_PER_ARM)
    arm = np.zeros(shape, dtype=bool)
    arm[:, HOSTS_PER_ARM:] = True
    mean_x = BASE_X + DX * arm + rng.normal(0, HOST_SD_X, shape)
    mean_d = BASE_D + DD * arm + rng.normal(0, HOST_SD_D, shape)
    return flow_sums(rng, host_sizes(rng, shape), mean_x, mean_d)


def covers(r: st.Ratios, truth: float) -> float:
    low, high = st.interval(r)
    return float(np.mean((low <= truth) & (truth <= high)))


def test_interval_of_the_difference_covers_the_truth_93_to_97_percent(parallel) -> None:
    u, _ = utility(parallel)
    n = parallel["n"]
    ctl = st.ratio(u[:, :HOSTS_PER_ARM], n[:, :HOSTS_PER_ARM])
    arm = st.ratio(u[:, HOSTS_PER_ARM:], n[:, HOSTS_PER_ARM:])
    coverage = covers(st.parallel_difference(arm, ctl), TRUE_DIFFERENCE)
    print(f"parallel: 95 % interval of the difference covers the truth in {coverage:.1%}")
    assert COVERAGE[0] <= coverage <= COVERAGE[1]


def test_interval_of_one_arm_covers_its_mean(parallel) -> None:
    u, _ = utility(parallel)
    n = parallel["n"]
    coverage = covers(st.ratio(u[:, :HOSTS_PER_ARM], n[:, :HOSTS_PER_ARM]), BASE_X - SIGMA * BASE_D)
    print(f"one arm: 95 % interval of its mean utility covers the truth in {coverage:.1%}")
    assert COVERAGE[0] <= coverage <= COVERAGE[1]


def test_a_per_flow_interval_would_be_far_too_narrow(parallel) -> None:
    """Why intervals are over hosts: treating correlated flows as independent (var/N, as
    ``FlowSums.utility`` gives for one set of flows) covers the truth much less often."""
    u, uu = utility(parallel)
    n = parallel["n"]

    def per_flow(cols: slice) -> tuple[np.ndarray, np.ndarray]:
        total, sq, flows = u[:, cols].sum(1), uu[:, cols].sum(1), n[:, cols].sum(1)
        mean = total / flows
        return mean, (sq - flows * mean**2) / (flows - 1) / flows

    (mc, vc), (ma, va) = per_flow(slice(0, HOSTS_PER_ARM)), per_flow(slice(HOSTS_PER_ARM, None))
    naive = float(np.mean(np.abs(ma - mc - TRUE_DIFFERENCE) <= 1.96 * np.sqrt(va + vc)))
    print(f"per-flow 95 % interval covers the truth in {naive:.1%}")
    assert naive < 0.8


def test_crossover_interval_covers_the_truth_despite_a_period_effect() -> None:
    """AB/BA: every host runs control one period and the arm the other; the second period is
    better for everyone. The within-host, period-adjusted interval covers in 93–97 %."""
    rng = np.random.default_rng(8)
    hosts = 2 * HOSTS_PER_ARM
    shape = (EXPERIMENTS, hosts, 2)  # (experiment, host, period)
    arm_first = np.zeros((EXPERIMENTS, hosts), dtype=bool)
    arm_first[:, : HOSTS_PER_ARM // 2] = True  # unequal sequence groups: 15 against 45
    on_arm = np.stack([arm_first, ~arm_first], axis=-1)
    period = np.broadcast_to(np.arange(2), shape)
    host_x = rng.normal(0, HOST_SD_X, (EXPERIMENTS, hosts, 1))
    host_d = rng.normal(0, HOST_SD_D, (EXPERIMENTS, hosts, 1))
    mean_x = BASE_X + DX * on_arm + PERIOD_EFFECT_X * period + host_x
    mean_d = BASE_D + DD * on_arm + host_d
    s = flow_sums(rng, host_sizes(rng, shape), mean_x, mean_d)
    u, _ = utility(s)

    def under(mask: np.ndarray, v: np.ndarray) -> np.ndarray:
        return np.where(mask, v, 0.0).sum(-1)

    r = st.crossover_difference(
        under(on_arm, u),
        under(on_arm, s["n"]),
        under(~on_arm, u),
        under(~on_arm, s["n"]),
        arm_first,
    )
    coverage = covers(r, TRUE_DIFFERENCE)
    bias = float(np.mean(r.mean) - TRUE_DIFFERENCE)
    print(f"crossover: covers the truth in {coverage:.1%}, mean error {bias:+.3f}")
    assert COVERAGE[0] <= coverage <= COVERAGE[1]
    assert abs(bias) < 0.1  # the period effect (3 Mbit/s) is removed


# --- the completion-time objective: Σbits/Σduration − σ·Σd/Σn, two ratios over hosts ---------

# Per flow: size b (Mbit, lognormal), duration b / the host's rate, plus a timeout's wait with
# some probability; the arm is 10 % faster but waits out a timeout twice as often.
RATE, HOST_RATE_SD = 50.0, 0.3  # Mbit/s, and the host effect (log scale)
TIMEOUT_S, TIMEOUT_P = (0.2, 0.02)
ARM_SPEED, ARM_TIMEOUT_P = 1.1, 0.04


def completion_sums(
    rng: np.random.Generator, flows: np.ndarray, arm: np.ndarray
) -> dict[str, np.ndarray]:
    """Per-host Σbits, Σseconds, Σdelay and flow counts (shape of ``flows``) from per-flow
    draws."""
    owner = np.repeat(np.arange(flows.size), flows.ravel())
    host_rate = RATE * np.exp(rng.normal(0, HOST_RATE_SD, flows.size))
    on_arm = arm.ravel()[owner]
    b = rng.lognormal(0.0, 1.0, owner.size)
    p = np.where(on_arm, ARM_TIMEOUT_P, TIMEOUT_P)
    t = b / (host_rate[owner] * np.where(on_arm, ARM_SPEED, 1.0))
    t = t + TIMEOUT_S * (rng.random(owner.size) < p)
    d = rng.normal(BASE_D, FLOW_SD_D, owner.size)

    def total(v: np.ndarray) -> np.ndarray:
        return np.bincount(owner, weights=v, minlength=flows.size).reshape(flows.shape)

    return {"b": total(b), "t": total(t), "d": total(d), "n": flows.astype(float)}


def completion_of(s: dict[str, np.ndarray], cols: slice) -> st.Ratios:
    n = s["n"][..., cols]
    terms = [(1.0, s["b"][..., cols], s["t"][..., cols]), (-SIGMA, s["d"][..., cols], n)]
    return st.combination(terms, n)


def test_completion_interval_covers_the_truth_93_to_97_percent() -> None:
    """Parallel arms compared by completion time: the jackknife over hosts of the two-ratio
    combination covers the true difference (from a 200,000-host population) in 93–97 %."""
    rng = np.random.default_rng(20261128)
    shape = (EXPERIMENTS, 2 * HOSTS_PER_ARM)
    arm = np.zeros(shape, dtype=bool)
    arm[:, HOSTS_PER_ARM:] = True
    s = completion_sums(rng, host_sizes(rng, shape), arm)
    big = completion_sums(rng, host_sizes(rng, (1, 200_000)), np.arange(200_000)[None] % 2 == 1)
    truth = completion_of(big, slice(1, None, 2)).mean - completion_of(big, slice(0, None, 2)).mean
    diff = st.parallel_difference(
        completion_of(s, slice(HOSTS_PER_ARM, None)), completion_of(s, slice(0, HOSTS_PER_ARM))
    )
    coverage = covers(diff, float(truth[0]))
    print(f"completion: covers the truth ({float(truth[0]):+.3f}) in {coverage:.1%}")
    assert COVERAGE[0] <= coverage <= COVERAGE[1]


def test_the_combinations_variance_is_the_leave_one_host_out_jackknife() -> None:
    rng = np.random.default_rng(3)
    hosts = 12
    b, t = rng.uniform(5, 50, hosts), rng.uniform(0.5, 3, hosts)
    d, n = rng.uniform(10, 100, hosts), rng.integers(1, 30, hosts).astype(float)
    r = st.combination([(1.0, b, t), (-SIGMA, d, n)], n)

    def f(keep: np.ndarray) -> float:
        return b[keep].sum() / t[keep].sum() - SIGMA * d[keep].sum() / n[keep].sum()

    whole = f(np.ones(hosts, dtype=bool))
    without = np.array([f(np.arange(hosts) != h) for h in range(hosts)])
    assert float(r.mean) == pytest.approx(whole, rel=1e-12)
    assert float(r.var) == pytest.approx((hosts - 1) / hosts * ((without - whole) ** 2).sum())
    one = st.combination([(1.0, b, t)], t)
    assert float(one.var) == pytest.approx(float(st.ratio(b, t).var), rel=1e-12)


# --- results from records, and the guardrail -------------------------------------------------

START = datetime(2026, 12, 1, tzinfo=UTC)
DAYS = [date(2026, 12, 1) + timedelta(days=i) for i in range(3)]


def make_experiment(
    arm_names: tuple[str, ...], n_hosts: int, crossover: date | None = None
) -> Experiment:
    hosts = {f"h{i:03d}": "eu" if i % 2 else "us" for i in range(n_hosts)}
    split = tuple([1 / len(arm_names)] * len(arm_names))
    groups = initial_groups(hosts, split, "stats")
    return Experiment(
        id=1,
        name="stats",
        description="",
        salt="stats",
        arms=tuple(
            ArmSpec(name=a, cc="cubic" if i == 0 else "bbr") for i, a in enumerate(arm_names)
        ),
        control=arm_names[0],
        split=split,
        hosts={h: Member(r, groups[h]) for h, r in hosts.items()},
        start=START,
        end=START + timedelta(days=len(DAYS)),
        crossover_day=crossover,
        sigma=SIGMA,
        guardrail=None,
        created_at=START,
        created_by="test",
    )


def records(
    e: Experiment, effect: dict[str, float], seed: int, flows_per_day: int = 20
) -> list[HostDay]:
    """Per host and day, real per-flow draws folded into FlowSums: the arm's effect on
    throughput, a host effect, flow noise; slow flows counted below 0.8 Mbit/s."""
    rng = np.random.default_rng(seed)
    out = []
    for host, m in e.hosts.items():
        host_x = rng.normal(0, HOST_SD_X)
        for day in DAYS:
            arm = e.arms[(m.group + e.period(day)) % len(e.arms)].name
            n = 1 + rng.poisson(flows_per_day)
            x = rng.normal(BASE_X + effect[arm] + host_x, FLOW_SD_X * 4, n)
            d = rng.normal(BASE_D, FLOW_SD_D, n)
            sums = FlowSums.total(FlowSums.of_flow(a, b) for a, b in zip(x, d, strict=True))
            out.append(HostDay(arm, host, day, sums, int((x < 0.8).sum())))
    return out


def test_point_estimates_are_exact_from_the_sums() -> None:
    e = make_experiment(("control", "treat"), 40)
    recs = records(e, {"control": 0.0, "treat": 5.0}, seed=1)
    for sigma in (0.0, SIGMA, 10.0):
        r = st.results(e, recs, sigma)
        for a in r.overall.arms:
            mine = [x for x in recs if x.arm == a.arm]
            total = FlowSums.total(x.sums for x in mine)
            assert a.flows == total.flow_count
            assert a.hosts == len({x.host for x in mine})
            assert a.metrics["utility"].mean == pytest.approx(total.utility(sigma).mean, rel=1e-12)
            assert a.metrics["throughput"].mean == pytest.approx(total.mean_throughput, rel=1e-12)
            assert a.metrics["delay"].mean == pytest.approx(total.mean_delay, rel=1e-12)
            slow = sum(x.slow_flows for x in mine) / total.flow_count
            assert a.metrics["slow_share"].mean == pytest.approx(slow, rel=1e-12)
            u = a.metrics["utility"]
            assert u.low is not None and u.high is not None and u.low < u.mean < u.high
        assert [d.day for d in r.days] == DAYS
        for day in r.days:
            on_day = FlowSums.total(x.sums for x in recs if x.day == day.day)
            assert sum(a.flows for a in day.arms) == on_day.flow_count
        [diff] = r.overall.differences
        arms = {a.arm: a.metrics["utility"].mean for a in r.overall.arms}
        assert diff.method == "parallel" and diff.arm == "treat" and diff.control == "control"
        assert diff.metrics["utility"].mean == pytest.approx(arms["treat"] - arms["control"])


def test_crossover_results_compare_within_host() -> None:
    """With a crossover on day 2, the overall difference is within host; before any host has
    run both arms it is the parallel one of the first period."""
    e = make_experiment(("control", "treat"), 40, crossover=DAYS[1])
    recs = records(e, {"control": 0.0, "treat": 5.0}, seed=2)
    r = st.results(e, recs)
    [diff] = r.overall.differences
    assert diff.method == "crossover" and diff.hosts == 40
    u = diff.metrics["utility"]
    assert u.low is not None and u.high is not None and u.low < 5.0 < u.high
    assert [d.period for d in r.days] == [0, 1, 1]
    first_day_only = st.results(e, [x for x in recs if x.day == DAYS[0]])
    assert first_day_only.overall.differences[0].method == "parallel_first_period"


def completion_records(e: Experiment, seed: int) -> list[HostDay]:
    """Per host and day, real flows folded into both objectives' sums: the second arm's
    flows are twice as fast but one in five waits out a 1 s timeout."""
    rng = np.random.default_rng(seed)
    out = []
    for host, m in e.hosts.items():
        for day in DAYS:
            arm = e.arms[(m.group + e.period(day)) % len(e.arms)].name
            n = 1 + rng.poisson(20)
            size = rng.integers(50_000, 2_000_000, n)
            fast = arm != e.control
            us = size * 8 / (80.0 if fast else 40.0) + 1_000_000 * (fast & (rng.random(n) < 0.2))
            d = rng.uniform(0, 10, n)
            flows = zip(size, us, d, strict=True)
            sums = FlowSums.total(FlowSums.of_record(int(a), int(b), float(q)) for a, b, q in flows)
            out.append(HostDay(arm, host, day, sums, 0))
    return out


def test_completion_results_are_exact_from_the_sums_and_follow_the_objective() -> None:
    e = replace(make_experiment(("control", "treat"), 40), objective=Objective.COMPLETION)
    recs = completion_records(e, seed=5)
    r = st.results(e, recs)
    for a in r.overall.arms:
        done = FlowSums.total(x.sums for x in recs if x.arm == a.arm).completion
        assert a.flows == done.flow_count
        want = done.utility(SIGMA).mean
        assert a.metrics["utility"].mean == pytest.approx(want, rel=1e-12)
        rate = done.mbit_sum / done.seconds_sum
        assert a.metrics["throughput"].mean == pytest.approx(rate, rel=1e-12)
        assert a.metrics["delay"].mean == pytest.approx(done.delay_sum / done.flow_count)
    [diff] = r.overall.differences
    eq9 = st.results(replace(e, objective=Objective.FLOW_MEAN), recs).overall.differences[0]
    # The timeouts cost the treated arm more time than its speed saves in all (completion),
    # though its mean flow is faster (eq. 9): each objective's verdict is its own.
    assert diff.metrics["utility"].mean is not None and eq9.metrics["utility"].mean is not None
    assert diff.metrics["utility"].mean < 0 < eq9.metrics["utility"].mean
    crossed = replace(e, crossover_day=DAYS[1])
    [within] = st.results(crossed, completion_records(crossed, seed=6)).overall.differences
    assert within.method == "crossover" and within.metrics["utility"].mean is not None
    assert within.metrics["utility"].mean < 0


def guardrail_arms(seed: int) -> tuple[Experiment, list[HostDay]]:
    """Control, an arm 10 Mbit/s worse (harmful beyond the 2 Mbit/s margin), and an arm
    as good as control (harmless)."""
    e = make_experiment(("control", "harmful", "harmless"), 90)
    return e, records(e, {"control": 0.0, "harmful": -10.0, "harmless": 0.0}, seed)


GUARD = GuardrailSpec(margin=2.0, confidence=0.95, min_hosts=5)


@pytest.mark.parametrize("seed", range(20))
def test_guardrail_stops_a_harmful_arm_and_not_a_harmless_one(seed: int) -> None:
    e, recs = guardrail_arms(seed)
    decisions = {d.arm: d for d in decide(e, st.results(e, recs, days=[]), GUARD)}
    assert set(decisions) == {"harmful", "harmless"}
    assert decisions["harmful"].stop, decisions["harmful"]
    assert not decisions["harmless"].stop, decisions["harmless"]
    assert decisions["harmful"].upper_bound is not None
    assert decisions["harmful"].upper_bound < -GUARD.margin


def test_guardrail_waits_for_enough_hosts_and_skips_stopped_arms() -> None:
    e, recs = guardrail_arms(0)
    few = [x for x in recs if x.host in {"h000", "h001", "h002", "h003", "h004", "h005"}]
    decisions = decide(e, st.results(e, few, days=[]), GUARD)
    assert decisions and not any(d.stop for d in decisions)
    assert all(d.reason.startswith("waiting") for d in decisions)
    stopped = replace(e, arm_stops={"harmful": ArmStop(START, "guardrail", "harm")})
    assert [d.arm for d in decide(stopped, st.results(stopped, recs, days=[]), GUARD)] == [
        "harmless"
    ]
