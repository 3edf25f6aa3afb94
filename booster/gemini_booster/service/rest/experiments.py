"""A/B experiments: operators create and stop them (audited), readers see them, their results
per day and per arm at any σ, and which arm a host runs now.

A host's arm is computed, not stored (``experiments/assignment.py``), so every replica answers
the same; a stopped experiment or arm answers "no experiment" for its hosts at once, which
restores them to their own defaults.
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, HTTPException, Path, Query
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field

from gemini_api.datapaths import registry
from gemini_api.sums import Objective

from ...experiments import assignment as assign
from ...experiments.domain import (
    DAY,
    MAX_HOSTS,
    ArmSpec,
    Experiment,
    ExperimentCreate,
    GuardrailSpec,
    HostId,
    PopulationSpec,
    Status,
)
from ...experiments.guardrail import Decision
from ...experiments.statistics import LEVEL, ArmResult, Difference, Estimate, Period, Results
from ...models import Sigma
from .. import experiments as ops
from .csvout import CSV_MEDIA, Format, csv_response
from .deps import BoosterDep, Reader, Writer
from .errors import AUTH_ERRORS, TOO_LARGE, error, refusals

router = APIRouter(prefix="/v1", tags=["experiments"], responses=AUTH_ERRORS)

NO_EXPERIMENT = error(404, "no experiment of that name")
ExperimentName = Annotated[str, Path(description="the experiment's name")]
HostPath = Annotated[
    str, Path(min_length=1, max_length=128, pattern=r"^\S+$", description="a host id")
]


class ArmStopOut(BaseModel):
    at: datetime
    by: str
    reason: str


class ArmOut(ArmSpec):
    stopped: ArmStopOut | None = None


class ExperimentOut(BaseModel):
    """An experiment, its state now, and how its hosts fell into arms per region."""

    name: str
    description: str
    status: Status
    arms: list[ArmOut]
    control: str
    split: list[float]
    start: datetime
    end: datetime
    crossover_day: date | None
    crossover_at: datetime | None = Field(
        description="the instant the two groups swap arms: the crossover day's first"
    )
    day_seconds: int = Field(description="an experiment day, in seconds (86400: UTC days)")
    sigma: float
    objective: Objective = Field(description="what an arm's utility is over its flows")
    guardrail: GuardrailSpec | None
    salt: str
    hosts: int = Field(description="hosts in the population now (joined and not left)")
    balance: dict[str, dict[str, int]] = Field(
        description="region → arm → hosts in the first period (groups swap at a crossover)"
    )
    created_at: datetime
    created_by: str
    stopped_at: datetime | None
    stopped_by: str | None
    stop_reason: str | None

    @classmethod
    def of(cls, e: Experiment) -> ExperimentOut:
        now = datetime.now(UTC)
        arms = [
            ArmOut(
                **a.model_dump(),
                stopped=None if (s := e.arm_stops.get(a.name)) is None else ArmStopOut(**vars(s)),
            )
            for a in e.arms
        ]
        return cls(
            name=e.name,
            description=e.description,
            status=e.status(now),
            arms=arms,
            control=e.control,
            split=list(e.split),
            start=e.start,
            end=e.end,
            crossover_day=e.crossover_day,
            crossover_at=e.crossover_at,
            day_seconds=e.day_seconds,
            sigma=e.sigma,
            objective=e.objective,
            guardrail=e.guardrail,
            salt=e.salt,
            hosts=sum(m.present(now) for m in e.hosts.values()),
            balance=assign.balance(e, now),
            created_at=e.created_at,
            created_by=e.created_by,
            stopped_at=e.stopped_at,
            stopped_by=e.stopped_by,
            stop_reason=e.stop_reason,
        )


class StopIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field("stopped by an operator", min_length=1, max_length=500)


class LeaveIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hosts: list[HostId] = Field(min_length=1, max_length=MAX_HOSTS)


class LeftOut(BaseModel):
    left: int = Field(description="how many of the hosts were in the population")


class HostArmOut(BaseModel):
    """The arm a host runs now, on which experiment day, and until when it holds (a crossover,
    the end)."""

    experiment: str
    arm: ArmSpec
    group: int
    period: int
    region: str
    day: date = Field(description="the experiment day now (its label)")
    day_index: int = Field(description="which day that is: 0 for the day holding the start")
    until: datetime


class HostAssignmentOut(BaseModel):
    host_id: str
    experiment: HostArmOut | None = Field(
        description="null: in no running experiment (or its arm stopped): own defaults"
    )


class EstimateOut(BaseModel):
    """A mean with its standard error and 95 % interval (null without two hosts)."""

    mean: float | None
    stderr: float | None
    low: float | None
    high: float | None

    @classmethod
    def of(cls, e: Estimate) -> EstimateOut:
        return cls(mean=e.mean, stderr=e.stderr, low=e.low, high=e.high)


class Metrics(BaseModel):
    utility: EstimateOut
    throughput_mbps: EstimateOut
    queue_delay_ms: EstimateOut
    slow_flow_share: EstimateOut = Field(description="flows below 100 KB/s")

    @classmethod
    def of(cls, m: dict[str, Estimate]) -> Metrics:
        return cls(
            utility=EstimateOut.of(m["utility"]),
            throughput_mbps=EstimateOut.of(m["throughput"]),
            queue_delay_ms=EstimateOut.of(m["delay"]),
            slow_flow_share=EstimateOut.of(m["slow_share"]),
        )


class ArmResultOut(Metrics):
    arm: str
    hosts: int
    flows: int

    @classmethod
    def of_arm(cls, a: ArmResult) -> ArmResultOut:
        return cls(arm=a.arm, hosts=a.hosts, flows=a.flows, **dict(Metrics.of(a.metrics)))


class DifferenceOut(Metrics):
    """``arm`` − ``control``: positive utility favours ``arm``. ``method``: parallel (hosts
    of the two arms compared), crossover (within host, period effect removed), or
    parallel_first_period (a crossover before enough hosts ran both arms)."""

    arm: str
    control: str
    method: str
    hosts: int

    @classmethod
    def of_difference(cls, d: Difference) -> DifferenceOut:
        return cls(
            arm=d.arm,
            control=d.control,
            method=d.method,
            hosts=d.hosts,
            **dict(Metrics.of(d.metrics)),
        )


class PeriodOut(BaseModel):
    arms: list[ArmResultOut]
    differences: list[DifferenceOut]

    @classmethod
    def of(cls, p: Period) -> PeriodOut:
        return cls(
            arms=[ArmResultOut.of_arm(a) for a in p.arms],
            differences=[DifferenceOut.of_difference(d) for d in p.differences],
        )


class DayOut(PeriodOut):
    """One experiment day. ``day`` is its label (a date: the calendar date with 86,400 s days,
    the start's date + ``index`` days with compressed ones); ``index``, ``start`` and ``end``
    say which stretch of time it really was, whatever the day's length."""

    day: date
    index: int = Field(description="0 for the day holding the experiment's start")
    start: datetime = Field(description="the day's first instant")
    end: datetime = Field(description="the next day's first instant")
    period: int


class ResultsOut(BaseModel):
    experiment: str
    sigma: float
    objective: Objective = Field(
        description="the experiment's; completion: utility and throughput are all bits over "
        "all durations of the flows carrying its sums, delay the mean over those flows"
    )
    level: float = Field(description="of every interval (two-sided)")
    day_seconds: int = Field(description="an experiment day, in seconds (86400: UTC days)")
    days: list[DayOut] = Field(
        description="each day the experiment ran so far (none after a stop), in order"
    )
    overall: PeriodOut

    @classmethod
    def of(cls, e: Experiment, r: Results) -> ResultsOut:
        first = e.calendar.first
        days = [
            DayOut(
                day=d.day,
                index=(d.day - first).days,
                start=e.day_start(d.day),
                end=e.day_start(d.day + DAY),
                period=d.period,
                **dict(PeriodOut.of(d)),
            )
            for d in r.days
        ]
        return cls(
            experiment=e.name,
            sigma=r.sigma,
            objective=e.objective,
            level=LEVEL,
            day_seconds=e.day_seconds,
            days=days,
            overall=PeriodOut.of(r.overall),
        )

    def csv_rows(self) -> list[dict[str, Any]]:
        """The same values as a table: per day, one row per arm (``row`` arm) then one per
        difference to control (``row`` difference); then the overall rows (``day`` overall)."""
        periods: list[tuple[dict[str, Any], PeriodOut]] = [
            (d.model_dump(include={"day", "index", "start", "end", "period"}), d) for d in self.days
        ]
        periods.append(({"day": "overall"}, self.overall))
        return [
            {"row": kind, **where, **item.model_dump()}
            for where, p in periods
            for kind, items in (("arm", p.arms), ("difference", p.differences))
            for item in items
        ]


class DecisionOut(BaseModel):
    arm: str
    stop: bool
    reason: str
    difference: float | None
    upper_bound: float | None

    @classmethod
    def of(cls, d: Decision) -> DecisionOut:
        return cls(**vars(d))


# A definition that works when pasted (into /docs' "Try it out", the dashboard, or curl): bbr
# as control against the default datapath at its spec default, 20 named hosts of two regions,
# for a week. Built from the registry, as every name of a datapath here is.
_EXAMPLE_CC = registry().default.cc
CREATE_EXAMPLES = {
    f"{_EXAMPLE_CC}-vs-bbr": {
        "summary": f"{_EXAMPLE_CC} at its default θ against bbr on 20 hosts, for a week",
        "value": {
            "name": f"{_EXAMPLE_CC}-vs-bbr",
            "description": f"does {_EXAMPLE_CC} at its default θ beat bbr on our EU and US hosts?",
            "arms": [
                {"name": "control", "cc": "bbr"},
                {"name": "tuned", "cc": _EXAMPLE_CC, "params": "kernel_default"},
            ],
            "population": {
                "regions": {
                    "eu": [f"eu-host-{i:02d}" for i in range(10)],
                    "us": [f"us-host-{i:02d}" for i in range(10)],
                }
            },
            "start": "2030-01-01T00:00:00Z",
            "end": "2030-01-08T00:00:00Z",
            "sigma": 1.0,
        },
    }
}


def _check_policies(body: ExperimentCreate, booster: BoosterDep) -> None:
    """An arm tuned by a policy names one this replica serves, for the CC it targets."""
    problems = []
    for i, arm in enumerate(body.arms):
        if arm.params != "policy":
            continue
        policy = booster.policies.get(arm.policy or "")
        loc = ("body", "arms", i, "policy")
        if policy is None:
            msg = f"policy: {arm.policy!r} does not exist"
        elif policy.target_cc != arm.cc:
            tunes = f"{policy.datapath} (CC {policy.target_cc})"
            msg = f"policy: {arm.policy!r} tunes {tunes}, not {arm.cc}"
        else:
            continue
        problems.append({"loc": loc, "msg": msg, "type": "value_error", "input": arm.policy})
    if problems:
        raise RequestValidationError(problems)


def _found(booster: BoosterDep, name: str) -> Experiment:
    with refusals():
        return ops.get_experiment(booster.engine, name)


@router.post(
    "/experiments",
    status_code=201,
    responses=error(409, "the name is taken, or a host is in an overlapping experiment")
    | TOO_LARGE,
)
def create_experiment(
    who: Writer,
    body: Annotated[ExperimentCreate, Body(openapi_examples=CREATE_EXAMPLES)],
    booster: BoosterDep,
) -> ExperimentOut:
    _check_policies(body, booster)
    with refusals():
        created = ops.create_experiment(booster.engine, body, who.name)
    booster.experiments_changed({created.id})
    return ExperimentOut.of(created)


@router.get("/experiments")
def list_experiments(_: Reader, booster: BoosterDep) -> list[ExperimentOut]:
    return [ExperimentOut.of(e) for e in ops.list_experiments(booster.engine)]


@router.get("/experiments/{name}", responses=NO_EXPERIMENT)
def get_experiment(_: Reader, name: ExperimentName, booster: BoosterDep) -> ExperimentOut:
    return ExperimentOut.of(_found(booster, name))


@router.post(
    "/experiments/{name}/stop",
    responses=NO_EXPERIMENT | error(409, "already stopped or over") | TOO_LARGE,
)
def stop_experiment(
    who: Writer, name: ExperimentName, booster: BoosterDep, body: StopIn | None = None
) -> ExperimentOut:
    """Stop now: every host of the experiment is restored to its own defaults."""
    reason = (body or StopIn()).reason
    with refusals():
        stopped = ops.stop_experiment(booster.engine, name, who.name, reason)
    booster.experiments_changed({stopped.id})
    return ExperimentOut.of(stopped)


@router.post(
    "/experiments/{name}/arms/{arm}/stop",
    responses=error(404, "no experiment of that name, or no such arm")
    | error(409, "the arm is already stopped, or the experiment is not running")
    | TOO_LARGE,
)
def stop_arm(
    who: Writer,
    name: ExperimentName,
    arm: Annotated[str, Path(description="the arm's name")],
    booster: BoosterDep,
    body: StopIn | None = None,
) -> ExperimentOut:
    """Stop one arm now: its hosts are restored to their own defaults, the others go on."""
    experiment = _found(booster, name)
    if arm not in experiment.arm_names:
        raise HTTPException(404, f"experiment {name!r} has no arm {arm!r}")
    reason = (body or StopIn()).reason
    if not ops.stop_arm(booster.engine, name, arm, who.name, reason):
        raise HTTPException(409, f"arm {arm!r} is already stopped, or {name!r} is not running")
    booster.experiments_changed({experiment.id})
    return ExperimentOut.of(_found(booster, name))


@router.post(
    "/experiments/{name}/join",
    responses=NO_EXPERIMENT
    | error(409, "stopped or over, or a host is in an overlapping experiment")
    | TOO_LARGE,
)
def join_hosts(
    who: Writer, name: ExperimentName, body: PopulationSpec, booster: BoosterDep
) -> ExperimentOut:
    """Add hosts: each goes to the arm its region is furthest below its share in (a host that
    left comes back to its own); no other host's arm changes."""
    with refusals():
        joined = ops.join_hosts(booster.engine, name, body, who.name)
    booster.experiments_changed({joined.id})
    return ExperimentOut.of(joined)


@router.post("/experiments/{name}/leave", responses=NO_EXPERIMENT | TOO_LARGE)
def leave_hosts(who: Writer, name: ExperimentName, body: LeaveIn, booster: BoosterDep) -> LeftOut:
    """Hosts leave now and are restored to their own defaults; their flows so far still
    count for their arm, and no other host's arm changes."""
    with refusals():
        left = ops.leave_hosts(booster.engine, name, body.hosts, who.name)
    booster.experiments_changed()
    return LeftOut(left=left)


@router.post("/experiments/{name}/guardrail", responses=NO_EXPERIMENT)
def run_guardrail(who: Writer, name: ExperimentName, booster: BoosterDep) -> list[DecisionOut]:
    """Apply the guardrail now: arms below control by more than its margin, with its
    confidence, are stopped (audited). Empty without a guardrail or when not running."""
    _found(booster, name)
    decisions = ops.enforce_guardrail(booster.engine, name, who.name)
    if any(d.stop for d in decisions):
        booster.experiments_changed()
    return [DecisionOut.of(d) for d in decisions]


@router.get(
    "/experiments/{name}/results",
    responses=NO_EXPERIMENT
    | {200: {"content": {CSV_MEDIA: {}}, "description": "JSON, or CSV (format=csv)"}},
    response_model=ResultsOut,
)
def experiment_results(
    _: Reader,
    name: ExperimentName,
    booster: BoosterDep,
    sigma: Annotated[
        Sigma | None, Query(description="eq. 9's σ (the experiment's by default)")
    ] = None,
    day: Annotated[
        date | None,
        Query(description="this experiment day only, by its label (overall: every day)"),
    ] = None,
    format: Format = "json",
) -> Any:
    """Per day and per arm, and over the whole experiment: flows, hosts, mean utility,
    throughput, queueing delay and slow-flow share with 95 % intervals over hosts, and each
    arm's difference to control (within host after a crossover). ``format=csv``: the same
    values as a table (``ResultsOut.csv_rows``)."""
    with refusals():
        experiment, r = ops.experiment_results(booster.engine, name, sigma, day)
    if day is not None and day not in experiment.days():
        msg = f"day: {day} is not a day of the experiment"
        raise RequestValidationError([{"loc": ("query", "day"), "msg": msg, "type": "value_error"}])
    out = ResultsOut.of(experiment, r)
    if format == "csv":
        return csv_response(out.csv_rows(), f"{name}-results.csv")
    return out


@router.get("/hosts/{host_id}/experiment")
def host_experiment(_: Reader, host_id: HostPath, booster: BoosterDep) -> HostAssignmentOut:
    """The arm ``host_id`` runs now, or null: in no running experiment, or its arm stopped."""
    now = datetime.now(UTC)
    a = ops.host_assignment(booster.engine, host_id, now)
    if a is None:
        return HostAssignmentOut(host_id=host_id, experiment=None)
    day = a.calendar.day_of(now)
    out = HostArmOut(
        experiment=a.experiment,
        arm=a.arm,
        group=a.group,
        period=a.period,
        region=a.region,
        day=day,
        day_index=(day - a.calendar.first).days,
        until=a.until,
    )
    return HostAssignmentOut(host_id=host_id, experiment=out)
