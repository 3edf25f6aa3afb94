"""The Booster service core: one replica's parts over one domain layer, behind the gRPC and
REST adapters.

- **Read path** (``plan_cache.py``): published plans in memory; GetParameters is answered from
  them and from the policy table in memory, so it keeps working through a database outage.
- **Follower** (``sync.py``): keeps policies, plans and tokens in step with PostgreSQL through
  LISTEN/NOTIFY, whichever replica changed them.
- **Experiments** (``service/arm_cache.py``): the pending experiments in memory, so each
  GetParameters answer carries the host's arm without a query.
- **Ingestion** (``ingest_writer.py``): checked reports stored exactly once, in group commits;
  append-only (no shared row is updated, no notification sent).
- **Refit owner** (``refit.py``, ``leases.py``): refits the policies whose advisory lock this
  replica holds; other replicas follow its published plans. Front processes run no refits.
- **Fold** (``fold.py``): the refit owner folds its policies' new aggregates into the trial
  sums every ``fold_interval_s``, exactly once, and keeps the raw partitions (retention).
- **Guardrail** (``guardrail_task.py``): every ``guardrail_interval_s``, one replica of the
  fleet stops the experiment arms their guardrails find harmful. Not in front processes.

Any number of replicas can run on one database: nothing here is shared through memory between
them, everything through PostgreSQL.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterator
from datetime import UTC, datetime

from sqlalchemy import Engine

from gemini_api.sums import Objective
from gemini_api.theta import ThetaSpec, load_spec
from gemini_api.v1 import booster_pb2 as pb

from ..config import Settings
from ..domain import ContextKey
from ..models import Policy
from ..policy.planner import ContextPlan, Planner
from ..storage import policies as policy_store
from ..storage.ingest import ReportRow
from .arm_cache import ArmCache, arm_message
from .auth import shorten
from .fold import FoldService
from .guardrail_task import GuardrailTask
from .ingest_writer import IngestWriter
from .leases import LeaseLost
from .metrics import Metrics, PlannedUtility
from .plan_cache import CachedPlan, PlanCache, ThetaMessage, theta_message
from .refit import PolicyHeld, RefitElsewhere, RefitService, replica_name
from .sync import Follower
from .validation import InvalidReport, context_key, report_row

log = logging.getLogger(__name__)

__all__ = ["Booster", "CachedPlan", "RefitElsewhere"]


class Booster:
    def __init__(
        self,
        engine: Engine,
        settings: Settings,
        metrics: Metrics | None = None,
        spec: ThetaSpec | None = None,
        *,
        refits: bool = True,
    ):
        self.engine = engine
        self.settings = settings
        self.spec = spec or load_spec()
        self.metrics = metrics or Metrics()
        self.plans = PlanCache(self.spec, self._spec_of)
        self.arms = ArmCache(engine)
        self.policies: dict[str, Policy] = {}
        self._by_id: dict[int, Policy] = {}
        self._served: dict[int, Policy] = {}  # those not held (``Policy.held``)
        self._defaults: dict[int, ThetaMessage] = {}
        self._lock = threading.Lock()
        self._token_listeners: list = []
        self.writer = IngestWriter(
            engine,
            self.metrics,
            self.mark_dirty,
            settings.ingest_batch_max,
            settings.ingest_linger_ms / 1000,
            settings.max_new_contexts_per_host_day,
            settings.ingest_queue_max,
        )
        self.refits = (
            RefitService(engine, settings, self.spec, self.metrics, self.plans, self._policy_ids)
            if refits
            else None
        )
        self.fold = (
            FoldService(
                engine,
                self.metrics,
                self.refits.owned,
                self._policy_ids,
                self.mark_dirty,
                settings.fold_interval_s,
                settings.raw_retention_days,
            )
            if self.refits is not None
            else None
        )
        self.guardrail = (
            GuardrailTask(
                engine, settings.guardrail_interval_s, self.metrics, self.experiments_changed
            )
            if refits
            else None
        )
        self.follower = Follower(engine, self, replica_name(settings))
        self.metrics.plans.source = self.planned_utilities

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self.sync_all()
        self.writer.start()
        self.follower.start()
        if self.refits is not None:
            self.refits.start()
        if self.fold is not None:
            self.fold.start()
        if self.guardrail is not None:
            self.guardrail.start()

    def stop(self) -> None:
        if self.guardrail is not None:
            self.guardrail.stop()
        self.follower.stop()
        if self.fold is not None:
            self.fold.stop()
        if self.refits is not None:
            self.refits.stop()
        self.writer.stop()

    def ready(self) -> str | None:
        """None when this replica serves current data; else why not (for readiness probes)."""
        if not self.follower.ready:
            return "database unreachable; serving the last plans loaded"
        if not self.follower.writable:
            return "database cannot write: reports are refused; serving the last plans loaded"
        return None

    def on_tokens_changed(self, listener) -> None:
        """Call ``listener()`` whenever credentials may have changed (any replica)."""
        self._token_listeners.append(listener)

    # -- following the database (called by the follower) -----------------------------------

    def _policy_ids(self) -> dict[int, Policy]:
        """The policies the fold and the refits work on: not the held ones."""
        return self._served

    def sync_all(self) -> None:
        """Reload policies, and the plans of every policy whose generation moved."""
        self.reload_policies()
        generations = policy_store.policy_generations(self.engine)
        stale = {p for p, (_, gen) in generations.items() if gen != self.plans.generation(p)}
        self.plans_changed(stale)
        self.plans.reload_overrides(self.engine)
        self.arms.refresh()

    def reload_policies(self) -> None:
        policies = {p.name: p for p in policy_store.list_policies(self.engine)}
        with self._lock:
            changed = {
                p.id
                for p in policies.values()
                if (old := self._by_id.get(p.id)) is None or old.revision != p.revision
            }
            # Defaults first: a request that finds a policy in ``policies`` finds its default.
            self._defaults = {p.id: self._default(p) for p in policies.values()}
            self._by_id = {p.id: p for p in policies.values()}
            self._served = {p.id: p for p in policies.values() if p.held is None}
            self.policies = policies
        for p in policies.values():
            if p.held is not None and p.id in changed:
                log.error("policy %s is held: %s", p.name, p.held)
        if changed:
            self.mark_dirty(changed)

    def _held(self, name: str) -> InvalidReport | None:
        """Why a held policy gets no answer: a ``policy:`` problem, so NOT_FOUND, which agents
        retry while keeping their reports (none is lost until an operator acts)."""
        policy = self.policies.get(name)
        if policy is None or policy.held is None:
            return None
        return InvalidReport([f"policy: {shorten(name)} is held: {policy.held}"])

    def _spec_of(self, policy_id: int) -> ThetaSpec:
        """The θ spec of the datapath a policy tunes (Fusion's for a policy not loaded)."""
        policy = self._by_id.get(policy_id)
        return self.spec if policy is None else policy.spec

    @staticmethod
    def _default(policy: Policy) -> ThetaMessage:
        """The spec's default θ moved into the policy's region, as its datapath's message."""
        spec = policy.spec
        return theta_message(spec, Planner(spec).clip_default(policy))

    def policies_changed(self, policy_ids: set[int]) -> None:
        self.reload_policies()
        self.plans.reload_overrides(self.engine)  # a datapath change voids the old θ keys

    def plans_changed(self, policy_ids: set[int]) -> None:
        for pid in policy_ids:
            self.plans.reload(self.engine, pid)

    def overrides_changed(self, policy_ids: set[int]) -> None:
        """An operator changed a policy's overrides (here, or on another replica)."""
        if not policy_ids:
            self.plans.reload_overrides(self.engine)
        for pid in policy_ids:
            self.plans.reload_overrides(self.engine, pid)

    def experiments_changed(self, experiment_ids: set[int] | None = None) -> None:
        """An experiment was created or changed (here, or on another replica)."""
        self.arms.refresh()

    def data_arrived(self, policy_ids: set[int] | None) -> None:
        if self.refits is None:
            return
        if policy_ids is None:
            self.refits.catch_up(None)
        else:
            self.refits.mark_dirty(policy_ids)

    def tokens_changed(self) -> None:
        for listener in self._token_listeners:
            listener()

    # -- agents ----------------------------------------------------------------------------

    def validate_report(self, raw: bytes, req: pb.ReportRequest | None = None) -> ReportRow:
        """Check one serialized ReportRequest (``req``: ``raw`` already parsed); raises
        DecodeError or InvalidReport."""
        if req is None:
            req = pb.ReportRequest.FromString(raw)
        if (held := self._held(req.policy)) is not None:
            raise held
        return report_row(
            raw, req, self.spec, self.policies, self.settings.max_aggregates_per_report
        )

    def parameters(self, req: pb.GetParametersRequest) -> pb.GetParametersResponse:
        """θ per context from memory. A context without a plan gets the policy's default and
        creates no state: contexts enter a policy only with data, within its quotas."""
        policy = self.policies.get(req.policy)
        if policy is None:
            raise InvalidReport([f"policy: unknown policy {shorten(req.policy)}"])
        if (held := self._held(req.policy)) is not None:
            raise held
        problems: list[str] = []
        if not req.host_id:
            problems.append("host_id: empty")
        keys = [context_key(c, f"contexts[{i}]", problems) for i, c in enumerate(req.contexts)]
        if problems:
            raise InvalidReport(problems)
        overrides = self.plans.overrides(policy.id)
        forced = None if overrides is None else overrides.default()
        default = self._defaults[policy.id] if forced is None else forced
        now = datetime.now(UTC)
        resp = pb.GetParametersResponse(
            target_cc=policy.target_cc,
            refresh_after_seconds=self._refresh_after(req, now),
            completion_sums=policy.objective == Objective.COMPLETION,
        )
        if isinstance(default, pb.Theta):
            resp.default_theta.CopyFrom(default)
        else:
            resp.default_datapath_theta.CopyFrom(default)
        for msg, key in zip(req.contexts, keys, strict=True):
            resp.parameters.append(self.plans.answer(policy, default, req.host_id, msg, key))
        found = self.arms.assignment(req.host_id, now)
        if found is not None and not (overrides is not None and overrides.killed):
            resp.experiment_arm.CopyFrom(arm_message(found))
            # An experiment compared by completion time needs its sums from every arm's flows.
            if found.objective == Objective.COMPLETION:
                resp.completion_sums = True
        return resp

    def _refresh_after(self, req: pb.GetParametersRequest, now: datetime) -> int:
        """Seconds until the agent should ask again: ``refresh_after_s``, or sooner when its
        arm changes sooner (an experiment's start, crossover or end), so that a host takes
        its next arm within one of its own intervals of that instant (its reports and θ
        refreshes still come every interval)."""
        change = self.arms.next_change(req.host_id, now)
        if change is None:
            return self.settings.refresh_after_s
        left = math.ceil((change - now).total_seconds())
        return max(1, min(self.settings.refresh_after_s, left))

    # -- refits ----------------------------------------------------------------------------

    def mark_dirty(self, policy_ids: set[int]) -> None:
        if self.refits is not None and policy_ids:
            self.refits.mark_dirty(policy_ids)

    def refit(self, policy: Policy) -> dict[ContextKey, ContextPlan]:
        """Refit ``policy`` now (this replica must own it or take it: else RefitElsewhere)."""
        if self.refits is None:
            raise RefitElsewhere("front processes do not refit")
        if policy.held is not None:
            raise PolicyHeld(f"policy {policy.name!r} is held: {policy.held}")
        if self.fold is not None and self.refits.leases.try_acquire(policy.id):
            self.fold.fold_one(policy.id)  # the owner's explicit refit reads folded sums
        try:
            return self.refits.refit(policy)
        except LeaseLost as e:
            raise RefitElsewhere(f"refit of policy {policy.name!r} not published: {e}") from e

    def fold_owned(self) -> set[int]:
        """Fold now the new aggregates of every policy this replica owns (for the CLI and
        tests; the fold thread does it every ``fold_interval_s``): the policies folded."""
        return set() if self.fold is None else set(self.fold.fold_owned())

    def refit_dirty(self) -> None:
        if self.refits is not None:
            self.refits.refit_dirty()

    def plan_snapshot(self, policy_id: int) -> dict[ContextKey, CachedPlan]:
        return self.plans.snapshot(policy_id)

    def planned_utilities(self) -> Iterator[PlannedUtility]:
        """The incumbent's predicted utility for every context of every served policy's
        current plan (the per-context gauge, drawn at each scrape)."""
        for policy in list(self._by_id.values()):
            for key, plan in self.plans.snapshot(policy.id).items():
                yield PlannedUtility(policy.name, key.label, plan.incumbent_utility)
