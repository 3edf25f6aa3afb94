"""The optimisers the benchmark compares, each driving the same simulated fleet.

Every method answers, per round and per context, the θ each host runs: exploring hosts (the
same hosts under every method, ``optimiser_landscapes.fleet_hosts``) run its proposals, the
others its incumbent; then it sees what those flows measured.

  - ``booster-<mode>``: Booster's planner as the service calls it: trials are the running sums
    per (context, θ key, hour bucket), ``plan()`` with the clock and the published incumbents,
    hosts assigned by ``policy.assignment.assign`` with the policy's exploration share.
  - ``skopt``: one scikit-optimize ``Optimizer`` (GP, GP-Hedge, LHS initial design) per context;
    a batch ``ask`` (constant liar) for its explorers; every θ run in a round is told the mean
    utility of its flows that round (the incumbent's included). Incumbent: the observed θ with
    the best GP-predicted utility (the GP's denoised estimate, as Booster's), or while there is
    no model yet, the best observed mean.
  - ``tpe``: one Optuna TPE study per context (ask/tell; the incumbent's rounds added as
    trials). Incumbent: the best trial.
  - ``random``: uniform θ on Θ's grid. Incumbent: the best observed mean over all its flows.
"""

from __future__ import annotations

import inspect
import warnings
import zlib
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from gemini_api.theta import load_spec
from gemini_booster.domain import FlowSums, Trial
from gemini_booster.models import Policy
from gemini_booster.policy.assignment import assign
from gemini_booster.policy.planner import ContextPlan, Planner, PolicyState

from .optimiser_landscapes import (
    EXPLORATION_SHARE,
    SIGMA,
    Landscape,
    fleet_hosts,
    make_trial,
)

INITIAL_POINTS = 8  # space-filling θ before a model leads (Booster's default)
SKOPT_ACQ_POINTS = 2000  # random points the skopt acquisition is maximised over
SKOPT_GP_RESTARTS = 0  # extra starts of the GP's hyperparameter fit (skopt's default: 2)
TIME_BUCKETS = 2  # the day in two blocks: the shared landscape's two time blocks


@dataclass(frozen=True)
class HostRun:
    """What one host ran in one context in one round, and what its flows measured."""

    host: str
    theta: dict[str, int]
    sums: FlowSums
    slow: int


@dataclass(frozen=True)
class RoundPlan:
    incumbent: dict[str, int]
    runs: dict[str, dict[str, int]]  # host → θ, every host of the context


def _key(theta: dict[str, int]) -> str:
    return load_spec().key(theta)


def _by_theta(runs: list[HostRun]) -> dict[str, tuple[dict[str, int], FlowSums, int, int]]:
    """One round's runs in one context merged per θ: (θ, sums, slow flows, hosts)."""
    out: dict[str, tuple[dict[str, int], FlowSums, int, int]] = {}
    for r in runs:
        k = _key(r.theta)
        if k in out:
            theta, sums, slow, hosts = out[k]
            out[k] = (theta, sums + r.sums, slow + r.slow, hosts + 1)
        else:
            out[k] = (r.theta, r.sums, r.slow, 1)
    return out


class Method:
    """One optimiser over one landscape and seed."""

    name = "method"

    def __init__(self, landscape: Landscape, seed: int):
        self.landscape = landscape
        self.seed = seed
        self.hosts = {c: fleet_hosts(k) for c, k in landscape.contexts.items()}
        self.policy = make_policy(landscape, "contextual", seed)

    def plan(self, round_index: int, now: datetime) -> dict[int, RoundPlan]:
        raise NotImplementedError

    def observe(self, round_index: int, runs: dict[int, list[HostRun]]) -> None:
        raise NotImplementedError

    @property
    def model_points(self) -> int | None:
        return None


def make_policy(landscape: Landscape, mode: str, seed: int) -> Policy:
    """The benchmark's policy: defaults except σ, the landscape's region and two time blocks."""
    return Policy(
        id=seed + 1,
        name=f"bench-{mode}",
        revision=1,
        sigma=SIGMA,
        mode=mode,  # a mode the service does not know fails validation here
        region="custom",
        bounds=landscape.bounds(),
        exploration_share=EXPLORATION_SHARE,
        time_buckets=TIME_BUCKETS,
        n_initial_points=INITIAL_POINTS,
    )


class BoosterMethod(Method):
    def __init__(self, landscape: Landscape, seed: int, mode: str):
        super().__init__(landscape, seed)
        self.name = f"booster-{mode}"
        self.policy = make_policy(landscape, mode, seed)
        self.planner = Planner(load_spec())
        self.state = PolicyState()
        self.trials: list[Trial] = []
        self.incumbents: dict[int, str] = {}
        self.candidates: dict[int, tuple[str, ...]] = {}
        # The published candidates keep their slots in planners that take them (later ones).
        self.pass_candidates = "candidates" in inspect.signature(Planner.plan).parameters

    def plan(self, round_index: int, now: datetime) -> dict[int, RoundPlan]:
        contexts = self.landscape.contexts
        extra = {"candidates": dict(self.candidates)} if self.pass_candidates else {}
        plans = self.planner.plan(
            self.policy,
            self.trials,
            contexts,
            contexts.keys(),
            self.state,
            now=now,
            incumbents=dict(self.incumbents),
            **extra,
        )
        out = {}
        for c, p in plans.items():
            self.incumbents[c] = _key(p.incumbent)
            self.candidates[c] = tuple(_key(t) for t in p.candidates)
            out[c] = RoundPlan(p.incumbent, self.host_runs(c, p, now))
        return out

    def host_runs(self, c: int, p: ContextPlan, now: datetime) -> dict[str, dict[str, int]]:
        """The θ each of context ``c``'s hosts runs under plan ``p`` (the fixed assignment)."""
        explore, exploit = self.hosts[c]
        key = self.landscape.contexts[c]
        share = self.policy.exploration_share
        return {h: assign(h, key, p.incumbent, p.candidates, share)[0] for h in explore + exploit}

    def observe(self, round_index: int, runs: dict[int, list[HostRun]]) -> None:
        for c, host_runs in runs.items():
            for k, (_, sums, slow, hosts) in _by_theta(host_runs).items():
                self.trials.append(make_trial(c, k, sums, slow, hosts, round_index))

    @property
    def model_points(self) -> int | None:
        return getattr(self.state, "model_points", None)


class PerContextBaseline(Method):
    """A baseline with one independent optimiser per context and the same fleet."""

    def __init__(self, landscape: Landscape, seed: int):
        super().__init__(landscape, seed)
        self.default = Planner(load_spec()).clip_default(self.policy)
        self.bounds = self.policy.resolved_bounds()
        self.dims = landscape.dims
        self.totals: dict[int, dict[str, tuple[dict[str, int], FlowSums]]] = defaultdict(dict)

    def context_seed(self, context_id: int) -> int:
        return zlib.crc32(f"{self.name}|{self.seed}|{context_id}".encode())

    def theta(self, values) -> dict[str, int]:
        out = dict(self.default)
        out.update({n: int(v) for n, v in zip(self.dims, values, strict=True)})
        return out

    def best_observed(self, context_id: int) -> dict[str, int]:
        """The θ with the best mean utility over all its flows (the default before any)."""
        seen = self.totals[context_id]
        if not seen:
            return self.default
        theta, _ = max(seen.values(), key=lambda v: v[1].utility(SIGMA).mean)
        return theta

    def incumbent(self, context_id: int) -> dict[str, int]:
        return self.best_observed(context_id)

    def propose(self, context_id: int, n: int) -> list[dict[str, int]]:
        raise NotImplementedError

    def tell(self, context_id: int, means: list[tuple[dict[str, int], float]]) -> None:
        """Each θ run this round with the mean utility of its flows."""

    def plan(self, round_index: int, now: datetime) -> dict[int, RoundPlan]:
        out = {}
        for c in self.landscape.contexts:
            explore, exploit = self.hosts[c]
            inc = self.incumbent(c)
            proposals = self.propose(c, len(explore))
            runs = dict(zip(explore, proposals, strict=True))
            runs.update(dict.fromkeys(exploit, inc))
            out[c] = RoundPlan(inc, runs)
        return out

    def observe(self, round_index: int, runs: dict[int, list[HostRun]]) -> None:
        for c, host_runs in runs.items():
            means = []
            for k, (theta, sums, _, _) in _by_theta(host_runs).items():
                prev = self.totals[c].get(k)
                self.totals[c][k] = (theta, sums if prev is None else prev[1] + sums)
                means.append((theta, sums.utility(SIGMA).mean))
            self.tell(c, means)


class RandomMethod(PerContextBaseline):
    name = "random"

    def __init__(self, landscape: Landscape, seed: int):
        super().__init__(landscape, seed)
        self.rngs = {c: np.random.default_rng(self.context_seed(c)) for c in landscape.contexts}

    def propose(self, context_id: int, n: int) -> list[dict[str, int]]:
        rng = self.rngs[context_id]
        return [
            self.theta([rng.integers(self.bounds[d][0], self.bounds[d][1] + 1) for d in self.dims])
            for _ in range(n)
        ]


class SkoptMethod(PerContextBaseline):
    name = "skopt"

    def __init__(self, landscape: Landscape, seed: int):
        super().__init__(landscape, seed)
        from skopt import Optimizer
        from skopt.space import Integer
        from skopt.utils import cook_estimator

        space = [Integer(*self.bounds[d], name=d) for d in self.dims]
        self.opts = {}
        for c in landscape.contexts:
            # skopt's own GP ("GP": Matérn 5/2 with a length scale per parameter, fitted
            # Gaussian noise, normalised y) with one optimiser start per fit instead of three:
            # a batch ask refits once per explorer, and 24 contexts × 30 rounds of threefold
            # fits do not fit this benchmark's time on two cores.
            seed_c = self.context_seed(c) % 2**31
            gp = cook_estimator("GP", space=space, random_state=seed_c, noise="gaussian")
            gp.set_params(n_restarts_optimizer=SKOPT_GP_RESTARTS)
            self.opts[c] = Optimizer(
                space,
                base_estimator=gp,
                acq_func="gp_hedge",
                acq_optimizer="sampling",
                acq_optimizer_kwargs={"n_points": SKOPT_ACQ_POINTS},
                n_initial_points=INITIAL_POINTS,
                initial_point_generator="lhs",
                random_state=seed_c,
            )

    def propose(self, context_id: int, n: int) -> list[dict[str, int]]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            points = self.opts[context_id].ask(n_points=n, strategy="cl_min")
        return [self.theta(p) for p in points]

    def tell(self, context_id: int, means: list[tuple[dict[str, int], float]]) -> None:
        X = [[t[d] for d in self.dims] for t, _ in means]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.opts[context_id].tell(X, [-m for _, m in means])

    def incumbent(self, context_id: int) -> dict[str, int]:
        opt = self.opts[context_id]
        if not opt.models:
            return self.best_observed(context_id)
        mu = opt.models[-1].predict(opt.space.transform(opt.Xi))
        return self.theta(opt.Xi[int(np.argmin(mu))])


class TpeMethod(PerContextBaseline):
    name = "tpe"

    def __init__(self, landscape: Landscape, seed: int):
        super().__init__(landscape, seed)
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.optuna = optuna
        self.dists: dict[str, optuna.distributions.BaseDistribution] = {
            d: optuna.distributions.IntDistribution(*self.bounds[d]) for d in self.dims
        }
        self.studies = {
            c: optuna.create_study(
                direction="maximize",
                sampler=optuna.samplers.TPESampler(
                    seed=self.context_seed(c) % 2**31, n_startup_trials=INITIAL_POINTS
                ),
            )
            for c in landscape.contexts
        }
        self.pending: dict[int, dict[str, list]] = defaultdict(lambda: defaultdict(list))

    def propose(self, context_id: int, n: int) -> list[dict[str, int]]:
        study = self.studies[context_id]
        out = []
        for _ in range(n):
            trial = study.ask(self.dists)
            theta = self.theta([trial.params[d] for d in self.dims])
            self.pending[context_id][_key(theta)].append(trial)
            out.append(theta)
        return out

    def tell(self, context_id: int, means: list[tuple[dict[str, int], float]]) -> None:
        study = self.studies[context_id]
        pending = self.pending.pop(context_id, {})
        for theta, mean in means:
            asked = pending.get(_key(theta))
            if asked:
                for trial in asked:
                    study.tell(trial, mean)
            else:  # the incumbent's hosts
                study.add_trial(
                    self.optuna.trial.create_trial(
                        params={d: theta[d] for d in self.dims},
                        distributions=self.dists,
                        value=mean,
                    )
                )

    def incumbent(self, context_id: int) -> dict[str, int]:
        study = self.studies[context_id]
        if not any(t.value is not None for t in study.trials):
            return self.best_observed(context_id)
        best = study.best_trial.params
        return self.theta([best[d] for d in self.dims])


BOOSTER_MODES = ("contextual", "standard", "independent")
METHODS = (*(f"booster-{m}" for m in BOOSTER_MODES), "skopt", "tpe", "random")


def make_method(name: str, landscape: Landscape, seed: int) -> Method:
    if name.startswith("booster-"):
        return BoosterMethod(landscape, seed, name.removeprefix("booster-"))
    return {"skopt": SkoptMethod, "tpe": TpeMethod, "random": RandomMethod}[name](landscape, seed)
