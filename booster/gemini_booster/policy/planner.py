"""The planner: from a policy's trials to the θ each context should run next (eq. 8).

For every context h' Booster serves, the planner answers two things:
  - the incumbent: the observed θ in h' with the best posterior mean (the GP's denoised
    estimate of eq. 9), which most hosts run;
  - exploration candidates: argmax over θ of an acquisition function evaluated at h = h',
    handed to the share of hosts that explore, several distinct θ so that hosts which share a
    context explore in parallel.

**Data.** ``history.py`` turns stored trials (sums per context, θ and time bucket) into
observations: buckets outside the history window dropped, each context's data before a detected
change of its path dropped (drift), buckets of one θ added, each moved to its context's common
hour where the hours differ beyond their noise (``levels.py``: an hour's level is shared by
every θ that ran in it, and the model has no term for it).

**Model, by mode.**
  - ``contextual`` (eq. 8, contexts pooled): the surrogate c·Matérn(θ)·k_h(h) has its
    hyperparameters fitted by marginal likelihood on a *fit set* of at most
    ``max_model_points`` observations, drawn round-robin over contexts, most-measured first.
    Each planned context then gets its own exact GP with those hyperparameters, conditioned on
    all of its own observations (up to ``LOCAL_OWN_MAX``) plus the fit set, which carries what
    the other contexts learned; the context kernel decides how much of it applies. Every trial
    of every planned context informs its plan, at the cost of one small Cholesky per context,
    instead of a single GP capped at a few hundred points. Utilities enter the pooled model in
    each context's own units (``context_scales``: its own level, and a spread in proportion to
    its flows' spread), so that a 60 Mbit/s path and an 8 Mbit/s one share a shape, not a scale.
  - ``independent``: one GP per context on its own observations, hyperparameters fitted per
    context; nothing is pooled. The baseline that measures what pooling is worth.
  - ``standard``: the paper's context-blind BO; one GP over θ for all contexts, one plan,
    conditioned on the fit set and up to ``LOCAL_OWN_MAX`` of the most-measured others. A
    policy of a single context is fitted this way whatever its mode (``model_mode``).

**Incumbent** (its rules in ``incumbent.py``, the candidate slots in ``slots.py``). Before a
context's model is fitted (its initial design), the best measured θ replaces the published
incumbent only when its mean is higher by ``SWITCH_Z`` standard deviations of the difference,
the two means taken over the hour buckets both θ ran in where they share some (``_paired``).
After it, a challenger replaces the published incumbent only when its posterior mean is
higher with confidence (``SWITCH_Z`` standard deviations of the difference, their covariance
included); a change of path found by ``history.py`` lifts that protection. Hosts keep their
exploration role (``assignment.py``), and a published candidate not yet run keeps its slot
while the acquisition still rates it, so that a refit moves few hosts.

**Transfer.** In ``contextual`` mode a context that has run fewer than ``n_initial_points``
distinct θ (too few for a view of its own: the point where ``independent`` mode leaves its
initial design) may also take as incumbent a θ it has never run: the best, by its own
posterior mean, of the θ the *fleet* has measured (the fit set's θ and the other contexts'
published incumbents). It replaces the context's own choice (or, with no
data of its own, the default θ it would run) only when the posterior says it is better with
``TRANSFER_Z`` standard deviations of the difference, covariance included: the same test as a
challenger's, at a stricter bar because no flow of this context has confirmed it. Where the
context kernel finds contexts unalike, the posterior at a θ the context never ran is wide and
nothing moves; a tail context whose hosts never explore gets what the fleet learned. Once its
hosts run the θ, its own flows are data like any other, and once it has run
``n_initial_points`` θ its own trials decide alone: a transferred θ that does worse here
is unseated by the ordinary switching rule (``tests/test_longtail_planner.py``).

**Exploration cost.** The acquisition's picks are limited to θ the model expects to lose at
most ``EXPLORE_MAX_LOSS`` of the incumbent's utility (|utility| when it is negative): its
scores elsewhere are set aside, unless fewer than ``N_CANDIDATES`` searched points qualify,
when the search is not capped. A fleet's explorers are real users' flows; a θ the model
already rates far below the incumbent teaches it little that cheaper neighbours of the best θ
do not, and costs those flows the whole gap. The cap does not apply to the initial design or
to the challenger, and a context whose pool runs out of qualifying new points fills the rest
at random, as a crowded pool does. It is relative to the incumbent's utility, whose zero
depends on σ (eq. 9): at a σ where utilities are near zero it tightens; measured at σ 0.1.

**Acquisition.** Chosen per refit by GP-Hedge (Hoffman et al.), as scikit-optimize's
``Optimizer`` does: each of EI, PI and LCB proposes, one is picked with probability
softmax(η·gains), and every proposer is credited with the model's later estimate of its pick.
It is maximised over the whole region by ``acquisition.py``: a pool, then batched polish.
For ``RECOVERY_HOURS`` after a detected change of its path a context uses EI instead: the
hedge's gains were earned on the old surface and by then favour PI, whose picks stay next to
the best θ seen and crawl from the old optimum toward the new one.

Until a context (``independent``) or the policy (otherwise) has ``n_initial_points`` distinct
θ, candidates come from a space-filling initial design (a maximin Latin hypercube).
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import numpy as np

from gemini_api.theta import ThetaSpec

from ..domain import ContextKey, Trial
from ..models import Policy
from . import acquisition, history, levels
from .acquisition import ACQUISITIONS
from .history import Observation
from .incumbent import (
    MIN_VARIANCE,
    SWITCH_Z,
    Incumbent,
    fleet_thetas,
    own_incumbent,
    pool_incumbent,
    transferred,
)
from .local_gp import KernelParams, LocalGP, Training
from .slots import N_CANDIDATES, fill_slots
from .surrogate import CONTEXT_ATTRIBUTES, ThetaSpace, fit_surrogate

LOCAL_OWN_MAX = 400  # a context's own observations in its local model, most-measured first
EXPLORE_MAX_LOSS = 0.05  # explorers' θ: expected utility ≥ incumbent's − this × |incumbent's|
# (chosen on benchmarks/optimiser.py, optimiser-exploration.md, with acquisition.XI at 0.1:
# against no cap, shared24 fleet regret 4.74 -> 3.89 % (lower in 20 of 20 seeds) and worst
# context @30 2.60 -> 2.46 %; lab fleet regret 3.96 -> 3.83 % over 80 seeds; drift @30
# 1.99 -> 1.57 %, recovery 7.5 -> 7 rounds)
HEDGE_ETA = 1.0
RECOVERY_HOURS = 6.0  # after a detected change of path, a context re-explores with EI this long
RECOVERY_ACQUISITION = "EI"  # (chosen on benchmarks/optimiser.py's drift landscape, 40 seeds)
DESIGN_CACHE_MAX = 20_000  # contexts' initial designs kept between refits
MIN_SCALE_POINTS = 3  # a context's own observations needed for its own units
MIN_FLOW_SPREAD = 1e-9  # utility units: a context whose flows never varied


@dataclass(frozen=True)
class ContextPlan:
    incumbent: dict[str, int]
    incumbent_utility: float | None
    candidates: tuple[dict[str, int], ...]
    acquisition: str


@dataclass
class PolicyState:
    """What the planner remembers between refits of one policy (in memory only; a takeover
    starts afresh and loses nothing it cannot find again in the data and the plans)."""

    gains: dict[str, float] = field(default_factory=lambda: dict.fromkeys(ACQUISITIONS, 0.0))
    last_picks: dict[int, dict[str, dict[str, int]]] = field(default_factory=dict)
    warm_kernel: object | None = None
    warm_key: tuple | None = None
    context_kernels: dict[int, object] = field(default_factory=dict)  # independent mode
    changes: dict[int, datetime] = field(default_factory=dict)  # drift: regime starts
    model_points: int = 0  # observations that informed the last refit's plans


def recovering(state: PolicyState, now: datetime | None) -> set[int]:
    """Contexts whose current regime (since a detected change of path) began at most
    RECOVERY_HOURS before ``now`` (none without a clock)."""
    if now is None:
        return set()
    return {
        c for c, start in state.changes.items() if now - start <= timedelta(hours=RECOVERY_HOURS)
    }


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


def model_mode(mode: str, contexts: Mapping[int, ContextKey]) -> str:
    """The model a refit fits: every mode over a single context is ``standard``.

    With one context the modes are one model: the context kernel only ever compares h with
    itself (a constant factor of the amplitude, whose weights no data can inform), and one GP
    per context is one GP. Fitted apart, their plans on the same data differed only by the
    random restarts of the extra hyperparameters and the order of the draws."""
    return "standard" if len(contexts) <= 1 else mode


def most_measured(obs: Iterable[Observation]) -> list[Observation]:
    """Most flows first (the least noisy means), then the most recent."""
    return sorted(obs, key=lambda o: (-o.flows, -o.last_seen, o.theta_key))


def fit_set(obs: list[Observation], max_points: int) -> list[Observation]:
    """Up to ``max_points`` observations for the hyperparameter fit: round-robin over contexts,
    each context's most-measured first, so every context is represented and none dominates.
    (Keeping each context's *best* means instead would keep mostly lucky noise.)"""
    if len(obs) <= max_points:
        return obs
    queues = [most_measured(group) for group in _by_context(obs).values()]
    out: list[Observation] = []
    depth = 0
    while len(out) < max_points:
        for q in queues:
            if depth < len(q):
                out.append(q[depth])
                if len(out) == max_points:
                    break
        depth += 1
    return out


def _by_context(obs: Iterable[Observation]) -> dict[int, list[Observation]]:
    out: dict[int, list[Observation]] = defaultdict(list)
    for o in obs:
        out[o.context_id].append(o)
    return out


@dataclass(frozen=True)
class Scale:
    """An affine map from utility to the units the pooled GP is fitted in: (u − mean)/std."""

    mean: float = 0.0
    std: float = 1.0

    @classmethod
    def of(cls, utilities: np.ndarray) -> Scale:
        std = float(np.std(utilities)) if len(utilities) else 0.0
        return cls(float(np.mean(utilities)) if len(utilities) else 0.0, std if std > 0 else 1.0)


def flow_spread(obs: Iterable[Observation]) -> float:
    """The median per-flow standard deviation of utility over observations (each one's noise
    variance, less the part from its hours' levels, is its per-flow variance over its flows)."""
    spread = float(np.sqrt(np.median([(o.noise_var - o.level_var) * o.flows for o in obs])))
    return max(spread, MIN_FLOW_SPREAD)


def context_scales(obs: list[Observation]) -> tuple[dict[int, Scale], Scale]:
    """Each context's units: its own mean utility, and the pool's spread times the ratio of
    its flows' spread to the pool's; the pool's units for contexts with fewer than
    MIN_SCALE_POINTS observations.

    Why: contexts differ in level by multiples (a fibre path's 60 Mbit/s against a mobile
    one's 8), and so do the utility differences θ makes in them. A zero-mean GP over (θ, h) in
    one pooled normalisation reverts, away from a context's data, toward the pool's mean, not
    the context's: a sparsely measured θ of a context above that mean looks worse than it is
    (below it, better), by an amount that depends on how much data lies near it; and one
    amplitude for all contexts is too wide for the low ones, so their single noisy rounds
    count for too much. In each context's own units the same relative shape is the same
    function, which is what the context kernel can pool.

    The scale is the spread of the context's *flows*, not of its observed utilities: the
    latter shrinks as exploration gathers near the optimum, which widened the prior against
    the noise and let one lucky round replace an incumbent (measured: lab regret @20
    1.22 → 1.79 %). Flow-to-flow spread is a property of the path and stays put.
    Measured on ``benchmarks/optimiser.py`` (``optimiser-context-units.md``, 20 seeds):
    shared24 fleet regret 6.10 → 4.10 % (lower in every seed), worst context @30
    3.43 → 3.16 %; lab and drift unchanged seed by seed."""
    pooled = Scale.of(np.asarray([o.utility for o in obs]))
    groups = {c: g for c, g in _by_context(obs).items() if len(g) >= MIN_SCALE_POINTS}
    if not groups:
        return {}, pooled
    ref = flow_spread(obs)
    scales = {
        c: Scale(float(np.mean([o.utility for o in g])), pooled.std * flow_spread(g) / ref)
        for c, g in groups.items()
    }
    return scales, pooled


def _seed(*parts: object) -> int:
    return zlib.crc32(repr(parts).encode())


@dataclass
class _Model:
    """One context's posterior over θ, in loss units (−(utility − mean)/std)."""

    gp: LocalGP
    y_mean: float
    y_std: float

    def posterior(self, Xt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.gp.posterior(Xt)

    def joint(self, Xt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.gp.joint(Xt)

    def utility(self, loss: np.ndarray | float) -> np.ndarray | float:
        return self.y_mean - loss * self.y_std

    def loss(self, utility: float) -> float:
        return (self.y_mean - utility) / self.y_std


class Planner:
    def __init__(self, spec: ThetaSpec):
        self.spec = spec
        # A context's initial design depends only on (region, size, seed) and costs a maximin
        # search: computed once, not at every refit of every cold context.
        self._designs: dict[tuple, list[dict[str, int]]] = {}

    def plan(
        self,
        policy: Policy,
        trials: list[Trial],
        contexts: Mapping[int, ContextKey],
        targets: Iterable[int],
        state: PolicyState,
        now: datetime | None = None,
        incumbents: Mapping[int, str] | None = None,
        candidates: Mapping[int, tuple[str, ...]] | None = None,
    ) -> dict[int, ContextPlan]:
        incumbents = dict(incumbents or {})
        candidates = candidates or {}
        bounds = policy.resolved_bounds()
        space = ThetaSpace(self.spec, bounds)
        targets = sorted(set(targets))
        obs, current = self._observations(policy, bounds, trials, state, now, incumbents)
        rng = np.random.default_rng(
            _seed(policy.id, policy.revision, len(trials), sum(o.flows for o in obs))
        )
        plan = _Refit(self, policy, space, obs, contexts, state, incumbents, candidates, rng)
        plan.trials = current  # the buckets behind ``obs``, for the paired test (``_paired``)
        plan.recovering = recovering(state, now)
        plans = plan.run(targets)
        state.model_points = plan.points_used
        return plans

    def _observations(
        self,
        policy: Policy,
        bounds: Mapping,
        trials: list[Trial],
        state: PolicyState,
        now: datetime | None,
        incumbents: dict[int, str],
    ) -> tuple[list[Observation], list[Trial]]:
        """Observations of each context's current regime, and the regime's trials (buckets);
        a context whose path changed loses its incumbent's protection."""
        recent = history.in_window(trials, now, policy.history_hours)
        # Changes are sought in each context's current regime only: a change already answered
        # is not found again, and the old regime's shift cannot mask a new one.
        regime = history.since_change(recent, state.changes)
        changes = history.change_points(regime, policy.sigma, incumbents, policy.objective)
        for c, start in changes.items():
            known = state.changes.get(c)
            if known is None or start > known:  # a change not answered yet
                state.changes[c] = start
                incumbents.pop(c, None)  # the path changed: no θ keeps its place on old merit
        current = history.since_change(recent, state.changes)
        hours = levels.bucket_levels(current, policy.sigma, incumbents, policy.objective)
        obs = history.observations(
            current, policy.sigma, self.spec, bounds, policy.objective, levels=hours
        )
        return obs, current

    def initial_design(
        self, space: ThetaSpace, bounds: Mapping, n: int, seed: int
    ) -> list[dict[str, int]]:
        key = (tuple(sorted(bounds.items())), n, seed)
        design = self._designs.get(key)
        if design is None:
            if len(self._designs) >= DESIGN_CACHE_MAX:
                self._designs.clear()
            design = self._designs[key] = space.design(n, seed)
        return design

    def clip_default(self, policy: Policy) -> dict[str, int]:
        """The spec's safe default θ, moved into the policy's region where it lies outside."""
        bounds = policy.resolved_bounds()
        return {n: min(max(v, bounds[n][0]), bounds[n][1]) for n, v in self.spec.default().items()}


class _Refit:
    """One refit of one policy: the shared fit, then a plan per target context."""

    def __init__(
        self,
        planner: Planner,
        policy: Policy,
        space: ThetaSpace,
        obs: list[Observation],
        contexts: Mapping[int, ContextKey],
        state: PolicyState,
        incumbents: Mapping[int, str],
        candidates: Mapping[int, tuple[str, ...]],
        rng: np.random.Generator,
    ):
        self.planner, self.policy, self.space, self.obs = planner, policy, space, obs
        self.bounds = policy.resolved_bounds()  # derived once: a refit checks many θ against it
        self.state, self.incumbents, self.candidates, self.rng = state, incumbents, candidates, rng
        self.by_context = _by_context(obs)
        self.mode = model_mode(policy.mode, contexts)
        self.encoder = (
            ContextEncoder(contexts, policy.time_buckets) if self.mode == "contextual" else None
        )
        self.used: set[tuple[int, str]] = set()
        self.credits: dict[str, list[float]] = defaultdict(list)
        self.shared: _Model | None = None
        self.fit_points: list[Observation] = []
        self.fit_keys: set[tuple[int, str]] = set()
        self.fit_theta = np.empty((0, space.dims))
        self.fit_codes: np.ndarray | None = None
        self.params: KernelParams | None = None
        self.base: Training | None = None
        self.y_mean, self.y_std = 0.0, 1.0
        self.recovering: set[int] = set()
        self.fleet: tuple[list[str], np.ndarray] | None = None  # _fleet_thetas
        self.trials: list[Trial] = []  # the regime's buckets behind ``obs`` (paired tests)
        self._buckets: dict[tuple[int, str], list[Trial]] | None = None  # by (context, θ)
        # contextual: each context's own level and spread (context_scales); other modes fit
        # utilities as they are (standard is context-blind, independent scales per context)
        self.scales: dict[int, Scale] = {}
        self.pooled = Scale()
        if self.mode == "contextual":
            self.scales, self.pooled = context_scales(obs)

    @property
    def points_used(self) -> int:
        return len(self.used)

    def run(self, targets: list[int]) -> dict[int, ContextPlan]:
        if self.space.dims == 0 or (self.mode != "independent" and self._cold(self.obs)):
            return {c: self._initial(c) for c in targets}
        if self.mode != "independent":
            self._fit_shared()
        plans: dict[int, ContextPlan] = {}
        standard_plan: ContextPlan | None = None
        for c in targets:
            if self.mode == "standard" and standard_plan is not None:
                plans[c] = standard_plan
                continue
            plans[c] = self._plan_context(c)
            standard_plan = plans[c]
        for acq, values in self.credits.items():
            self.state.gains[acq] += float(np.mean(values))
        return plans

    def _cold(self, obs: list[Observation]) -> bool:
        return len({o.theta_key for o in obs}) < max(self.policy.n_initial_points, 2)

    # -- models ------------------------------------------------------------------------------

    def _X(self, points: list[Observation]) -> np.ndarray:
        Xt = self.space.encode([o.theta for o in points])
        if self.encoder is None:
            return Xt
        return np.hstack([Xt, np.vstack([self.encoder.row(o.context_id) for o in points])])

    def _fit_shared(self) -> None:
        """Hyperparameters by marginal likelihood on the fit set (warm from the last refit)."""
        self.fit_points = fit_set(self.obs, self.policy.max_model_points)
        X = self._X(self.fit_points)
        key = (self.policy.revision, self.mode, X.shape[1])
        warm = self.state.warm_kernel if self.state.warm_key == key else None
        if warm is None:
            self.state.last_picks = {}  # picks from another region or mode cannot be credited
        fitted = fit_surrogate(
            X,
            *self._standardised(self.fit_points),
            context_dims=len(CONTEXT_ATTRIBUTES) if self.encoder is not None else 0,
            seed=int(self.rng.integers(2**31 - 1)),
            warm_kernel=warm,
        )
        self.state.warm_kernel, self.state.warm_key = fitted.gp.kernel_, key
        self.params = KernelParams.of(fitted.gp.kernel_)
        self.y_mean, self.y_std = fitted.y_mean, fitted.y_std
        self.fit_theta = self.space.encode([o.theta for o in self.fit_points])
        self.fit_codes = self._codes(self.fit_points)
        self.fit_keys = {(o.context_id, o.theta_key) for o in self.fit_points}
        self.used.update(self.fit_keys)
        self.base = self._training(self.fit_points, self.fit_theta, self.fit_codes)
        if self.mode == "standard":
            gp = LocalGP(self.params, self._with_own(self.obs), None)
            self.shared = _Model(gp, self.y_mean, self.y_std)

    def _codes(self, points: list[Observation]) -> np.ndarray | None:
        if self.encoder is None:
            return None
        rows = [self.encoder.row(o.context_id) for o in points]
        return np.vstack(rows) if rows else np.empty((0, len(CONTEXT_ATTRIBUTES)))

    def _scale(self, context_id: int) -> Scale:
        return self.scales.get(context_id, self.pooled)

    def _standardised(self, points: list[Observation]) -> tuple[np.ndarray, np.ndarray]:
        """Utilities and their noise variance in each point's context units (``_scale``)."""
        scales = [self._scale(o.context_id) for o in points]
        mean = np.asarray([s.mean for s in scales])
        std = np.asarray([s.std for s in scales])
        utility = np.asarray([o.utility for o in points])
        return (utility - mean) / std, np.asarray([o.noise_var for o in points]) / (std * std)

    def _scaled(self, points: list[Observation]) -> tuple[np.ndarray, np.ndarray]:
        """Utilities and noise in loss units (context units, then the shared fit's
        normalisation)."""
        y, noise = self._standardised(points)
        return (self.y_mean - y) / self.y_std, noise / (self.y_std * self.y_std)

    def _context_model(self, gp: LocalGP, context_id: int) -> _Model:
        """A context's posterior with the map from its loss units back to utility."""
        s = self._scale(context_id)
        return _Model(gp, s.mean + s.std * self.y_mean, s.std * self.y_std)

    def _training(
        self, points: list[Observation], theta: np.ndarray, codes: np.ndarray | None
    ) -> Training:
        assert self.params is not None
        return Training.factor(self.params, theta, codes, *self._scaled(points))

    def _model(self, context_id: int, own: list[Observation]) -> _Model:
        if self.mode == "standard":
            assert self.shared is not None
            return self.shared
        if self.mode == "independent":
            return self._independent_model(context_id, own)
        assert self.encoder is not None and self.params is not None
        gp = LocalGP(self.params, self._with_own(own), self.encoder.row(context_id))
        return self._context_model(gp, context_id)

    def _with_own(self, own: list[Observation]) -> Training:
        """The fit set plus up to LOCAL_OWN_MAX of ``own`` not in it, most-measured first
        (the shared fit caps what sets the hyperparameters, not what informs a plan)."""
        assert self.params is not None and self.base is not None
        extra = [
            o
            for o in most_measured(own)[:LOCAL_OWN_MAX]
            if (o.context_id, o.theta_key) not in self.fit_keys
        ]
        self.used.update((o.context_id, o.theta_key) for o in extra)
        if not extra:
            return self.base
        return self.base.extend(
            self.params,
            self.space.encode([o.theta for o in extra]),
            self._codes(extra),
            *self._scaled(extra),
        )

    def _independent_model(self, context_id: int, own: list[Observation]) -> _Model:
        points = most_measured(own)[:LOCAL_OWN_MAX]
        self.used.update((o.context_id, o.theta_key) for o in points)
        theta = self.space.encode([o.theta for o in points])
        fitted = fit_surrogate(
            theta,
            np.asarray([o.utility for o in points]),
            np.asarray([o.noise_var for o in points]),
            context_dims=0,
            seed=int(self.rng.integers(2**31 - 1)),
            warm_kernel=self.state.context_kernels.get(context_id),
        )
        self.state.context_kernels[context_id] = fitted.gp.kernel_
        self.params = KernelParams.of(fitted.gp.kernel_)
        self.y_mean, self.y_std = fitted.y_mean, fitted.y_std
        gp = LocalGP(self.params, self._training(points, theta, None), None)
        return _Model(gp, self.y_mean, self.y_std)

    # -- one context ---------------------------------------------------------------------------

    def _plan_context(self, context_id: int) -> ContextPlan:
        own = self.by_context.get(context_id, [])
        scope = self.obs if self.mode == "standard" else own
        if self.mode == "independent" and self._cold(own):
            return self._initial(context_id)
        model = self._model(context_id, own)
        self._credit(context_id, model)
        eligible = [o for o in scope if o.flows >= self.policy.min_flows]
        inc = self._incumbent(context_id, model, eligible)
        # GP-Hedge's gains were earned on the context's old surface (and favour PI, whose
        # picks hug the best point seen); a context whose path changed searches with EI.
        recovering = context_id in self.recovering and RECOVERY_ACQUISITION in ACQUISITIONS
        chosen = RECOVERY_ACQUISITION if recovering else self._choose_acquisition()
        current = self._current_candidates(context_id)
        X, score, loss = acquisition.maximise(
            self.space, model.posterior, inc.loss, chosen, inc.anchors, current, self.rng
        )
        score = _capped(score, model, loss, inc.loss)
        self.state.last_picks[context_id] = {
            a: self.space.decode(X[int(np.argmax(s)) : int(np.argmax(s)) + 1])[0]
            for a, s in score.items()
        }
        published = self.candidates.get(context_id, ())
        picks = fill_slots(
            self.planner.spec,
            self.space,
            self.bounds,
            own,
            X,
            score[chosen],
            inc.challenger,
            published,
            self.rng,
        )
        return ContextPlan(inc.theta, float(model.utility(inc.loss)), picks, chosen)

    def _incumbent(self, context_id: int, model: _Model, eligible: list[Observation]) -> Incumbent:
        """The context's incumbent and challenger (``incumbent``); in ``contextual`` mode, a θ
        the fleet measured when it beats that choice with confidence."""
        if self.mode != "contextual" and not eligible:
            return pool_incumbent(self.space, model, self.rng)
        previous = self.incumbents.get(context_id)
        default = self.planner.clip_default(self.policy)
        inc = own_incumbent(self.space, model, eligible, previous, default)
        own = self.by_context.get(context_id, [])
        if self.mode != "contextual" or not self._cold(own):  # its own trials decide
            return inc
        fleet = self._fleet_thetas()
        if not fleet[0]:
            return inc
        moved = transferred(self.planner.spec, self.space, model, fleet, own, inc.theta)
        if moved is None:
            return inc
        x = self.space.encode([moved])
        anchors = np.vstack([x, inc.anchors])
        return Incumbent(moved, float(model.posterior(x)[0][0]), anchors, inc.challenger)

    def _fleet_thetas(self) -> tuple[list[str], np.ndarray]:
        """``incumbent.fleet_thetas``, computed once per refit."""
        if self.fleet is None:
            self.fleet = fleet_thetas(
                self.planner.spec, self.space, self.bounds, self.fit_points, self.incumbents
            )
        return self.fleet

    def _current_candidates(self, context_id: int) -> np.ndarray:
        keys = self.candidates.get(context_id, ())
        thetas = [self.planner.spec.from_key(k) for k in keys]
        inside = [t for t in thetas if not self.planner.spec.violations(t, self.bounds)]
        return self.space.encode(inside) if inside else np.empty((0, self.space.dims), dtype=float)

    # -- GP-Hedge ------------------------------------------------------------------------------

    def _credit(self, context_id: int, model: _Model) -> None:
        """Credit each acquisition with this refit's estimate of what it proposed last time."""
        picks = self.state.last_picks.pop(context_id, None)
        if not picks:
            return
        for acq, theta in picks.items():
            loss, _ = model.posterior(self.space.encode([theta]))
            self.credits[acq].append(-float(loss[0]))

    def _choose_acquisition(self) -> str:
        if self.policy.acq_func != "gp_hedge":
            return self.policy.acq_func
        g = np.asarray([self.state.gains[a] for a in ACQUISITIONS])
        p = np.exp(HEDGE_ETA * (g - g.max()))
        return ACQUISITIONS[int(self.rng.choice(len(ACQUISITIONS), p=p / p.sum()))]

    # -- cold start ----------------------------------------------------------------------------

    def _published(self, context_id: int) -> dict[str, int] | None:
        """The context's published incumbent, where it lies inside the policy's region: a
        context in its initial design keeps it unless a measured θ is better by
        ``_measured_better``."""
        key = self.incumbents.get(context_id)
        if key is None:
            return None
        theta = self.planner.spec.from_key(key)
        return None if self.planner.spec.violations(theta, self.bounds) else theta

    def _initial(self, context_id: int) -> ContextPlan:
        per_context = self.mode != "standard"
        scope = self.by_context.get(context_id, []) if per_context else self.obs
        eligible = [o for o in scope if o.flows >= self.policy.min_flows]
        best = max(eligible, key=lambda o: o.utility) if eligible else None
        published = self._published(context_id)
        key = None if published is None else self.planner.spec.key(published)
        mine = next((o for o in eligible if o.theta_key == key), None)
        if published is not None and (best is None or not self._better(best, mine)):
            incumbent, inc_u = published, (None if mine is None else mine.utility)
        elif best is not None:
            incumbent, inc_u = best.theta, best.utility
        else:
            incumbent, inc_u = self.planner.clip_default(self.policy), None
        seen = {o.theta_key for o in scope}
        design = self.planner.initial_design(
            self.space,
            self.bounds,
            self.policy.n_initial_points,
            _seed("design", self.policy.id, self.policy.revision, context_id if per_context else 0),
        )
        spec = self.planner.spec
        todo = tuple(t for t in design if spec.key(t) not in seen)[:N_CANDIDATES]
        if not todo:  # the design is done but too few distinct θ overall: random ones
            return ContextPlan(
                incumbent, inc_u, tuple(self.space.sample(N_CANDIDATES, self.rng)), "random"
            )
        return ContextPlan(incumbent, inc_u, todo, "initial design")

    def _better(self, best: Observation, published: Observation | None) -> bool:
        """``_measured_better``, over the buckets both θ ran in where they share some
        (``_paired``): two observations of one context (a context-blind plan's pool may hold
        them from two contexts, which share no hour's conditions, and compares them as is)."""
        if published is not None and published.context_id == best.context_id:
            best, published = self._paired(best.context_id, best, published)
        return _measured_better(best, published)

    def _paired(
        self, context_id: int, best: Observation, published: Observation
    ) -> tuple[Observation, Observation]:
        """The two θ measured over the time buckets both ran in, as measured (no hour levels):
        the initial design's test then compares them under the same conditions.

        Hosts run the incumbent and the explorers side by side, so every θ a context explored
        shares its buckets with the incumbent; the incumbent's other buckets are other hours.
        Compared over all of them, a θ explored only at a good hour beats one measured at good
        and bad hours by the hours' difference, not by its own: the FlashPass mix tuning left
        the paper's θ twice so when its rounds ran seeds a factor of two apart (benchmarks/
        results/flashpass.md, "Why the mix tuning left the paper's θ"). Over the shared buckets
        the hours cancel exactly, so the hour levels' estimate and its noise are not wanted
        here, also when the two ran in exactly the same buckets. Unchanged when they share
        none."""
        if self._buckets is None:
            self._buckets = defaultdict(list)
            for t in self.trials:
                self._buckets[(t.context_id, t.theta_key)].append(t)
        mine = self._buckets.get((context_id, best.theta_key), [])
        theirs = self._buckets.get((context_id, published.theta_key), [])
        a, b = {t.bucket for t in mine}, {t.bucket for t in theirs}
        shared = a & b
        if not shared:
            return best, published
        both = [t for t in mine + theirs if t.bucket in shared]
        pol = self.policy
        paired = history.observations(
            both, pol.sigma, self.planner.spec, self.bounds, pol.objective
        )
        by_key = {o.theta_key: o for o in paired}
        if best.theta_key not in by_key or published.theta_key not in by_key:
            return best, published
        return by_key[best.theta_key], by_key[published.theta_key]


def _measured_better(best: Observation, published: Observation | None) -> bool:
    """Whether the best measured θ of a context in its initial design replaces the published
    incumbent: when that was not measured, or when the best's mean is higher by SWITCH_Z
    standard deviations of the difference of the two means (their noise from ``history``).

    Before the model is fitted nothing else can tell a θ's worth from its luck. The design's
    θ have a flow or a bucket each, and the best of them is the luckiest as often as the best:
    taken as incumbent on its mean alone (on wifi-jitter a design θ's one flow at 26.8 against
    the default's 26.7), it was served on that flow's word, and the switching rule then
    protected it. A θ measured better on many flows (60 against 20 Mbit/s) still takes over."""
    if published is None:
        return True
    if best.theta_key == published.theta_key:
        return False
    sd = float(np.sqrt(max(best.noise_var + published.noise_var, MIN_VARIANCE)))
    return best.utility - published.utility >= SWITCH_Z * sd


def _capped(
    score: dict[str, np.ndarray], model: _Model, loss: np.ndarray, inc_loss: float
) -> dict[str, np.ndarray]:
    """Every acquisition's scores, −inf at the searched points (posterior loss ``loss``) the
    model expects to lose more than EXPLORE_MAX_LOSS of the incumbent's utility; unchanged
    when fewer than N_CANDIDATES points are within the cap."""
    incumbent = float(model.utility(inc_loss))
    ok = np.asarray(model.utility(loss)) >= incumbent - EXPLORE_MAX_LOSS * abs(incumbent)
    if int(ok.sum()) < N_CANDIDATES:
        return score
    return {k: np.where(ok, v, -np.inf) for k, v in score.items()}
