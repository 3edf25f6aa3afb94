"""The planner: from a policy's trials to the θ each context should run next (eq. 8).

For every context h' Booster serves, the planner answers two things:
  - the incumbent: the observed θ in h' with the best posterior mean (the GP's denoised
    estimate of eq. 9), which most hosts run;
  - exploration candidates: argmax over θ of an acquisition function evaluated at h = h',
    handed to the share of hosts that explore, several distinct θ so that hosts which share a
    context explore in parallel.
Until a policy has ``n_initial_points`` distinct θ, candidates come from a space-filling
initial design per context (a maximin Latin hypercube, ordered farthest point first). The
acquisition is chosen per refit by GP-Hedge (Hoffman et al.), as scikit-optimize's ``Optimizer``
does: each of EI, PI and LCB proposes, one is picked with probability
softmax(η·gains), and every proposer is credited with the model's later estimate of its pick.

The model is kept bounded: trials older than the policy's history window are dropped (drift),
trials with the same θ in the same context are already one point, and past
``max_model_points`` the planner keeps each context's best trials and the most recent rest.
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
from skopt.acquisition import gaussian_ei, gaussian_lcb, gaussian_pi

from gemini_api.theta import ThetaSpec

from ..domain import SINGLE_FLOW_STD, ContextKey, Trial, Utility
from ..models import Policy
from .surrogate import CONTEXT_ATTRIBUTES, FittedSurrogate, ThetaSpace, fit_surrogate

N_CANDIDATES = 8
POOL_RANDOM = 500
POOL_LOCAL_PER_ANCHOR = 60
LOCAL_STEP = 0.08  # std of local perturbations, in normalised θ units
MIN_CANDIDATE_DISTANCE = 0.05  # normalised L∞ distance between parallel candidates
BEST_PER_CONTEXT = 5
PRIOR_FLOWS = 4  # weight, in flows, of a context's pooled per-flow variance in a trial's noise
HEDGE_ETA = 1.0
ACQUISITIONS = ("EI", "PI", "LCB")


@dataclass(frozen=True)
class ContextPlan:
    incumbent: dict[str, int]
    incumbent_utility: float | None
    candidates: tuple[dict[str, int], ...]
    acquisition: str


@dataclass
class PolicyState:
    """What the planner remembers between refits of one policy (in memory only)."""

    gains: dict[str, float] = field(default_factory=lambda: dict.fromkeys(ACQUISITIONS, 0.0))
    last_picks: dict[int, dict[str, dict[str, int]]] = field(default_factory=dict)
    warm_kernel: object | None = None
    warm_key: tuple | None = None


@dataclass(frozen=True)
class Observation:
    context_id: int
    theta: dict[str, int]
    utility: float
    noise_var: float
    flows: int
    last_seen: float


@dataclass(frozen=True)
class _Posterior:
    """The GP's posterior at one candidate pool, computed once and handed to all of
    scikit-optimize's acquisition functions (which would otherwise each predict again)."""

    loss: np.ndarray
    std: np.ndarray

    def predict(self, X, return_std: bool = True):
        return self.loss, self.std


def context_features(key: ContextKey, time_buckets: int) -> tuple:
    src_region, src_isp, dst_region, dst_isp, hour = key
    return (src_region, src_isp, dst_region, dst_isp, hour * time_buckets // 24)


class ContextEncoder:
    """Categorical context attributes → stable integer codes (compared by ContextKernel)."""

    def __init__(self, contexts: Mapping[int, ContextKey], time_buckets: int):
        self.time_buckets = time_buckets
        self.codes: list[dict] = [{} for _ in CONTEXT_ATTRIBUTES]
        for key in sorted(contexts.values()):
            for j, value in enumerate(context_features(key, time_buckets)):
                self.codes[j].setdefault(value, len(self.codes[j]))
        self.contexts = contexts

    def row(self, context_id: int) -> np.ndarray:
        feats = context_features(self.contexts[context_id], self.time_buckets)
        return np.asarray([self.codes[j][v] for j, v in enumerate(feats)], dtype=float)


def _pooled_flow_var(per_trial: list[tuple[int, Utility]]) -> dict[int, float]:
    """Per context, the per-flow variance of utility pooled over its trials of 2+ flows."""
    num: dict[int, float] = defaultdict(float)
    dof: dict[int, int] = defaultdict(int)
    for context_id, u in per_trial:
        if u.flows >= 2:
            num[context_id] += u.var_of_mean * u.flows * (u.flows - 1)
            dof[context_id] += u.flows - 1
    return {c: num[c] / dof[c] for c in dof if num[c] > 0}


def shrunk_noise(u: Utility, pooled: float | None) -> float:
    """Variance of a trial's mean, its per-flow variance shrunk toward the context's pooled one
    with the weight of PRIOR_FLOWS flows. Two flows that happen to agree say little about the
    spread: taken at face value they would pin the model to a lucky mean."""
    prior = SINGLE_FLOW_STD**2 if pooled is None else pooled
    sample = u.var_of_mean * u.flows if u.flows >= 2 else 0.0
    dof = max(u.flows - 1, 0)
    return (dof * sample + PRIOR_FLOWS * prior) / (dof + PRIOR_FLOWS) / u.flows


def observations(
    trials: Iterable[Trial], sigma: float, spec: ThetaSpec, bounds: Mapping
) -> list[Observation]:
    per_trial = []
    for t in trials:
        if t.flow_count <= 0:
            continue
        theta = spec.from_key(t.theta_key)
        if spec.violations(theta, bounds):
            continue  # measured under an earlier, wider region: not a point of this space
        u = t.sums.utility(sigma)
        per_trial.append((t, theta, u))
    pooled = _pooled_flow_var([(t.context_id, u) for t, _, u in per_trial])
    return [
        Observation(
            t.context_id,
            theta,
            u.mean,
            shrunk_noise(u, pooled.get(t.context_id)),
            t.flow_count,
            t.last_seen.timestamp(),
        )
        for t, theta, u in per_trial
    ]


def bound_points(obs: list[Observation], max_points: int) -> list[Observation]:
    """Each context's best trials, then the most recent others, up to ``max_points``."""
    if len(obs) <= max_points:
        return obs
    by_ctx: dict[int, list[int]] = defaultdict(list)
    for i, o in enumerate(obs):
        by_ctx[o.context_id].append(i)
    keep: set[int] = set()
    for idx in by_ctx.values():
        keep.update(sorted(idx, key=lambda i: -obs[i].utility)[:BEST_PER_CONTEXT])
    for i in sorted(range(len(obs)), key=lambda i: -obs[i].last_seen):
        if len(keep) >= max_points:
            break
        keep.add(i)
    return [obs[i] for i in sorted(keep)][:max_points]


def _seed(*parts: object) -> int:
    return zlib.crc32(repr(parts).encode())


DESIGN_CACHE_MAX = 20_000  # contexts' initial designs kept between refits


class Planner:
    def __init__(self, spec: ThetaSpec):
        self.spec = spec
        # A context's initial design depends only on (region, size, seed) and costs a maximin
        # search: computed once, not at every refit of every cold context.
        self._designs: dict[tuple, list[dict[str, int]]] = {}

    def _initial_design(
        self, space: ThetaSpace, bounds: Mapping, n: int, seed: int
    ) -> list[dict[str, int]]:
        key = (tuple(sorted(bounds.items())), n, seed)
        design = self._designs.get(key)
        if design is None:
            if len(self._designs) >= DESIGN_CACHE_MAX:
                self._designs.clear()
            design = self._designs[key] = space.design(n, seed)
        return design

    def plan(
        self,
        policy: Policy,
        trials: list[Trial],
        contexts: Mapping[int, ContextKey],
        targets: Iterable[int],
        state: PolicyState,
        now: datetime | None = None,
        incumbents: Mapping[int, str] | None = None,
    ) -> dict[int, ContextPlan]:
        bounds = policy.resolved_bounds()
        space = ThetaSpace(self.spec, bounds)
        targets = sorted(set(targets))
        obs = observations(trials, policy.sigma, self.spec, bounds)
        rng = np.random.default_rng(
            _seed(policy.id, policy.revision, len(trials), sum(o.flows for o in obs))
        )
        distinct = {self.spec.key(o.theta) for o in obs}
        if len(distinct) < max(policy.n_initial_points, 2) or space.dims == 0:
            return {c: self._initial_plan(policy, space, obs, c, rng) for c in targets}
        contextual = policy.mode == "contextual"
        points = bound_points(obs, policy.max_model_points)
        encoder = ContextEncoder(contexts, policy.time_buckets) if contextual else None
        X = self._design(space, points, encoder)
        model = self._fit(policy, state, X, points, contextual, rng)
        self._credit_hedge(state, space, encoder, model)
        plans = {}
        shared = None
        for c in targets:
            if not contextual and shared is not None:
                plans[c] = shared
                continue
            plans[c] = self._context_plan(policy, space, points, encoder, model, c, state, rng)
            shared = plans[c]
        return plans

    # -- building blocks -------------------------------------------------------------------

    def _design(self, space: ThetaSpace, points: list[Observation], encoder) -> np.ndarray:
        Xt = space.encode([o.theta for o in points])
        if encoder is None:
            return Xt
        return np.hstack([Xt, np.vstack([encoder.row(o.context_id) for o in points])])

    def _fit(self, policy, state, X, points, contextual, rng) -> FittedSurrogate:
        key = (policy.revision, X.shape[1])
        warm = state.warm_kernel if state.warm_key == key else None
        if warm is None:
            state.last_picks = {}  # picks from another region or mode cannot be credited
        model = fit_surrogate(
            X,
            np.asarray([o.utility for o in points]),
            np.asarray([o.noise_var for o in points]),
            context_dims=len(CONTEXT_ATTRIBUTES) if contextual else 0,
            seed=int(rng.integers(2**31 - 1)),
            warm_kernel=warm,
        )
        state.warm_kernel, state.warm_key = model.gp.kernel_, key
        return model

    def _with_context(self, Xt: np.ndarray, encoder, context_id: int) -> np.ndarray:
        if encoder is None:
            return Xt
        return np.hstack([Xt, np.tile(encoder.row(context_id), (len(Xt), 1))])

    def _credit_hedge(self, state: PolicyState, space, encoder, model) -> None:
        """Credit each acquisition with the refitted model's estimate of what it proposed."""
        credit = defaultdict(list)
        for c, picks in state.last_picks.items():
            if encoder is not None and c not in encoder.contexts:
                continue
            for acq, theta in picks.items():
                X = self._with_context(space.encode([theta]), encoder, c)
                mu, _ = model.predict(X)
                credit[acq].append(-model.to_loss(mu[0]))
        for acq, values in credit.items():
            state.gains[acq] += float(np.mean(values))
        state.last_picks = {}

    def _choose_acquisition(self, policy: Policy, state: PolicyState, rng) -> str:
        if policy.acq_func != "gp_hedge":
            return policy.acq_func
        g = np.asarray([state.gains[a] for a in ACQUISITIONS])
        p = np.exp(HEDGE_ETA * (g - g.max()))
        return ACQUISITIONS[int(rng.choice(len(ACQUISITIONS), p=p / p.sum()))]

    def _pool(self, space: ThetaSpace, anchors: np.ndarray, rng) -> np.ndarray:
        random_pts = space.encode(space.sample(POOL_RANDOM, rng))
        if len(anchors) == 0:
            return random_pts
        local = anchors[:, None, :] + rng.normal(
            0.0, LOCAL_STEP, size=(len(anchors), POOL_LOCAL_PER_ANCHOR, space.dims)
        )
        local = space.encode(space.decode(local.reshape(-1, space.dims)))  # onto the grid
        return np.unique(np.vstack([anchors, local, random_pts]), axis=0)

    def _context_plan(self, policy, space, points, encoder, model, context_id, state, rng):
        in_ctx = [o for o in points if encoder is None or o.context_id == context_id]
        eligible = [o for o in in_ctx if o.flows >= policy.min_flows]
        anchors = (
            space.encode([o.theta for o in eligible]) if eligible else np.empty((0, space.dims))
        )
        if len(anchors):
            mu_a, _ = model.predict(self._with_context(anchors, encoder, context_id))
            order = np.argsort(-mu_a)
            anchors, mu_a = anchors[order], mu_a[order]
            incumbent, inc_mu = space.decode(anchors[:1])[0], float(mu_a[0])
            anchors = anchors[:BEST_PER_CONTEXT]
        pool = self._pool(space, anchors, rng)
        posterior = _Posterior(
            *model.gp.predict(self._with_context(pool, encoder, context_id), return_std=True)
        )
        if not len(anchors):
            best = int(np.argmin(posterior.loss))
            incumbent = space.decode(pool[best : best + 1])[0]
            inc_mu = float(model.y_mean - posterior.loss[best] * model.y_std)
        loss_opt = float(model.to_loss(inc_mu))
        scores = {
            "EI": gaussian_ei(pool, posterior, y_opt=loss_opt, xi=0.01),
            "PI": gaussian_pi(pool, posterior, y_opt=loss_opt, xi=0.01),
            "LCB": -gaussian_lcb(pool, posterior, kappa=1.96),
        }
        chosen = self._choose_acquisition(policy, state, rng)
        state.last_picks[context_id] = {
            a: space.decode(pool[int(np.argmax(s)) : int(np.argmax(s)) + 1])[0]
            for a, s in scores.items()
        }
        picks = self._diverse_top(pool, scores[chosen], N_CANDIDATES)
        candidates = tuple(space.decode(pool[picks]))
        return ContextPlan(incumbent, inc_mu, candidates, chosen)

    @staticmethod
    def _diverse_top(pool: np.ndarray, score: np.ndarray, k: int) -> list[int]:
        chosen: list[int] = []
        for i in np.argsort(-score):
            if all(np.max(np.abs(pool[i] - pool[j])) > MIN_CANDIDATE_DISTANCE for j in chosen):
                chosen.append(int(i))
                if len(chosen) == k:
                    break
        return chosen

    def _initial_plan(self, policy, space, obs, context_id, rng) -> ContextPlan:
        contextual = policy.mode == "contextual"
        scope = [o for o in obs if o.context_id == context_id] if contextual else obs
        eligible = [o for o in scope if o.flows >= policy.min_flows]
        if eligible:
            best = max(eligible, key=lambda o: o.utility)
            incumbent, inc_u = best.theta, best.utility
        else:
            incumbent, inc_u = self.clip_default(policy), None
        seen = {self.spec.key(o.theta) for o in scope}
        design = self._initial_design(
            space,
            policy.resolved_bounds(),
            policy.n_initial_points,
            _seed("design", policy.id, policy.revision, context_id if contextual else 0),
        )
        todo = tuple(t for t in design if self.spec.key(t) not in seen)[:N_CANDIDATES]
        if not todo:  # the design is done but too few distinct θ overall: random ones
            return ContextPlan(incumbent, inc_u, tuple(space.sample(N_CANDIDATES, rng)), "random")
        return ContextPlan(incumbent, inc_u, todo, "initial design")

    def clip_default(self, policy: Policy) -> dict[str, int]:
        """The spec's safe default θ, moved into the policy's region where it lies outside."""
        bounds = policy.resolved_bounds()
        return {n: min(max(v, bounds[n][0]), bounds[n][1]) for n, v in self.spec.default().items()}
