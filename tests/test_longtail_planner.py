"""Transfer to a context without data of its own, and its safety (issue 33).

Six donor contexts, each measured well on a grid of θ, agree that θ near (30, 1) beats the
default θ by a third. A seventh context, one host that never explores, shares a destination
region and ISP with one donor; its only data is the default θ. Once its flows at the default
show it at the donors' level there, the pooled model predicts the donors' θ for it with
confidence, and it moves there (within ``TRANSFER_ROUNDS`` refits). On the landscape where that
prediction is wrong (its own surface peaks at the default, and the donors' θ loses 45 %), its
own flows, 20 a round at 30 % noise, bring its incumbent back to a θ no worse than the default
within ``BACK_ROUNDS`` rounds, and it stays there.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np

from gemini_api.theta import load_spec
from gemini_booster.domain import ContextKey, FlowSums, Trial
from gemini_booster.models import Policy
from gemini_booster.policy.planner import Planner, PolicyState

SPEC = load_spec()
T0 = datetime(2026, 3, 1, tzinfo=UTC)
BOUNDS = {p.name: (p.default, p.default) for p in SPEC.params} | {
    "mult_decrease": (10, 99),
    "loss_threshold": (0, 10),
}
DONOR_PEAK = (0.225, 0.1)  # θ (30, 1)
TARGET = 7
CONTEXTS = {
    c: ContextKey("eu-west", "cdn-a", region, isp, 3)
    for c, (region, isp) in enumerate(
        [(r, i) for r in ("r0", "r1", "r2") for i in ("fiber", "cable")], start=1
    )
} | {TARGET: ContextKey("eu-west", "cdn-a", "r0", "fiber", 15)}
NOISE = 0.30  # relative std of one flow's utility
FLOWS_PER_ROUND = 20
ROUNDS = 12
TRANSFER_ROUNDS = 6  # refits within which the target takes the fleet's θ
BACK_ROUNDS = 6  # rounds after the move within which the context's own flows undo it


def policy() -> Policy:
    return Policy(
        id=1, revision=1, name="p", region="custom", bounds=BOUNDS, mode="contextual",
        time_buckets=2,
    )  # fmt: skip


def theta(a: int, b: int) -> dict[str, int]:
    return {p.name: p.default for p in SPEC.params} | {"mult_decrease": a, "loss_threshold": b}


def x(th: dict[str, int]) -> tuple[float, float]:
    return (th["mult_decrease"] - 10) / 89, th["loss_threshold"] / 10


def donor_utility(th: dict[str, int]) -> float:
    a, b = x(th)
    return 100.0 - 60.0 * ((a - DONOR_PEAK[0]) ** 2 + (b - DONOR_PEAK[1]) ** 2)


DEFAULT = theta(SPEC.default()["mult_decrease"], SPEC.default()["loss_threshold"])


def target_utility(th: dict[str, int]) -> float:
    """The target's own surface: its peak at the default θ, at the donors' level there."""
    a, b = x(th)
    d = x(DEFAULT)
    return donor_utility(DEFAULT) - 60.0 * ((a - d[0]) ** 2 + (b - d[1]) ** 2)


def flows(mean: float, n: int, rng: np.random.Generator) -> FlowSums:
    values = mean * (1.0 + NOISE * rng.standard_normal(n))
    return FlowSums.total(FlowSums.of_flow(v, 0.0) for v in values)


def trial(c: int, th: dict[str, int], sums: FlowSums, hour: int) -> Trial:
    when = T0 + timedelta(hours=hour)
    return Trial(c, SPEC.key(th), sums, 0, 1, when, when)


def donor_trials(rng: np.random.Generator) -> list[Trial]:
    grid = [theta(a, b) for a in (10, 30, 55, 85, 99) for b in (0, 1, 5, 10)]
    return [
        trial(c, th, flows(donor_utility(th), 60, rng), 0)
        for c in CONTEXTS
        if c != TARGET
        for th in grid
    ]


def run_target(rounds: int) -> list[dict[str, int]]:
    """The target's incumbent after each refit, its single host running it every round."""
    rng = np.random.default_rng(33)
    planner, pol, state = Planner(SPEC), policy(), PolicyState()
    trials = [
        *donor_trials(rng),
        trial(TARGET, DEFAULT, flows(target_utility(DEFAULT), 20, rng), 0),
    ]
    incumbents: dict[int, str] = {}
    out = []
    for r in range(1, rounds + 1):
        plans = planner.plan(
            pol, trials, CONTEXTS, [TARGET], state, now=T0 + timedelta(hours=r),
            incumbents=dict(incumbents),
        )  # fmt: skip
        inc = plans[TARGET].incumbent
        out.append(inc)
        incumbents[TARGET] = SPEC.key(inc)
        trials.append(trial(TARGET, inc, flows(target_utility(inc), FLOWS_PER_ROUND, rng), r))
    return out


def test_a_context_with_only_the_default_takes_the_theta_the_fleet_predicts_best_for_it():
    incumbents = run_target(TRANSFER_ROUNDS)
    moved = [th for th in incumbents if th != DEFAULT]
    assert moved, "the target stayed at the default"
    assert donor_utility(moved[0]) > donor_utility(DEFAULT) + 10.0  # toward the donors' optimum


def test_where_the_pooled_prediction_is_wrong_its_own_flows_bring_it_back():
    incumbents = run_target(ROUNDS)
    moved = next(i for i, th in enumerate(incumbents) if th != DEFAULT)
    assert target_utility(incumbents[moved]) < target_utility(DEFAULT) - 10.0  # it was wrong
    back = moved + BACK_ROUNDS
    floor = target_utility(DEFAULT) - 1.0  # within 1 % of the default's utility
    assert all(target_utility(th) >= floor for th in incumbents[back:]), [
        (i, SPEC.key(th), round(target_utility(th), 1)) for i, th in enumerate(incumbents)
    ]
