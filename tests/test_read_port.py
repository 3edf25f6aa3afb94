"""Booster's read port (``parameters_listen``): a process of its own that answers GetParameters
only, over real gRPC and real PostgreSQL. It answers a host as the agent port does, refuses
reports (UNIMPLEMENTED, naming the port to report to), refuses every bad or foreign credential
exactly as the agent port does, serves an agent configured with ``parameters_address`` while
its reports go to the agent port, and dies with its parent."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from concurrent import futures
from functools import partial
from pathlib import Path

import grpc
import pytest
from prometheus_client import Metric
from sqlalchemy import text

from gemini_agent.config import AgentSettings
from gemini_agent.daemon import Agent
from gemini_agent.reporter import READ_PORT_RETRY_S
from gemini_agent.writeback import Kernel
from gemini_api.v1 import booster_pb2 as pb
from gemini_api.v1 import booster_pb2_grpc as pb_grpc
from gemini_booster import simulation as sim
from gemini_booster.config import Settings
from gemini_booster.models import PolicyCreate
from gemini_booster.service.app import BoosterServer
from gemini_booster.service.grpc_server import READ_PORT_ONLY, Serves
from gemini_booster.storage import credentials as token_store
from gemini_booster.storage import policies as policy_store

from .conftest import AGENT, OPERATOR, agent_md, free_port, make_settings
from .polling import until
from .processes import alive, children, start_booster
from .sysctls import fusion_sysctls
from .test_identity import POLICY, parameters, report

HOST, OTHER = "host-a", "host-b"
CALL_S = 30.0  # one call's bound: a busy host must not fail the test
LATENCY = "gemini_booster_grpc_request_seconds_count"


@pytest.fixture
def server(db_url) -> Iterator[BoosterServer]:
    """A Booster with per-host tokens only (as a new install) and a read port."""
    s = BoosterServer(
        make_settings(
            db_url,
            parameters_listen="127.0.0.1:0",
            bootstrap_agent_token=None,
            allow_unbound_agent_tokens=False,
        )
    ).start()
    policy_store.create_policy(s.engine, PolicyCreate(name=POLICY, n_initial_points=2), "test")
    s.booster.reload_policies()
    try:
        yield s
    finally:
        s.stop()


def stub(port: int) -> pb_grpc.BoosterStub:
    return pb_grpc.BoosterStub(grpc.insecure_channel(f"127.0.0.1:{port}"))


def host_token(server: BoosterServer, host: str) -> str:
    token = token_store.create_token(server.engine, f"{host}-1", "agent", "test", host_id=host)
    server.booster.tokens_changed()  # as REST does; the reader learns it from the database
    return token


def refused(call, request, metadata) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as e:
        call(request, metadata=metadata, timeout=CALL_S)
    return e.value.code(), e.value.details()


def reports_stored(server: BoosterServer) -> int:
    with server.engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM reports")).scalar_one()


def test_the_read_port_answers_a_host_as_the_agent_port_does(server):
    token = host_token(server, HOST)
    main = stub(server.grpc_port)
    main.ReportAggregates(report(HOST), metadata=agent_md(token), timeout=CALL_S)
    server.booster.refit(server.booster.policies[POLICY])
    read = stub(server.parameters_port)
    req = parameters(HOST)

    def same() -> bytes | None:
        a, b = (
            s.GetParameters(req, metadata=agent_md(token), timeout=CALL_S).SerializeToString(
                deterministic=True
            )
            for s in (main, read)
        )
        return a if a == b else None  # the reader loads the plans once told they were published

    answer = pb.GetParametersResponse.FromString(until(same, "both ports answer alike"))
    assert len(answer.parameters) == len(sim.DEFAULT_CONTEXTS)
    assert all(p.plan_version >= 1 for p in answer.parameters), "answered before any plan"


def test_the_read_port_refuses_reports_before_any_work(server):
    token = host_token(server, HOST)
    code, details = refused(
        stub(server.parameters_port).ReportAggregates, report(HOST), agent_md(token)
    )
    assert code == grpc.StatusCode.UNIMPLEMENTED
    assert details == READ_PORT_ONLY and "grpc_listen" in details
    assert reports_stored(server) == 0
    # not even a bad credential is looked at: the call does not exist on this port
    code, _ = refused(stub(server.parameters_port).ReportAggregates, report(HOST), ())
    assert code == grpc.StatusCode.UNIMPLEMENTED


def test_the_read_port_refuses_credentials_as_the_agent_port_does(server):
    own = host_token(server, HOST)
    host_token(server, OTHER)
    unbound = token_store.create_token(server.engine, "fleet", "agent", "test")
    revoked = token_store.create_token(server.engine, "gone", "agent", "test", host_id=HOST)
    token_store.revoke_token(server.engine, "gone", "test")
    server.booster.tokens_changed()
    cases = {
        "no token": (parameters(HOST), ()),
        "unknown token": (parameters(HOST), agent_md("not-a-token")),
        "revoked token": (parameters(HOST), agent_md(revoked)),
        "operator token": (parameters(HOST), agent_md(OPERATOR)),
        "unbound agent token": (parameters(HOST), agent_md(unbound)),
        "another host's token": (parameters(OTHER), agent_md(own)),
        "metadata over the limit": (parameters(HOST), (*agent_md(own), ("x-pad", "x" * 20_000))),
    }
    main, read = stub(server.grpc_port), stub(server.parameters_port)
    for name, (req, md) in cases.items():
        on_main = refused(main.GetParameters, req, md)
        settled = partial(_settled, read, req, md, on_main)
        on_read = until(settled, f"{name}: the read port agrees")
        assert on_read == on_main, name
        assert on_main[0] != grpc.StatusCode.OK, name
    assert read.GetParameters(parameters(HOST), metadata=agent_md(own), timeout=CALL_S)


def _settled(read, req, md, expected) -> tuple[grpc.StatusCode, str] | None:
    """The read port's refusal once it equals ``expected`` (its process follows token
    changes through the database, a moment after the main process), else None."""
    got = refused(read.GetParameters, req, md)
    return got if got == expected else None


def families(server: BoosterServer) -> tuple[list[Metric], list[Metric]]:
    """The main process's own metrics, and the reader's latest snapshot (the only other
    process: grpc_processes is 1)."""
    remote = server.booster.metrics.remote
    return list(server.booster.metrics.registry.collect()), next(iter(remote.values()), [])


def calls(fams: list[Metric], method: str) -> float:
    return sum(
        s.value
        for f in fams
        for s in f.samples
        if s.name == LATENCY and s.labels.get("method") == method and s.labels["code"] == "OK"
    )


def agent_of(server: BoosterServer, tmp_path: Path, parameters_address: str) -> Agent:
    """HOST's agent (dry run) with its own token, reporting to the agent port and asking
    ``parameters_address`` for θ."""
    sysctls = fusion_sysctls(tmp_path)
    settings = AgentSettings(
        host_id=HOST,
        policy=POLICY,
        token=host_token(server, HOST),
        booster_address=f"127.0.0.1:{server.grpc_port}",
        parameters_address=parameters_address,
        spool_dir=tmp_path / "spool",
        sysctl_root=sysctls,
        apply_to_kernel=False,
    )
    return Agent(settings, kernel=Kernel(sysctls, use_netlink=False), module_params={})


def test_an_agent_asks_the_read_port_and_reports_to_the_agent_port(server, tmp_path: Path):
    agent = agent_of(server, tmp_path, f"127.0.0.1:{server.parameters_port}")
    agent.reporter.submit(report(HOST))
    assert agent.reporter.drain() == 1
    agent.refresh_theta()
    assert not agent.booster_silent, "GetParameters failed"

    def snapshots() -> tuple[list[Metric], list[Metric]] | None:
        main, reader = families(server)
        return (main, reader) if calls(reader, "GetParameters") >= 1 else None

    main, reader = until(snapshots, "the reader's metrics count the agent's GetParameters")
    assert calls(main, "GetParameters") == 0, "GetParameters reached the agent port"
    assert calls(main, "ReportAggregates") == 1
    assert calls(reader, "ReportAggregates") == 0
    assert reports_stored(server) == 1


def test_an_agent_asks_the_agent_port_when_the_read_port_does_not_answer(server, tmp_path):
    agent = agent_of(server, tmp_path, f"127.0.0.1:{free_port()}")  # nothing listens there
    agent.refresh_theta()
    assert not agent.booster_silent, "no θ although the agent port answers"
    main, _ = families(server)
    assert calls(main, "GetParameters") == 1


class NoBooster(grpc.GenericRpcHandler):
    """A real gRPC server that serves no Booster method (every call UNIMPLEMENTED, as a port of
    something else or a Booster without a read port would), counting the Booster calls it
    refuses."""

    def __init__(self) -> None:
        self.calls = 0

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> None:
        if handler_call_details.method.startswith("/gemini."):  # not the channel's health watch
            self.calls += 1
        return None


def test_a_read_port_that_refuses_is_not_asked_again_until_its_retry_time(server, tmp_path):
    refuser = NoBooster()
    other = grpc.server(futures.ThreadPoolExecutor(max_workers=1), handlers=[refuser])
    port = other.add_insecure_port("127.0.0.1:0")
    other.start()
    try:
        agent = agent_of(server, tmp_path, f"127.0.0.1:{port}")
        now = [1000.0]
        agent.reporter.read_port.clock = lambda: now[0]
        agent.refresh_theta()
        agent.refresh_theta()
        assert not agent.booster_silent, "no θ although the agent port answers"
        assert refuser.calls == 1, "the refusing read port was asked on every refresh"
        assert calls(families(server)[0], "GetParameters") == 2
        now[0] += READ_PORT_RETRY_S
        agent.refresh_theta()
        assert refuser.calls == 2, "the read port was not tried again after its retry time"
        assert calls(families(server)[0], "GetParameters") == 3
    finally:
        other.stop(None)


def test_a_reader_that_dies_is_replaced_on_the_same_port(server):
    token = host_token(server, HOST)
    assert server.fronts is not None
    (first,) = server.fronts.pids(Serves.PARAMETERS)
    os.kill(first, signal.SIGKILL)

    def answered_by_another() -> bool:
        pids = server.fronts.pids(Serves.PARAMETERS) if server.fronts else []
        if pids == [first] or not pids:
            return False
        try:
            stub(server.parameters_port).GetParameters(
                parameters(HOST), metadata=agent_md(token), timeout=CALL_S
            )
        except grpc.RpcError:
            return False  # the new process not listening yet
        return True

    until(answered_by_another, "a new reader serves the read port")
    assert server.fronts.respawned == 1
    assert first not in server.fronts.pids(Serves.PARAMETERS)


def test_a_read_port_on_the_agent_port_is_refused(db_url):
    with pytest.raises(ValueError, match="parameters_listen is grpc_listen"):
        Settings(grpc_listen="127.0.0.1:50051", parameters_listen="127.0.0.1:50051")


def test_the_reader_exits_when_its_parent_is_killed(db_url, tmp_path):
    grpc_port, http_port, read_port = free_port(), free_port(), free_port()
    proc = start_booster(
        db_url,
        grpc_port,
        http_port,
        tmp_path,
        parameters_listen=f"127.0.0.1:{read_port}",
        refit_processes="0",
    )
    try:
        kids = children(proc.pid)
        read = stub(read_port)
        policy = pb.GetParametersRequest(host_id=HOST, policy="none-such")
        code, _ = refused(read.GetParameters, policy, agent_md(AGENT))
        assert code == grpc.StatusCode.NOT_FOUND, "the read port did not serve"
        assert kids and all(alive(p) for p in kids)
    finally:
        proc.kill()
        proc.wait()
    until(lambda: not any(alive(p) for p in kids), "the reader exits with its parent")
    code, _ = refused(read.GetParameters, policy, agent_md(AGENT))
    assert code == grpc.StatusCode.UNAVAILABLE, "something still serves the read port"
