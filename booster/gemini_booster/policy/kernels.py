"""GP kernels for a surrogate over (θ, h) whose cost does not grow with the number of contexts.

One-hot columns per region and ISP would add hundreds of GP dimensions. Instead each categorical
attribute of the context (source/destination region and ISP, time-of-day block) is one integer
code column, and the context kernel is a weighted sum of "same value?" indicators:

    k_h(h, h') = [h = h'] + w_0 + Σ_j w_j·[h_j = h'_j]

Each term is a valid (positive semi-definite) kernel, so the sum is one. The weights are fitted
by marginal likelihood like any other hyperparameter: when a destination region explains most
of the difference between contexts, its w_j grows and trials from other ISPs in that region
inform each other. The full surrogate is  c · Matérn(θ) · k_h(h).
"""

from __future__ import annotations

import numpy as np
from sklearn.gaussian_process.kernels import Hyperparameter, Kernel


class OnColumns(Kernel):
    """Apply ``kernel`` to a subset of the input columns (sklearn kernels have no active dims)."""

    def __init__(self, kernel: Kernel, columns: tuple[int, ...]):
        self.kernel = kernel
        self.columns = columns

    def get_params(self, deep: bool = True) -> dict:
        params = {"kernel": self.kernel, "columns": self.columns}
        if deep:
            params.update(("kernel__" + k, v) for k, v in self.kernel.get_params().items())
        return params

    @property
    def hyperparameters(self) -> list[Hyperparameter]:
        return [
            Hyperparameter("kernel__" + h.name, h.value_type, h.bounds, h.n_elements, h.fixed)
            for h in self.kernel.hyperparameters
        ]

    @property
    def theta(self) -> np.ndarray:
        return self.kernel.theta

    @theta.setter
    def theta(self, theta: np.ndarray) -> None:
        self.kernel.theta = theta

    @property
    def bounds(self) -> np.ndarray:
        return self.kernel.bounds

    def __call__(self, X, Y=None, eval_gradient=False):
        cols = list(self.columns)
        X = np.asarray(X)[:, cols]
        Y = None if Y is None else np.asarray(Y)[:, cols]
        return self.kernel(X, Y, eval_gradient=eval_gradient)

    def diag(self, X):
        return self.kernel.diag(np.asarray(X)[:, list(self.columns)])

    def is_stationary(self) -> bool:
        return self.kernel.is_stationary()

    @property
    def requires_vector_input(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"OnColumns({self.kernel!r}, {self.columns})"


class ContextKernel(Kernel):
    """[h = h'] + w_0 + Σ_j w_j·[h_j = h'_j] over integer-coded categorical columns."""

    def __init__(self, weights=(0.1,), weights_bounds=(1e-4, 1.0)):
        self.weights = weights
        self.weights_bounds = weights_bounds

    @property
    def hyperparameter_weights(self) -> Hyperparameter:
        return Hyperparameter("weights", "numeric", self.weights_bounds, len(self.weights))

    def _terms(self, X, Y):
        same = X[:, None, :] == Y[None, :, :]  # n × m × attributes
        full = np.all(same, axis=2).astype(float)
        parts = [np.ones(full.shape)] + [same[:, :, j].astype(float) for j in range(X.shape[1])]
        return full, parts

    def __call__(self, X, Y=None, eval_gradient=False):
        X = np.asarray(X)
        w = np.asarray(self.weights, dtype=float)
        if len(w) != X.shape[1] + 1:
            raise ValueError(f"ContextKernel needs {X.shape[1] + 1} weights, has {len(w)}")
        full, parts = self._terms(X, X if Y is None else np.asarray(Y))
        K = full + sum(wi * p for wi, p in zip(w, parts, strict=True))
        if not eval_gradient:
            return K
        if Y is not None:
            raise ValueError("gradient only when Y is None")
        grad = np.stack([wi * p for wi, p in zip(w, parts, strict=True)], axis=2)
        return K, grad

    def diag(self, X):
        return np.full(np.asarray(X).shape[0], 1.0 + float(np.sum(self.weights)))

    def is_stationary(self) -> bool:
        return False

    @property
    def requires_vector_input(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"ContextKernel(weights={np.round(np.asarray(self.weights), 4).tolist()})"
