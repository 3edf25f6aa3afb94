"""Booster with a front process on its one gRPC port (``grpc_processes = 2``): a report through
either process is stored exactly once, the main process refits on what the front stored (told
by the database's notification), both processes answer GetParameters alike, and ``/metrics``
adds the front's counts in."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from gemini_api.theta import load_spec
from gemini_api.v1 import booster_pb2 as pb
from gemini_api.v1 import booster_pb2_grpc as pb_grpc
from gemini_booster import simulation as sim
from gemini_booster.models import PolicyCreate
from gemini_booster.service.app import BoosterServer
from gemini_booster.service.fronts import METRICS_EVERY_S
from gemini_booster.storage import database
from gemini_booster.storage import policies as policy_store

from .conftest import agent_md, make_settings

POLICY = "fronts"
CONNECTIONS = 16  # the kernel spreads connections, not calls: 16 miss a process with p = 2⁻¹⁵


@pytest.fixture
def server(db_url):
    engine = database.make_engine(db_url)
    policy_store.create_policy(engine, PolicyCreate(name=POLICY, n_initial_points=2), actor="test")
    engine.dispose()
    s = BoosterServer(make_settings(db_url, grpc_processes=2, refit_interval_s=0.2)).start()
    try:
        yield s
    finally:
        s.stop()


def stubs(server: BoosterServer) -> list[pb_grpc.BoosterStub]:
    target = f"127.0.0.1:{server.grpc_port}"
    return [
        pb_grpc.BoosterStub(
            grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
        )
        for _ in range(CONNECTIONS)
    ]


def reports(n: int) -> list[pb.ReportRequest]:
    rng = np.random.default_rng(7)
    theta = load_spec().default()
    out = []
    for i in range(n):
        aggs = [sim.make_aggregate(c, theta, 1.0, 10, rng) for c in sim.DEFAULT_CONTEXTS]
        out.append(sim.make_report(f"host-{i}", POLICY, aggs))
    return out


def accepted_on_metrics(server: BoosterServer) -> float:
    body = httpx.get(f"http://127.0.0.1:{server.http_port}/metrics").text
    for family in text_string_to_metric_families(body):
        if family.name == "gemini_booster_reports":
            return sum(s.value for s in family.samples if s.labels.get("outcome") == "accepted")
    return 0.0


def test_reports_through_both_processes_are_stored_once_and_counted(server):
    reqs = reports(48)
    lanes = stubs(server)
    # Every report twice, at once, on two different connections.
    calls = [(lanes[i % CONNECTIONS], r) for i, r in enumerate(reqs)]
    calls += [(lanes[(i + 5) % CONNECTIONS], r) for i, r in enumerate(reqs)]
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda c: c[0].ReportAggregates(c[1], metadata=agent_md()), calls))
    by_id: dict[str, list[bool]] = {}
    for (_, r), a in zip(calls, answers, strict=True):
        by_id.setdefault(r.report_id, []).append(a.duplicate)
    assert all(sorted(d) == [False, True] for d in by_id.values())
    with server.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM reports")).scalar_one() == 48
        flows = conn.execute(text("SELECT sum(flow_count) FROM trials")).scalar_one()
    assert flows == 48 * 10 * len(sim.DEFAULT_CONTEXTS)

    # the front's metrics arrive with its next snapshot (every METRICS_EVERY_S)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (
        server.booster.metrics.remote and accepted_on_metrics(server) == 48
    ):
        time.sleep(METRICS_EVERY_S / 5)
    fronts = server.booster.metrics.remote
    assert fronts, "the front process never reported its metrics"
    front_accepted = sum(
        s.value
        for f in next(iter(fronts.values()))
        if f.name == "gemini_booster_reports"
        for s in f.samples
        if s.name.endswith("_total") and s.labels.get("outcome") == "accepted"
    )
    assert 0 < front_accepted < 48, "both processes should have taken some connections"
    assert accepted_on_metrics(server) == 48


def test_both_processes_answer_the_same_plan(server):
    lanes = stubs(server)
    for i, r in enumerate(reports(12)):
        lanes[i % CONNECTIONS].ReportAggregates(r, metadata=agent_md())
    deadline = time.monotonic() + 60
    policy = server.booster.policies[POLICY]
    while len(server.booster.plan_snapshot(policy.id)) < len(sim.DEFAULT_CONTEXTS):
        assert time.monotonic() < deadline, "the main process never refit on the reports"
        time.sleep(0.2)
    contexts = [c.message() for c in sim.DEFAULT_CONTEXTS]
    req = pb.GetParametersRequest(host_id="host-a", policy=POLICY, contexts=contexts)

    def answers() -> set[bytes]:
        return {
            lane.GetParameters(req, metadata=agent_md()).SerializeToString(deterministic=True)
            for lane in lanes
        }

    seen = answers()
    while len(seen) != 1:  # the front loads the plans when it is told they were published
        assert time.monotonic() < deadline, "the two processes answered one host differently"
        time.sleep(0.1)
        seen = answers()
    (answer,) = seen
    assert all(p.plan_version >= 1 for p in pb.GetParametersResponse.FromString(answer).parameters)
