"""The Gaussian-process surrogate f(θ, h) on scikit-optimize's GP and search space.

θ is encoded by scikit-optimize's ``Space`` (Integer dimensions in spec units, so Table III's
granularity holds by construction, normalised to [0, 1]); the context by integer codes that the
``ContextKernel`` compares. Observation noise is per trial (``alpha``): var(utility)/flows.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.optimize
from sklearn.exceptions import ConvergenceWarning
from sklearn.gaussian_process.kernels import ConstantKernel, Matern
from skopt.learning import GaussianProcessRegressor
from skopt.sampler import Lhs
from skopt.space import Integer, Space

from gemini_api.theta import ThetaSpec

from .kernels import ContextKernel, OnColumns

CONTEXT_ATTRIBUTES = ("src_region", "src_isp", "dst_region", "dst_isp", "time_block")
COLD_RESTARTS = 1
# L-BFGS iterations of the marginal-likelihood search. From a warm start (the last refit's
# kernel) the optimum moves little between refits; an unbounded search at a few hundred points
# costs seconds for gains in the fourth digit of the likelihood.
COLD_ITERATIONS = 200
WARM_ITERATIONS = 30
JITTER = 1e-6
LHS_ITERATIONS = 200  # random hypercubes tried for the maximin design


class ThetaSpace:
    """θ in spec units ↔ points in [0, 1]^d; parameters pinned by the bounds are not searched."""

    def __init__(self, spec: ThetaSpec, bounds: Mapping[str, tuple[int, int]]):
        self.names = spec.names
        self.fixed = {n: bounds[n][0] for n in self.names if bounds[n][0] == bounds[n][1]}
        self.free = tuple(n for n in self.names if n not in self.fixed)
        self.space = Space(
            [Integer(bounds[n][0], bounds[n][1], name=n, transform="normalize") for n in self.free]
        )
        self._low = np.asarray([bounds[n][0] for n in self.free], dtype=float)
        self._span = np.asarray([bounds[n][1] - bounds[n][0] for n in self.free], dtype=float)

    @property
    def dims(self) -> int:
        return len(self.free)

    def sample(self, n: int, rng: np.random.Generator) -> list[dict[str, int]]:
        """``n`` θ drawn uniformly from the region's grid."""
        seed = int(rng.integers(2**31 - 1))
        return [self.theta(row) for row in self.space.rvs(n, random_state=seed)]

    def sample_points(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` grid points drawn uniformly by scikit-optimize's space, already encoded (the
        same draws as ``sample``, without a θ dict for each)."""
        if self.dims == 0:
            return np.zeros((n, 0))
        seed = int(rng.integers(2**31 - 1))
        rows = np.asarray(self.space.rvs(n, random_state=seed), dtype=float)
        return (rows.reshape(n, self.dims) - self._low) / self._span

    def grid_rows(self, points: np.ndarray) -> list[tuple[int, ...]]:
        """Grid points as tuples of steps from the lower bounds: exact keys for comparing
        points (e.g. membership in a set) where float rows would need a tolerance."""
        steps = np.rint(np.clip(points, 0.0, 1.0) * self._span).astype(np.int64)
        return [tuple(r) for r in steps.tolist()]

    def snap(self, points: np.ndarray) -> np.ndarray:
        """Points of [0, 1]^d moved onto the nearest grid point: ``encode(decode(points))``
        without building a θ for each."""
        return np.rint(np.clip(points, 0.0, 1.0) * self._span) / self._span

    def design(self, n: int, seed: int) -> list[dict[str, int]]:
        """``n`` space-filling θ for a cold start: a maximin Latin hypercube (every parameter's
        range cut in ``n`` strata, one point in each), ordered farthest point first, so that
        the first few tried already span the region instead of clustering by chance."""
        if self.dims == 0:
            return [self.theta([])]
        rows = Lhs(criterion="maximin", iterations=LHS_ITERATIONS).generate(
            self.space.dimensions, n, random_state=seed
        )
        thetas = [self.theta(r) for r in rows]
        X = self.encode(thetas)
        order = [int(np.argmax(np.abs(X - 0.5).sum(axis=1)))]  # start at a corner
        nearest = np.abs(X - X[order[0]]).max(axis=1)  # L∞ to the nearest point chosen
        while len(order) < len(thetas):
            nearest[order] = -1.0
            order.append(int(np.argmax(nearest)))
            nearest = np.minimum(nearest, np.abs(X - X[order[-1]]).max(axis=1))
        return [thetas[i] for i in order]

    def theta(self, free_values: Sequence[int]) -> dict[str, int]:
        values = dict(zip(self.free, (int(v) for v in free_values), strict=True))
        return {n: values[n] if n in values else self.fixed[n] for n in self.names}

    def encode(self, thetas: Sequence[Mapping[str, int]]) -> np.ndarray:
        """θ rows → [0, 1]^d, as scikit-optimize's ``normalize`` transform of Integer
        dimensions does, in one array operation (a refit encodes and decodes thousands)."""
        rows = np.asarray([[t[n] for n in self.free] for t in thetas], dtype=float)
        return ((rows.reshape(len(thetas), self.dims) - self._low) / self._span).reshape(
            len(thetas), self.dims
        )

    def decode(self, points: np.ndarray) -> list[dict[str, int]]:
        """Points of [0, 1]^d → the nearest θ on the grid (inverse of ``encode``)."""
        values = np.rint(np.clip(points, 0.0, 1.0) * self._span + self._low).astype(int)
        return [self.theta(row) for row in values.reshape(-1, self.dims)]


def make_kernel(theta_dims: int, context_dims: int) -> ConstantKernel:
    matern = Matern(length_scale=np.full(theta_dims, 0.5), length_scale_bounds=(0.02, 20.0), nu=2.5)
    amplitude = ConstantKernel(1.0, (1e-2, 1e2))
    if context_dims == 0:
        return amplitude * matern
    theta_cols = tuple(range(theta_dims))
    ctx_cols = tuple(range(theta_dims, theta_dims + context_dims))
    context = ContextKernel(weights=(0.1,) * (context_dims + 1))
    return amplitude * OnColumns(matern, theta_cols) * OnColumns(context, ctx_cols)


@dataclass
class FittedSurrogate:
    """A GP fit on the normalised *loss* −(f − mean)/std, the form scikit-optimize's acquisition
    functions minimise, plus the scaling that maps it back to utility units."""

    gp: GaussianProcessRegressor
    y_mean: float
    y_std: float

    def predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mu, sd = self.gp.predict(X, return_std=True)
        return self.y_mean - mu * self.y_std, sd * self.y_std

    def to_loss(self, utility: np.ndarray | float) -> np.ndarray | float:
        return (self.y_mean - utility) / self.y_std


def _lbfgs(max_iterations: int):
    """scikit-learn's hyperparameter optimiser (L-BFGS-B) with an iteration budget."""

    def optimise(obj_func, initial_theta, bounds):
        result = scipy.optimize.minimize(
            obj_func,
            initial_theta,
            method="L-BFGS-B",
            jac=True,
            bounds=bounds,
            options={"maxiter": max_iterations},
        )
        return result.x, result.fun

    return optimise


def fit_surrogate(
    X: np.ndarray,
    y: np.ndarray,
    noise_var: np.ndarray,
    context_dims: int,
    seed: int,
    warm_kernel=None,
) -> FittedSurrogate:
    """Fit on utilities (maximised); a warm kernel from the last refit saves optimiser restarts."""
    y_mean = float(np.mean(y))
    y_std = float(np.std(y)) or 1.0
    loss = (y_mean - y) / y_std
    alpha = noise_var / (y_std * y_std) + JITTER
    kernel = warm_kernel or make_kernel(X.shape[1] - context_dims, context_dims)
    gp = GaussianProcessRegressor(
        kernel=kernel,
        alpha=alpha,
        normalize_y=False,
        # one restart besides the default start: the marginal likelihood here is smooth
        # enough, and each restart costs a full fit
        n_restarts_optimizer=0 if warm_kernel is not None else COLD_RESTARTS,
        optimizer=_lbfgs(WARM_ITERATIONS if warm_kernel is not None else COLD_ITERATIONS),
        random_state=seed,
    )
    with warnings.catch_warnings():
        # Length scales at their bounds are expected (a θ parameter that does not matter in
        # a context); they are not a failed fit.
        warnings.simplefilter("ignore", ConvergenceWarning)
        gp.fit(X, loss)
    return FittedSurrogate(gp=gp, y_mean=y_mean, y_std=y_std)
