"""The prototype's tunable parameters (θ), read from the file the agent writes at each flow's
start, checked against the datapath's spec (api/gemini_api/specs/flashpass.toml) so that a θ
outside Θ' never runs; the file holds the spec's integer units, one ``name = units`` a line."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gemini_api.datapaths import datapath
from gemini_api.theta import ThetaError, ThetaSpec

DATAPATH = "flashpass"
PERCENT = 100.0
MS_PER_S = 1000.0


def spec() -> ThetaSpec:
    return datapath(DATAPATH).spec


@dataclass(frozen=True)
class Theta:
    """θ in natural units: loss bounds as fractions, T_wait in seconds."""

    min_target_loss: float
    max_target_loss: float
    t_wait_s: float

    @classmethod
    def from_units(cls, units: Mapping[str, int]) -> Theta:
        s = spec()
        checked = s.validate(units, s.limits)
        natural = s.natural(checked)
        return cls(
            natural["min_target_loss"] / PERCENT,
            natural["max_target_loss"] / PERCENT,
            natural["t_wait"] / MS_PER_S,
        )

    @classmethod
    def default(cls) -> Theta:
        return cls.from_units(spec().default())


def read_theta(path: Path | None) -> Theta:
    """θ from ``path`` (the spec's default when there is no file); ThetaError naming the file
    when it is not a complete θ inside Θ'."""
    if path is None or not path.exists():
        return Theta.default()
    try:
        raw = tomllib.loads(path.read_text())
        return Theta.from_units(raw)
    except (tomllib.TOMLDecodeError, ValueError, TypeError) as exc:
        raise ThetaError(f"{path}: {exc}") from None
