"""Model refresh time as history grows: Booster's planner against a plain scikit-optimize tell.

Both see the same aggregated trials (random θ across 50 contexts, utilities from the synthetic
surface). Booster's refit is everything a refresh does: bound the model, fit the contextual GP
(cold: no previous kernel; warm: the previous refit's kernel as start), and plan all 50 contexts.
The baseline is ``skopt.Optimizer(...).tell(X, y)`` with the context as a Categorical dimension
(one-hot encoded by scikit-optimize), which is what "plain scikit-optimize" does with contexts.
Target: Booster ≤ 5 s at 5,000 trials.

    python -m benchmarks.refit [--sizes 100 1000 5000] [--plain-max 1000]
"""

from __future__ import annotations

import argparse
import time
import warnings
from datetime import UTC, datetime

import numpy as np
from skopt import Optimizer
from skopt.space import Categorical, Integer

from gemini_api.theta import load_spec
from gemini_booster import simulation as sim
from gemini_booster.domain import FlowSums, Trial
from gemini_booster.models import Policy
from gemini_booster.policy.planner import Planner, PolicyState

from .common import write_result

N_CONTEXTS = 50


def make_data(n: int, rng: np.random.Generator):
    spec = load_spec()
    bounds = spec.region_bounds("production")
    ctxs = []
    for i in range(N_CONTEXTS):
        key = ("eu-west", "cdn-a", f"region-{i // 5}", f"isp-{i}", (i * 7) % 24)
        ctxs.append(sim.SyntheticContext(key, tuple(rng.uniform(0, 1, 7)), 100.0, 40.0, 5.0))
    trials, X, y = [], [], []
    now = datetime.now(UTC)
    for j in range(n):
        c = j % N_CONTEXTS
        theta = {p: int(rng.integers(lo, hi + 1)) for p, (lo, hi) in bounds.items()}
        agg = sim.make_aggregate(ctxs[c], theta, 1.0, 30, rng)
        trials.append(
            Trial(
                c + 1,
                spec.key(theta),
                FlowSums(
                    agg.flow_count,
                    agg.throughput_mbps_sum,
                    agg.throughput_mbps_sq_sum,
                    agg.queue_delay_ms_sum,
                    agg.queue_delay_ms_sq_sum,
                    agg.throughput_queue_delay_sum,
                ),
                agg.slow_flow_count,
                1,
                now,
            )
        )
        X.append([theta[p] for p in spec.names] + [f"ctx-{c}"])
        y.append(-(agg.throughput_mbps_sum - agg.queue_delay_ms_sum) / agg.flow_count)
    contexts = {i + 1: c.key for i, c in enumerate(ctxs)}
    return trials, contexts, X, y


def plain_tell(X, y) -> float:
    spec = load_spec()
    dims = [Integer(*p.production, name=p.name) for p in spec.params]
    dims.append(Categorical([f"ctx-{i}" for i in range(N_CONTEXTS)], name="context"))
    opt = Optimizer(
        dims, base_estimator="GP", acq_func="gp_hedge", n_initial_points=1, random_state=0
    )
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt.tell(X, y)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 5000])
    ap.add_argument("--plain-max", type=int, default=1000)
    args = ap.parse_args()
    planner = Planner(load_spec())
    policy = Policy(id=1, name="bench", revision=1)
    rows = []
    for n in args.sizes:
        trials, contexts, X, y = make_data(n, np.random.default_rng(n))
        state = PolicyState()
        t0 = time.perf_counter()
        plans = planner.plan(policy, trials, contexts, contexts.keys(), state)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        planner.plan(policy, trials, contexts, contexts.keys(), state)
        warm = time.perf_counter() - t0
        plain = plain_tell(X, y) if n <= args.plain_max else None
        plain_txt = f"{plain:.2f}" if plain is not None else "not run (O(n³); > plain-max)"
        ratio = f"{plain / cold:.1f}×" if plain is not None else "–"
        rows.append(
            f"| {n:,} | {min(n, policy.max_model_points)} | {len(plans)} | "
            f"**{cold:.2f}** | {warm:.2f} | {plain_txt} | {ratio} |"
        )
        print(rows[-1], flush=True)
    write_result(
        "refit",
        "python -m benchmarks.refit "
        + " ".join(["--sizes", *map(str, args.sizes), "--plain-max", str(args.plain_max)]),
        [
            f"{N_CONTEXTS} contexts; θ in Θ (production); model bounded at "
            f"{policy.max_model_points} points. Times in seconds, same process, same data.",
            "",
            "| trials | model points | contexts planned | Booster refit, cold "
            "| Booster refit, warm | plain skopt `tell` (one-hot contexts) "
            "| plain ÷ Booster cold |",
            "| --- | --- | --- | --- | --- | --- | --- |",
            *rows,
        ],
    )


if __name__ == "__main__":
    main()
