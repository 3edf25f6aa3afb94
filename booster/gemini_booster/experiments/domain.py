"""What an experiment is: arms, a population of hosts, a split, a schedule, a guardrail.

An arm is a congestion control and how its parameters are set: the kernel's defaults
(``kernel_default``: the CC as the host would run it, Fusion with the θ spec's defaults), a
fixed θ (``fixed``: a CC with a θ spec, Fusion or CUBIC, inside its Θ′: what the kernel
accepts), or whatever a Booster policy plans (``policy``, the policy's target CC). The control
arm is the one every other arm is compared with, and the one the guardrail protects. An arm runs
its CC host-wide, or on the routes to the destination prefixes it lists only (the route's
``congctl`` attribute).

Booster keeps no inventory of hosts (a host is known only by the id its agent token is bound
to, without region or labels), so the population is declared with the experiment: hosts per
region (``population.regions``), and hosts without a region (``population.hosts``, region
``""``). Regions are the strata that assignment keeps balanced and that results can be read by.

Days: results, the crossover and the stored per-host sums go by experiment day, and a day is
labelled by a date everywhere (``crossover_day``, results rows, ``experiment_host_days.day``).
A day lasts ``day_seconds``: 86,400 by default, the UTC calendar day; shorter for a lab or
staging rehearsal that must see a crossover in minutes, not weeks. Day boundaries are the
multiples of ``day_seconds`` since the Unix epoch, and day k of the experiment (k = 0 for the
day holding ``start``) is labelled the UTC date of ``start`` plus k days. So with the default
the boundaries are the UTC midnights and the labels the calendar dates; with 120 s, an
experiment started at 2026-11-23T08:01:10Z has day 0 = [08:00:00, 08:02:00) labelled
2026-11-23, day 1 = [08:02, 08:04) labelled 2026-11-24, and so on. ``Days`` is that mapping,
the one place an instant becomes a day and a day its first instant; other modules ask the
experiment (``Experiment.day_of``, ``Experiment.day_start``), never ``.date()`` or midnight.

A crossover day swaps the two arms' host groups at its first instant, so every day lies wholly
in one period and each host runs each arm for one period.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Annotated, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gemini_api.datapaths import datapaths, registry
from gemini_api.sums import Objective

from ..models import NAME_PATTERN, Sigma

ParamMode = Literal["kernel_default", "fixed", "policy"]
Status = Literal["scheduled", "running", "ended", "stopped"]

MIN_ARMS, MAX_ARMS = 2, 8
MAX_HOSTS = 100_000  # a fleet's worth; the create body stays well under the REST body limit
MAX_DAYS = 366  # results are computed per day: bound the work of one results call
SPLIT_TOLERANCE = 1e-6  # shares must add up to 1 within this
NO_REGION = ""  # the region of hosts declared without one
DAY = timedelta(days=1)  # from one day's label to the next, whatever the day's length
CALENDAR_DAY_SECONDS = 86_400  # the default day: the UTC calendar day
MIN_DAY_SECONDS = 60  # the shortest day (see ``ExperimentCreate.day_seconds``)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)  # day boundaries are multiples of a day since then

# A CC name as the kernel knows it (TCP_CA_NAME_MAX is 16 with the NUL), as agents report it.
CCName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,15}$", description="e.g. fusion, cubic")]
ArmName = Annotated[str, Field(pattern=NAME_PATTERN)]
HostId = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^\S+$")]
RegionName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^\S+$")]
Share = Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)]
# A destination prefix (e.g. 203.0.113.0/24, 2001:db8::/32): an arm may set its CC on the
# routes to at most this many (each one a route the agent writes and later restores).
DestinationPrefix = Annotated[str, Field(min_length=3, max_length=43)]
MAX_DESTINATIONS = 64


class ArmSpec(BaseModel):
    """One arm: a CC, and how its parameters are set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: ArmName
    cc: CCName
    params: ParamMode = Field(
        "kernel_default", description="kernel_default, fixed (θ given) or policy (policy named)"
    )
    theta: dict[str, int] | None = Field(
        None, description="θ in the CC's spec units (params 'fixed' only), inside Θ′"
    )
    policy: str | None = Field(
        None, pattern=NAME_PATTERN, description="the policy that tunes θ (params 'policy' only)"
    )
    destinations: list[DestinationPrefix] | None = Field(
        None,
        max_length=MAX_DESTINATIONS,
        description="the CC on the routes to these prefixes only (the route's congctl); "
        "unset: host-wide (net.ipv4.tcp_congestion_control)",
    )

    @field_validator("destinations")
    @classmethod
    def _prefixes(cls, prefixes: list[str] | None) -> list[str] | None:
        """Each a network address with its length (no host bits): the route the agent sets."""
        if prefixes is None:
            return None
        if not prefixes:
            raise ValueError("destinations: empty (leave it unset for host-wide)")
        try:
            canonical = [str(ipaddress.ip_network(p, strict=True)) for p in prefixes]
        except ValueError as e:
            raise ValueError(f"destinations: {e}") from e
        if len(set(canonical)) != len(canonical):
            raise ValueError("destinations: a prefix is listed twice")
        return canonical

    @model_validator(mode="after")
    def _params_match_mode(self) -> ArmSpec:
        if self.params == "fixed":
            tuned = registry().for_cc(self.cc)
            if tuned is None:
                raise ValueError(f"theta: {self.cc} has no θ spec (fixed θ: {datapaths()})")
            if self.theta is None:
                raise ValueError("theta: required when params is 'fixed'")
            spec = tuned.spec
            problems = spec.violations(self.theta, spec.limits)
            if problems:
                raise ValueError("theta: " + "; ".join(problems))
        elif self.theta is not None:
            raise ValueError("theta: only allowed when params is 'fixed'")
        if self.params == "policy":
            if self.policy is None:
                raise ValueError("policy: required when params is 'policy'")
        elif self.policy is not None:
            raise ValueError("policy: only allowed when params is 'policy'")
        return self


class GuardrailSpec(BaseModel):
    """Stop an arm once its utility is below control's by more than ``margin`` with
    ``confidence`` (one-sided), at ``sigma`` (the experiment's σ when unset)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    margin: float = Field(ge=0, le=1e6, allow_inf_nan=False, description="utility, Mbit/s")
    confidence: float = Field(0.95, ge=0.5, le=0.9999, allow_inf_nan=False)
    sigma: Sigma | None = None
    min_hosts: int = Field(
        5, ge=2, le=MAX_HOSTS, description="hosts with flows needed in each arm before acting"
    )


class PopulationSpec(BaseModel):
    """The hosts in the experiment: per region, and without one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    regions: dict[RegionName, list[HostId]] = Field(default_factory=dict)
    hosts: list[HostId] = Field(default_factory=list, description="hosts without a region")

    @model_validator(mode="after")
    def _each_host_once(self) -> PopulationSpec:
        listed = [h for hs in self.regions.values() for h in hs] + list(self.hosts)
        if not listed:
            raise ValueError("population: no hosts")
        if len(listed) > MAX_HOSTS:
            raise ValueError(f"population: {len(listed)} hosts, at most {MAX_HOSTS}")
        twice = sorted(h for h, n in Counter(listed).items() if n > 1)
        if twice:
            raise ValueError(f"population: hosts listed twice: {twice[:5]}")
        return self

    def host_regions(self) -> dict[str, str]:
        out = {h: region for region, hs in self.regions.items() for h in hs}
        out.update((h, NO_REGION) for h in self.hosts)
        return out


@dataclass(frozen=True)
class Days:
    """An experiment's days: boundaries at the multiples of ``seconds`` since the epoch, day k
    (k = 0 holding ``start``) labelled ``start``'s UTC date + k days (the module docstring).

    With ``seconds`` = 86,400 a boundary is a UTC midnight and a label the calendar date, for
    any instant. Exact in integer microseconds (no float timestamps): a report at the last
    microsecond of a day counts for that day."""

    start: datetime
    seconds: int = CALENDAR_DAY_SECONDS

    def _index(self, at: datetime) -> int:
        """Which day since the epoch ``at`` falls in (days of ``seconds``)."""
        return (at - EPOCH) // timedelta(seconds=self.seconds)

    @property
    def first(self) -> date:
        """The label of day 0, the day holding ``start``: its UTC date."""
        return self.start.astimezone(UTC).date()

    def day_of(self, at: datetime) -> date:
        """The label of the day ``at`` falls in (before ``start``: earlier labels)."""
        return self.first + (self._index(at) - self._index(self.start)) * DAY

    def day_start(self, day: date) -> datetime:
        """The first instant of the day labelled ``day``."""
        k = self._index(self.start) + (day - self.first).days
        return EPOCH + k * timedelta(seconds=self.seconds)

    def between(self, start: datetime, end: datetime) -> list[date]:
        """The labels of every day that [start, end) touches, in order."""
        first, last = self.day_of(start), self.day_of(end - timedelta(microseconds=1))
        return [first + i * DAY for i in range((last - first).days + 1)]


class ExperimentCreate(BaseModel):
    """What an operator declares. Fields are checked in order, so a rule that relates two
    fields is reported under the later one (e.g. ``end`` before ``start`` names ``end``)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_PATTERN)
    description: str = Field("", max_length=1000)
    arms: list[ArmSpec] = Field(min_length=MIN_ARMS, max_length=MAX_ARMS)
    control: ArmName | None = Field(None, description="the arm others are compared with: first")
    split: list[Share] | None = Field(
        None, description="each arm's share of the hosts, in (0, 1), adding up to 1: equal"
    )
    population: PopulationSpec
    day_seconds: int = Field(
        CALENDAR_DAY_SECONDS,
        ge=MIN_DAY_SECONDS,
        le=CALENDAR_DAY_SECONDS,
        description="an experiment day, in seconds, dividing 86400: 86400 for UTC calendar "
        "days, e.g. 120 for a rehearsal whose days are two minutes",
    )
    start: AwareDatetime
    end: AwareDatetime
    crossover_day: date | None = Field(
        None,
        description="the day (its label) from whose first instant the two arms swap host "
        "groups: 00:00 UTC of that date with calendar days",
    )
    sigma: Sigma = 1.0
    objective: Objective = Field(
        Objective.FLOW_MEAN,
        description="what an arm's utility is over its flows, as a policy's objective: "
        "flow-mean (eq. 9) or completion (all bits over all flow durations − σ·mean queueing "
        "delay: short flows, incast; the hosts are asked for its sums, and flows of agents "
        "older than them do not count in it)",
    )
    guardrail: GuardrailSpec | None = None
    salt: str | None = Field(
        None, min_length=1, max_length=64, description="assignment seed (random when unset)"
    )

    @field_validator("arms")
    @classmethod
    def _distinct_names(cls, arms: list[ArmSpec]) -> list[ArmSpec]:
        names = [a.name for a in arms]
        if len(set(names)) != len(names):
            raise ValueError(f"arms: names must differ, got {names}")
        return arms

    @field_validator("control")
    @classmethod
    def _control_is_an_arm(cls, control: str | None, info: ValidationInfo) -> str | None:
        arms = info.data.get("arms")
        if control is not None and arms is not None and control not in {a.name for a in arms}:
            raise ValueError(f"control: {control!r} is not one of the arms")
        return control

    @field_validator("split")
    @classmethod
    def _split_fits_arms(
        cls, split: list[float] | None, info: ValidationInfo
    ) -> list[float] | None:
        if split is None:
            return None
        arms = info.data.get("arms")
        if arms is not None and len(split) != len(arms):
            raise ValueError(f"split: {len(split)} shares for {len(arms)} arms")
        if abs(sum(split) - 1) > SPLIT_TOLERANCE:
            raise ValueError(f"split: shares add up to {sum(split)}, not 1")
        return split

    @field_validator("day_seconds")
    @classmethod
    def _day_tiles_a_calendar_day(cls, seconds: int) -> int:
        """A day divides the calendar day, so every UTC midnight is a boundary: boundaries fall
        on round clock times (120 s: every even minute) that a rehearsal can be scheduled on
        and read off a clock, and a calendar day holds a whole number of experiment days, so a
        compressed experiment is a real one scaled down. The floor of 60 s keeps a day longer
        than a GetParameters refresh and an agent's report interval can usefully be made: a
        host changes arm only when it next asks, and a report counts for the day its interval
        starts in."""
        if CALENDAR_DAY_SECONDS % seconds:
            raise ValueError(
                f"day_seconds: {seconds} does not divide {CALENDAR_DAY_SECONDS} "
                "(e.g. 60, 120, 300, 600, 3600, 86400)"
            )
        return seconds

    @field_validator("end")
    @classmethod
    def _end_after_start(cls, end: datetime, info: ValidationInfo) -> datetime:
        start = info.data.get("start")
        seconds = info.data.get("day_seconds", CALENDAR_DAY_SECONDS)
        if start is not None:
            if end <= start:
                raise ValueError("end: must be after start")
            if end - start > MAX_DAYS * timedelta(seconds=seconds):
                raise ValueError(f"end: an experiment lasts at most {MAX_DAYS} days of {seconds} s")
        if end <= datetime.now(UTC):
            raise ValueError("end: already past")
        return end

    @field_validator("crossover_day")
    @classmethod
    def _crossover_inside(cls, day: date | None, info: ValidationInfo) -> date | None:
        if day is None:
            return None
        arms, start, end, seconds = (
            info.data.get(k) for k in ("arms", "start", "end", "day_seconds")
        )
        if arms is not None and len(arms) != 2:
            raise ValueError("crossover_day: a crossover swaps exactly two arms")
        if start is None or end is None or seconds is None:
            return day
        at = Days(start, seconds).day_start(day)
        if not start < at < end:
            raise ValueError(
                f"crossover_day: {day} begins at {at.isoformat()} (days of day_seconds = "
                f"{seconds}), not strictly between start and end"
            )
        return day


@dataclass(frozen=True)
class Member:
    """A host of the population: its region, its group (the arm it runs in the first
    period), and when it left (None: still in). A host that left keeps its group, so its
    flows so far still count for its arm, and it gets the same group if it joins again."""

    region: str
    group: int
    left_at: datetime | None = None

    def present(self, at: datetime) -> bool:
        return self.left_at is None or at < self.left_at


@dataclass(frozen=True)
class ArmStop:
    """An arm stopped before the experiment ended (by an operator or the guardrail)."""

    at: datetime
    by: str
    reason: str


@dataclass(frozen=True)
class Experiment:
    """An experiment as stored: the declaration, its salt and id, and what stopped."""

    id: int
    name: str
    description: str
    salt: str
    arms: tuple[ArmSpec, ...]
    control: str
    split: tuple[float, ...]
    hosts: Mapping[str, Member]  # every host that ever joined, by id
    start: datetime
    end: datetime
    crossover_day: date | None
    sigma: float
    guardrail: GuardrailSpec | None
    created_at: datetime
    created_by: str
    stopped_at: datetime | None = None
    stopped_by: str | None = None
    stop_reason: str | None = None
    arm_stops: Mapping[str, ArmStop] = field(default_factory=dict)
    day_seconds: int = CALENDAR_DAY_SECONDS
    objective: Objective = Objective.FLOW_MEAN

    @property
    def arm_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.arms)

    def arm(self, name: str) -> ArmSpec:
        for a in self.arms:
            if a.name == name:
                return a
        raise KeyError(name)

    @property
    def calendar(self) -> Days:
        """The experiment's days (``Days``): every instant ↔ day mapping goes through it."""
        return Days(self.start, self.day_seconds)

    def day_of(self, at: datetime) -> date:
        """The label of the experiment day ``at`` falls in."""
        return self.calendar.day_of(at)

    def day_start(self, day: date) -> datetime:
        """The first instant of the experiment day labelled ``day``."""
        return self.calendar.day_start(day)

    @property
    def crossover_at(self) -> datetime | None:
        """The instant the two groups swap arms: the first of the crossover day."""
        return None if self.crossover_day is None else self.day_start(self.crossover_day)

    def status(self, now: datetime) -> Status:
        if self.stopped_at is not None and self.stopped_at <= now:
            return "stopped"
        if now < self.start:
            return "scheduled"
        if now >= self.end:
            return "ended"
        return "running"

    def period(self, day: date) -> int:
        """0 before the crossover day (or without one), 1 from it."""
        return int(self.crossover_day is not None and day >= self.crossover_day)

    def days(self) -> list[date]:
        """Every day the experiment touches, in order."""
        return self.calendar.between(self.start, self.end)

    def days_begun(self, at: datetime) -> list[date]:
        """The experiment's days that have begun by ``at`` (its days so far). Compared as
        instants, not as labels, so a long-past compressed experiment never needs the label
        of ``at``, which could lie beyond year 9999."""
        return [d for d in self.days() if self.day_start(d) <= at]

    def days_run(self, at: datetime) -> list[date]:
        """The days the experiment ran by ``at``: those begun by then and before a stop (a day
        that begins at or after the stop, or a stop before the start, leaves no day to show:
        no empty days after a stop)."""
        stop = self.stopped_at
        if stop is not None and stop <= self.start:
            return []
        return [d for d in self.days_begun(at) if stop is None or self.day_start(d) < stop]

    def live_at(self, at: datetime) -> bool:
        return self.status(at) == "running"

    def arm_live_at(self, arm: str, at: datetime) -> bool:
        stop = self.arm_stops.get(arm)
        return self.live_at(at) and (stop is None or at < stop.at)
