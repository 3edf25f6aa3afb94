"""The refit owner: refits the policies whose lease this replica holds, and publishes plans.

A keeper thread tries, every ``lease_poll_s``, to take the lease of every policy nobody owns
(``leases.py``); for each owned policy a worker thread of its own waits until the policy is
marked dirty (new data, changed settings, a takeover) and refits it, at most once per
``refit_interval_s``. One policy's slow or failing refit never delays or drops another's.

The model is fitted and the contexts planned in a pool of ``refit_processes`` worker processes:
a refit is CPU-bound Python and numpy, and in the serving process it would hold the interpreter
lock that gRPC needs, and make one policy's refit slow down another's. In workers, refits of
different policies run on different cores while the serving process only loads and publishes.

A refit's cost is bounded whatever agents send: the model sees at most ``max_model_points``
trials, and at most ``max_contexts_per_refit`` contexts are planned per round, those with data
newer than their plan first and then the longest unplanned, so every admitted context is
replanned in turn. Contexts exist for a policy only once admitted within its quotas.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from datetime import UTC, datetime, timedelta
from typing import TypedDict

from sqlalchemy import Engine, text
from threadpoolctl import threadpool_limits

from gemini_api.theta import ThetaSpec

from ..config import Settings
from ..domain import ContextKey, Trial
from ..models import Policy
from ..policy.planner import ContextPlan, Planner, PolicyState
from ..storage import plans as plan_store
from ..storage import trials as trial_store
from .leases import LeaseLost, Leases
from .metrics import Metrics
from .orphans import exit_with_parent
from .plan_cache import PlanCache
from .ratelimit_log import RateLimitedLog

log = logging.getLogger(__name__)
NEVER = datetime.min.replace(tzinfo=UTC)
# Owned policies whose data or settings are newer than their last published refit.
_BEHIND = text(
    "SELECT p.id FROM policies p "
    "LEFT JOIN LATERAL (SELECT r.started_at FROM refit_log r WHERE r.policy_id = p.id "
    "ORDER BY r.id DESC LIMIT 1) last ON true "
    "WHERE p.id = ANY(:ids) AND (last.started_at IS NULL OR p.updated_at > last.started_at "
    "OR (SELECT max(t.last_seen) FROM trials t WHERE t.policy_id = p.id) > last.started_at)"
)


_WORKER_PLANNERS: dict[str, Planner] = {}  # by datapath, in a worker process


# What the planner is told of the published plans: the clock, and per context the incumbent
# and candidates hosts run now (so it keeps a stable incumbent and candidates in their slots).
class Published(TypedDict):
    now: datetime
    incumbents: dict[int, str]
    candidates: dict[int, tuple[str, ...]]


def plan_in_worker(
    policy: Policy,
    trials: list[Trial],
    contexts: Mapping[int, ContextKey],
    targets: list[int],
    state: PolicyState,
    published: Published,
) -> tuple[dict[int, ContextPlan], PolicyState]:
    """A refit's CPU part, in a worker process: the plans and the planner's updated state."""
    spec = policy.spec
    planner = _WORKER_PLANNERS.setdefault(spec.datapath, Planner(spec))
    plans = planner.plan(policy, trials, contexts, targets, state, **published)
    return plans, state


def refit_worker_init() -> None:
    """A refit worker: leaves with its parent, and runs BLAS on one thread. A refit is
    thousands of small matrix products (a context's posterior); threads of a BLAS call that
    contend with the other worker and the serving process for two cores made a fleet-size
    refit about ten times slower on a loaded machine (benchmarks/results/optimiser.md)."""
    exit_with_parent()
    threadpool_limits(1)


class RefitElsewhere(Exception):
    """Another replica owns this policy's refits."""


class PolicyHeld(RefitElsewhere):
    """A refit asked for a held policy (``Policy.held``): refused, as a refit owned elsewhere
    is (409 over REST), with the reason."""


def replica_name(settings: Settings) -> str:
    return settings.replica_name or f"{socket.gethostname()}:{os.getpid()}"


def plan_order(
    candidates: set[int], trials: list[Trial], planned_at: dict[int, datetime]
) -> list[int]:
    """Contexts with data newer than their plan (or never planned) first, then the longest
    unplanned: planning the first N of this order replans every context in turn."""
    newest: dict[int, datetime] = {}
    for t in trials:
        if t.last_seen > newest.get(t.context_id, NEVER):
            newest[t.context_id] = t.last_seen

    def priority(cid: int) -> tuple[int, datetime, int]:
        planned = planned_at.get(cid, NEVER)
        stale = planned == NEVER or newest.get(cid, NEVER) > planned
        return (0 if stale else 1, planned, cid)

    return sorted(candidates, key=priority)


class _Worker:
    """One owned policy's refit loop.

    A dirty mark is consumed by exactly one refit: the worker's, or ``run_now``'s when a
    caller wants the refit done in its own thread. The worker refits at most once per
    ``min_interval_s`` counted from the policy's last refit of any kind (``last_started``),
    so an explicit refit is not followed by a redundant background one."""

    def __init__(
        self,
        policy_id: int,
        run: Callable[[int], None],
        min_interval_s: float,
        last_started: Callable[[int], float | None],
    ):
        self.policy_id = policy_id
        self._run_refit = run
        self._min_interval_s = min_interval_s
        self._last_started = last_started
        self.dirty = threading.Event()
        self.stopping = threading.Event()
        self._busy = False
        self._state = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name=f"refit-{policy_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.dirty.set()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def run_now(self) -> None:
        """Refit now in this thread if dirty; else wait for a refit the worker has begun.
        On return, no refit of this policy marked before the call is pending or running."""
        if self._take():
            self._run()
            return
        with self._state:
            self._state.wait_for(lambda: not self._busy)

    def _take(self) -> bool:
        with self._state:
            if self.stopping.is_set() or not self.dirty.is_set():
                return False
            self.dirty.clear()
            self._busy = True
            return True

    def _run(self) -> None:
        try:
            self._run_refit(self.policy_id)
        finally:
            with self._state:
                self._busy = False
                self._state.notify_all()

    def _until_due(self) -> float:
        last = self._last_started(self.policy_id)
        if last is None:
            return 0.0
        return max(0.0, last + self._min_interval_s - time.monotonic())

    def _loop(self) -> None:
        while not self.stopping.is_set():
            self.dirty.wait()
            while not self.stopping.is_set() and (wait := self._until_due()) > 0:
                self.stopping.wait(wait)
            if self._take():
                self._run()


class RefitService:
    def __init__(
        self,
        engine: Engine,
        settings: Settings,
        spec: ThetaSpec,
        metrics: Metrics,
        plans: PlanCache,
        policies: Callable[[], dict[int, Policy]],
    ):
        self.engine = engine
        self.settings = settings
        self.metrics = metrics
        self.plans = plans
        # One planner per datapath: a policy searches the θ space of the CC it tunes.
        self.planners = {spec.datapath: Planner(spec)}
        self.spec = spec
        self.owner = replica_name(settings)
        self.leases = Leases(engine, self.owner)
        self._policies = policies
        self._states: dict[int, PolicyState] = {}
        self._planned_at: dict[int, dict[int, datetime]] = {}
        self._workers: dict[int, _Worker] = {}
        self._locks: dict[int, threading.Lock] = {}
        self._started: dict[int, float] = {}  # policy id -> monotonic start of its last refit
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._errors = RateLimitedLog(log, 30.0)
        self._keeper = threading.Thread(target=self._keep, name="refit-leases", daemon=True)
        self._pool: ProcessPoolExecutor | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._take_leases()
        self._keeper.start()

    def stop(self) -> None:
        self._stopping.set()
        self._keeper.join(timeout=5)
        with self._lock:
            workers = list(self._workers.values())
            self._workers.clear()
        for w in workers:
            w.stop()
        for w in workers:
            w.join(timeout=30)
        self.leases.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _keep(self) -> None:
        while not self._stopping.wait(self.settings.lease_poll_s):
            try:
                self._take_leases()
            except Exception as e:
                self._errors.warning("refit leases: %s", type(e).__name__)

    def _take_leases(self) -> None:
        held = self.leases.check()
        with self._lock:
            for pid in [p for p in self._workers if p not in held]:
                self._workers.pop(pid).stop()  # lost with the session: another replica refits
        taken = [p for p in self._policies() if p not in held and self.leases.try_acquire(p)]
        for pid in taken:
            self._worker(pid)
        self.catch_up(set(taken))

    def catch_up(self, policy_ids: set[int] | None) -> None:
        """Mark dirty the owned policies (of ``policy_ids``; None: all) whose newest data is
        newer than their last published refit: after a takeover or a lost notification. A
        policy whose plans are current is not refitted, so a restart changes no host's θ."""
        owned = self.owned() if policy_ids is None else self.owned() & policy_ids
        if not owned:
            return
        with self.engine.connect() as conn:
            behind = conn.execute(_BEHIND, {"ids": sorted(owned)}).scalars().all()
        self.mark_dirty(set(behind))

    def _worker(self, policy_id: int) -> _Worker:
        with self._lock:
            w = self._workers.get(policy_id)
            if w is None:
                w = _Worker(
                    policy_id, self._background, self.settings.refit_interval_s, self._started.get
                )
                self._workers[policy_id] = w
                w.start()
            return w

    # -- triggers --------------------------------------------------------------------------

    def owned(self) -> set[int]:
        with self._lock:
            return set(self._workers)

    def mark_dirty(self, policy_ids: set[int] | None) -> None:
        """New data or settings for these policies (None: all); only owned ones act on it."""
        with self._lock:
            for pid, w in self._workers.items():
                if policy_ids is None or pid in policy_ids:
                    w.dirty.set()

    def refit_dirty(self) -> None:
        """Refit every owned, dirty policy now, in this thread, and wait for refits the
        workers have begun: on return none is pending or running (for the CLI and tests)."""
        with self._lock:
            workers = list(self._workers.values())
        for w in workers:
            w.run_now()

    def _background(self, policy_id: int) -> None:
        policy = self._policies().get(policy_id)
        if policy is None:
            return
        try:
            self._refit_owned(policy)
        except LeaseLost as e:
            log.info("refit of %s not published: %s", policy.name, e)
        except Exception as e:  # this policy only; the others' workers go on
            self.metrics.refit_failures.labels(policy.name).inc()
            self._errors.error("refit of policy %s failed: %s", policy.name, type(e).__name__)
            log.debug("refit of %s failed", policy.name, exc_info=True)

    # -- the refit -------------------------------------------------------------------------

    def refit(self, policy: Policy) -> dict[ContextKey, ContextPlan]:
        """Refit ``policy`` now and publish its plans; RefitElsewhere if another replica owns
        its refits."""
        if not self.leases.try_acquire(policy.id):
            owner = self.leases.owner_of(policy.id) or "another replica"
            raise RefitElsewhere(f"refits of policy {policy.name!r} are owned by {owner}")
        self._worker(policy.id)
        return self._refit_owned(policy)

    def _refit_owned(self, policy: Policy) -> dict[ContextKey, ContextPlan]:
        with self._lock:
            lock = self._locks.setdefault(policy.id, threading.Lock())
        with lock:  # one refit of a policy at a time in this process, as across replicas
            self._started[policy.id] = time.monotonic()
            return self._refit_locked(policy)

    def _refit_locked(self, policy: Policy) -> dict[ContextKey, ContextPlan]:
        t0 = time.perf_counter()
        with self.engine.connect() as conn:
            started = conn.execute(text("SELECT clock_timestamp()")).scalar_one()
        trials = trial_store.load_trials(
            self.engine, policy.id, timedelta(hours=policy.history_hours)
        )
        admitted = trial_store.admitted_contexts(self.engine, policy.id)
        contexts = trial_store.load_contexts(self.engine, admitted | {t.context_id for t in trials})
        planned_at = self._planned_at.setdefault(policy.id, {})
        targets = plan_order(admitted & contexts.keys(), trials, planned_at)
        targets = targets[: self.settings.max_contexts_per_refit]
        plans = self._plan(policy, trials, contexts, targets, self._published(policy, started))
        records = self._records(policy, plans, contexts)
        previous = self.plans.generation(policy.id)
        generation = self.leases.publish(
            policy.id,
            lambda conn: plan_store.publish_plans(
                conn,
                policy.id,
                records,
                self.owner,
                started,
                len(trials),
                sigma=policy.sigma,
                datapath=policy.spec.datapath,
            ),
        )
        if generation == previous + 1:
            self.plans.update(policy.id, records, contexts, generation)
        else:  # the cache missed a publish (another owner's): take the whole policy from storage
            self.plans.reload(self.engine, policy.id)
        self.metrics.refit_published(policy.name)
        for cid in plans:
            planned_at[cid] = started
        elapsed = time.perf_counter() - t0
        self.metrics.refit_seconds.labels(policy.name).observe(elapsed)
        self.metrics.model_points.labels(policy.name).set(self._states[policy.id].model_points)
        log.info(
            "refit %s: %d trials, %d of %d contexts, %.2fs",
            policy.name,
            len(trials),
            len(plans),
            len(admitted),
            elapsed,
        )
        return {contexts[c]: p for c, p in plans.items()}

    def _published(self, policy: Policy, now: datetime) -> Published:
        """The clock and what hosts run now, from the published plans (so the planner's
        incumbent hysteresis survives a takeover: it reads the plans, not its own memory)."""
        snapshot = self.plans.snapshot(policy.id)
        return {
            "now": now,
            "incumbents": {p.context_id: p.incumbent_key for p in snapshot.values()},
            "candidates": {p.context_id: p.candidate_keys for p in snapshot.values()},
        }

    def planner(self, policy: Policy) -> Planner:
        """The planner over the θ space of the datapath ``policy`` tunes."""
        spec = policy.spec
        with self._lock:
            return self.planners.setdefault(spec.datapath, Planner(spec))

    def _plan(
        self,
        policy: Policy,
        trials: list[Trial],
        contexts: dict[int, ContextKey],
        targets: list[int],
        published: Published,
    ) -> dict[int, ContextPlan]:
        state = self._states.setdefault(policy.id, PolicyState())
        if self.settings.refit_processes == 0:
            planner = self.planner(policy)
            return planner.plan(policy, trials, contexts, targets, state, **published)
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(
                    self.settings.refit_processes,
                    mp_context=mp.get_context("spawn"),
                    initializer=refit_worker_init,
                )
            pool = self._pool
        try:
            plans, self._states[policy.id] = pool.submit(
                plan_in_worker, policy, trials, contexts, targets, state, published
            ).result()
        except BrokenProcessPool:
            with self._lock:  # a worker died (out of memory?): a new pool for the next refit
                if self._pool is pool:
                    self._pool = None
            raise
        return plans

    def _records(
        self, policy: Policy, plans: dict[int, ContextPlan], contexts: dict[int, ContextKey]
    ) -> list[plan_store.PlanRecord]:
        """Plan rows; a context's plan version moves only when its answer changes."""
        current = self.plans.snapshot(policy.id)
        spec = policy.spec
        records = []
        for cid, plan in plans.items():
            old = current.get(contexts[cid])
            inc_key = spec.key(plan.incumbent)
            cand_keys = tuple(spec.key(c) for c in plan.candidates)
            if old is None:
                version = 1
            elif (old.incumbent_key, old.candidate_keys) == (inc_key, cand_keys):
                version = old.version
            else:
                version = old.version + 1
            records.append(
                plan_store.PlanRecord(
                    policy.id, cid, version, inc_key, plan.incumbent_utility, cand_keys
                )
            )
        return records
