"""Booster killed (SIGKILL) and restarted keeps policies, trials and incumbents; every host gets
the same θ as before the kill."""

from __future__ import annotations

import signal
import subprocess

import grpc
import httpx

from gemini_api.v1 import booster_pb2 as pb
from gemini_api.v1 import booster_pb2_grpc as pb_grpc
from gemini_booster import simulation as sim
from gemini_booster.fleet import SyntheticFleet

from .conftest import AGENT, OPERATOR, agent_md, auth, free_port
from .processes import start_booster


def start(db_url: str, grpc_port: int, http_port: int, tmp_path) -> subprocess.Popen:
    return start_booster(db_url, grpc_port, http_port, tmp_path)


def answers(target: str) -> list[tuple]:
    stub = pb_grpc.BoosterStub(grpc.insecure_channel(target))
    out = []
    for h in range(20):
        req = pb.GetParametersRequest(
            host_id=f"host-{h}", policy="cdn", contexts=[c.message() for c in sim.DEFAULT_CONTEXTS]
        )
        resp = stub.GetParameters(req, metadata=agent_md(), timeout=10)
        out.append(
            tuple(
                (p.theta.SerializeToString(), p.plan_version, p.exploratory)
                for p in resp.parameters
            )
        )
    return out


def state(http: str) -> tuple:
    h = auth(OPERATOR)
    policies = httpx.get(f"{http}/v1/policies", headers=h).json()
    trials = httpx.get(f"{http}/v1/policies/cdn/trials?limit=10000", headers=h).json()
    params = httpx.get(f"{http}/v1/policies/cdn/parameters", headers=h).json()
    return policies, sorted(map(str, trials)), params


def test_kill_and_restart_keeps_state_and_answers(db_url, tmp_path):
    grpc_port, http_port = free_port(), free_port()
    http = f"http://127.0.0.1:{http_port}"
    target = f"127.0.0.1:{grpc_port}"
    proc = start(db_url, grpc_port, http_port, tmp_path)
    try:
        r = httpx.post(
            f"{http}/v1/policies",
            json={"name": "cdn", "exploration_share": 0.5},
            headers=auth(OPERATOR),
        )
        assert r.status_code == 201
        fleet = SyntheticFleet(target, AGENT, "cdn", hosts_per_context=4)
        for i in range(10):
            fleet.run_round(i)
            assert (
                httpx.post(
                    f"{http}/v1/policies/cdn/refit", headers=auth(OPERATOR), timeout=60
                ).status_code
                == 200
            )
        fleet.close()
        before_answers, before_state = answers(target), state(http)
        assert any(any(e for _, _, e in a) for a in before_answers)  # some hosts explore
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    proc = start(db_url, grpc_port, http_port, tmp_path)
    try:
        assert state(http) == before_state
        assert answers(target) == before_answers
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
