"""Eq. 9 from running sums: f = mean(throughput − σ·delay), and how sure we are of it.

Because the objective is linear in per-flow values, a trial's sums give its mean utility for any
σ, and the second moments (including Σ throughput·delay) give the exact sample variance of the
per-flow utility. The variance of the mean, var/N, is the GP's observation noise: a trial seen in
ten thousand flows is trusted far more than one seen in ten.
"""

from __future__ import annotations

from dataclasses import dataclass

# A trial of one flow has no sample variance; assume a per-flow spread this large (in utility
# units, Mbit/s) rather than pretending the single value is exact.
SINGLE_FLOW_STD = 5.0


@dataclass(frozen=True)
class Utility:
    mean: float
    var_of_mean: float
    flows: int


def utility(
    sigma: float,
    flow_count: int,
    tpt_sum: float,
    tpt_sq_sum: float,
    delay_sum: float,
    delay_sq_sum: float,
    tpt_delay_sum: float,
) -> Utility:
    n = flow_count
    mean = (tpt_sum - sigma * delay_sum) / n
    if n < 2:
        return Utility(mean, SINGLE_FLOW_STD**2, n)
    second = (tpt_sq_sum - 2 * sigma * tpt_delay_sum + sigma * sigma * delay_sq_sum) / n
    sample_var = max(second - mean * mean, 0.0) * n / (n - 1)
    return Utility(mean, max(sample_var, 1e-6) / n, n)
