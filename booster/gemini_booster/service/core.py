"""The Booster service core, shared by the gRPC and REST front doors.

It owns the state that must be consistent between them: the policy table, the plan cache that
answers GetParameters without touching the database, and the background refresher that refits
a policy's model when new trials arrived (or its settings changed) and publishes new plans.
Plans are persisted, so a restarted Booster answers every host exactly as before.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import Engine

from gemini_api.theta import ThetaSpec, load_spec
from gemini_api.v1 import booster_pb2 as pb

from ..config import Settings
from ..models import Policy
from ..policy.planner import ContextPlan, Planner, PolicyState
from ..storage import repository as repo
from ..storage.ingest import ContextKey, ReportRow
from .ingest_writer import IngestWriter
from .metrics import Metrics
from .validation import InvalidReport, context_key, report_row

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CachedPlan:
    """A published plan: θ keys for comparisons and display, ready messages for the hot path."""

    version: int
    incumbent_key: str
    candidate_keys: tuple[str, ...]
    incumbent: pb.Theta
    incumbent_utility: float
    candidates: tuple[pb.Theta, ...]


def context_label(key: ContextKey) -> str:
    return "{}/{}->{}/{}@{}".format(*key)


class Booster:
    def __init__(
        self,
        engine: Engine,
        settings: Settings,
        metrics: Metrics | None = None,
        spec: ThetaSpec | None = None,
    ):
        self.engine = engine
        self.settings = settings
        self.spec = spec or load_spec()
        self.metrics = metrics or Metrics()
        self.planner = Planner(self.spec)
        self.policies: dict[str, Policy] = {}
        self._states: dict[int, PolicyState] = {}
        self._plans: dict[tuple[int, ContextKey], CachedPlan] = {}
        self._defaults: dict[int, pb.Theta] = {}
        self._dirty: set[int] = set()
        self._requested: dict[int, set[ContextKey]] = {}
        self._lock = threading.Lock()
        self._refit_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self.writer = IngestWriter(
            engine,
            self.metrics,
            self.mark_dirty,
            settings.ingest_batch_max,
            settings.ingest_linger_ms / 1000,
        )
        self._refresher = threading.Thread(target=self._refresh_loop, name="refresher", daemon=True)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self.reload_policies()
        self._load_plans()
        self.writer.start()
        self._refresher.start()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        self.writer.stop()
        self._refresher.join(timeout=30)

    def reload_policies(self) -> None:
        policies = {p.name: p for p in repo.list_policies(self.engine)}
        with self._lock:
            changed = [
                p.id
                for p in policies.values()
                if self.policies.get(p.name) is None or self.policies[p.name].revision != p.revision
            ]
            self.policies = policies
            self._defaults = {
                p.id: pb.Theta(**self.planner.clip_default(p)) for p in policies.values()
            }
        self.mark_dirty(set(changed))

    def _load_plans(self) -> None:
        contexts = repo.load_contexts(self.engine)
        for rec in repo.load_plans(self.engine):
            self._plans[(rec.policy_id, contexts[rec.context_id])] = self._cached(rec)
        self._dirty.clear()  # persisted plans are current until new data arrives

    def _cached(self, rec: repo.PlanRecord) -> CachedPlan:
        return CachedPlan(
            version=rec.plan_version,
            incumbent_key=rec.incumbent_key,
            candidate_keys=tuple(rec.candidate_keys),
            incumbent=pb.Theta(**self.spec.from_key(rec.incumbent_key)),
            incumbent_utility=rec.incumbent_utility or 0.0,
            candidates=tuple(pb.Theta(**self.spec.from_key(k)) for k in rec.candidate_keys),
        )

    # -- agents ----------------------------------------------------------------------------

    def validate_report(self, raw: bytes) -> ReportRow:
        """Parse and check one serialized ReportRequest; raises DecodeError or InvalidReport."""
        req = pb.ReportRequest.FromString(raw)
        return report_row(
            raw, req, self.spec, self.policies, self.settings.max_aggregates_per_report
        )

    def parameters(self, req: pb.GetParametersRequest) -> pb.GetParametersResponse:
        policy = self.policies.get(req.policy)
        if policy is None:
            raise InvalidReport([f"policy: unknown policy {req.policy!r}"])
        problems: list[str] = []
        if not req.host_id:
            problems.append("host_id: empty")
        keys = [context_key(c, f"contexts[{i}]", problems) for i, c in enumerate(req.contexts)]
        if problems:
            raise InvalidReport(problems)
        resp = pb.GetParametersResponse(
            default_theta=self._defaults[policy.id],
            target_cc=policy.target_cc,
            refresh_after_seconds=self.settings.refresh_after_s,
        )
        for msg, key in zip(req.contexts, keys, strict=True):
            resp.parameters.append(self._answer(policy, req.host_id, msg, key))
        return resp

    def _answer(self, policy: Policy, host: str, msg: pb.Context, key: ContextKey):
        plan = self._plans.get((policy.id, key))
        if plan is None:
            self.request_contexts(policy.id, {key})
            return pb.ContextParameters(context=msg, theta=self._defaults[policy.id])
        explore = plan.candidates and _share(host, key, plan.version) < policy.exploration_share
        theta = plan.incumbent
        if explore:
            theta = plan.candidates[zlib.crc32(host.encode()) % len(plan.candidates)]
        return pb.ContextParameters(
            context=msg,
            theta=theta,
            plan_version=plan.version,
            exploratory=bool(explore),
            predicted_utility=plan.incumbent_utility,
        )

    # -- refits ----------------------------------------------------------------------------

    def request_contexts(self, policy_id: int, keys: set[ContextKey]) -> None:
        """Plan for these contexts at the next refit, though no data came from them yet."""
        with self._lock:
            self._requested.setdefault(policy_id, set()).update(keys)
        self.mark_dirty({policy_id})

    def mark_dirty(self, policy_ids: set[int]) -> None:
        if policy_ids:
            with self._lock:
                self._dirty |= policy_ids
            self._wake.set()

    def _refresh_loop(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self.settings.refit_interval_s)
            self._wake.clear()
            if self._stopping.is_set():
                return
            try:
                self.refit_dirty()
            except Exception:
                log.exception("refit failed; keeping the current plans")
            self._stopping.wait(self.settings.refit_interval_s)

    def refit_dirty(self) -> None:
        with self._lock:
            dirty, self._dirty = self._dirty, set()
        for policy in list(self.policies.values()):
            if policy.id in dirty:
                self.refit(policy)

    def refit(self, policy: Policy) -> dict[ContextKey, ContextPlan]:
        """Refit ``policy``'s model now and publish plans for its contexts."""
        with self._refit_lock:
            t0 = time.perf_counter()
            trials = repo.load_trials(self.engine, policy.id, timedelta(hours=policy.history_hours))
            with self._lock:
                requested = self._requested.pop(policy.id, set())
            if requested:
                self.writer.context_ids.resolve_with_engine(self.engine, requested)
            contexts = repo.load_contexts(self.engine)
            ids = {v: k for k, v in contexts.items()}
            targets = {t.context_id for t in trials} | {ids[k] for k in requested if k in ids}
            targets |= {ids[k] for (pid, k) in self._plans if pid == policy.id and k in ids}
            state = self._states.setdefault(policy.id, PolicyState())
            plans = self.planner.plan(policy, trials, contexts, targets, state)
            self._publish(policy, plans, contexts)
            elapsed = time.perf_counter() - t0
        self.metrics.refit_seconds.labels(policy.name).observe(elapsed)
        self.metrics.model_points.labels(policy.name).set(min(len(trials), policy.max_model_points))
        log.info(
            "refit %s: %d trials, %d contexts, %.2fs", policy.name, len(trials), len(plans), elapsed
        )
        return {contexts[c]: p for c, p in plans.items()}

    def _publish(self, policy: Policy, plans: dict[int, ContextPlan], contexts) -> None:
        records = []
        for cid, plan in plans.items():
            key = contexts[cid]
            old = self._plans.get((policy.id, key))
            inc_key = self.spec.key(plan.incumbent)
            cand_keys = tuple(self.spec.key(c) for c in plan.candidates)
            same = (
                old is not None and old.incumbent_key == inc_key and old.candidate_keys == cand_keys
            )
            version = old.version if same else (old.version + 1 if old else 1)
            records.append(
                repo.PlanRecord(policy.id, cid, version, inc_key, plan.incumbent_utility, cand_keys)
            )
            if plan.incumbent_utility is not None:
                self.metrics.best_utility.labels(policy.name, context_label(key)).set(
                    plan.incumbent_utility
                )
        repo.save_plans(self.engine, records)  # persist first: a crash never serves unsaved θ
        for rec in records:
            self._plans[(policy.id, contexts[rec.context_id])] = self._cached(rec)

    def plan_snapshot(self, policy_id: int) -> dict[ContextKey, CachedPlan]:
        return {k: v for (pid, k), v in list(self._plans.items()) if pid == policy_id}


def _share(host: str, key: ContextKey, version: int) -> float:
    """A host's fixed position in [0, 1) for one plan: the lowest ``share`` explore."""
    return zlib.crc32(f"{host}|{key}|{version}".encode()) / 2**32
