"""Link scenarios: the emulated paths of the Gemini paper's Table IV, as small TOML files.

A scenario gives the round-trip time, either a fixed rate or a rate schedule (a binned cellular
trace), random loss, and the bottleneck queue in packets or in multiples of the BDP.
"""

from __future__ import annotations

import csv
import math
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

SCENARIO_DIR = Path(__file__).with_name("scenarios")
PACKET_BYTES = 1500
MIN_RATE_KBIT = 8  # netem reads rate 0 as "unlimited"; a dead cellular bin is a near-stop


class ScenarioError(ValueError):
    """A scenario file that cannot describe a link; the message names the field."""


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

    def __post_init__(self) -> None:
        if (self.rate_mbit is None) == (self.rate_trace is None):
            raise ScenarioError(f"{self.name}: give exactly one of rate_mbit and rate_trace")
        if self.rtt_ms <= 0:
            raise ScenarioError(f"{self.name}: rtt_ms must be > 0")
        if not 0 <= self.loss_percent < 100:
            raise ScenarioError(f"{self.name}: loss_percent must be in [0, 100)")
        if (self.queue_bdp is None) == (self.queue_packets is None):
            raise ScenarioError(f"{self.name}: give exactly one of queue_bdp and queue_packets")

    def schedule(self) -> list[tuple[float, int]]:
        """(start seconds, rate kbit/s) rows; one row for a fixed-rate link."""
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
