"""Link scenarios: the emulated paths of the Gemini paper's Table IV, as small TOML files.

A scenario gives the round-trip time, either a fixed rate or a rate schedule (a binned cellular
trace), random loss, and the bottleneck queue in packets or in multiples of the BDP.

Two additions for the datacenter paths (issue #31, item 4):

- ``ecn_threshold_packets`` (DCTCP's K): the bottleneck queue marks ECN-capable packets CE once
  it holds K packets (RED, min K and max K + 1 packets, probability 1; gemini_lab.netem), and
  still tail-drops at its limit. ``burst_packets`` sets the shaper's token bucket: the lab's
  default (2 ms of tokens) is about a whole BDP of a 100 Mbit/s, 2 ms path and would hide the
  queue that K is about. ``receiver_cc`` is the receivers' default congestion control: DCTCP's
  receiver echoes CE exactly only when its own socket runs dctcp.
- ``hops``: a path of several links in the direction data flows, each with its rate, one-way
  delay, queue, loss, K and burst (``[[hops]]`` tables; the top-level link fields are then
  left out and ``rtt_ms`` must be twice the sum of the one-way delays). A queue in BDPs is a
  multiple of that hop's rate times the path's RTT. For the code that wants one rate and one
  queue (reports, the BDP), the path's bottleneck is its slowest hop (the first, on a tie).

Three more for the paths the Table IV set leaves out (issue #34; docs/lab-paths.md):

- ``jitter_ms`` J: the round trip varies uniformly over [RTT − J, RTT + J]. By default the
  variation does not reorder: it is drawn per ACK on the return path's delay line, and an ACK
  never overtakes the one before it (netem ``rate``: each packet leaves after the previous
  one), so a long draw holds back those behind it, as a Wi-Fi hop's retries do.
- ``jitter_reorder``: the variation is drawn per data packet instead, at the bottleneck queue,
  independently, so data arrives out of order (the return path then carries RTT − J).
- ``ack_burst_ms`` A: ACKs leave the return path in bursts, one every A ms (netem ``slot``),
  as a Wi-Fi station's aggregated frames deliver them.
"""

from __future__ import annotations

import csv
import math
import re
import tomllib
from dataclasses import asdict, dataclass, fields
from pathlib import Path

SCENARIO_DIR = Path(__file__).with_name("scenarios")
PACKET_BYTES = 1500
MIN_RATE_KBIT = 8  # netem reads rate 0 as "unlimited"; a dead cellular bin is a near-stop


CC_NAME = re.compile(r"[a-z][a-z0-9_]{0,15}")  # a kernel CC's name (TCP_CA_NAME_MAX 16)


class ScenarioError(ValueError):
    """A scenario file that cannot describe a link; the message names the field."""


def _check_link(
    where: str,
    loss_percent: float,
    queue_bdp: float | None,
    queue_packets: int | None,
    ecn_threshold_packets: int | None,
    burst_packets: int | None,
) -> None:
    """The checks one link's fields need, for the top level and for each hop alike."""
    if not 0 <= loss_percent < 100:
        raise ScenarioError(f"{where}: loss_percent must be in [0, 100)")
    if (queue_bdp is None) == (queue_packets is None):
        raise ScenarioError(f"{where}: give exactly one of queue_bdp and queue_packets")
    if queue_packets is not None and queue_packets < 1:
        raise ScenarioError(f"{where}: queue_packets must be >= 1")
    if queue_bdp is not None and queue_bdp <= 0:
        raise ScenarioError(f"{where}: queue_bdp must be > 0")
    if ecn_threshold_packets is not None:
        if ecn_threshold_packets < 1:
            raise ScenarioError(f"{where}: ecn_threshold_packets must be >= 1")
        if queue_packets is not None and ecn_threshold_packets >= queue_packets:
            raise ScenarioError(
                f"{where}: ecn_threshold_packets ({ecn_threshold_packets}) must be below "
                f"queue_packets ({queue_packets}), or the queue drops before it marks"
            )
        if loss_percent:
            raise ScenarioError(
                f"{where}: loss_percent and ecn_threshold_packets on one link: the marking "
                "queue replaces netem there; put the random loss on another hop"
            )
    if burst_packets is not None and burst_packets < 1:
        raise ScenarioError(f"{where}: burst_packets must be >= 1")


@dataclass(frozen=True)
class Hop:
    """One link of a multi-hop path, in the direction data flows (see the module's notes)."""

    rate_mbit: float
    delay_ms: float  # one way
    queue_packets: int | None = None
    queue_bdp: float | None = None
    loss_percent: float = 0.0
    ecn_threshold_packets: int | None = None
    burst_packets: int | None = None
    name: str = ""  # what the hop stands for ("dc-switch", "wan"), for people

    def check(self, where: str) -> None:
        if self.rate_mbit <= 0:
            raise ScenarioError(f"{where}: rate_mbit must be > 0")
        if self.delay_ms < 0:
            raise ScenarioError(f"{where}: delay_ms must be >= 0")
        _check_link(
            where,
            self.loss_percent,
            self.queue_bdp,
            self.queue_packets,
            self.ecn_threshold_packets,
            self.burst_packets,
        )


@dataclass(frozen=True)
class Link:
    """One shaped link as the lab builds it: the rate it starts at, its queue in packets."""

    rate_kbit: int
    queue_limit: int
    loss_percent: float = 0.0
    ecn_threshold_packets: int | None = None
    burst_packets: int | None = None
    jitter_ms: float = 0.0  # data-path delay variation (Scenario.jitter_reorder), 0 to 2 J


# the top-level fields that describe a single link, left out when a scenario lists hops
LINK_FIELDS = (
    "rate_mbit",
    "rate_trace",
    "loss_percent",
    "queue_bdp",
    "queue_packets",
    "ecn_threshold_packets",
    "burst_packets",
)


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    rtt_ms: float
    rate_mbit: float | None = None
    rate_trace: str | None = None
    loss_percent: float = 0.0
    queue_bdp: float | None = None
    queue_packets: int | None = None
    ecn_threshold_packets: int | None = None
    burst_packets: int | None = None
    receiver_cc: str | None = None
    hops: tuple[Hop, ...] = ()
    jitter_ms: float = 0.0
    jitter_reorder: bool = False
    ack_burst_ms: float = 0.0

    def __post_init__(self) -> None:
        if self.rtt_ms <= 0:
            raise ScenarioError(f"{self.name}: rtt_ms must be > 0")
        self._check_variation()
        if self.receiver_cc is not None and not CC_NAME.fullmatch(self.receiver_cc):
            raise ScenarioError(f"{self.name}: receiver_cc {self.receiver_cc!r} is not a CC name")
        if self.hops:
            self._check_hops()
        else:
            if (self.rate_mbit is None) == (self.rate_trace is None):
                raise ScenarioError(f"{self.name}: give exactly one of rate_mbit and rate_trace")
            _check_link(
                self.name,
                self.loss_percent,
                self.queue_bdp,
                self.queue_packets,
                self.ecn_threshold_packets,
                self.burst_packets,
            )
        if self.ecn_threshold_packets is not None or any(
            h.ecn_threshold_packets for h in self.hops
        ):
            for i, link in enumerate(self.links()):
                k = link.ecn_threshold_packets
                if k is not None and k >= link.queue_limit:
                    where = f"{self.name}: hops[{i}]" if self.hops else self.name
                    raise ScenarioError(
                        f"{where}: ecn_threshold_packets ({k}) must be below the queue "
                        f"({link.queue_limit} packets), or the queue drops before it marks"
                    )

    def _check_variation(self) -> None:
        """Jitter within the RTT (a round trip is never shorter than zero), reordering only
        where there is jitter and one netem queue to draw it in, bursts of a positive period."""
        if not 0 <= self.jitter_ms <= self.rtt_ms:
            raise ScenarioError(f"{self.name}: jitter_ms must be in [0, rtt_ms = {self.rtt_ms:g}]")
        if not isinstance(self.jitter_reorder, bool):
            raise ScenarioError(f"{self.name}: jitter_reorder must be true or false")
        if self.jitter_reorder and not self.jitter_ms:
            raise ScenarioError(f"{self.name}: jitter_reorder needs jitter_ms > 0")
        if self.jitter_reorder and (self.hops or self.ecn_threshold_packets is not None):
            raise ScenarioError(
                f"{self.name}: jitter_reorder draws at a single link's netem queue; "
                "a path of hops or an ECN-marking queue has none"
            )
        if self.ack_burst_ms < 0:
            raise ScenarioError(f"{self.name}: ack_burst_ms must be >= 0")

    def return_delay_ms(self) -> float:
        """The return path's base delay: the RTT, less the data path's mean jitter when that
        is where the variation is drawn."""
        return self.rtt_ms - (self.jitter_ms if self.jitter_reorder else 0.0)

    def capacity_kbit(self, start_s: float, duration_s: float) -> float:
        """The mean rate over [start_s, start_s + duration_s) of the schedule, looping as the
        lab replays it: what a flow that ran over that stretch could have carried."""
        rows = self.schedule()
        if len(rows) == 1 or duration_s <= 0:
            return float(rows[0][1])
        period = rows[-1][0] + (rows[1][0] - rows[0][0])
        ends = [at for at, _ in rows[1:]] + [period]
        total, t, end = 0.0, start_s, start_s + duration_s
        while t < end:
            base = (t // period) * period
            for (at, rate), stop in zip(rows, ends, strict=True):
                lo, hi = max(t, base + at), min(end, base + stop)
                if hi > lo:
                    total += rate * (hi - lo)
            t = base + period
        return total / duration_s

    def _check_hops(self) -> None:
        """Hops as dicts (a TOML file's tables, a plan's JSON) become Hop; the top level then
        carries no link of its own, and the delays add up to the RTT."""
        hops = []
        known = {f.name for f in fields(Hop)}
        for i, hop in enumerate(self.hops):
            where = f"{self.name}: hops[{i}]"
            if isinstance(hop, dict):
                unknown = sorted(set(hop) - known)
                if unknown:
                    raise ScenarioError(f"{where}: unknown field(s) {', '.join(unknown)}")
                try:
                    hop = Hop(**hop)
                except TypeError as exc:
                    raise ScenarioError(f"{where}: {exc}") from exc
            if not isinstance(hop, Hop):
                raise ScenarioError(f"{where}: a hop is a table of fields, not {hop!r}")
            hop.check(where)
            hops.append(hop)
        object.__setattr__(self, "hops", tuple(hops))
        defaults = {f.name: f.default for f in fields(Scenario)}
        given = [f for f in LINK_FIELDS if getattr(self, f) != defaults[f]]
        if given:
            raise ScenarioError(
                f"{self.name}: {', '.join(given)} belong to each hop when hops are listed"
            )
        one_way = sum(h.delay_ms for h in hops)
        if not math.isclose(2 * one_way, self.rtt_ms, rel_tol=1e-9, abs_tol=1e-9):
            raise ScenarioError(
                f"{self.name}: rtt_ms ({self.rtt_ms:g}) must be twice the hops' one-way "
                f"delay_ms (2 x {one_way:g} = {2 * one_way:g})"
            )

    def bottleneck(self) -> Hop | None:
        """The slowest hop of a multi-hop path (the first on a tie); None for one link."""
        return min(self.hops, key=lambda h: h.rate_mbit) if self.hops else None

    def links(self) -> list[Link]:
        """The path's links as the lab shapes them, in the direction data flows."""
        if not self.hops:
            return [
                Link(
                    self.schedule()[0][1],
                    self.queue_limit(),
                    self.loss_percent,
                    self.ecn_threshold_packets,
                    self.burst_packets,
                    self.jitter_ms if self.jitter_reorder else 0.0,
                )
            ]
        return [
            Link(
                int(h.rate_mbit * 1000),
                self._hop_queue(h),
                h.loss_percent,
                h.ecn_threshold_packets,
                h.burst_packets,
            )
            for h in self.hops
        ]

    def _hop_queue(self, hop: Hop) -> int:
        if hop.queue_packets is not None:
            return hop.queue_packets
        assert hop.queue_bdp is not None
        return max(1, math.ceil(self.bdp_packets(hop.rate_mbit * 1000) * hop.queue_bdp))

    def schedule(self) -> list[tuple[float, int]]:
        """(start seconds, rate kbit/s) rows; one row for a fixed-rate link (a multi-hop
        path's bottleneck hop)."""
        neck = self.bottleneck()
        if neck is not None:
            return [(0.0, int(neck.rate_mbit * 1000))]
        if self.rate_mbit is not None:
            return [(0.0, int(self.rate_mbit * 1000))]
        rows = list(csv.DictReader((SCENARIO_DIR / str(self.rate_trace)).open()))
        return [(int(r["start_ms"]) / 1000, max(int(r["rate_kbit"]), MIN_RATE_KBIT)) for r in rows]

    @property
    def mean_rate_kbit(self) -> float:
        rates = [r for _, r in self.schedule()]
        return sum(rates) / len(rates)

    def bdp_packets(self, rate_kbit: float | None = None) -> int:
        rate = self.mean_rate_kbit if rate_kbit is None else rate_kbit
        return max(1, math.ceil(rate * 1000 * self.rtt_ms / 1000 / (PACKET_BYTES * 8)))

    def queue_limit(self) -> int:
        """Bottleneck queue in packets."""
        neck = self.bottleneck()
        if neck is not None:
            return self._hop_queue(neck)
        if self.queue_packets is not None:
            return self.queue_packets
        assert self.queue_bdp is not None, f"{self.name}: neither queue_packets nor queue_bdp"
        return max(1, math.ceil(self.bdp_packets() * self.queue_bdp))

    def to_dict(self) -> dict:
        return asdict(self)


def load(name_or_path: str) -> Scenario:
    path = Path(name_or_path)
    if not path.suffix:
        path = SCENARIO_DIR / f"{name_or_path}.toml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in SCENARIO_DIR.glob("*.toml")))
        raise ScenarioError(f"no scenario {name_or_path!r}; shipped: {known}")
    data = tomllib.loads(path.read_text())
    try:
        return Scenario(**data)
    except TypeError as exc:
        raise ScenarioError(f"{path.name}: {exc}") from exc
