"""The agents' arms from memory: GetParameters tells each host its arm without a query.

The cache holds every experiment that is not stopped and not over (running or scheduled), with
its population, indexed by host. A host's arm is then ``assignment.assignment`` at the time of
the request, a pure function, so a start, a crossover or an end takes effect at its instant
without a reload. Anything stored (a new experiment, a stop, an arm stopped, hosts joining or
leaving) is picked up by ``refresh``: the core calls it on every full resynchronisation and
after its own REST changes; it reads the populations again only when ``store.change_mark``
moved. Through a database outage the last loaded experiments keep being served, as plans are.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine

from gemini_api.datapaths import registry
from gemini_api.v1 import booster_pb2 as pb

from ..experiments.assignment import Assignment, assignment
from ..experiments.domain import ArmSpec, Experiment
from ..storage import experiments as store

PARAMS = {
    "kernel_default": pb.ExperimentArm.KERNEL_DEFAULT,
    "fixed": pb.ExperimentArm.FIXED,
    "policy": pb.ExperimentArm.POLICY,
}


def arm_message(found: Assignment) -> pb.ExperimentArm:
    """What the agent needs to run ``found``'s arm, and until when to hold it."""
    arm: ArmSpec = found.arm
    msg = pb.ExperimentArm(
        experiment=found.experiment,
        arm=arm.name,
        cc=arm.cc,
        params=PARAMS[arm.params],
        policy=arm.policy or "",
        destination_prefixes=arm.destinations or [],
        until_unix_ms=int(found.until.timestamp() * 1000),
    )
    tuned = registry().for_cc(arm.cc)
    if arm.theta is not None and tuned is not None:  # a fixed θ's CC has a spec (ArmSpec)
        msg.fixed_theta.datapath = tuned.name
        msg.fixed_theta.values.update(arm.theta)
    return msg


class ArmCache:
    """The pending experiments by host, swapped whole under a lock: GetParameters reads it
    from many threads while ``refresh`` replaces it."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._by_host: dict[str, tuple[Experiment, ...]] = {}
        self._mark: tuple[Any, ...] | None = None
        self._lock = threading.Lock()

    def refresh(self, force: bool = False) -> None:
        """Reload the pending experiments when anything about them changed (or ``force``)."""
        mark = store.change_mark(self.engine)
        if mark == self._mark and not force:
            return
        self.replace(store.pending_experiments(self.engine, datetime.now(UTC)), mark)

    def replace(self, experiments: Sequence[Experiment], mark: tuple[Any, ...] | None) -> None:
        by_host: dict[str, list[Experiment]] = {}
        for e in experiments:
            for host in e.hosts:
                by_host.setdefault(host, []).append(e)
        with self._lock:
            self._by_host = {h: tuple(es) for h, es in by_host.items()}
            self._mark = mark

    def assignment(self, host: str, at: datetime) -> Assignment | None:
        """The host's arm at ``at`` (None: in no running experiment, or its arm stopped)."""
        for e in self._by_host.get(host, ()):
            found = assignment(e, host, at)
            if found is not None:
                return found
        return None

    def next_change(self, host: str, at: datetime) -> datetime | None:
        """The first instant after ``at`` at which the host's arm may change (an experiment's
        start, crossover or end), or None: the agent should ask again by then."""
        instants = [
            t
            for e in self._by_host.get(host, ())
            for t in (e.start, e.crossover_at, e.end)
            if t is not None and t > at
        ]
        return min(instants, default=None)
