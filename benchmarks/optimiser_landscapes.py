"""Landscapes for the optimiser benchmark: known utility surfaces f(θ, h) and the simulated fleet.

Every surface lives in normalised θ over Θ (the production region of ``specs/fusion.toml``) for
the parameters the landscape searches; the other parameters are pinned at the spec's default
through a custom region (``region="custom"`` with lo = hi), so every method searches exactly the
landscape's dimensions. Each surface is a bowl around an optimum that lies on Θ's integer grid
(so the optimum is reachable and regret can reach 0): per parameter and per side of the
optimum, the utility lost at the edge of Θ (``drop``), reached as |distance|^power. Utility is
positive everywhere (the drops of a surface sum to less than its peak) and is eq. 9 at the
benchmark's σ: each θ has a queueing delay D(θ) and a throughput U(θ) + σ·D(θ).

Landscapes:
  - ``lab``: two contexts, 4 parameters (ω, λ, l, δ), scales and optima from the lab's figures
    (``benchmarks/results/lab-loop.md``, σ = 0.1). Ethernet-like (wired 40 ms, 20 Mbit/s, no
    loss): peak 15.2 (ω 40 at l 1 % measured 15.0–15.2), ω* 46 and λ* 0.76 (tuned 46–50 and
    0.72–0.79), δ* 30 % (14.54, the best δ), l nearly irrelevant; losses at Θ's edges from the
    fixed-θ tables: ω 10 −1.6, δ 5 % −9.0, δ 100 % −1.2, λ 0.50 −0.7. Satellite-like (lossy
    100 ms, 1 % random loss): l* at Θ's cap of 1 % (l below the loss rate reads every loss as
    congestion: 0 % → 5.84 against 1 % → 7.35; the tuned 2.8 % lies beyond Θ), ω* 48, λ* 0.84,
    δ* 30 %, peak 8.4; losses δ 5 % −3.7, ω 10 −2.3, λ 0.50 −0.9. Queueing 16 and 20 ms (the
    datapath benchmark's ethernet and satellite rows, ``fusion-datapath.md``).
  - ``shared24``: 24 contexts (4 destination regions × 3 ISPs × 2 time blocks), 6 parameters;
    each context's optimum is a region part + an ISP part + a time-block part, and its peak a
    product of the same three, so pooling across contexts has something to learn.
  - ``drift``: one context, 4 parameters, whose optimum (and peak) moves at ``DRIFT_ROUND``.
  - ``plateau``: the lab's two contexts with every θ within ``PLATEAU_SPREAD`` of the best, far
    inside one round's noise: what an incumbent change there buys is noise, so the changes it
    makes measure the churn a switching rule lets noise alone cause.
  - ``hourly``: the lab's two contexts where each hour (round) also has a level of its own,
    shared by every flow of the context in that hour (the day's load, cross traffic, the flow
    mix that arrived): a factor with relative spread ``HOUR_SPREAD``, drawn per seed, round and
    context. A θ explored in a good hour looks better by the hour, not by itself.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol

import numpy as np

from gemini_api.aggregate import SLOW_FLOW_MBPS
from gemini_api.theta import load_spec
from gemini_booster.domain import ContextKey, FlowSums, Trial
from gemini_booster.simulation import hosts_exploring

SIGMA = 0.1  # eq. 9's σ, Mbit/s per ms, as in the lab loop
FLOW_NOISE = 0.15  # relative std of one flow's utility
HOSTS_PER_CONTEXT = 8
FLOWS_PER_HOST = 20
EXPLORATION_SHARE = 0.5
DRIFT_ROUND = 15  # 0-based: rounds 0–14 see the old surface, rounds 15– the new one
T0 = datetime(2026, 1, 5, tzinfo=UTC)
MIN_NOISE_FACTOR = 0.05  # a flow's factor is clipped here (−6 std): throughput stays positive

LAB_DIMS = ("init_cwnd", "mult_decrease", "loss_threshold", "rtt_threshold")
SHARED_DIMS = (
    "init_cwnd",
    "mult_increase",
    "add_increase",
    "mult_decrease",
    "loss_threshold",
    "rtt_threshold",
)


@dataclass(frozen=True)
class Surface:
    """One context's utility over normalised θ (the landscape's parameters, in order)."""

    peak: float  # utility at the optimum, Mbit/s
    optimum: tuple[float, ...]  # in [0, 1], on Θ's grid
    drop_low: tuple[float, ...]  # utility lost at the low edge of each parameter
    drop_high: tuple[float, ...]  # ... and at its high edge
    delay_ms: float  # queueing delay at the optimum
    power_low: tuple[float, ...] = ()  # shape exponent per side (2 when empty)
    power_high: tuple[float, ...] = ()

    def utility(self, x: np.ndarray) -> np.ndarray:
        """Expected eq. 9 utility at normalised points ``x`` (n × dims)."""
        x = np.atleast_2d(x)
        opt = np.asarray(self.optimum)
        low = x < opt
        span = np.where(low, opt, 1.0 - opt)
        t = np.abs(x - opt) / np.maximum(span, 1e-9)
        p_lo = np.asarray(self.power_low or (2.0,) * len(opt))
        p_hi = np.asarray(self.power_high or (2.0,) * len(opt))
        drop = np.where(
            low, np.asarray(self.drop_low) * t**p_lo, np.asarray(self.drop_high) * t**p_hi
        )
        return self.peak - drop.sum(axis=1)

    def delay(self, x: np.ndarray) -> np.ndarray:
        """Queueing delay, ms: larger for θ further up its range (more aggressive)."""
        x = np.atleast_2d(x)
        return self.delay_ms * (0.6 + 0.8 * x.mean(axis=1))

    @property
    def floor(self) -> float:
        """The lowest utility anywhere in Θ: every parameter at its costlier edge."""
        return self.peak - sum(map(max, self.drop_low, self.drop_high))


class UtilitySurface(Protocol):
    """What a method's flows are drawn from: a ``Surface`` or a composite of them."""

    @property
    def peak(self) -> float: ...

    @property
    def optimum(self) -> tuple[float, ...]: ...

    def utility(self, x: np.ndarray) -> np.ndarray: ...

    def delay(self, x: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True)
class Landscape:
    name: str
    dims: tuple[str, ...]
    contexts: dict[int, ContextKey]
    surfaces: Mapping[int, UtilitySurface]
    drifted: Mapping[int, UtilitySurface] = field(default_factory=dict)  # from DRIFT_ROUND on
    hour_spread: float = 0.0  # relative spread of an hour's level, shared by a context's flows

    def surface(self, context_id: int, round_index: int) -> UtilitySurface:
        if round_index >= DRIFT_ROUND and context_id in self.drifted:
            return self.drifted[context_id]
        return self.surfaces[context_id]

    def bounds(self) -> dict[str, tuple[int, int]]:
        """The custom region: Θ for the landscape's parameters, the default for the rest."""
        spec = load_spec()
        return {
            p.name: p.production if p.name in self.dims else (p.default, p.default)
            for p in spec.params
        }

    def normalise(self, thetas: Sequence[Mapping[str, int]]) -> np.ndarray:
        spec = load_spec()
        lo = np.asarray([spec.param(n).production[0] for n in self.dims], dtype=float)
        hi = np.asarray([spec.param(n).production[1] for n in self.dims], dtype=float)
        rows = np.asarray([[t[n] for n in self.dims] for t in thetas], dtype=float)
        return (rows.reshape(len(thetas), len(self.dims)) - lo) / (hi - lo)

    def theta(self, x: Sequence[float]) -> dict[str, int]:
        """The θ on Θ's grid nearest normalised ``x``; pinned parameters at their default."""
        spec = load_spec()
        out = {p.name: p.default for p in spec.params}
        for n, v in zip(self.dims, x, strict=True):
            lo, hi = spec.param(n).production
            out[n] = round(lo + float(np.clip(v, 0, 1)) * (hi - lo))
        return out

    def true_utility(self, context_id: int, round_index: int, theta: Mapping[str, int]) -> float:
        return float(self.surface(context_id, round_index).utility(self.normalise([theta]))[0])

    def optimum_utility(self, context_id: int, round_index: int) -> float:
        return self.surface(context_id, round_index).peak

    def optimum_theta(self, context_id: int, round_index: int) -> dict[str, int]:
        return self.theta(self.surface(context_id, round_index).optimum)


def _on_grid(dims: Sequence[str], x: Sequence[float]) -> tuple[float, ...]:
    """Snap normalised ``x`` to Θ's integer grid, so the optimum is a θ a method can run."""
    spec = load_spec()
    out = []
    for n, v in zip(dims, x, strict=True):
        lo, hi = spec.param(n).production
        out.append((round(lo + float(np.clip(v, 0, 1)) * (hi - lo)) - lo) / (hi - lo))
    return tuple(out)


def _x(name: str, units: float) -> float:
    lo, hi = load_spec().param(name).production
    return (units - lo) / (hi - lo)


def lab_landscape() -> Landscape:
    """Two contexts after the lab's wired and lossy paths (see the module docstring)."""
    ethernet = Surface(
        peak=15.2,
        optimum=_on_grid(
            LAB_DIMS,
            (
                _x("init_cwnd", 46),
                _x("mult_decrease", 76),
                _x("loss_threshold", 8),
                _x("rtt_threshold", 30),
            ),
        ),
        drop_low=(1.6, 0.7, 0.35, 9.6),
        drop_high=(0.1, 0.4, 0.05, 1.2),
        power_low=(2.0, 2.0, 2.0, 3.0),  # δ: a cliff near its low edge, flat near 30 %
        delay_ms=16.0,
    )
    satellite = Surface(
        peak=8.4,
        optimum=_on_grid(
            LAB_DIMS,
            (
                _x("init_cwnd", 48),
                _x("mult_decrease", 84),
                _x("loss_threshold", 10),
                _x("rtt_threshold", 30),
            ),
        ),
        drop_low=(2.3, 0.9, 1.5, 3.2),
        drop_high=(0.05, 0.3, 0.0, 1.4),
        power_low=(2.0, 2.0, 2.0, 3.0),
        delay_ms=20.0,
    )
    contexts = {
        1: ContextKey("eu-west", "cdn-a", "eu-west", "fiber-isp", 12),
        2: ContextKey("eu-west", "cdn-a", "africa", "sat-isp", 12),
    }
    return Landscape("lab", LAB_DIMS, contexts, {1: ethernet, 2: satellite})


PLATEAU_SPREAD = 0.01  # the worst θ's utility below the best, as a share of the peak


def plateau_landscape() -> Landscape:
    """The lab's contexts and peaks, every θ within PLATEAU_SPREAD of the best."""
    lab = lab_landscape()
    drop = PLATEAU_SPREAD / len(LAB_DIMS)
    surfaces = {
        c: Surface(
            peak=s.peak,
            optimum=s.optimum,
            drop_low=(s.peak * drop,) * len(LAB_DIMS),
            drop_high=(s.peak * drop,) * len(LAB_DIMS),
            delay_ms=s.delay_ms,
        )
        for c, s in lab.surfaces.items()
    }
    return Landscape("plateau", LAB_DIMS, lab.contexts, surfaces)


REGIONS = ("eu-west", "us-east", "ap-south", "sa-east")
REGION_PEAK = (60.0, 45.0, 30.0, 20.0)
ISPS = ("fiber", "cable", "mobile")
ISP_FACTOR = (1.0, 0.75, 0.5)
BLOCK_HOURS = (3, 15)  # night and afternoon: time blocks 0 and 1 with time_buckets = 2
BLOCK_FACTOR = (1.0, 0.8)
REGION_DELAY_MS = (5.0, 15.0, 40.0, 25.0)
SHARED_DROP = (0.12, 0.08, 0.1, 0.16, 0.12, 0.18)  # share of the peak lost at Θ's edge
PART_SCALE = 0.15  # spread of each additive part of the optimum, normalised units


def shared_landscape(
    regions: int = 4, isps: int = 3, blocks: int = 2, name: str = "shared24"
) -> Landscape:
    """regions × ISPs × time blocks contexts; optimum = region + ISP + block part (+ a base)."""
    rng = np.random.default_rng(zlib.crc32(b"shared-structure"))
    d = len(SHARED_DIMS)
    base = rng.uniform(0.35, 0.65, d)
    region_part = rng.uniform(-PART_SCALE, PART_SCALE, (regions, d))
    isp_part = rng.uniform(-PART_SCALE, PART_SCALE, (isps, d))
    block_part = rng.uniform(-PART_SCALE, PART_SCALE, (blocks, d))
    contexts: dict[int, ContextKey] = {}
    surfaces: dict[int, Surface] = {}
    cid = 0
    for r in range(regions):
        for i in range(isps):
            for b in range(blocks):
                cid += 1
                region = REGIONS[r] if r < len(REGIONS) else f"region-{r}"
                isp = ISPS[i] if i < len(ISPS) else f"isp-{i}"
                hour = BLOCK_HOURS[b % len(BLOCK_HOURS)] if blocks <= 2 else (b * 24) // blocks
                contexts[cid] = ContextKey("eu-west", "cdn-a", region, isp, hour)
                x = np.clip(base + region_part[r] + isp_part[i] + block_part[b], 0.05, 0.95)
                peak = (
                    REGION_PEAK[r % len(REGION_PEAK)]
                    * ISP_FACTOR[i % len(ISP_FACTOR)]
                    * BLOCK_FACTOR[b % len(BLOCK_FACTOR)]
                )
                surfaces[cid] = Surface(
                    peak=peak,
                    optimum=_on_grid(SHARED_DIMS, x),
                    drop_low=tuple(peak * s for s in SHARED_DROP),
                    drop_high=tuple(peak * s for s in SHARED_DROP),
                    delay_ms=REGION_DELAY_MS[r % len(REGION_DELAY_MS)],
                )
    return Landscape(name, SHARED_DIMS, contexts, surfaces)


def drift_landscape() -> Landscape:
    """One context whose path changes at DRIFT_ROUND: the optimum moves across Θ, peak drops."""
    before = Surface(
        peak=50.0,
        optimum=_on_grid(LAB_DIMS, (0.3, 0.75, 0.2, 0.4)),
        drop_low=(10.0, 8.0, 6.0, 12.0),
        drop_high=(10.0, 8.0, 6.0, 12.0),
        delay_ms=10.0,
    )
    after = Surface(
        peak=40.0,
        optimum=_on_grid(LAB_DIMS, (0.8, 0.35, 0.8, 0.7)),
        drop_low=(8.0, 7.0, 6.0, 10.0),
        drop_high=(8.0, 7.0, 6.0, 10.0),
        delay_ms=25.0,
    )
    contexts = {1: ContextKey("eu-west", "cdn-a", "us-east", "cable", 9)}
    return Landscape("drift", LAB_DIMS, contexts, {1: before}, {1: after})


HOUR_SPREAD = 0.2  # an hour's level: ±20 % (1 std) around the surface, chosen before any run


def hourly_landscape() -> Landscape:
    """The lab's contexts, each hour at a level of its own (``HOUR_SPREAD``)."""
    lab = lab_landscape()
    return Landscape("hourly", LAB_DIMS, lab.contexts, lab.surfaces, hour_spread=HOUR_SPREAD)


LANDSCAPES = {
    "lab": lab_landscape,
    "shared24": shared_landscape,
    "drift": drift_landscape,
    "plateau": plateau_landscape,
    "hourly": hourly_landscape,
}


# -- the fleet ---------------------------------------------------------------------------------


def fleet_hosts(key: ContextKey, share: float = EXPLORATION_SHARE) -> tuple[list[str], list[str]]:
    """(explorers, exploiters) of one context: HOSTS_PER_CONTEXT hosts of which exactly
    ``share`` explore, so every context has the same number of explorers under every method."""
    want = round(HOSTS_PER_CONTEXT * share)
    return hosts_exploring(key, HOSTS_PER_CONTEXT, want, share)


def flow_factors(seed: int, landscape: str, round_index: int, context_id: int, host: str):
    """One host's per-flow noise factors in one round: the same draws for every method."""
    rng = np.random.default_rng(
        [seed, zlib.crc32(landscape.encode()), round_index, context_id, zlib.crc32(host.encode())]
    )
    m = 1.0 + FLOW_NOISE * rng.standard_normal(FLOWS_PER_HOST)
    return np.maximum(m, MIN_NOISE_FACTOR)


def hour_factor(seed: int, landscape: Landscape, round_index: int, context_id: int) -> float:
    """The level every flow of ``context_id`` shares in one round (1 without ``hour_spread``):
    the same draw for every method and host, so methods meet the same hours."""
    if landscape.hour_spread <= 0.0:
        return 1.0
    rng = np.random.default_rng(
        [seed, zlib.crc32(landscape.name.encode()), round_index, context_id, zlib.crc32(b"hour")]
    )
    return max(1.0 + landscape.hour_spread * float(rng.standard_normal()), MIN_NOISE_FACTOR)


def run_flows(surface: UtilitySurface, x: np.ndarray, factors: np.ndarray) -> tuple[FlowSums, int]:
    """Flows of one θ: throughput and delay both scaled by the flow's factor, so one flow's
    utility x − σ·d is the θ's expected utility times the factor (relative std FLOW_NOISE).
    Returns the sums and the number of slow flows."""
    u = float(surface.utility(x)[0])
    d = float(surface.delay(x)[0])
    tpt = (u + SIGMA * d) * factors
    delay = d * factors
    sums = FlowSums(
        len(factors),
        float(tpt.sum()),
        float((tpt * tpt).sum()),
        float(delay.sum()),
        float((delay * delay).sum()),
        float((tpt * delay).sum()),
    )
    return sums, int((tpt < SLOW_FLOW_MBPS).sum())


def bucket_time(round_index: int) -> datetime:
    """One simulated hour per round."""
    return T0 + timedelta(hours=round_index)


def make_trial(
    context_id: int, key: str, sums: FlowSums, slow: int, hosts: int, round_index: int
) -> Trial:
    """The service's running sums of one (context, θ, time bucket)."""
    t = bucket_time(round_index)
    return Trial(context_id, key, sums, slow, hosts, t, t)
