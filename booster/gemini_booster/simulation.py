"""A synthetic fleet: hosts whose flows follow a known f(θ, h), for demos, tests and benchmarks.

This is not a network model. It stands in for the lab (real kernels, real links) wherever what is
under test is Booster itself: the optimum of every context is known, so convergence can be
measured exactly. Each context has its own optimum in θ, so a context-blind optimiser must
compromise between them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from gemini_api import sketch as sketches
from gemini_api.aggregate import SIZE_EDGES_BYTES, SLOW_FLOW_MBPS
from gemini_api.theta import load_spec
from gemini_api.v1 import booster_pb2 as pb

from .domain import ContextKey
from .policy.assignment import exploration_position


@dataclass(frozen=True)
class SyntheticContext:
    """A context and the shape of its utility surface over normalised θ."""

    key: tuple[str, str, str, str, int]
    optimum: tuple[float, ...]  # per θ parameter, in [0, 1] of the production region
    peak_mbps: float
    curvature: float
    base_delay_ms: float

    def message(self) -> pb.Context:
        s, si, d, di, h = self.key
        return pb.Context(src_region=s, src_isp=si, dst_region=d, dst_isp=di, hour=h)


WEIGHTS = (0.6, 1.0, 0.6, 1.0, 0.8, 0.5, 0.4)

ETHERNET = SyntheticContext(
    key=("eu-west", "cdn-a", "eu-west", "fiber-isp", 12),
    optimum=(0.2, 0.9, 0.3, 0.85, 0.1, 0.3, 0.6),
    peak_mbps=100.0,
    curvature=40.0,
    base_delay_ms=5.0,
)
SATELLITE = SyntheticContext(
    key=("eu-west", "cdn-a", "africa", "sat-isp", 12),
    optimum=(0.7, 0.4, 0.7, 0.5, 0.9, 0.8, 0.3),
    peak_mbps=60.0,
    curvature=40.0,
    base_delay_ms=40.0,
)
DEFAULT_CONTEXTS = (ETHERNET, SATELLITE)


def normalise(theta: Mapping[str, int]) -> np.ndarray:
    spec = load_spec()
    out = []
    for p in spec.params:
        lo, hi = p.production
        out.append((min(max(theta[p.name], lo), hi) - lo) / (hi - lo))
    return np.asarray(out)


def true_utility(ctx: SyntheticContext, theta: Mapping[str, int]) -> float:
    """The expected eq. 9 utility of θ in ``ctx`` (σ-independent by construction)."""
    x = normalise(theta)
    gap = np.asarray(WEIGHTS) * (x - np.asarray(ctx.optimum)) ** 2
    return ctx.peak_mbps - ctx.curvature * float(np.sum(gap))


def queue_delay_ms(ctx: SyntheticContext, theta: Mapping[str, int]) -> float:
    x = normalise(theta)
    return ctx.base_delay_ms * (0.5 + x[1] + 0.5 * x[2])


def best_utility(ctx: SyntheticContext) -> float:
    return ctx.peak_mbps


def baseline_theta() -> dict[str, int]:
    """The θ whose outcome a baseline CC's flows follow here: the spec's default. A synthetic
    choice, stated: an untuned CC does as well as Fusion before tuning, so an A/B experiment
    of the tuned policy against it measures what tuning gained."""
    return load_spec().default()


def baseline_aggregate(
    ctx: SyntheticContext,
    cc: str,
    flows: int,
    rng: np.random.Generator,
    sigma: float = 1.0,
    noise_mbps: float = 8.0,
) -> pb.Aggregate:
    """Flows of another CC (``cc``, e.g. an experiment's "cubic" control arm) in ``ctx``: no θ,
    the outcome of ``baseline_theta``."""
    agg = make_aggregate(ctx, baseline_theta(), sigma, flows, rng, noise_mbps)
    agg.ClearField("theta")
    agg.cc = cc
    return agg


def make_aggregate(
    ctx: SyntheticContext,
    theta: Mapping[str, int],
    sigma: float,
    flows: int,
    rng: np.random.Generator,
    noise_mbps: float = 8.0,
) -> pb.Aggregate:
    """Flows that ran θ in ``ctx``: per-flow throughput and delay with noise, then aggregated."""
    mean_delay = queue_delay_ms(ctx, theta)
    mean_tpt = true_utility(ctx, theta) + sigma * mean_delay
    delay = np.maximum(mean_delay * (1 + 0.1 * rng.standard_normal(flows)), 0.0)
    tpt = np.maximum(mean_tpt + noise_mbps * rng.standard_normal(flows), 0.01)
    sizes = rng.lognormal(mean=14.0, sigma=2.0, size=flows)
    sk, delay_sk = sketches.new_sketch(), sketches.new_sketch()
    for v, d in zip(tpt, delay, strict=True):
        sk.add(float(v))
        delay_sk.add(float(d))
    return pb.Aggregate(
        theta=pb.Theta(**theta),
        theta_version=1,
        context=ctx.message(),
        flow_count=flows,
        throughput_mbps_sum=float(tpt.sum()),
        throughput_mbps_sq_sum=float((tpt * tpt).sum()),
        queue_delay_ms_sum=float(delay.sum()),
        queue_delay_ms_sq_sum=float((delay * delay).sum()),
        throughput_queue_delay_sum=float((tpt * delay).sum()),
        throughput_sketch=sketches.to_proto(sk),
        queue_delay_sketch=sketches.to_proto(delay_sk),
        slow_flow_count=int((tpt < SLOW_FLOW_MBPS).sum()),
        size_bucket_counts=np.bincount(
            np.searchsorted(SIZE_EDGES_BYTES, sizes, side="right"), minlength=5
        ).tolist(),
    )


def make_report(
    host_id: str,
    policy: str,
    aggregates: list[pb.Aggregate],
    start_ms: int | None = None,
    interval_ms: int = 300_000,
) -> pb.ReportRequest:
    """A report of ``aggregates``; by default over the interval that ends now (Booster refuses
    intervals far from its clock)."""
    if start_ms is None:
        start_ms = int(time.time() * 1000) - interval_ms
    return pb.ReportRequest(
        report_id=str(uuid.uuid4()),
        host_id=host_id,
        policy=policy,
        interval_start_unix_ms=start_ms,
        interval_end_unix_ms=start_ms + interval_ms,
        aggregates=aggregates,
    )


def hosts_exploring(
    key: ContextKey, hosts: int, explorers: int, share: float, prefix: str = "host-"
) -> tuple[list[str], list[str]]:
    """(explorers, exploiters) of one context of a simulated fleet: ``hosts`` names
    ``<prefix><i>`` picked so that exactly ``explorers`` of them fall below ``share`` in the
    service's own exploration position, whatever the hash gives, so a simulation explores as
    much as it planned."""
    explore: list[str] = []
    exploit: list[str] = []
    i = 0
    while len(explore) < explorers or len(exploit) < hosts - explorers:
        host = f"{prefix}{i}"
        i += 1
        if exploration_position(host, key) < share:
            if len(explore) < explorers:
                explore.append(host)
        elif len(exploit) < hosts - explorers:
            exploit.append(host)
    return explore, exploit
