"""Booster as a fleet service: replicas on one PostgreSQL agree, one of them at a time refits a
policy, a killed owner's refits move to the survivor, and front processes die with their parent.

Every replica here is a real ``booster serve`` process on the real test PostgreSQL, killed with
SIGKILL where the test says so. Propagation and exit times are printed (``-s`` shows them); the
asserted deadlines are generous so that a busy host cannot fail the test, and the figures from
a quiet host are recorded in benchmarks/results/replicas.md.
"""

from __future__ import annotations

import itertools
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from sqlalchemy import create_engine, text

from gemini_api.theta import load_spec
from gemini_api.v1 import booster_pb2 as pb
from gemini_api.v1 import booster_pb2_grpc as pb_grpc
from gemini_booster import simulation as sim

from . import polling
from .conftest import OPERATOR, agent_md, auth, free_port
from .processes import alive, children, start_booster

POLICY = "cdn"
DEADLINE_S = 60.0  # asserted bound on anything that should take about a second
POLL_S = 0.02  # the took-seconds it returns are printed: a fine poll keeps them close
CALL_S = 30.0  # one request's bound: a busy host must not fail the test


@dataclass
class Replica:
    name: str
    proc: subprocess.Popen
    http: str
    target: str

    def stub(self) -> pb_grpc.BoosterStub:
        return pb_grpc.BoosterStub(grpc.insecure_channel(self.target))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


def start_replica(name: str, db_url: str, workdir: Path, **settings: str) -> Replica:
    grpc_port, http_port = free_port(), free_port()
    proc = start_booster(db_url, grpc_port, http_port, workdir, replica_name=name, **settings)
    return Replica(name, proc, f"http://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}")


@pytest.fixture
def pair(db_url, tmp_path) -> Iterator[tuple[Replica, Replica]]:
    a = start_replica("replica-a", db_url, tmp_path)
    b = start_replica("replica-b", db_url, tmp_path)
    try:
        yield a, b
    finally:
        a.kill()
        b.kill()


def until(check, what: str, deadline_s: float = DEADLINE_S) -> float:
    """Poll ``check`` until it is true; the seconds it took."""
    t0 = time.monotonic()
    polling.until(check, what, deadline_s, POLL_S)
    return time.monotonic() - t0


def policy_on(r: Replica) -> dict | None:
    resp = httpx.get(f"{r.http}/v1/policies/{POLICY}", headers=auth(OPERATOR), timeout=CALL_S)
    return resp.json() if resp.status_code == 200 else None


def contexts() -> list[pb.Context]:
    return [c.message() for c in sim.DEFAULT_CONTEXTS]


def answers(r: Replica, hosts: int = 12) -> list[bytes]:
    stub = r.stub()
    out = []
    for h in range(hosts):
        req = pb.GetParametersRequest(host_id=f"host-{h}", policy=POLICY, contexts=contexts())
        resp = stub.GetParameters(req, metadata=agent_md(), timeout=CALL_S)
        out.append(resp.SerializeToString(deterministic=True))
    return out


def report(host: str, rng: np.random.Generator) -> pb.ReportRequest:
    theta = load_spec().default()
    aggs = [sim.make_aggregate(c, theta, 1.0, 10, rng) for c in sim.DEFAULT_CONTEXTS]
    return sim.make_report(host, POLICY, aggs)


def refit(r: Replica) -> httpx.Response:
    return httpx.post(f"{r.http}/v1/policies/{POLICY}/refit", headers=auth(OPERATOR), timeout=120)


def create_policy(r: Replica, **fields) -> None:
    body = {"name": POLICY, "n_initial_points": 2, "exploration_share": 0.5, **fields}
    resp = httpx.post(f"{r.http}/v1/policies", json=body, headers=auth(OPERATOR), timeout=CALL_S)
    assert resp.status_code == 201, resp.text


def test_a_policy_made_on_one_replica_is_served_by_the_other(pair):
    a, b = pair
    t0 = time.monotonic()
    create_policy(a, sigma=0.5)
    rest_s = until(lambda: policy_on(b) is not None, "B serves the policy over REST")
    req = pb.GetParametersRequest(host_id="h", policy=POLICY, contexts=contexts())
    grpc_s = until(
        lambda: b.stub().GetParameters(req, metadata=agent_md(), timeout=CALL_S) is not None,
        "B answers agents for the policy",
    )
    print(f"\npolicy created on A: B serves it after {rest_s:.3f} s (REST), {grpc_s:.3f} s more")

    resp = httpx.patch(
        f"{b.http}/v1/policies/{POLICY}",
        json={"sigma": 2.0, "exploration_share": 0.1},
        headers=auth(OPERATOR),
        timeout=CALL_S,
    )
    assert resp.status_code == 200, resp.text
    change_s = until(lambda: (policy_on(a) or {}).get("sigma") == 2.0, "A serves B's change")
    assert policy_on(a) == policy_on(b)
    print(
        f"σ changed on B: A serves it after {change_s:.3f} s (total {time.monotonic() - t0:.2f} s)"
    )


def refit_log(db_url: str) -> list[tuple]:
    engine = create_engine(db_url)
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT owner, started_at, finished_at FROM refit_log ORDER BY started_at")
        ).all()
    engine.dispose()
    return [tuple(r) for r in rows]


def stored(db_url: str) -> tuple[set[str], int, int]:
    """Stored report ids, Σ trials.report_count / aggregates, Σ flows in trials vs raw."""
    engine = create_engine(db_url)
    with engine.connect() as conn:
        ids = set(conn.execute(text("SELECT report_id FROM reports")).scalars())
        per_trial = conn.execute(text("SELECT sum(report_count) FROM trials")).scalar_one()
        raw = conn.execute(text("SELECT count(*) FROM report_aggregates")).scalar_one()
    engine.dispose()
    return ids, per_trial, raw


class Agent(threading.Thread):
    """An agent that sends reports to either replica and retries the same report elsewhere
    until one acknowledges it, as agents behind a load balancer do."""

    def __init__(self, index: int, replicas: list[Replica], stop: threading.Event):
        super().__init__(daemon=True)
        self.index, self.replicas, self.stop_event = index, replicas, stop
        self.acknowledged: set[str] = set()
        self.errors: dict[str, int] = {}
        self.rng = np.random.default_rng(index)

    def run(self) -> None:
        stubs = [r.stub() for r in self.replicas]
        n = 0
        while not self.stop_event.is_set():
            req = report(f"agent-{self.index}", self.rng)
            req.report_id = str(uuid.uuid4())
            for attempt in range(200):
                stub = stubs[(n + attempt) % len(stubs)]
                try:
                    stub.ReportAggregates(req, metadata=agent_md(), timeout=CALL_S)
                except grpc.RpcError as e:
                    key = f"{e.code().name}: {e.details()}"
                    self.errors[key] = self.errors.get(key, 0) + 1
                    time.sleep(0.05)
                    continue
                self.acknowledged.add(req.report_id)
                break
            n += 1


def reporting(a: Replica, b: Replica, stop: threading.Event) -> list[Agent]:
    """A policy created on ``a``; once ``b`` serves it too, four agents report to both until
    ``stop``. Returns them once their first 40 reports are acknowledged."""
    create_policy(a)
    until(lambda: policy_on(b) is not None, "B serves the policy")
    agents = [Agent(i, [a, b], stop) for i in range(4)]
    for agent in agents:
        agent.start()
    until(
        lambda: sum(len(x.acknowledged) for x in agents) >= 40,
        f"reports acknowledged (errors: {agents[0].errors})",
    )
    return agents


def test_one_refit_owner_and_a_takeover_when_it_is_killed(pair, db_url):
    a, b = pair
    stop = threading.Event()
    agents = reporting(a, b, stop)

    first, second = refit(a), refit(b)
    assert sorted([first.status_code, second.status_code]) == [200, 409], (first, second)
    owner, other = (a, b) if first.status_code == 200 else (b, a)
    assert owner.name in (second if owner is a else first).json()["detail"]
    for _ in range(2):
        assert refit(owner).status_code == 200
        assert refit(other).status_code == 409

    until(lambda: answers(a) == answers(b), "both replicas answer every host alike")
    before = answers(other)
    workers = children(owner.proc.pid)  # its refit pool
    assert workers, "the owner ran its refits without worker processes"
    owner.kill()
    assert answers(other) == before, "hosts got other θ when the owner died"
    took_s = until(lambda: refit(other).status_code == 200, "the survivor takes over refits")
    print(f"\nowner killed: the survivor owned its refits after {took_s:.2f} s")
    until(lambda: not any(alive(p) for p in workers), "the dead owner's refit workers exit")
    # reports keep flowing, to the survivor alone: every agent has one more acknowledged
    flowed = [len(x.acknowledged) for x in agents]
    until(
        lambda: all(len(x.acknowledged) > n for x, n in zip(agents, flowed, strict=True)),
        f"reports acknowledged by the survivor (errors: {agents[0].errors})",
    )
    stop.set()
    for agent in agents:
        agent.join(timeout=60)

    log = refit_log(db_url)
    assert {o for o, _, _ in log} == {owner.name, other.name}
    for (o1, _, end1), (o2, start2, _) in itertools.pairwise(log):
        assert end1 <= start2 or o1 == o2, "two replicas refitted the policy at once"
    acknowledged = set().union(*(x.acknowledged for x in agents))
    ids, per_trial, raw = stored(db_url)
    assert acknowledged <= ids, f"{len(acknowledged - ids)} acknowledged reports lost"
    assert per_trial == raw == len(ids) * len(sim.DEFAULT_CONTEXTS), "a report counted twice"


def test_front_processes_exit_when_their_parent_is_killed(db_url, tmp_path):
    main = start_replica("replica-f", db_url, tmp_path, grpc_processes="3")
    fronts = children(main.proc.pid)
    assert len([p for p in fronts if alive(p)]) >= 2, "the fronts did not start"
    main.kill()
    gone_s = until(lambda: not any(alive(p) for p in fronts), "fronts exit with their parent")
    print(f"\nparent killed: its {len(fronts)} children were gone after {gone_s:.2f} s")
