"""Booster's domain models (pydantic): what an operator declares and what the service keeps.

The REST API validates requests with these, and the planner reads them, so a policy that passes
validation here is one the optimiser can run. Every setting has a range: a value outside it
would either fail later, in a refit or in the database (``history_hours`` of 1e308 overflows
the history window; an integer above 2³¹−1 does not fit its ``Integer`` column), or make the
optimiser useless. Each range is defined once, as an ``Annotated`` type below, and used by both
the whole policy (``PolicyFields``) and a partial change (``PolicyUpdate``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    computed_field,
    field_validator,
    model_validator,
)

from gemini_api.datapaths import DEFAULT_DATAPATH, datapath, datapaths, registry
from gemini_api.sums import Objective
from gemini_api.theta import ThetaError, ThetaSpec

NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,63}$"
HOURS_PER_YEAR = 8766  # 365.25 days
Mode = Literal["contextual", "independent", "standard"]
AcqFunc = Literal["gp_hedge", "EI", "PI", "LCB"]
Region = Literal["production", "wide", "custom"]
Bounds = dict[str, tuple[int, int]]

# The ranges. Floats are finite (NaN compares false with every bound, and JSON bodies parsed by
# Python may carry NaN or Infinity); every integer range lies well inside the int32 columns.
Sigma = Annotated[
    float,
    Field(ge=0, le=1000, allow_inf_nan=False, description="σ of eq. 9: Mbit/s per ms of delay"),
]
ExplorationShare = Annotated[
    float,
    Field(
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="share of hosts per context that explore instead of exploit",
    ),
]
DatapathName = Annotated[
    str,
    Field(
        pattern=r"^[a-z0-9_]{1,16}$",
        description="the datapath whose θ the policy tunes: fusion, cubic, gemini, dcvegas, ...",
    ),
]
CCName = Annotated[str, Field(pattern=r"^[a-z0-9_]{1,16}$")]
InitialPoints = Annotated[
    int, Field(ge=1, le=1000, description="space-filling θ before the model leads")
]
TimeBuckets = Annotated[int, Field(ge=1, le=24, description="the day split into this many blocks")]
# Trials are running sums per time bucket so that the history window can drop old flows. An hour
# keeps a fortnight's window at 336 rows per running θ; a week is the coarsest that still ages.
TrialBucketHours = Annotated[
    int,
    Field(
        ge=1,
        le=168,
        description="flows are summed per this many hours; the window drops whole buckets",
    ),
]
# At least an hour: agents report every few minutes, so a shorter window leaves the model almost
# no trials. At most ten years: far beyond any drift worth modelling, and well inside what a
# timedelta (and PostgreSQL's interval arithmetic) can hold.
HistoryHours = Annotated[
    float,
    Field(
        ge=1,
        le=10 * HOURS_PER_YEAR,
        allow_inf_nan=False,
        description="hours (1 h to 10 years): older trials are left out of the model (drift)",
    ),
]
ModelPoints = Annotated[
    int, Field(ge=20, le=5000, description="the model is fit on at most this many trials")
]
# A million flows per θ and context is already more than a fleet sends in a day; a larger
# threshold would only keep every trial from ever becoming the incumbent.
MinFlows = Annotated[
    int,
    Field(ge=1, le=1_000_000, description="a trial needs this many flows to be incumbent"),
]
MaxContexts = Annotated[
    int,
    Field(ge=1, le=100_000, description="contexts the policy admits; reports beyond: refused"),
]


def _named_datapath(data: object) -> object:
    """``target_cc``, the field a policy named its CC by before datapaths were explicit, is
    still taken from older clients: it names the datapath whose CC it is, and must agree with
    ``datapath`` when both are given. A CC that no datapath runs is refused, not guessed."""
    if not isinstance(data, dict) or "target_cc" not in data:
        return data
    data = dict(data)
    cc = data.pop("target_cc")
    tuned = registry().for_cc(cc) if isinstance(cc, str) else None
    if tuned is None:
        ccs = [d.cc for d in registry()]
        raise ValueError(f"target_cc: {cc!r} is no datapath's congestion control; have {ccs}")
    if data.setdefault("datapath", tuned.name) != tuned.name:
        raise ValueError(f"target_cc: {cc!r} is datapath {tuned.name!r}, not {data['datapath']!r}")
    return data


class PolicyFields(BaseModel):
    """The tunable part of a policy; every field has a safe default."""

    model_config = ConfigDict(extra="forbid")

    sigma: Sigma = 1.0
    region: Region = Field(
        "production", description="Θ (production), Θ' (wide) or custom bounds inside Θ'"
    )
    bounds: Bounds | None = Field(
        None, description="custom bounds in spec units, required when region is custom"
    )
    datapath: DatapathName = DEFAULT_DATAPATH
    objective: Objective = Field(
        Objective.FLOW_MEAN,
        description="what the utility is over a θ's flows: flow-mean (eq. 9, the mean over "
        "flows of throughput − σ·queueing delay) or completion (all bits over all flow "
        "durations − σ·mean queueing delay: short flows, incast; agents older than it send "
        "no completion sums, and their flows do not train such a policy)",
    )
    exploration_share: ExplorationShare = 0.5
    mode: Mode = Field(
        "contextual",
        description="contextual (eq. 8, contexts pooled), independent (one model per context, "
        "no pooling) or standard (the paper's context-blind BO)",
    )
    acq_func: AcqFunc = "gp_hedge"
    n_initial_points: InitialPoints = 8
    time_buckets: TimeBuckets = 1
    trial_bucket_hours: TrialBucketHours = 1
    history_hours: HistoryHours = 24.0 * 14
    max_model_points: ModelPoints = 200
    min_flows: MinFlows = 1
    max_contexts: MaxContexts = 1000

    @model_validator(mode="before")
    @classmethod
    def _datapath_from_target_cc(cls, data: object) -> object:
        return _named_datapath(data)

    @field_validator("datapath")
    @classmethod
    def _known_datapath(cls, name: str) -> str:
        if name not in datapaths():
            raise ValueError(f"no datapath {name!r}; have {list(datapaths())}")
        return name

    @property
    def spec(self) -> ThetaSpec:
        """The θ spec of the datapath this policy tunes (api/gemini_api/specs/<datapath>.toml)."""
        return datapath(self.datapath).spec

    @property
    def target_cc(self) -> str:
        """The kernel CC whose flows this policy tunes: its datapath's (what agents are told)."""
        return datapath(self.datapath).cc

    @model_validator(mode="after")
    def _bounds_fit_region(self) -> PolicyFields:
        if self.region == "custom":
            if self.bounds is None:
                raise ValueError("bounds: required when region is 'custom'")
            try:
                self.spec.check_bounds(self.bounds)
            except ThetaError as e:
                raise ValueError(f"bounds: {e}") from e
        elif self.bounds is not None:
            raise ValueError("bounds: only allowed when region is 'custom'")
        return self

    def resolved_bounds(self) -> Bounds:
        if self.region == "custom":
            assert self.bounds is not None
            return {k: (int(v[0]), int(v[1])) for k, v in self.bounds.items()}
        return self.spec.region_bounds(self.region)


class PolicyCreate(PolicyFields):
    name: str = Field(pattern=NAME_PATTERN)


class PolicyUpdate(BaseModel):
    """A partial change; unset fields keep their value. Same ranges as ``PolicyFields``; the
    rules across fields (bounds against region) are checked on the merged policy."""

    model_config = ConfigDict(extra="forbid")

    sigma: Sigma | None = None
    region: Region | None = None
    bounds: Bounds | None = None
    datapath: DatapathName | None = None
    objective: Objective | None = None
    exploration_share: ExplorationShare | None = None
    mode: Mode | None = None
    acq_func: AcqFunc | None = None
    n_initial_points: InitialPoints | None = None
    time_buckets: TimeBuckets | None = None
    trial_bucket_hours: TrialBucketHours | None = None
    history_hours: HistoryHours | None = None
    max_model_points: ModelPoints | None = None
    min_flows: MinFlows | None = None
    max_contexts: MaxContexts | None = None

    @model_validator(mode="before")
    @classmethod
    def _datapath_from_target_cc(cls, data: object) -> object:
        return _named_datapath(data)


class Policy(PolicyFields):
    id: int
    name: str
    revision: int
    theta_spec_version: int | None = Field(
        None,
        description="the version of its datapath's θ spec that its stored θ are in (they are "
        "read back by position); null: the spec's own",
    )

    @computed_field(  # type: ignore[prop-decorator]
        description="why Booster holds the policy (plans and serves nothing for it; agents keep "
        "their reports and retry), or null: its stored θ are in another version of its "
        "datapath's θ spec than this Booster's"
    )
    @property
    def held(self) -> str | None:
        stored, now = self.theta_spec_version, self.spec.version
        if stored is None or stored == now:
            return None
        return (
            f"its stored θ are in {self.datapath} θ spec version {stored}, this Booster reads "
            f"version {now}, whose parameters mean other things: a migration must convert them, "
            "or an operator keep them under another name and create the policy again "
            "(booster policy restart)"
        )

    @computed_field(  # type: ignore[prop-decorator]
        description="the kernel CC of the policy's datapath (what agents are told to run)"
    )
    @property
    def target_cc(self) -> str:
        return datapath(self.datapath).cc

    @property
    def history_window(self) -> timedelta:
        """The one history rule: what the model fits on (its refits), the trials and the
        comparison served over REST, and the dashboard's charts all cover the time buckets
        that began within ``history_hours`` of now; older flows have aged out."""
        return timedelta(hours=self.history_hours)

    @field_validator("bounds", mode="before")
    @classmethod
    def _tuples(cls, v: dict | None) -> dict | None:
        return None if v is None else {k: tuple(b) for k, b in v.items()}
