"""The guardrail runs on its own: a real Booster (embedded PostgreSQL, gRPC, REST) with a short
``guardrail_interval_s`` stops an arm whose flows, reported through the real gRPC ingest path,
are clearly worse than control's, without any operator call; the stop is audited by
``guardrail`` and GetParameters stops carrying the arm. A healthy experiment keeps running; two
replicas on one database stop the arm once; a round whose advisory lock is held elsewhere is
skipped; a round that cannot reach the database is counted and the task carries on; an interval
of 0 runs nothing. Outcomes are awaited by polling up to a generous deadline, never timed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import pytest
from sqlalchemy import create_engine, text

from gemini_api.aggregate import AggregateBuilder, FlowStats
from gemini_api.theta import load_spec
from gemini_api.v1 import booster_pb2 as pb
from gemini_booster import simulation as sim
from gemini_booster.service.guardrail_task import LOCK_KEY, GuardrailTask
from gemini_booster.service.metrics import Metrics

from .conftest import OPERATOR, Running, agent_md, auth, free_port, serve
from .polling import until
from .test_experiments_api import host_arm

T = TypeVar("T")
SPEC = load_spec()
INTERVAL_S = 0.2  # rounds in quick succession, so that a test waits little
DEADLINE_S = 120.0  # generous: the verdict must not depend on the machine's speed
POLL_S = 0.1
GUARD = {"margin": 1.0, "confidence": 0.95, "min_hosts": 3}
HARMFUL = {"control": 60.0, "fusion": 20.0}  # Mbit/s of each arm's flows
HEALTHY = {"control": 60.0, "fusion": 62.0}
HOST_SPREAD_MBPS = 0.5  # far below either difference, whichever hosts each arm gets


def eventually(check: Callable[[], T], what: str) -> T:
    """``check()`` once it is truthy; fails after DEADLINE_S."""
    return until(check, what, DEADLINE_S, POLL_S)


def hosts_of(name: str) -> list[str]:
    return [f"{name}-{i}" for i in range(8)]


def create(booster: Running, name: str) -> dict[str, str]:
    """Control (cubic) against Fusion at its default θ on eight hosts, running now, with the
    guardrail; host → its arm."""
    body = {
        "name": name,
        "arms": [
            {"name": "control", "cc": "cubic"},
            {"name": "fusion", "cc": "fusion", "params": "fixed", "theta": SPEC.default()},
        ],
        "population": {"regions": {"eu": hosts_of(name)}},
        "start": (datetime.now(UTC) - timedelta(hours=1)).isoformat(),
        "end": (datetime.now(UTC) + timedelta(days=3)).isoformat(),
        "sigma": 1.0,
        "guardrail": GUARD,
    }
    r = booster.http.post("/v1/experiments", json=body, headers=auth(OPERATOR))
    assert r.status_code == 201, r.text
    return {h: host_arm(booster.http, h)["arm"]["name"] for h in hosts_of(name)}  # type: ignore[index]


def aggregate(mbps: float, cc: str) -> pb.Aggregate:
    """Five flows of 1 s at ``mbps`` with no queueing, of ``cc`` ('' is Fusion)."""
    b = AggregateBuilder()
    for _ in range(5):
        b.add(FlowStats(int(mbps * 1e6 / 8), 1_000_000, 40_000, 40_000))
    return b.to_proto(SPEC.default(), 1, sim.ETHERNET.message(), cc)


def report(booster: Running, arms: dict[str, str], mbps: dict[str, float]) -> None:
    """Each host reports Fusion and cubic flows through gRPC; only its own arm's count. Hosts
    differ a little (by HOST_SPREAD_MBPS at most), as real ones do, so the differences have a
    spread."""
    for i, host in enumerate(arms):
        extra = HOST_SPREAD_MBPS * i / len(arms)
        parts = [aggregate(mbps["fusion"] + extra, ""), aggregate(mbps["control"] + extra, "cubic")]
        req = sim.make_report(host, "cdn", parts)
        assert booster.stub().ReportAggregates(req, metadata=agent_md()).aggregates_stored == 2


def setup_policy(booster: Running) -> None:
    r = booster.http.post("/v1/policies", json={"name": "cdn"}, headers=auth(OPERATOR))
    assert r.status_code == 201, r.text


def arm_of(booster: Running, host: str) -> pb.ExperimentArm | None:
    req = pb.GetParametersRequest(host_id=host, policy="cdn")
    resp = booster.stub().GetParameters(req, metadata=agent_md(), timeout=10)
    return resp.experiment_arm if resp.HasField("experiment_arm") else None


def arm_stops(booster: Running, name: str) -> list[dict[str, Any]]:
    """The audit entries of arms stopped in experiment ``name``."""
    entries = booster.http.get("/v1/audit?limit=1000", headers=auth(OPERATOR)).json()
    return [e for e in entries if e["action"] == "experiment.stop_arm" and e["target"] == name]


def fusion_stopped(booster: Running, name: str) -> dict[str, Any] | None:
    e = booster.http.get(f"/v1/experiments/{name}", headers=auth(OPERATOR)).json()
    return {a["name"]: a for a in e["arms"]}["fusion"]["stopped"]


def a_full_round(booster: Running) -> int:
    """Run one round by hand, retrying while the scheduled one holds the lock: a round that
    began after everything so far was stored. The arms it stopped."""
    task = booster.booster.guardrail
    assert task is not None
    rounds: list[int] = []

    def once() -> bool:
        got = task.run_once()
        if got is not None:
            rounds.append(got)
        return got is not None

    eventually(once, "a round of this replica's own")
    return rounds[0]


def counter(booster: Running, name: str) -> float:
    return booster.booster.metrics.registry.get_sample_value(name) or 0.0


def test_a_harmful_arm_is_stopped_on_schedule_and_a_healthy_experiment_runs_on(db_url) -> None:
    with serve(db_url, guardrail_interval_s=INTERVAL_S) as booster:
        setup_policy(booster)
        healthy, harmful = create(booster, "healthy"), create(booster, "harmful")
        report(booster, healthy, HEALTHY)
        report(booster, harmful, HARMFUL)
        stopped = eventually(lambda: fusion_stopped(booster, "harmful"), "stop of the arm")
        assert stopped["by"] == "guardrail" and "utility below control" in stopped["reason"]
        [entry] = arm_stops(booster, "harmful")
        assert entry["actor"] == "guardrail" and entry["detail"]["arm"] == "fusion"
        assert entry["detail"]["upper_bound"] < -GUARD["margin"]
        # Agents of the stopped arm get no arm at their next GetParameters; control keeps its.
        fusion = [h for h, a in harmful.items() if a == "fusion"]
        eventually(lambda: all(arm_of(booster, h) is None for h in fusion), "arm gone")
        for host in harmful.keys() - set(fusion):
            got = arm_of(booster, host)
            assert got is not None and got.arm == "control"
        # A round that began after all the healthy experiment's flows were stored left it alone.
        assert a_full_round(booster) == 0
        assert counter(booster, "gemini_booster_guardrail_stops_total") == 1
        assert fusion_stopped(booster, "healthy") is None and arm_stops(booster, "healthy") == []
        assert all(arm_of(booster, h) is not None for h in healthy)
        assert counter(booster, "gemini_booster_guardrail_failures_total") == 0


def test_two_replicas_stop_the_arm_once(db_url) -> None:
    with (
        serve(db_url, guardrail_interval_s=INTERVAL_S) as one,
        serve(db_url, guardrail_interval_s=INTERVAL_S) as two,
    ):
        setup_policy(one)
        arms = create(one, "harmful")
        eventually(lambda: arm_of(two, next(iter(arms))), "experiment on the second replica")
        report(one, arms, HARMFUL)
        eventually(lambda: fusion_stopped(two, "harmful"), "stop of the arm")
        # More rounds on both replicas find the arm stopped and leave it so.
        assert a_full_round(one) == 0 and a_full_round(two) == 0
        assert len(arm_stops(one, "harmful")) == 1
        stops = sum(counter(b, "gemini_booster_guardrail_stops_total") for b in (one, two))
        assert stops == 1
        fusion = [h for h, a in arms.items() if a == "fusion"]
        for replica in (one, two):  # the other replica learns of the stop by notification
            eventually(lambda r=replica: all(arm_of(r, h) is None for h in fusion), "arm gone")


@pytest.fixture
def unscheduled(db_url) -> Iterator[tuple[Running, GuardrailTask]]:
    """A Booster with no rounds of its own (interval 0), its harmful experiment's flows
    stored, and its guardrail task (for rounds by hand)."""
    with serve(db_url, guardrail_interval_s=0) as booster:
        setup_policy(booster)
        report(booster, create(booster, "harmful"), HARMFUL)
        task = booster.booster.guardrail
        assert task is not None
        yield booster, task


def test_a_round_is_skipped_while_another_holds_the_lock(db_url, unscheduled) -> None:
    booster, task = unscheduled
    elsewhere = create_engine(db_url)
    try:
        with elsewhere.connect() as conn:  # another replica's round, under way
            held = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": LOCK_KEY})
            assert held.scalar() is True
            assert task.run_once() is None
            assert fusion_stopped(booster, "harmful") is None
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": LOCK_KEY})
    finally:
        elsewhere.dispose()
    assert task.run_once() == 1
    assert fusion_stopped(booster, "harmful") is not None


def test_an_interval_of_zero_runs_nothing(unscheduled) -> None:
    booster, task = unscheduled
    assert not task.running  # no rounds of its own
    assert fusion_stopped(booster, "harmful") is None
    assert arm_stops(booster, "harmful") == []
    assert task.run_once() == 1  # what a round would have done: the data are harmful


def test_a_failed_round_is_counted_and_the_task_carries_on() -> None:
    """A database that is not there: each round fails, is counted, and the next one comes."""
    gone = create_engine(f"postgresql+psycopg://nobody@127.0.0.1:{free_port()}/nothing")
    metrics = Metrics()
    task = GuardrailTask(gone, INTERVAL_S, metrics, lambda: None)
    assert task.run_once() == 0
    task.start()
    try:
        failures = "gemini_booster_guardrail_failures_total"
        eventually(lambda: (metrics.registry.get_sample_value(failures) or 0) >= 3, "rounds")
        assert task.running
    finally:
        task.stop()
        gone.dispose()
    assert not task.running
