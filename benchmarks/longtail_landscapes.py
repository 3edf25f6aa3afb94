"""Fleet-shaped landscapes: uneven traffic, optima from latent path features, two peaks, 30 % noise.

The optimiser benchmark's ``shared24`` gives every context 8 hosts and an optimum that is
literally a region part plus an ISP part plus a time part: the structure Booster's context
kernel assumes. A fleet is not like that, and these landscapes are built not to flatter it:

  - **Contexts**: source region × destination region × destination ISP × time block.
  - **Latent path features** per (destination region, ISP) pair: base RTT (set by the region,
    stretched by the ISP, with a pair-specific factor), bottleneck capacity (set by the ISP,
    scaled by the region, with a pair-specific factor) and random loss (the ISP's, with a
    pair-specific factor); the source region adds propagation delay; the busy time block cuts
    capacity and adds loss and queueing. None of these is a context attribute's part.
  - **Optima** are nonlinear maps of those features (BDP for the initial window, loss for the
    decrease factor and loss threshold, RTT for the delay threshold, a non-monotone function
    of the BDP for the additive increase), over all seven of Θ's parameters on their integer
    grid. Two contexts that share a region or an ISP share some features, not a shape.
  - **Two peaks**: each surface is the higher of its bowl and a second, narrower bowl at
    ``SECOND_PEAK_SHARE`` of the peak, mirrored across Θ in three parameters.
  - **Traffic** is Zipf: context ranks drawn at random, hosts ∝ rank^−``ZIPF_EXPONENT``, at
    least one, so most contexts have one or two hosts and a few hold most of the fleet.
  - **Noise**: each flow's utility is the θ's expected utility times
    1 + ``FLEET_FLOW_NOISE``·N(0, 1).

A landscape is fixed by its name (``FLEET_LANDSCAPES``): ``fleet-a`` is the one settings may be
looked at on; ``fleet-b`` and ``fleet-c`` (other draws of every feature and of the traffic, and
``fleet-c`` a steeper Zipf) are held out.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from gemini_api.theta import load_spec
from gemini_booster.domain import ContextKey

from .optimiser_landscapes import Landscape, Surface, _on_grid

FLEET_DIMS = tuple(p.name for p in load_spec().params)  # all seven
FLEET_FLOW_NOISE = 0.30  # relative std of one flow's utility
# One source region and HOSTS_TOTAL 110: 24 contexts, the size whose 8 seeds × 4 methods two
# shared cores could run (a second region, 70 ms further, doubles the contexts and the cost).
SRC_REGIONS = ("eu-west",)
SRC_EXTRA_RTT_MS = (0.0,)
DST_REGIONS = ("eu-central", "us-west", "ap-south", "sa-east")
ISPS = ("fiber", "cable", "mobile")
ISP_CAPACITY_MBPS = (120.0, 45.0, 12.0)
ISP_RTT_FACTOR = (1.0, 1.3, 2.2)
ISP_LOSS = (2e-4, 1.5e-3, 1.2e-2)
BLOCK_HOURS = (3, 15)  # night and afternoon: time blocks 0 and 1 of two
BUSY_CAPACITY_FACTOR = 0.55  # the afternoon's share of the night's capacity
BUSY_LOSS_FACTOR = 3.0
BUSY_RTT_FACTOR = 1.35
PAIR_SPREAD = 0.45  # log-normal spread of each (region, ISP) pair's own factors
HOSTS_TOTAL = 110
ZIPF_EXPONENT = 1.1
MIN_PEAK_MBPS = 1.5
DROP_SHARE = (0.13, 0.07, 0.09, 0.17, 0.13, 0.18, 0.08)  # peak share lost at Θ's edge, per dim
SECOND_PEAK_SHARE = 0.92
SECOND_DROP_FACTOR = 1.6  # the second bowl is this much steeper
MIRRORED = ("init_cwnd", "mult_decrease", "rtt_threshold")  # where the second peak sits opposite
EDGE = 0.05  # optima stay this far inside Θ (normalised units)
PACKET_KBIT = 12.0  # 1,500 bytes


@dataclass(frozen=True)
class TwoPeaks:
    """A surface that is the higher of two bowls (``Surface``): a main one and a second peak."""

    main: Surface
    second: Surface

    @property
    def peak(self) -> float:
        return self.main.peak

    @property
    def optimum(self) -> tuple[float, ...]:
        return self.main.optimum

    def utility(self, x: np.ndarray) -> np.ndarray:
        return np.maximum(self.main.utility(x), self.second.utility(x))

    def delay(self, x: np.ndarray) -> np.ndarray:
        return self.main.delay(x)


@dataclass(frozen=True)
class Path:
    """A context's latent path: what the optimum follows (never shown to a method)."""

    rtt_ms: float
    capacity_mbps: float
    loss: float
    busy: bool


def _squash(v: float) -> float:
    """A real number into [EDGE, 1 − EDGE], smoothly."""
    return EDGE + (1.0 - 2.0 * EDGE) / (1.0 + float(np.exp(-v)))


def optimum(path: Path) -> tuple[float, ...]:
    """The optimum θ (normalised, FLEET_DIMS order) as nonlinear maps of the latent path."""
    bdp_packets = path.capacity_mbps * path.rtt_ms / PACKET_KBIT
    log_loss = float(np.log10(path.loss))
    values = {
        "init_cwnd": _squash(1.3 * (np.log(bdp_packets) - np.log(120.0))),
        "mult_increase": _squash(
            1.5 * np.log(path.capacity_mbps / 30.0) - np.log(path.rtt_ms / 60.0)
        ),
        "add_increase": 0.5 + 0.4 * float(np.sin(1.7 * np.log(bdp_packets))),
        "mult_decrease": _squash(2.2 * (log_loss + 2.4)),
        "loss_threshold": _squash(3.0 * (log_loss + 2.2) + (0.8 if path.busy else 0.0)),
        "rtt_threshold": _squash(1.6 * np.log(path.rtt_ms / 90.0) - (1.0 if path.busy else 0.0)),
        "window_intervals": _squash(2.0 * float(np.cos(path.rtt_ms / 45.0))),
    }
    return _on_grid(FLEET_DIMS, [values[d] for d in FLEET_DIMS])


def surface(path: Path) -> TwoPeaks:
    peak = max(path.capacity_mbps * (1.0 - min(8.0 * path.loss, 0.5)), MIN_PEAK_MBPS)
    x = optimum(path)
    drops = tuple(peak * s for s in DROP_SHARE)
    delay = 0.15 * path.rtt_ms
    main = Surface(peak=peak, optimum=x, drop_low=drops, drop_high=drops, delay_ms=delay)
    mirrored = tuple(1.0 - v if d in MIRRORED else v for d, v in zip(FLEET_DIMS, x, strict=True))
    steep = tuple(SECOND_DROP_FACTOR * v for v in drops)
    second = Surface(
        peak=SECOND_PEAK_SHARE * peak,
        optimum=_on_grid(FLEET_DIMS, mirrored),
        drop_low=steep,
        drop_high=steep,
        delay_ms=delay,
    )
    return TwoPeaks(main, second)


def hosts_per_context(n: int, rng: np.random.Generator, exponent: float) -> list[int]:
    """Zipf traffic: context i gets hosts ∝ rank(i)^−exponent (ranks at random), at least 1."""
    ranks = rng.permutation(n) + 1
    weights = ranks.astype(float) ** -exponent
    return [max(1, round(HOSTS_TOTAL * w / weights.sum())) for w in weights]


@dataclass(frozen=True)
class Fleet:
    """A fleet-shaped landscape and its traffic (hosts per context)."""

    landscape: Landscape
    hosts: dict[int, int]
    paths: dict[int, Path]


def fleet_landscape(name: str, exponent: float = ZIPF_EXPONENT) -> Fleet:
    """Every feature and the traffic drawn from ``name`` (see the module docstring)."""
    rng = np.random.default_rng(zlib.crc32(f"fleet|{name}".encode()))
    region_rtt = np.exp(rng.uniform(np.log(15.0), np.log(180.0), len(DST_REGIONS)))
    region_capacity = np.exp(rng.uniform(np.log(0.5), np.log(1.5), len(DST_REGIONS)))
    pair = np.exp(PAIR_SPREAD * rng.standard_normal((len(DST_REGIONS), len(ISPS), 3)))
    contexts: dict[int, ContextKey] = {}
    paths: dict[int, Path] = {}
    cid = 0
    for s, src in enumerate(SRC_REGIONS):
        for r, dst in enumerate(DST_REGIONS):
            for i, isp in enumerate(ISPS):
                for b, hour in enumerate(BLOCK_HOURS):
                    cid += 1
                    busy = b == 1
                    rtt = region_rtt[r] * ISP_RTT_FACTOR[i] * pair[r, i, 0] + SRC_EXTRA_RTT_MS[s]
                    cap = ISP_CAPACITY_MBPS[i] * region_capacity[r] * pair[r, i, 1]
                    loss = ISP_LOSS[i] * pair[r, i, 2] ** 2
                    if busy:
                        rtt, cap = rtt * BUSY_RTT_FACTOR, cap * BUSY_CAPACITY_FACTOR
                        loss *= BUSY_LOSS_FACTOR
                    contexts[cid] = ContextKey(src, "cdn-a", dst, isp, hour)
                    paths[cid] = Path(float(rtt), float(cap), float(min(loss, 0.05)), busy)
    hosts = hosts_per_context(len(contexts), rng, exponent)
    landscape = Landscape(
        name,
        FLEET_DIMS,
        contexts,
        {c: surface(p) for c, p in paths.items()},
    )
    return Fleet(landscape, dict(zip(sorted(contexts), hosts, strict=True)), paths)


FLEET_LANDSCAPES = {
    "fleet-a": lambda: fleet_landscape("fleet-a"),
    "fleet-b": lambda: fleet_landscape("fleet-b"),
    "fleet-c": lambda: fleet_landscape("fleet-c", exponent=1.3),
}
TUNING = ("fleet-a",)
HELD_OUT = ("fleet-b", "fleet-c")
