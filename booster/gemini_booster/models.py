"""Booster's domain models (pydantic): what an operator declares and what the service keeps.

The REST API validates requests with these, and the planner reads them, so a policy that passes
validation here is one the optimiser can run.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gemini_api.theta import ThetaError, load_spec

NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,63}$"
Mode = Literal["contextual", "standard"]
AcqFunc = Literal["gp_hedge", "EI", "PI", "LCB"]


class PolicyFields(BaseModel):
    """The tunable part of a policy; every field has a safe default."""

    model_config = ConfigDict(extra="forbid")

    sigma: float = Field(
        1.0, ge=0, le=1000, description="σ of eq. 9: Mbit/s traded per ms of delay"
    )
    region: Literal["production", "wide", "custom"] = Field(
        "production", description="Θ (production), Θ' (wide) or custom bounds inside Θ'"
    )
    bounds: dict[str, tuple[int, int]] | None = Field(
        None, description="custom bounds in spec units, required when region is custom"
    )
    target_cc: str = Field("fusion", pattern=r"^[a-z0-9_]{1,16}$")
    exploration_share: float = Field(
        0.5, ge=0, le=1, description="share of hosts per context that explore instead of exploit"
    )
    mode: Mode = Field("contextual", description="contextual (eq. 8) or context-blind standard BO")
    acq_func: AcqFunc = "gp_hedge"
    n_initial_points: int = Field(8, ge=1, le=1000, description="random θ before the model leads")
    time_buckets: int = Field(1, ge=1, le=24, description="the day split into this many blocks")
    history_hours: float = Field(
        24 * 14, gt=0, description="trials older than this are left out of the model (drift)"
    )
    max_model_points: int = Field(
        200, ge=20, le=5000, description="the model is fit on at most this many trials"
    )
    min_flows: int = Field(1, ge=1, description="a trial needs this many flows to be incumbent")
    max_contexts: int = Field(
        1000, ge=1, le=100_000, description="contexts the policy admits; reports beyond: refused"
    )

    @model_validator(mode="after")
    def _bounds_fit_region(self) -> PolicyFields:
        if self.region == "custom":
            if self.bounds is None:
                raise ValueError("bounds: required when region is 'custom'")
            try:
                load_spec().check_bounds(self.bounds)
            except ThetaError as e:
                raise ValueError(f"bounds: {e}") from e
        elif self.bounds is not None:
            raise ValueError("bounds: only allowed when region is 'custom'")
        return self

    def resolved_bounds(self) -> dict[str, tuple[int, int]]:
        if self.region == "custom":
            assert self.bounds is not None
            return {k: (int(v[0]), int(v[1])) for k, v in self.bounds.items()}
        return load_spec().region_bounds(self.region)


class PolicyCreate(PolicyFields):
    name: str = Field(pattern=NAME_PATTERN)


class PolicyUpdate(BaseModel):
    """A partial change; unset fields keep their value."""

    model_config = ConfigDict(extra="forbid")

    sigma: float | None = Field(None, ge=0, le=1000)
    region: Literal["production", "wide", "custom"] | None = None
    bounds: dict[str, tuple[int, int]] | None = None
    target_cc: str | None = Field(None, pattern=r"^[a-z0-9_]{1,16}$")
    exploration_share: float | None = Field(None, ge=0, le=1)
    mode: Mode | None = None
    acq_func: AcqFunc | None = None
    n_initial_points: int | None = Field(None, ge=1, le=1000)
    time_buckets: int | None = Field(None, ge=1, le=24)
    history_hours: float | None = Field(None, gt=0)
    max_model_points: int | None = Field(None, ge=20, le=5000)
    min_flows: int | None = Field(None, ge=1)
    max_contexts: int | None = Field(None, ge=1, le=100_000)


class Policy(PolicyFields):
    id: int
    name: str
    revision: int

    @field_validator("bounds", mode="before")
    @classmethod
    def _tuples(cls, v: dict | None) -> dict | None:
        return None if v is None else {k: tuple(b) for k, b in v.items()}
