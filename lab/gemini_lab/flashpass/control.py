"""Algorithm 2 of the paper: each flow's emulation rate, adjusted once per RTT (MIMD).

    loss = 1 − credits_in / emulation_out            (over the last RTT)
    loss > max_target_loss:  rate ← rate · (1 − loss) · (1 + min_target_loss)
    loss < min_target_loss:  rate ← min(max_rate, rate · (1 + max_target_loss))
    otherwise unchanged; the first rate is max_rate (the link's emulation share).

Cutting to (1 − loss) brings a flow's emulation to what survived, and the (1 + min) keeps a
little probing above it; between the two bounds the rate holds, so competing flows settle with
a small, steady emulation loss: the data that loss stands for was never sent.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EmulationRate:
    max_rate_pps: float
    min_target_loss: float
    max_target_loss: float
    rate_pps: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.min_target_loss < self.max_target_loss < 1:
            raise ValueError(
                f"target loss bounds must satisfy 0 <= min < max < 1, got "
                f"{self.min_target_loss}, {self.max_target_loss}"
            )
        self.rate_pps = self.rate_pps or self.max_rate_pps

    def update(self, emulation_out: int, credits_in: int, floor_pps: float) -> float:
        """The new rate after one RTT in which ``emulation_out`` packets left and
        ``credits_in`` credits came back; unchanged when nothing was sent. Never below
        ``floor_pps`` (the sender's one packet per RTT: a flow that stopped emulating would
        learn nothing more, and a sample of one or two packets can read 100 % loss)."""
        if emulation_out <= 0:
            return self.rate_pps
        loss = max(0.0, 1.0 - credits_in / emulation_out)
        if loss > self.max_target_loss:
            self.rate_pps *= (1 - loss) * (1 + self.min_target_loss)
        elif loss < self.min_target_loss:
            self.rate_pps *= 1 + self.max_target_loss
        self.rate_pps = min(self.max_rate_pps, max(floor_pps, self.rate_pps))
        return self.rate_pps
