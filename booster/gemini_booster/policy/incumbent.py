"""The incumbent: the θ a context publishes as its best, and the challenger measured against it.

Every host of a context that is not exploring runs its incumbent, so changing it is the
decision with the most traffic behind it. Each rule is a comparison under the context's
posterior (loss units, lower is better) that counts the two θ's covariance:

- **own**: among the θ this context ran with enough flows, the lowest posterior loss; but a
  published incumbent is kept unless that best beats it by ``SWITCH_Z`` std of the difference —
  the best is then the *challenger*, measured again in a candidate slot (``slots``);
- **none run**: the policy's default θ (clipped into its region), or in the context-blind and
  independent modes the best point of a random pool under the posterior;
- **transfer** (contextual mode, a context with fewer θ of its own than the initial design):
  the fleet-measured θ it never ran that its posterior rates best, when that beats the own
  incumbent by ``TRANSFER_Z`` std. The fleet's θ are each context's most-measured and the
  published incumbents, inside the region (``fleet_thetas``).

Plain functions over a posterior: the refit (``planner``) owns the state and calls them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from gemini_api.theta import Bounds, ThetaSpec

from . import acquisition
from .history import Observation
from .surrogate import ThetaSpace

ANCHORS = 5  # the best observed θ of a context whose neighbourhoods are searched
SWITCH_Z = 1.0  # a challenger must beat the incumbent by this many std of the difference
# (chosen on benchmarks/optimiser.py, optimiser-switch-bar.md: against 1.5, shared24's worst
# context @30 3.16 -> 2.89 % and mean 1.58 -> 1.36 %; the plateau landscape, where every θ is
# within 1 %, changed no incumbent in its last 10 rounds at either bar (median of 20 seeds),
# and 0.0 changed 6.5. On tests/test_planner.py's flat surface, where the incumbent is measured
# no better than 15 rivals, noise unseats it in 5 of 40 refits, 1 at 1.5, 9 at 0.75.)
TRANSFER_Z = 2.0  # a θ this context never ran must beat its incumbent by this many std
# (one-sided ≈ 98 % under the posterior; SWITCH_Z's 1.0 is for θ the context's own flows measured)
MIN_VARIANCE = 1e-12  # the difference's variance floor: two θ the model cannot tell apart


class Posterior(Protocol):
    """A context's model over encoded θ rows, in loss units."""

    def posterior(self, Xt: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...
    def joint(self, Xt: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass(frozen=True)
class Incumbent:
    theta: dict[str, int]
    loss: float  # its posterior loss
    anchors: np.ndarray  # the best observed points, whose neighbourhoods are searched
    challenger: dict[str, int] | None  # the best by posterior mean, not yet better with confidence


def beats(model: Posterior, new: np.ndarray, old: np.ndarray, z: float) -> bool:
    """Whether θ row ``new`` has a lower loss than ``old`` by ``z`` std of the difference."""
    mu, cov = model.joint(np.vstack([new, old]))
    sd_diff = float(np.sqrt(max(cov[0, 0] + cov[1, 1] - 2 * cov[0, 1], MIN_VARIANCE)))
    return bool(mu[1] - mu[0] >= z * sd_diff)


def own_incumbent(
    space: ThetaSpace,
    model: Posterior,
    eligible: Sequence[Observation],
    previous: str | None,
    default: dict[str, int],
) -> Incumbent:
    """The incumbent among the θ this context ran (``default`` when it ran none); the
    ``previous`` published one is kept until the best beats it with confidence."""
    if not eligible:
        x = space.encode([default])
        return Incumbent(default, float(model.posterior(x)[0][0]), x[:0], None)
    uniq = {o.theta_key: o for o in eligible}
    keys = list(uniq)
    X = space.encode([uniq[k].theta for k in keys])
    loss, _ = model.posterior(X)
    order = np.argsort(loss)
    best = int(order[0])
    challenger = None
    if previous in uniq and keys[best] != previous:
        p = keys.index(previous)
        if not beats(model, X[best], X[p], SWITCH_Z):  # not better with confidence: keep it
            challenger, best = uniq[keys[best]].theta, p
    return Incumbent(uniq[keys[best]].theta, float(loss[best]), X[order[:ANCHORS]], challenger)


def pool_incumbent(space: ThetaSpace, model: Posterior, rng: np.random.Generator) -> Incumbent:
    """A context with no eligible θ in a mode without a default rule: the best of a random
    pool under the posterior."""
    X = space.sample_points(acquisition.POOL_RANDOM, rng)
    loss, _ = model.posterior(X)
    best = int(np.argmin(loss))
    return Incumbent(space.decode(X[best : best + 1])[0], float(loss[best]), X[:0], None)


def fleet_thetas(
    spec: ThetaSpec,
    space: ThetaSpace,
    bounds: Bounds,
    fit_points: Sequence[Observation],
    incumbents: Mapping[int, str],
) -> tuple[list[str], np.ndarray]:
    """The θ the fleet measured that a context may take without running them first: the fit
    set's (each context's most-measured) and the published incumbents, inside the region."""
    thetas = {o.theta_key: o.theta for o in fit_points}
    for key in incumbents.values():
        if key not in thetas:
            theta = spec.from_key(key)
            if not spec.violations(theta, bounds):
                thetas[key] = theta
    keys = sorted(thetas)
    X = space.encode([thetas[k] for k in keys]) if keys else np.empty((0, 0))
    return keys, X


def transferred(
    spec: ThetaSpec,
    space: ThetaSpace,
    model: Posterior,
    fleet: tuple[list[str], np.ndarray],
    own: Sequence[Observation],
    incumbent: dict[str, int],
) -> dict[str, int] | None:
    """The fleet-measured θ this context never ran that its posterior rates best, when it
    beats ``incumbent`` by TRANSFER_Z std of the difference; otherwise None."""
    keys, X = fleet
    run = {o.theta_key for o in own}
    new = [i for i, k in enumerate(keys) if k not in run]
    if not new:
        return None
    loss, _ = model.posterior(X[new])
    best = new[int(np.argmin(loss))]
    if not beats(model, X[best], space.encode([incumbent])[0], TRANSFER_Z):
        return None
    return spec.from_key(keys[best])
