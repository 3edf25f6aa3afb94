"""The prototype's tunable parameters (θ), read from the file the agent writes at each flow's
start, checked against the datapath's spec (api/gemini_api/specs/flashpass.toml) so that a θ
outside Θ' never runs; the file holds the spec's integer units, one ``name = units`` a line.

A flow's record names the θ it ran by its units and a version: the file's modification time in
nanoseconds (0 without a file: the spec's default). The agent replaces the file in one rename
for every new θ (gemini_agent.datapath.ConfigFile), so each θ it writes is a new file with a
new time, and the version needs no change to the file's format or its writer; it is read from
the same open file as the values, so the two agree while the agent replaces the file. Two
writes within the file system's timestamp granularity (a jiffy) would share a version; the
agent writes at most once per refresh, a second or more apart."""

from __future__ import annotations

import os
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


@dataclass(frozen=True)
class ThetaRead:
    """θ as one flow read it: natural values, the spec's units, and the file's version."""

    theta: Theta
    units: dict[str, int]
    version: int  # the file's st_mtime_ns; 0 without a file (the spec's default)


def read_theta_file(path: Path | None) -> ThetaRead:
    """θ from ``path`` with its version (the spec's default, version 0, when there is no
    file); ThetaError naming the file when it is not a complete θ inside Θ'."""
    try:
        fd = os.open(path, os.O_RDONLY) if path is not None else None
    except FileNotFoundError:
        fd = None
    if fd is None:
        return ThetaRead(Theta.default(), spec().default(), 0)
    with os.fdopen(fd, "rb") as f:
        version, text = os.fstat(fd).st_mtime_ns, f.read()
    try:
        units = spec().validate(tomllib.loads(text.decode()), spec().limits)
        return ThetaRead(Theta.from_units(units), units, version)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, ValueError, TypeError) as exc:
        raise ThetaError(f"{path}: {exc}") from None


def read_theta(path: Path | None) -> Theta:
    """θ from ``path`` (the spec's default when there is no file); ThetaError naming the file
    when it is not a complete θ inside Θ'."""
    return read_theta_file(path).theta
