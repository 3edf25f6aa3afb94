"""The operator's overrides as operations (REST and CLI share them): pin, freeze, roll back,
unpin, and the kill switch, for a whole policy or one context.

Each reads what it needs from PostgreSQL (the published plans, the overrides in force, the
incumbent history), so it means the same through any replica or the CLI, and writes the change
in one transaction with its audit entry (old and new θ) and the notification every replica
reloads on (``storage/overrides.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine

from gemini_api.theta import ThetaSpec
from gemini_api.v1 import booster_pb2 as pb

from ..domain import ContextKey
from ..models import Policy
from ..policy.planner import Planner
from ..storage import overrides as ovr
from ..storage import plans as plan_store
from ..storage import trials as trial_store
from ..storage.overrides import Change
from .auth import shorten
from .plan_cache import Overrides, ThetaMessage, build_overrides

LABEL = re.compile(r"^(?P<s>[^/]+)/(?P<si>.*)->(?P<d>[^/]+)/(?P<di>.*)@(?P<h>\d{1,2})$")


class BadContextLabel(ValueError):
    """Not a context label (``src_region/src_isp->dst_region/dst_isp@hour``)."""


class UnknownContext(LookupError):
    """No agent has reported that context."""


class BadTheta(ValueError):
    """A θ outside Θ': one problem per parameter, each starting with its name."""

    def __init__(self, problems: list[str], datapath: str):
        super().__init__(f"θ outside Θ' of datapath {datapath}: " + "; ".join(problems))
        self.problems = problems


class NothingToOverride(Exception):
    """No published plan to freeze at or roll back."""


def parse_label(label: str) -> ContextKey:
    m = LABEL.match(label)
    if m is None:
        raise BadContextLabel(
            f"context {shorten(label)}: not a context label, expected "
            "src_region/src_isp->dst_region/dst_isp@hour"
        )
    return ContextKey(m["s"], m["si"], m["d"], m["di"], int(m["h"]))


@dataclass
class _State:
    """What the policy serves now, from storage."""

    spec: ThetaSpec
    incumbents: dict[ContextKey, str]  # published incumbent θ keys
    ids: dict[ContextKey, int]  # context ids of the planned contexts
    current: Overrides | None

    def served(self, key: ContextKey | None) -> dict[str, int] | None:
        """The θ a scope runs now (the audit entry's old value): its override, else its plan's
        incumbent; None for a whole policy without a policy-wide override."""
        if key is None:
            forced = None if self.current is None else self.current.default()
            return None if forced is None else as_dict(self.spec, forced)
        if self.current is not None and (forced := self.current.theta(key)) is not None:
            return as_dict(self.spec, forced)
        inc = self.incumbents.get(key)
        return None if inc is None else self.spec.from_key(inc)


def as_dict(spec: ThetaSpec, msg: ThetaMessage) -> dict[str, int]:
    if isinstance(msg, pb.DatapathTheta):
        return {n: int(msg.values[n]) for n in spec.names}
    return spec.from_message(msg)


def _state(engine: Engine, policy: Policy) -> _State:
    records, _ = plan_store.load_plans(engine, policy.id)
    contexts = trial_store.load_contexts(engine, {r.context_id for r in records})
    incumbents = {ContextKey(*contexts[r.context_id]): r.incumbent_key for r in records}
    ids = {ContextKey(*contexts[r.context_id]): r.context_id for r in records}
    current = build_overrides(policy.spec, ovr.load(engine, policy.id))
    return _State(policy.spec, incumbents, ids, current)


def _context(engine: Engine, label: str | None) -> tuple[int | None, ContextKey | None]:
    if label is None:
        return None, None
    key = parse_label(label)
    cid = ovr.context_id(engine, key)
    if cid is None:
        raise UnknownContext(f"no context {shorten(label)} has been reported")
    return cid, key


def _detail(reason: str | None, **more: object) -> dict[str, object]:
    out = {k: v for k, v in more.items() if v is not None}
    if reason:
        out["reason"] = reason
    return out


def pin(
    engine: Engine,
    policy: Policy,
    theta: dict[str, int],
    actor: str,
    context: str | None = None,
    reason: str | None = None,
) -> int:
    """Serve ``theta`` (inside Θ') to every host of the policy, or of one context."""
    spec = policy.spec
    problems = spec.violations(theta, spec.limits)
    if problems:
        raise BadTheta(problems, spec.datapath)
    cid, key = _context(engine, context)
    state = _state(engine, policy)
    theta = spec.validate(theta, spec.limits)
    item = Change(cid, context, spec.key(theta), state.served(key), theta)
    ovr.set_overrides(
        engine, policy.id, policy.name, spec.datapath, "pin", "pin", [item], actor, _detail(reason)
    )
    return 1


def freeze(
    engine: Engine,
    policy: Policy,
    actor: str,
    context: str | None = None,
    reason: str | None = None,
) -> int:
    """Pin every planned context (or one) at the incumbent it is served now."""
    spec = policy.spec
    _, key = _context(engine, context)
    state = _state(engine, policy)
    keys = [key] if key is not None else sorted(state.incumbents)
    planned = [k for k in keys if k in state.incumbents]
    if not planned:
        raise NothingToOverride("no published plan to freeze at (pin a θ instead)")
    items = []
    for k in planned:
        theta = spec.from_key(state.incumbents[k])
        items.append(Change(state.ids[k], k.label, spec.key(theta), state.served(k), theta))
    ovr.set_overrides(
        engine,
        policy.id,
        policy.name,
        spec.datapath,
        "pin",
        "freeze",
        items,
        actor,
        _detail(reason),
    )
    return len(items)


def rollback(
    engine: Engine,
    policy: Policy,
    actor: str,
    at: datetime | None = None,
    plan_generation: int | None = None,
    context: str | None = None,
    reason: str | None = None,
) -> int:
    """Pin every planned context (or one) at the incumbent it was served at ``at`` (or after
    the publish of ``plan_generation``); a context without a plan then gets the default θ it
    was served then."""
    if (at is None) == (plan_generation is None):
        raise ValueError("give exactly one of 'at' and 'plan_generation'")
    spec = policy.spec
    cid, key = _context(engine, context)
    state = _state(engine, policy)
    ids = {key: cid} if key is not None and cid is not None else dict(state.ids)
    if not ids:
        raise NothingToOverride("the policy has no planned context to roll back")
    then = ovr.incumbents_at(engine, policy.id, at, plan_generation, sorted(ids.values()))
    default = Planner(spec).clip_default(policy)
    items = []
    for k, c in sorted(ids.items()):
        theta = spec.from_key(then[c]) if c in then else default
        items.append(Change(c, k.label, spec.key(theta), state.served(k), theta))
    detail = _detail(
        reason, at=None if at is None else at.isoformat(), plan_generation=plan_generation
    )
    ovr.set_overrides(
        engine, policy.id, policy.name, spec.datapath, "pin", "rollback", items, actor, detail
    )
    return len(items)


def unpin(engine: Engine, policy: Policy, actor: str, context: str | None = None) -> int:
    """Remove the pins (of one context, or every pin of the policy); the number removed."""
    cid, key = _context(engine, context)
    state = _state(engine, policy)
    item = Change(cid, context, None, state.served(key), None)
    return ovr.clear_overrides(
        engine, policy.id, policy.name, "pin", [item], actor, everything=context is None
    )


def kill(
    engine: Engine,
    policy: Policy,
    actor: str,
    context: str | None = None,
    reason: str | None = None,
) -> int:
    """Every host of the policy (or of one context) to the datapath's safe default."""
    spec = policy.spec
    cid, key = _context(engine, context)
    state = _state(engine, policy)
    item = Change(cid, context, None, state.served(key), {"safe_default": spec.default()})
    ovr.set_overrides(
        engine,
        policy.id,
        policy.name,
        spec.datapath,
        "kill",
        "kill",
        [item],
        actor,
        _detail(reason),
    )
    return 1


def release(engine: Engine, policy: Policy, actor: str, context: str | None = None) -> int:
    """Release the kill switch (of the policy, or of one context); the number removed."""
    cid, key = _context(engine, context)
    state = _state(engine, policy)
    item = Change(cid, context, None, state.served(key), None)
    return ovr.clear_overrides(engine, policy.id, policy.name, "kill", [item], actor)


def listing(engine: Engine, policy: Policy) -> dict[str, object]:
    """The policy's overrides as stored (what every replica serves)."""
    rows = ovr.load(engine, policy.id)
    spec = policy.spec
    return {
        "policy": policy.name,
        "kill_switch": any(r.kind == "kill" and r.context is None for r in rows),
        "overrides": [
            {
                "context": None if r.context is None else r.context.label,
                "kind": r.kind,
                "origin": r.origin,
                "theta": None
                if r.theta_key is None or r.datapath != spec.datapath
                else spec.from_key(r.theta_key),
                "detail": r.detail,
                "set_by": r.set_by,
                "set_at": r.set_at,
            }
            for r in rows
        ],
    }
