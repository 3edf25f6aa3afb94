"""An exact GP posterior over θ at one context, with hyperparameters fitted elsewhere.

The surrogate's kernel is  c · Matérn₅/₂(θ, θ'; ℓ) · k_h(h, h')  (``surrogate.make_kernel``).
At a fixed target context h*, the covariance between a test point (θ, h*) and a training point
(θᵢ, hᵢ) is c · M(θ, θᵢ) · aᵢ with aᵢ = k_h(h*, hᵢ) a constant per training point, so the
posterior at h* is an ordinary GP computation over θ alone:

    mean(θ) = kᵀ K⁻¹ y,   var(θ) = c · k_h(h*, h*) − kᵀ K⁻¹ k,   kᵢ = c · M(θ, θᵢ) · aᵢ

with K the training covariance plus each trial's noise. Written out here in numpy instead of
through scikit-learn's kernel objects, a context's prediction over a few hundred candidates
costs about a millisecond, which is what lets a refit plan hundreds of contexts, each against
its own data and the shared fit set, within seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.linalg import cholesky, solve_triangular
from sklearn.gaussian_process.kernels import Kernel

from .kernels import ContextKernel, OnColumns

SQRT5 = np.sqrt(5.0)
JITTER = 1e-6
MIN_VARIANCE = 1e-12


@dataclass(frozen=True)
class KernelParams:
    """The fitted hyperparameters of ``c · Matérn(θ) [· k_h(h)]``."""

    amplitude: float
    length_scale: np.ndarray
    context_weights: np.ndarray | None  # (w₀, w₁, …); None without a context kernel

    @classmethod
    def of(cls, kernel: Kernel) -> KernelParams:
        """Read them from a fitted kernel of the shape ``make_kernel`` builds."""
        parts: list[Kernel] = []
        stack = [kernel]
        while stack:
            k = stack.pop()
            if hasattr(k, "k1") and hasattr(k, "k2"):
                stack += [k.k2, k.k1]
            else:
                parts.append(k.kernel if isinstance(k, OnColumns) else k)
        amplitude = next(float(p.constant_value) for p in parts if hasattr(p, "constant_value"))
        matern = next(p for p in parts if hasattr(p, "length_scale"))
        context = next((p for p in parts if isinstance(p, ContextKernel)), None)
        return cls(
            amplitude,
            np.atleast_1d(np.asarray(matern.length_scale, dtype=float)),
            None if context is None else np.asarray(context.weights, dtype=float),
        )


def matern52(A: np.ndarray, B: np.ndarray, length_scale: np.ndarray) -> np.ndarray:
    """Matérn ν = 5/2 between the rows of A and B (anisotropic length scales)."""
    a, b = A / length_scale, B / length_scale
    sq = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T
    r = SQRT5 * np.sqrt(np.maximum(sq, 0.0))
    return (1.0 + r + r * r / 3.0) * np.exp(-r)


def context_similarity(A: np.ndarray, B: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """k_h between integer-coded contexts: [h = h'] + w₀ + Σⱼ wⱼ·[hⱼ = h'ⱼ]."""
    same = A[:, None, :] == B[None, :, :]
    return same.all(axis=2) + weights[0] + (same * weights[1:]).sum(axis=2)


def _covariance(
    params: KernelParams,
    theta_a: np.ndarray,
    codes_a: np.ndarray | None,
    theta_b: np.ndarray,
    codes_b: np.ndarray | None,
) -> np.ndarray:
    K = params.amplitude * matern52(theta_a, theta_b, params.length_scale)
    if params.context_weights is not None and codes_a is not None and codes_b is not None:
        K *= context_similarity(codes_a, codes_b, params.context_weights)
    return K


def _noisy_covariance(
    params: KernelParams, theta: np.ndarray, codes: np.ndarray | None, noise_var: np.ndarray
) -> np.ndarray:
    """The covariance of training points among themselves, with each one's noise added."""
    K = _covariance(params, theta, codes, theta, codes)
    K[np.diag_indices_from(K)] += noise_var + JITTER
    return K


def _inverse_cholesky(K: np.ndarray) -> np.ndarray:
    L = cholesky(K, lower=True, check_finite=False)
    return solve_triangular(L, np.eye(len(K)), lower=True, check_finite=False)


@dataclass(frozen=True)
class Training:
    """Training points and L⁻¹, the inverse Cholesky factor of their covariance plus noise.
    It does not depend on the context predicted at, so the fit set's is computed once per
    refit and each context's own points are added to it by a block update."""

    theta: np.ndarray
    codes: np.ndarray | None
    loss: np.ndarray
    linv: np.ndarray

    @classmethod
    def factor(
        cls,
        params: KernelParams,
        theta: np.ndarray,
        codes: np.ndarray | None,
        loss: np.ndarray,
        noise_var: np.ndarray,
    ) -> Training:
        return cls(
            theta,
            codes,
            loss,
            _inverse_cholesky(_noisy_covariance(params, theta, codes, noise_var)),
        )

    def extend(
        self,
        params: KernelParams,
        theta: np.ndarray,
        codes: np.ndarray | None,
        loss: np.ndarray,
        noise_var: np.ndarray,
    ) -> Training:
        """These points and ``theta``'s: with L = [[L₁, 0], [C, L₂]], C = K₂₁ L₁⁻ᵀ and
        L₂L₂ᵀ = K₂₂ − CCᵀ, the inverse is [[L₁⁻¹, 0], [−L₂⁻¹ C L₁⁻¹, L₂⁻¹]]."""
        if len(theta) == 0:
            return self
        K21 = _covariance(params, theta, codes, self.theta, self.codes)
        K22 = _noisy_covariance(params, theta, codes, noise_var)
        C = K21 @ self.linv.T
        l2inv = _inverse_cholesky(K22 - C @ C.T)
        n1, n2 = len(self.theta), len(theta)
        linv = np.zeros((n1 + n2, n1 + n2))
        linv[:n1, :n1] = self.linv
        linv[n1:, :n1] = -l2inv @ (C @ self.linv)
        linv[n1:, n1:] = l2inv
        both = None if codes is None or self.codes is None else np.vstack([self.codes, codes])
        return Training(
            np.vstack([self.theta, theta]), both, np.concatenate([self.loss, loss]), linv
        )


class LocalGP:
    """The posterior at one context (``context``: its code row; None for θ-only models)."""

    def __init__(self, params: KernelParams, training: Training, context: np.ndarray | None):
        self.params, self.training = params, training
        w = params.context_weights
        if w is not None and training.codes is not None and context is not None:
            self.a = context_similarity(training.codes, context[None, :], w)[:, 0]
            self.prior_var = params.amplitude * float(
                context_similarity(context[None], context[None], w)[0, 0]
            )
        else:
            self.a = np.ones(len(training.theta))
            self.prior_var = params.amplitude
        linv = training.linv
        self.alpha = linv.T @ (linv @ training.loss)

    def _project(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(K(X, training), L⁻¹ K(training, X)): what both the mean and the variance need."""
        Ks = self.params.amplitude * matern52(X, self.training.theta, self.params.length_scale)
        Ks *= self.a
        return Ks, self.training.linv @ Ks.T

    def posterior(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Loss mean and std at the θ rows of X."""
        Ks, v = self._project(X)
        var = self.prior_var - (v * v).sum(axis=0)
        return Ks @ self.alpha, np.sqrt(np.maximum(var, MIN_VARIANCE))

    def joint(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Loss mean and full covariance at the θ rows of X."""
        Ks, v = self._project(X)
        prior = self.prior_var * matern52(X, X, self.params.length_scale)
        return Ks @ self.alpha, prior - v.T @ v
