"""The read path: published plans in memory, answering GetParameters without the database.

Plans are written by the refit owner of a policy (possibly another replica) and loaded here by
the follower whenever the policy's plan generation moves. Each policy's plans are replaced as
one dictionary, so a request sees either all of a refit's plans or none of them, and through a
database outage the last plans keep being served.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Engine

from gemini_api.datapaths import Message, datapath
from gemini_api.theta import ThetaSpec
from gemini_api.v1 import booster_pb2 as pb

from ..domain import ContextKey
from ..models import Policy
from ..policy.assignment import assign
from ..storage import overrides as ovr
from ..storage import plans as plan_store
from ..storage import trials as trial_store
from ..storage.overrides import OverrideRecord
from ..storage.plans import PlanRecord

# θ as GetParameters carries it: Fusion's own message, or any other datapath's.
ThetaMessage = pb.Theta | pb.DatapathTheta


def theta_message(spec: ThetaSpec, theta: Mapping[str, int]) -> ThetaMessage:
    if datapath(spec.datapath).message is Message.THETA:
        return pb.Theta(**theta)
    return pb.DatapathTheta(datapath=spec.datapath, values=theta)


def context_answer(msg: pb.Context, theta: ThetaMessage, **fields) -> pb.ContextParameters:
    """A context's answer with θ in the field of its datapath."""
    if isinstance(theta, pb.Theta):
        return pb.ContextParameters(context=msg, theta=theta, **fields)
    return pb.ContextParameters(context=msg, datapath_theta=theta, **fields)


@dataclass(frozen=True)
class CachedPlan:
    """A published plan: θ keys for comparisons and display, ready messages for the hot path."""

    context_id: int
    version: int
    incumbent_key: str
    candidate_keys: tuple[str, ...]
    incumbent: ThetaMessage
    incumbent_utility: float
    candidates: tuple[ThetaMessage, ...]


@dataclass(frozen=True)
class Overrides:
    """A policy's operator overrides as the read path applies them (``storage/overrides.py``):
    the kill switch (policy-wide or per context) before a context's pin before the policy's."""

    safe: ThetaMessage  # the datapath's safe default: what the kill switch serves
    killed: bool = False
    killed_contexts: frozenset[ContextKey] = frozenset()
    pin: ThetaMessage | None = None
    pins: Mapping[ContextKey, ThetaMessage] | None = None

    def theta(self, key: ContextKey) -> ThetaMessage | None:
        """What ``key`` is served instead of its plan; None: its plan."""
        if self.killed or key in self.killed_contexts:
            return self.safe
        if self.pins and key in self.pins:
            return self.pins[key]
        return self.pin

    def default(self) -> ThetaMessage | None:
        """What a context without an override of its own runs instead of the default θ."""
        return self.safe if self.killed else self.pin


def build_overrides(spec: ThetaSpec, records: Iterable[OverrideRecord]) -> Overrides | None:
    """A policy's rows as served; rows for another datapath than the policy's (its datapath
    changed since) are ignored, their θ keys mean nothing in this spec."""
    killed, killed_contexts = False, set()
    pin: ThetaMessage | None = None
    pins: dict[ContextKey, ThetaMessage] = {}
    any_row = False
    for r in records:
        if r.datapath != spec.datapath:
            continue
        any_row = True
        if r.kind == "kill":
            if r.context is None:
                killed = True
            else:
                killed_contexts.add(r.context)
        elif r.theta_key is not None:
            theta = theta_message(spec, spec.from_key(r.theta_key))
            if r.context is None:
                pin = theta
            else:
                pins[r.context] = theta
    if not any_row:
        return None
    return Overrides(
        theta_message(spec, spec.default()), killed, frozenset(killed_contexts), pin, pins
    )


def utc_now() -> datetime:
    return datetime.now(UTC)


class PlanCache:
    def __init__(
        self,
        spec: ThetaSpec,
        spec_of: Callable[[int], ThetaSpec] | None = None,
        clock: Callable[[], datetime] = utc_now,
    ):
        """``spec_of(policy_id)``: the θ spec of the datapath the policy tunes (``spec``, for
        every policy, when not given). ``clock``: the time whose rotation slot picks a
        context's explorers (``policy.assignment``), so that over the slots every host of a
        one-host context explores; replicas agree because the slot is the clock's alone."""
        self.spec = spec
        self.spec_of = spec_of or (lambda _policy_id: spec)
        self.clock = clock
        self._plans: dict[int, dict[ContextKey, CachedPlan]] = {}
        self._generations: dict[int, int] = {}
        self._overrides: dict[int, Overrides] = {}
        self._lock = threading.Lock()

    # -- overrides ---------------------------------------------------------------------------

    def reload_overrides(self, engine: Engine, policy_id: int | None = None) -> None:
        """Take the overrides of one policy (None: of all) from storage."""
        records = ovr.load(engine, policy_id)
        by_policy: dict[int, list[OverrideRecord]] = {}
        for r in records:
            by_policy.setdefault(r.policy_id, []).append(r)
        built = {
            pid: o
            for pid, rows in by_policy.items()
            if (o := build_overrides(self.spec_of(pid), rows)) is not None
        }
        with self._lock:
            if policy_id is None:
                self._overrides = built
            else:
                fresh = dict(self._overrides)
                fresh.pop(policy_id, None)
                fresh.update(built)
                self._overrides = fresh

    def overrides(self, policy_id: int) -> Overrides | None:
        return self._overrides.get(policy_id)

    def cached(self, rec: PlanRecord) -> CachedPlan:
        spec = self.spec_of(rec.policy_id)
        return CachedPlan(
            context_id=rec.context_id,
            version=rec.plan_version,
            incumbent_key=rec.incumbent_key,
            candidate_keys=tuple(rec.candidate_keys),
            incumbent=theta_message(spec, spec.from_key(rec.incumbent_key)),
            incumbent_utility=rec.incumbent_utility or 0.0,
            candidates=tuple(theta_message(spec, spec.from_key(k)) for k in rec.candidate_keys),
        )

    def _by_context(
        self, records: Iterable[PlanRecord], contexts: dict[int, ContextKey]
    ) -> dict[ContextKey, CachedPlan]:
        return {contexts[r.context_id]: self.cached(r) for r in records}

    def reload(self, engine: Engine, policy_id: int) -> None:
        """Take the policy's plans from storage, unless this generation is already here (a
        replica's own publish, or a notification that arrived twice)."""
        records, generation = plan_store.load_plans(engine, policy_id)
        if generation == self.generation(policy_id):
            return
        contexts = trial_store.load_contexts(engine, {r.context_id for r in records})
        self.replace(policy_id, records, contexts, generation)

    def generation(self, policy_id: int) -> int:
        return self._generations.get(policy_id, -1)

    def replace(
        self,
        policy_id: int,
        records: Iterable[PlanRecord],
        contexts: dict[int, ContextKey],
        generation: int,
    ) -> None:
        """All of a policy's plans at ``generation``; an older generation never replaces a newer
        one (a slow reload racing a publish)."""
        plans = self._by_context(records, contexts)
        with self._lock:
            if generation < self._generations.get(policy_id, -1):
                return
            self._plans[policy_id] = plans
            self._generations[policy_id] = generation

    def update(
        self,
        policy_id: int,
        records: Iterable[PlanRecord],
        contexts: dict[int, ContextKey],
        generation: int,
    ) -> None:
        """Merge a refit's plans (the owner's own publish: only the contexts it planned)."""
        with self._lock:
            merged = dict(self._plans.get(policy_id, {}))
            merged.update(self._by_context(records, contexts))
            self._plans[policy_id] = merged
            self._generations[policy_id] = max(generation, self._generations.get(policy_id, -1))

    def snapshot(self, policy_id: int) -> dict[ContextKey, CachedPlan]:
        return self._plans.get(policy_id, {})

    def answer(
        self, policy: Policy, default: ThetaMessage, host: str, msg: pb.Context, key: ContextKey
    ) -> pb.ContextParameters:
        """What ``host`` runs in context ``key``: the incumbent, or one of the exploration
        candidates for the policy's exploring share of hosts; the default θ where no plan is.
        An operator's override (kill switch, pin) replaces all of it, with no exploration."""
        plan = self._plans.get(policy.id, {}).get(key)
        overrides = self._overrides.get(policy.id)
        forced = None if overrides is None else overrides.theta(key)
        if forced is not None:
            return context_answer(
                msg, forced, plan_version=0 if plan is None else plan.version, exploratory=False
            )
        if plan is None:
            return context_answer(msg, default)
        theta, explore = assign(
            host, key, plan.incumbent, plan.candidates, policy.exploration_share, self.clock()
        )
        return context_answer(
            msg,
            theta,
            plan_version=plan.version,
            exploratory=explore,
            predicted_utility=plan.incumbent_utility,
        )
