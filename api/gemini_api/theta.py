"""Loader and checks for θ specifications: one per datapath, ``specs/<datapath>.toml``.

A datapath is a congestion control whose parameters Booster tunes, with a way to apply them;
``gemini_api.datapaths`` is the registry that says which exist and how each is applied. This
module knows only the θ part of a spec: parameters, units, regions, defaults. ``load_spec()``
is the first datapath's (Fusion's, per destination context through its module's table).

θ is carried everywhere as integers in the spec's units (one unit = one step of granularity), the
same integers the kernel's sysctls take. That keeps Booster, the agent and the kernel bit-exact:
no float ever has to be rounded on its way into the kernel.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache, cached_property
from pathlib import Path
from types import MappingProxyType

SPECS_DIR = Path(__file__).with_name("specs")
SPEC_PATH = SPECS_DIR / "fusion.toml"  # the first datapath's, which load_spec() reads
REGIONS = ("production", "wide")
SCOPES = ("context", "host")  # one θ per destination context, or one per host


class ThetaError(ValueError):
    """A θ that does not fit the spec or a region; the message names each offending parameter."""


@dataclass(frozen=True)
class ThetaParam:
    name: str
    symbol: str
    meaning: str
    unit: str
    scale: int
    production: tuple[int, int]
    wide: tuple[int, int]
    default: int

    def bounds(self, region: str) -> tuple[int, int]:
        if region not in REGIONS:
            raise ThetaError(f"unknown region {region!r}; expected one of {REGIONS}")
        return self.production if region == "production" else self.wide

    def to_natural(self, units: int) -> float:
        return units / self.scale


Bounds = Mapping[str, tuple[int, int]]


@dataclass(frozen=True)
class ThetaSpec:
    version: int
    params: tuple[ThetaParam, ...]
    datapath: str
    target: str = ""  # where θ is written (Fusion: its sysctls and netlink table)
    scope: str = "context"

    @cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def param(self, name: str) -> ThetaParam:
        for p in self.params:
            if p.name == name:
                return p
        raise ThetaError(f"unknown θ parameter {name!r}")

    def region_bounds(self, region: str) -> dict[str, tuple[int, int]]:
        return {p.name: p.bounds(region) for p in self.params}

    @cached_property
    def limits(self) -> Mapping[str, tuple[int, int]]:
        """Θ': the kernel's limits, which every policy's region lies inside (read-only)."""
        return MappingProxyType(self.region_bounds("wide"))

    def default(self) -> dict[str, int]:
        return {p.name: p.default for p in self.params}

    def check_bounds(self, bounds: Bounds) -> None:
        """A custom region must name every parameter and lie inside Θ' (the kernel's limits)."""
        errors = []
        unknown = set(bounds) - set(self.names)
        if unknown:
            errors.append(f"unknown parameters {sorted(unknown)}")
        for p in self.params:
            if p.name not in bounds:
                errors.append(f"{p.name}: missing")
                continue
            lo, hi = bounds[p.name]
            wlo, whi = p.wide
            if not (wlo <= lo <= hi <= whi):
                errors.append(f"{p.name}: [{lo}, {hi}] is not an interval inside Θ' [{wlo}, {whi}]")
        if errors:
            raise ThetaError("; ".join(errors))

    def violations(self, theta: Mapping[str, int], bounds: Bounds) -> list[str]:
        """Every way ``theta`` misses ``bounds``, one message per parameter (empty when it fits)."""
        errors = [f"{k}: unknown parameter" for k in sorted(set(theta) - set(self.names))]
        for p in self.params:
            if p.name not in theta:
                errors.append(f"{p.name}: missing")
                continue
            v = theta[p.name]
            if isinstance(v, bool) or not isinstance(v, int):
                errors.append(f"{p.name}: {v!r} is not an integer number of units")
                continue
            lo, hi = bounds[p.name]
            if not lo <= v <= hi:
                errors.append(f"{p.name}: {v} outside [{lo}, {hi}] ({p.unit} × 1/{p.scale})")
        return errors

    def validate(self, theta: Mapping[str, int], bounds: Bounds) -> dict[str, int]:
        errors = self.violations(theta, bounds)
        if errors:
            raise ThetaError("θ rejected: " + "; ".join(errors))
        return {p.name: int(theta[p.name]) for p in self.params}

    def key(self, theta: Mapping[str, int]) -> str:
        """A canonical text key for a θ, stable across processes (used as a database key)."""
        return ",".join(str(int(theta[n])) for n in self.names)

    def from_message(self, msg: object) -> dict[str, int]:
        """θ from anything carrying the parameters as attributes (the protobuf Theta)."""
        return {n: int(getattr(msg, n)) for n in self.names}

    def from_key(self, key: str) -> dict[str, int]:
        values = [int(v) for v in key.split(",")]
        if len(values) != len(self.params):
            raise ThetaError(f"θ key {key!r} has {len(values)} values, expected {len(self.params)}")
        return dict(zip(self.names, values, strict=True))

    def natural(self, theta: Mapping[str, int]) -> dict[str, float]:
        return {p.name: p.to_natural(theta[p.name]) for p in self.params}


def parse_spec(raw: Mapping) -> ThetaSpec:
    """The θ part of a spec file's table (the registry reads the rest of it)."""
    if "datapath" not in raw:
        raise ThetaError("spec: missing 'datapath' (the name the registry knows it by)")
    scope = raw.get("scope", "context")
    if scope not in SCOPES:
        raise ThetaError(f"spec scope {scope!r}; expected one of {SCOPES}")
    params = []
    for entry in raw["param"]:
        p = ThetaParam(
            name=entry["name"],
            symbol=entry["symbol"],
            meaning=entry["meaning"],
            unit=entry["unit"],
            scale=int(entry["scale"]),
            production=(int(entry["production"][0]), int(entry["production"][1])),
            wide=(int(entry["wide"][0]), int(entry["wide"][1])),
            default=int(entry["default"]),
        )
        wlo, whi = p.wide
        plo, phi = p.production
        if not (wlo <= plo <= p.default <= phi <= whi):
            raise ThetaError(f"spec for {p.name}: need wide ⊇ production ∋ default")
        params.append(p)
    return ThetaSpec(
        version=int(raw["version"]),
        params=tuple(params),
        datapath=str(raw["datapath"]),
        target=str(raw.get("target", "")),
        scope=scope,
    )


@cache
def load_spec(path: Path = SPEC_PATH) -> ThetaSpec:
    with open(path, "rb") as f:
        return parse_spec(tomllib.load(f))
