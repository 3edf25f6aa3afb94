"""Linux CUBIC as a datapath: its θ spec (the module parameters that matter, the kernel's
defaults), Booster's planning of a policy that targets cubic in CUBIC's space, and the agent's
write-back into /sys/module/tcp_cubic/parameters of this real kernel, checked and restored.

The module parameters are global to the machine: the tests that write them save the host's
values first and put them back whatever happens.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from sqlalchemy import create_engine, text

from gemini_agent.aggregator import Flow
from gemini_agent.config import AgentSettings
from gemini_agent.daemon import Agent
from gemini_agent.datapath import ModuleParams, host_theta
from gemini_agent.writeback import Kernel
from gemini_api.aggregate import AggregateBuilder, FlowStats
from gemini_api.datapaths import datapaths, load_datapath, registry
from gemini_api.theta import ThetaError, load_spec
from gemini_api.v1 import booster_pb2 as pb
from gemini_booster import simulation as sim
from gemini_booster.storage import database
from gemini_booster.storage import policies as policy_store

from .conftest import AGENT, OPERATOR, agent_md, at_revision, auth, free_port, serve
from .test_experiment_arm import HOSTS, _agent, experiment
from .test_experiments_api import host_arm

CUBIC = load_datapath("cubic")
PARAMS = Path(CUBIC.target)
# net/ipv4/tcp_cubic.c: fast_convergence = 1, beta = 717 (/1024), tcp_friendliness = 1,
# hystart = 1, hystart_detect = HYSTART_ACK_TRAIN | HYSTART_DELAY, hystart_low_window = 16,
# hystart_ack_delta_us = 2000.
KERNEL_DEFAULTS = {
    "beta": 717,
    "fast_convergence": 1,
    "tcp_friendliness": 1,
    "hystart": 1,
    "hystart_detect": 3,
    "hystart_low_window": 16,
    "hystart_ack_delta_us": 2000,
}
on_cubic_kernel = pytest.mark.skipif(
    not PARAMS.is_dir() or os.geteuid() != 0, reason="needs tcp_cubic's parameters, as root"
)


def net_ipv4(tmp_path: Path, available: str) -> Path:
    """A directory standing in for /proc/sys/net/ipv4: ``available`` CCs, cubic in use."""
    net = tmp_path / "net-ipv4"
    net.mkdir()
    (net / "tcp_available_congestion_control").write_text(f"{available}\n")
    (net / "tcp_congestion_control").write_text("cubic\n")
    return net


def host_on_arm(http, name: str, arms: list[dict[str, Any]], arm: str) -> str:
    """Start experiment ``name`` with ``arms``; a host its split put on ``arm``."""
    body = experiment(name=name, arms=arms)
    r = http.post("/v1/experiments", json=body, headers=auth(OPERATOR))
    assert r.status_code == 201, r.text
    return next(h for h in HOSTS if host_arm(http, h)["arm"]["name"] == arm)


def test_the_cubic_spec_holds_the_kernels_defaults_inside_its_regions() -> None:
    assert datapaths()[0] == "fusion" and "cubic" in datapaths()
    assert (CUBIC.datapath, CUBIC.scope) == ("cubic", "host")
    assert CUBIC.default() == KERNEL_DEFAULTS
    for p in CUBIC.params:
        (wlo, whi), (plo, phi) = p.wide, p.production
        assert wlo <= plo <= p.default <= phi <= whi, p.name
    assert CUBIC.param("beta").to_natural(717) == pytest.approx(0.7, abs=0.001)
    assert registry().for_cc("cubic").name == "cubic"  # type: ignore[union-attr]
    assert registry().for_cc("bbr") is None  # no spec of its own: no datapath, not Fusion's
    assert load_datapath("fusion") == load_spec()
    with pytest.raises(ThetaError, match="no datapath 'vegas'"):
        load_datapath("vegas")


@on_cubic_kernel
def test_every_spec_parameter_is_a_writable_module_parameter_at_its_default() -> None:
    for name in CUBIC.names:
        path = PARAMS / name
        assert path.is_file() and path.stat().st_mode & 0o200, name
    assert not (PARAMS / "bic_scale").stat().st_mode & 0o200  # read-only: left out
    assert ModuleParams(CUBIC).read() == KERNEL_DEFAULTS  # this host runs the kernel's defaults


@pytest.fixture
def host_cubic() -> Iterator[ModuleParams]:
    """The real module parameters, the host's values saved and put back afterwards."""
    saved = {n: (PARAMS / n).read_text() for n in CUBIC.names}
    try:
        yield ModuleParams(CUBIC)
    finally:
        for name, text in saved.items():
            (PARAMS / name).write_text(text)


@on_cubic_kernel
def test_the_agent_writes_cubic_theta_reads_it_back_and_restores(host_cubic) -> None:
    before = host_cubic.read()
    tuned = KERNEL_DEFAULTS | {"beta": 820, "hystart_detect": 2, "hystart_low_window": 32}
    assert host_cubic.write(tuned) == tuned
    assert host_cubic.read() == tuned
    with pytest.raises(ThetaError, match="beta"):  # outside Θ': refused before any write
        host_cubic.write(tuned | {"beta": 1024, "hystart": 0})
    assert host_cubic.read() == tuned
    production = CUBIC.region_bounds("production")
    with pytest.raises(ThetaError, match="hystart_ack_delta_us"):
        host_cubic.write(tuned | {"hystart_ack_delta_us": 20_000}, production)
    assert host_cubic.read() == tuned
    host_cubic.restore()
    assert host_cubic.read() == before


def test_the_host_theta_is_the_busiest_contexts_else_the_default() -> None:
    tuned = KERNEL_DEFAULTS | {"beta": 800}
    default = pb.DatapathTheta(datapath="cubic", values=KERNEL_DEFAULTS)
    resp = pb.GetParametersResponse(
        target_cc="cubic",
        default_datapath_theta=default,
        parameters=[
            pb.ContextParameters(),  # the busiest context has no plan of its own
            pb.ContextParameters(datapath_theta=pb.DatapathTheta(datapath="cubic", values=tuned)),
        ],
    )
    assert host_theta(resp, "cubic") == tuned
    assert host_theta(pb.GetParametersResponse(default_datapath_theta=default), "cubic") == (
        KERNEL_DEFAULTS
    )
    assert host_theta(pb.GetParametersResponse(), "cubic") is None


def baseline_flows(ctx: pb.Context, cc: str) -> pb.Aggregate:
    b = AggregateBuilder()
    for mbps in (10, 20, 30):
        b.add(FlowStats(int(mbps * 1e6 / 8), 1_000_000, 50_000, 40_000))
    return b.to_proto(load_spec().default(), 1, ctx, cc)


def test_booster_plans_a_cubic_policy_in_cubics_space(booster) -> None:
    http = booster.http
    r = http.post(
        "/v1/policies", json={"name": "tcp", "target_cc": "cubic"}, headers=auth(OPERATOR)
    )
    assert r.status_code == 201, r.text
    bad = {"name": "bad", "target_cc": "cubic", "region": "custom"}
    bad["bounds"] = {k: list(v) for k, v in load_spec().region_bounds("production").items()}
    assert http.post("/v1/policies", json=bad, headers=auth(OPERATOR)).status_code == 422
    spec = http.get("/v1/theta-spec", params={"datapath": "cubic"}, headers=auth(OPERATOR))
    assert [p["name"] for p in spec.json()["params"]] == list(CUBIC.names)
    ctx = sim.ETHERNET.message()
    # flows of another CC bring the context in (its own flows: the test below)
    report = sim.make_report("host-1", "tcp", [baseline_flows(ctx, "bbr")])
    assert booster.stub().ReportAggregates(report, metadata=agent_md()).aggregates_stored == 1
    booster.booster.refit(booster.booster.policies["tcp"])
    req = pb.GetParametersRequest(host_id="host-1", policy="tcp", contexts=[ctx])
    resp = booster.stub().GetParameters(req, metadata=agent_md())
    assert resp.target_cc == "cubic" and not resp.HasField("default_theta")
    assert resp.default_datapath_theta.datapath == "cubic"
    assert dict(resp.default_datapath_theta.values) == KERNEL_DEFAULTS
    [answer] = resp.parameters
    assert answer.plan_version >= 1 and not answer.HasField("theta")
    theta = dict(answer.datapath_theta.values)
    assert answer.datapath_theta.datapath == "cubic" and set(theta) == set(CUBIC.names)
    assert CUBIC.violations(theta, CUBIC.region_bounds("production")) == []
    [plan] = http.get("/v1/policies/tcp/parameters", headers=auth(OPERATOR)).json()
    assert set(plan["incumbent"]) == set(CUBIC.names)
    assert plan["incumbent_natural"]["beta"] == plan["incumbent"]["beta"] / 1024


def _stored_trials(engine) -> list[tuple]:
    """Every stored trial as (cc, θ key, flows): a tuned θ's trials and baselines apart."""
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT cc, theta_key, flow_count FROM trials ORDER BY cc"))
        return [tuple(r) for r in rows.all()]


def cubic_flows(ctx: pb.Context, theta: dict[str, int], datapath: str = "cubic") -> pb.Aggregate:
    """A CUBIC policy's own flows: cc empty, the host's CUBIC θ as datapath_theta."""
    a = baseline_flows(ctx, "")
    a.ClearField("theta")
    a.datapath_theta.CopyFrom(pb.DatapathTheta(datapath=datapath, values=theta))
    return a


def _refused(booster, aggregate: pb.Aggregate) -> str:
    report = sim.make_report("host-1", "tcp", [aggregate])
    with pytest.raises(grpc.RpcError) as e:
        booster.stub().ReportAggregates(report, metadata=agent_md())
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return e.value.details()


def test_booster_learns_from_a_cubic_policys_own_flows(booster) -> None:
    """A CUBIC θ reported as datapath_theta is stored as a trial of that θ, and the refit
    plans from it; a θ of the wrong datapath, incomplete or outside Θ' is refused
    whole, naming the field."""
    r = booster.http.post(
        "/v1/policies", json={"name": "tcp", "target_cc": "cubic"}, headers=auth(OPERATOR)
    )
    assert r.status_code == 201, r.text
    ctx, tuned = sim.ETHERNET.message(), KERNEL_DEFAULTS | {"beta": 800}
    report = sim.make_report("host-1", "tcp", [cubic_flows(ctx, tuned)])
    assert booster.stub().ReportAggregates(report, metadata=agent_md()).aggregates_stored == 1
    [trial] = booster.http.get("/v1/policies/tcp/trials", headers=auth(OPERATOR)).json()
    assert trial["flows"] == 3 and trial["theta"] == tuned
    [plan] = booster.booster.refit(booster.booster.policies["tcp"]).values()
    assert set(plan.incumbent) == set(CUBIC.names)

    assert "datapath_theta.datapath: 'bic'" in _refused(booster, cubic_flows(ctx, tuned, "bic"))
    partial = {k: v for k, v in tuned.items() if k != "hystart"}
    assert "datapath_theta.values.hystart: missing" in _refused(booster, cubic_flows(ctx, partial))
    outside = tuned | {"beta": CUBIC.region_bounds("wide")["beta"][1] + 1}
    assert "theta.beta" in _refused(booster, cubic_flows(ctx, outside))
    fusion = baseline_flows(ctx, "")  # Fusion's θ on a CUBIC policy
    assert "carry datapath_theta" in _refused(booster, fusion)


def _answer(target_cc: str, theta: dict[str, int] | None = None) -> bytes:
    resp = pb.GetParametersResponse(target_cc=target_cc, default_theta=pb.Theta(**FUSION_DEFAULT))
    if theta is not None:
        resp.default_datapath_theta.CopyFrom(pb.DatapathTheta(datapath="cubic", values=theta))
    return resp.SerializeToString()


FUSION_DEFAULT = load_spec().default()


@on_cubic_kernel
def test_the_agent_runs_its_policys_cubic_theta_reports_it_and_restores(
    host_cubic, tmp_path, monkeypatch
) -> None:
    before = host_cubic.read()
    tuned = KERNEL_DEFAULTS | {"beta": 870, "hystart": 0}
    outside = tuned | {"hystart_low_window": 1}
    answers = [_answer("cubic", tuned), _answer("cubic", outside), _answer("fusion")]
    agent = _agent(tmp_path, answers, {"cubic": host_cubic}, monkeypatch)
    agent.refresh_theta()
    assert host_cubic.read() == tuned
    ended = dt.datetime.now(dt.UTC)
    stats = FlowStats(2_000_000, 1_000_000, 50_000, 40_000)
    agent.aggregator.add(Flow("192.0.2.1", stats, {}, 0, ended, cc="cubic"))
    agent.aggregator.add(Flow("192.0.2.1", stats, {}, 0, ended, cc="bbr"))
    report = agent.aggregator.close_interval(0, 1)
    assert report is not None
    by_cc = {a.cc: a for a in report.aggregates}
    assert set(by_cc) == {"", "bbr"}  # the policy's CC: trials of the θ that ran
    assert dict(by_cc[""].datapath_theta.values) == tuned and not by_cc[""].HasField("theta")
    assert not by_cc["bbr"].HasField("datapath_theta")
    agent.refresh_theta()  # a θ outside Θ' never reaches the kernel
    assert host_cubic.read() == tuned and agent.metrics.theta_refused._value.get() == 1
    agent.refresh_theta()  # the policy tunes Fusion now: CUBIC's own values come back
    assert host_cubic.read() == before and agent.aggregator.datapath_theta is None


def test_a_cubic_arm_decides_the_host_theta_over_the_policy(tmp_path, monkeypatch) -> None:
    """A fixed CUBIC θ arm runs its θ; a kernel-default CUBIC arm runs the kernel's own values
    (the agent restores them); without an arm the policy's plan decides."""
    agent = _agent(tmp_path, [], {"cubic": ModuleParams(CUBIC, tmp_path)}, monkeypatch)
    planned = pb.GetParametersResponse.FromString(_answer("cubic", KERNEL_DEFAULTS))
    assert agent.host_choice(planned) == ("cubic", KERNEL_DEFAULTS)
    fixed = KERNEL_DEFAULTS | {"beta": 600}
    agent.arm = pb.ExperimentArm(
        cc="cubic",
        params=pb.ExperimentArm.FIXED,
        fixed_theta=pb.DatapathTheta(datapath="cubic", values=fixed),
    )
    assert agent.host_choice(planned) == ("cubic", fixed)
    agent.arm = pb.ExperimentArm(cc="cubic", params=pb.ExperimentArm.KERNEL_DEFAULT)
    assert agent.host_choice(planned) == ("cubic", None)
    agent.arm = pb.ExperimentArm(cc="bbr", params=pb.ExperimentArm.KERNEL_DEFAULT)
    assert agent.host_choice(planned) == ("cubic", KERNEL_DEFAULTS)


def test_migration_moves_cubic_policies_into_cubics_space(db_url) -> None:
    """0006 → head: a cubic policy's bounds are CUBIC's (a custom region in Fusion's
    parameters becomes production); a Fusion policy is untouched; both load."""
    engine = create_engine(db_url)
    at_revision(engine, "0006")
    fusion = json.dumps(load_spec().region_bounds("production"))
    with engine.begin() as conn:
        for name, target, region in (
            ("f", "fusion", "custom"),
            ("c", "cubic", "custom"),
            ("w", "cubic", "wide"),
        ):
            conn.execute(
                text(
                    "INSERT INTO policies (name, sigma, region, bounds, mode, target_cc, acq_func,"
                    " exploration_share, n_initial_points, min_flows, history_hours,"
                    " time_buckets, max_model_points, revision) VALUES (:n, 1, :r,"
                    " CAST(:b AS jsonb), 'contextual', :t, 'gp_hedge', 0.1, 5, 1, 24, 1, 500, 1)"
                ),
                {"n": name, "r": region, "b": fusion, "t": target},
            )
    database.migrate(engine)
    policies = {p.name: p for p in policy_store.list_policies(engine)}
    engine.dispose()
    assert policies["f"].resolved_bounds() == load_spec().region_bounds("production")
    assert policies["c"].region == "production" and policies["c"].revision == 2
    assert policies["c"].resolved_bounds() == CUBIC.region_bounds("production")
    assert policies["w"].resolved_bounds() == CUBIC.region_bounds("wide")


# -- an agent on a CUBIC policy, against a whole Booster ---------------------------------------

STALENESS_S = 600.0  # long enough never to pass by itself; the tests move the agent's clock


def cubic_policy(http, name: str = "tcp") -> None:
    """A cubic policy whose region keeps β in [0.83, 0.88]: Booster's default for it (the
    kernel's defaults moved into the region) is a θ the kernel does not run by itself."""
    bounds = {k: list(v) for k, v in CUBIC.region_bounds("production").items()}
    bounds["beta"] = [850, 900]
    body = {"name": name, "target_cc": "cubic", "region": "custom", "bounds": bounds}
    r = http.post("/v1/policies", json=body, headers=auth(OPERATOR))
    assert r.status_code == 201, r.text


def module_dir(tmp_path: Path) -> Path:
    """A directory laid out like /sys/module/tcp_cubic/parameters at the kernel's defaults
    (the agent's writes land here instead of in this machine's kernel)."""
    root = tmp_path / "tcp_cubic"
    root.mkdir()
    for name, value in KERNEL_DEFAULTS.items():
        (root / name).write_text(f"{value}\n")
    return root


def cubic_agent(
    tmp_path: Path,
    target: str,
    params: ModuleParams,
    host_id: str = "host-1",
    with_fusion: bool = True,
    **extra: Any,
) -> Agent:
    """An agent of policy 'tcp' talking gRPC to the Booster at ``target``; Fusion's sysctls
    and CUBIC's module parameters in directories. Without Fusion the host is one that never
    loads the module: no net.fusion sysctls, and the agent asks this machine's kernel for
    Fusion's netlink family, which it does not have. ``extra`` settings: e.g. net_ipv4_root,
    a directory standing in for the namespace's CC sysctls when an arm's CC is one this
    kernel does not offer (Fusion)."""
    fusion = tmp_path / "net-fusion"
    if with_fusion:
        fusion.mkdir()
        for name, value in FUSION_DEFAULT.items():
            (fusion / name).write_text(f"{value}\n")
    settings = AgentSettings(
        host_id=host_id,
        policy="tcp",
        booster_address=target,
        token=AGENT,
        spool_dir=tmp_path / "spool",
        sysctl_root=fusion,
        rpc_deadline_s=5,
        retry_initial_s=0.01,
        retry_max_s=0.02,
        staleness_s=STALENESS_S,
        **extra,
    )
    kernel = Kernel(fusion, use_netlink=not with_fusion)
    return Agent(settings, kernel=kernel, module_params={"cubic": params})


def agent_lines(caplog: pytest.LogCaptureFixture, words: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("gemini_agent") and words in r.getMessage()
    ]


def stale_fallbacks(agent: Agent) -> float:
    value = agent.metrics.registry.get_sample_value(
        "gemini_agent_fallbacks_total", {"reason": "stale"}
    )
    assert value is not None
    return value


def fusion_values(agent: Agent) -> dict[str, int]:
    return {n: int((agent.s.sysctl_root / n).read_text()) for n in FUSION_DEFAULT}


def a_cubic_flow() -> Flow:
    stats = FlowStats(2_000_000, 1_000_000, 50_000, 40_000)
    return Flow("192.0.2.1", stats, {}, 0, dt.datetime.now(dt.UTC), cc="cubic")


def test_an_agent_on_a_cubic_policy_refuses_no_fusion_theta(db_url, tmp_path, caplog) -> None:
    """Booster's answers for a cubic policy carry CUBIC's θ and no Fusion θ: refresh after
    refresh the agent writes the CUBIC θ and refuses, counts and logs nothing, and leaves
    Fusion's sysctls as they were."""
    caplog.set_level(logging.INFO, logger="gemini_agent")
    params = ModuleParams(CUBIC, module_dir(tmp_path))
    with serve(db_url) as b:
        cubic_policy(b.http)
        agent = cubic_agent(tmp_path, b.grpc_target, params)
        req = pb.GetParametersRequest(host_id="host-1", policy="tcp")
        answer = b.stub().GetParameters(req, metadata=agent_md())
        assert not answer.HasField("default_theta")  # nothing of Fusion's in it
        tuned = host_theta(answer, "cubic")
        for _ in range(5):
            agent.refresh_theta()
    assert tuned is not None and 850 <= tuned["beta"] <= 900
    assert params.read() == tuned
    assert agent.metrics.theta_refused._value.get() == 0
    assert agent_lines(caplog, "refusing") == []
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert fusion_values(agent) == FUSION_DEFAULT


def test_a_cubic_theta_outside_the_wide_region_is_refused_once_never_written(
    booster, tmp_path, monkeypatch, caplog
) -> None:
    """Booster's real answer with β past Θ' (as a faulty Booster would send it): the module
    parameters keep the kernel's values, and the refusal is counted once and logged once;
    the next, good answer is written."""
    cubic_policy(booster.http)
    req = pb.GetParametersRequest(host_id="h", policy="tcp")
    good = booster.stub().GetParameters(req, metadata=agent_md())
    bad = pb.GetParametersResponse()
    bad.CopyFrom(good)
    bad.default_datapath_theta.values["beta"] = CUBIC.region_bounds("wide")["beta"][1] + 24
    params = ModuleParams(CUBIC, module_dir(tmp_path))
    answers = [bad.SerializeToString(), good.SerializeToString()]
    agent = _agent(tmp_path, answers, {"cubic": params}, monkeypatch)
    caplog.set_level(logging.INFO, logger="gemini_agent")
    agent.refresh_theta()
    assert params.read() == KERNEL_DEFAULTS and params.saved is None  # nothing written
    assert agent.metrics.theta_refused._value.get() == 1
    [line] = agent_lines(caplog, "refusing")
    assert "cubic" in line and "beta" in line
    agent.refresh_theta()
    assert params.read() == host_theta(good, "cubic") != KERNEL_DEFAULTS
    assert (
        agent.metrics.theta_refused._value.get() == 1 and len(agent_lines(caplog, "refusing")) == 1
    )


def test_cubic_falls_back_to_the_kernels_defaults_when_booster_is_stale_and_back_after(
    db_url, tmp_path, caplog
) -> None:
    """Booster goes away: once its silence passes staleness_s the module parameters hold the
    spec's defaults (the kernel's), counted and logged once however many refreshes fail, and
    the flows since are reported as CUBIC baselines, not as trials of Booster's θ. Booster
    comes back on the same address: its θ is written again. Booster stores both reports."""
    caplog.set_level(logging.INFO, logger="gemini_agent")
    params = ModuleParams(CUBIC, module_dir(tmp_path))
    with serve(db_url) as b:
        cubic_policy(b.http)
        target = b.grpc_target
        agent = cubic_agent(tmp_path, target, params)
        agent.refresh_theta()
        tuned = params.read()
        assert tuned != KERNEL_DEFAULTS and 850 <= tuned["beta"] <= 900
    agent.aggregator.add(a_cubic_flow())  # ran Booster's θ
    agent.applier.last_ok -= STALENESS_S  # Booster's last answer is older than the limit now
    fallbacks = stale_fallbacks(agent)
    for _ in range(3):
        agent.refresh_theta()  # Booster is away
        assert params.read() == KERNEL_DEFAULTS
    [line] = agent_lines(caplog, "cubic falls back")
    assert "no θ from Booster" in line
    assert stale_fallbacks(agent) == fallbacks + 1  # CUBIC's, once: Fusion is left alone
    assert agent.aggregator.datapath_theta is None and len(agent.spool) == 1
    agent.aggregator.add(a_cubic_flow())  # ran the kernel's defaults
    with serve(db_url, grpc_listen=target) as b:
        for _ in range(600):  # the agent's channel reconnects after Booster's restart
            agent.refresh_theta()
            if not agent.applier.fell_back:
                break
            time.sleep(0.05)
        assert not agent.applier.fell_back, "Booster never answered again"
        assert params.read() == tuned
        assert agent.aggregator.datapath_theta is not None
        assert dict(agent.aggregator.datapath_theta.values) == tuned
        assert len(agent.spool) == 2  # the interval at the defaults closed before the change
        while agent.reporter.drain() == 0 and len(agent.spool):
            time.sleep(0.05)
        agent.reporter.drain()
        assert len(agent.spool) == 0
        rows = _stored_trials(b.engine)
    assert rows == [("", CUBIC.key(tuned), 1), ("cubic", "", 1)]
    assert stale_fallbacks(agent) == fallbacks + 1 and agent.metrics.theta_refused._value.get() == 0


def test_cubic_falls_back_on_a_host_without_fusions_sysctls(db_url, tmp_path, caplog) -> None:
    """Fusion's sysctls are gone (the module unloaded): a cubic policy's agent tries no Fusion
    fallback when Booster is stale, so it logs no error; CUBIC still falls back, counted
    once."""
    caplog.set_level(logging.INFO, logger="gemini_agent")
    params = ModuleParams(CUBIC, module_dir(tmp_path))
    with serve(db_url) as b:
        cubic_policy(b.http)
        agent = cubic_agent(tmp_path, b.grpc_target, params)
        agent.refresh_theta()
    assert params.read() != KERNEL_DEFAULTS
    for name in FUSION_DEFAULT:
        (agent.s.sysctl_root / name).unlink()
    agent.applier.last_ok -= STALENESS_S
    fallbacks = stale_fallbacks(agent)
    for _ in range(2):
        agent.refresh_theta()
    assert params.read() == KERNEL_DEFAULTS
    assert stale_fallbacks(agent) == fallbacks + 1
    assert errors_logged(caplog) == []  # a cubic policy's agent tries no Fusion fallback
    assert len(agent_lines(caplog, "cubic falls back")) == 1


# -- Fusion is left alone by an agent whose policy tunes CUBIC ---------------------------------


def errors_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def table_refused_fallbacks(agent: Agent) -> float:
    value = agent.metrics.registry.get_sample_value(
        "gemini_agent_fallbacks_total", {"reason": "table_refused"}
    )
    return value or 0.0  # never counted: the label has no sample yet


def narrowed(datapath: str, name: str, lo: int, hi: int) -> dict[str, list[int]]:
    """Custom bounds of ``datapath``: its production region with ``name`` in [lo, hi], so
    that Booster's default (the spec's default moved into the region) is a θ of its own."""
    bounds = {k: list(v) for k, v in load_datapath(datapath).region_bounds("production").items()}
    bounds[name] = [lo, hi]
    return bounds


FUSION_REGION = narrowed("fusion", "mult_decrease", 60, 70)
CUBIC_REGION = narrowed("cubic", "beta", 850, 900)


def retarget(http, target_cc: str, bounds: dict[str, list[int]]) -> None:
    """The operator points policy 'tcp' at another datapath (with a region in its space)."""
    body = {"target_cc": target_cc, "region": "custom", "bounds": bounds}
    r = http.patch("/v1/policies/tcp", json=body, headers=auth(OPERATOR))
    assert r.status_code == 200, r.text


@contextmanager
def fusionless_cubic_host(db_url, tmp_path: Path, caplog) -> Iterator[tuple[ModuleParams, Agent]]:
    """Booster serving policy 'tcp' on CUBIC, and an agent (logging at INFO) on a host that
    never loads Fusion: the setting of every test below that runs one."""
    caplog.set_level(logging.INFO, logger="gemini_agent")
    params = ModuleParams(CUBIC, module_dir(tmp_path))
    with serve(db_url) as b:
        cubic_policy(b.http)
        yield params, cubic_agent(tmp_path, b.grpc_target, params, with_fusion=False)


def test_an_agent_on_a_cubic_policy_leaves_fusion_alone_on_a_host_without_it(
    db_url, tmp_path, caplog
) -> None:
    """A host that tunes its stock CUBIC and never loads Fusion (no net.fusion sysctls, and no
    Fusion netlink family in this machine's kernel): refresh after refresh the agent writes
    Booster's CUBIC θ and tries no Fusion table or sysctl, so it logs no error and counts no
    refused table and no table_refused fallback."""
    with fusionless_cubic_host(db_url, tmp_path, caplog) as (params, agent):
        for _ in range(5):
            agent.refresh_theta()
    assert params.read() != KERNEL_DEFAULTS and 850 <= params.read()["beta"] <= 900
    assert agent.metrics.tables_refused._value.get() == 0
    assert table_refused_fallbacks(agent) == 0
    assert errors_logged(caplog) == []
    assert agent.leaves_fusion and not agent.s.sysctl_root.exists()


def test_a_cubic_policys_agent_on_a_host_without_fusion_falls_back_cubic_alone(
    db_url, tmp_path, caplog
) -> None:
    """Booster goes silent past staleness_s on a host that never loads Fusion (this kernel's
    netlink has no Fusion family, no net.fusion sysctls): CUBIC falls back to the kernel's
    defaults, counted once, and nothing of Fusion's is tried: no error, no refused table."""
    with fusionless_cubic_host(db_url, tmp_path, caplog) as (params, agent):
        agent.refresh_theta()
    assert params.read() != KERNEL_DEFAULTS
    agent.applier.last_ok -= STALENESS_S
    fallbacks = stale_fallbacks(agent)
    for _ in range(3):
        agent.refresh_theta()  # Booster is away
    assert params.read() == KERNEL_DEFAULTS
    assert stale_fallbacks(agent) == fallbacks + 1
    assert agent.metrics.tables_refused._value.get() == 0
    assert table_refused_fallbacks(agent) == 0
    assert errors_logged(caplog) == []


def test_the_agents_loop_runs_on_a_host_without_fusion(db_url, tmp_path, caplog) -> None:
    """The daemon's loop on a host that never loads Fusion (this kernel has no Fusion netlink
    family to read flow records from): it starts, watches flows through socket diagnostics,
    writes Booster's CUBIC θ, says once that there are no Fusion records, logs no error, and
    a clean exit puts CUBIC's own values back."""
    caplog.set_level(logging.INFO, logger="gemini_agent")
    params = ModuleParams(CUBIC, module_dir(tmp_path))
    failed: list[BaseException] = []
    with serve(db_url) as b:
        cubic_policy(b.http)
        listen = f"127.0.0.1:{free_port()}"
        agent = cubic_agent(
            tmp_path, b.grpc_target, params, with_fusion=False, sockdiag=True, metrics_listen=listen
        )

        def run() -> None:
            try:
                agent.run()
            except BaseException as exc:  # the test's verdict, not the thread's traceback
                failed.append(exc)

        runner = threading.Thread(target=run)
        runner.start()
        try:
            for _ in range(600):  # until the loop's first refresh has written Booster's θ
                if params.read() != KERNEL_DEFAULTS or not runner.is_alive():
                    break
                time.sleep(0.05)
            tuned = params.read()
        finally:
            agent.stopped.set()
            runner.join(timeout=30)
    assert failed == [] and not runner.is_alive()
    assert 850 <= tuned["beta"] <= 900
    assert params.read() == KERNEL_DEFAULTS  # the clean exit
    assert len(agent_lines(caplog, "no Fusion flow records")) == 1
    assert errors_logged(caplog) == []


def test_an_agent_on_a_host_without_fusion_asks_for_no_module_counters(
    db_url, tmp_path, caplog
) -> None:
    """The agent's intervals on a host that never loads Fusion: each closes, drains and asks
    Booster, and none asks the missing module for its counts of lost records, so nothing is
    logged about them, at the start or at any interval."""
    with fusionless_cubic_host(db_url, tmp_path, caplog) as (params, agent):
        for _ in range(3):
            agent.tick()
    assert 850 <= params.read()["beta"] <= 900
    assert agent_lines(caplog, "counters") == [] and agent.kernel_drops == {}
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_policy_turned_from_fusion_to_cubic_puts_fusions_table_back_once(
    db_url, tmp_path, caplog
) -> None:
    """The host's policy tuned Fusion; the operator points it at CUBIC: the next refresh
    writes Booster's CUBIC θ and puts Fusion back on its safe default, once. From then on
    Fusion is left alone: with its module gone (no sysctls) refreshes log no error. Pointed at
    Fusion again, the policy's Fusion θ is installed again and CUBIC gets its own values back."""
    caplog.set_level(logging.INFO, logger="gemini_agent")
    params = ModuleParams(CUBIC, module_dir(tmp_path))
    with serve(db_url) as b:
        body = {"name": "tcp", "region": "custom", "bounds": FUSION_REGION}
        r = b.http.post("/v1/policies", json=body, headers=auth(OPERATOR))
        assert r.status_code == 201, r.text
        agent = cubic_agent(tmp_path, b.grpc_target, params)
        agent.refresh_theta()
        tuned = fusion_values(agent)
        assert tuned != FUSION_DEFAULT and 60 <= tuned["mult_decrease"] <= 70
        assert params.read() == KERNEL_DEFAULTS and params.saved is None

        retarget(b.http, "cubic", CUBIC_REGION)
        agent.refresh_theta()
        assert fusion_values(agent) == FUSION_DEFAULT
        cubic = params.read()
        assert 850 <= cubic["beta"] <= 900
        assert len(agent_lines(caplog, "back on the safe default")) == 1

        for name in FUSION_DEFAULT:  # the module unloaded
            (agent.s.sysctl_root / name).unlink()
        for _ in range(3):
            agent.refresh_theta()
        assert params.read() == cubic and errors_logged(caplog) == []
        assert len(agent_lines(caplog, "back on the safe default")) == 1

        retarget(b.http, "fusion", FUSION_REGION)
        for name, value in FUSION_DEFAULT.items():  # and loaded again
            (agent.s.sysctl_root / name).write_text(f"{value}\n")
        agent.refresh_theta()
    assert fusion_values(agent) == tuned and params.read() == KERNEL_DEFAULTS
    assert not agent.leaves_fusion and errors_logged(caplog) == []


def test_an_agent_started_on_a_cubic_policy_puts_fusions_table_back_once(
    db_url, tmp_path, caplog
) -> None:
    """The host ran a Fusion policy's θ (the module keeps it across the agent's restart), and
    the agent starts on a cubic policy: its first answer puts Fusion back on the safe default,
    and no later refresh writes Fusion again."""
    caplog.set_level(logging.INFO, logger="gemini_agent")
    params = ModuleParams(CUBIC, module_dir(tmp_path))
    with serve(db_url) as b:
        cubic_policy(b.http)
        agent = cubic_agent(tmp_path, b.grpc_target, params)
        left = FUSION_DEFAULT | {"mult_decrease": 65}  # what the module held at the start
        for name, value in left.items():
            (agent.s.sysctl_root / name).write_text(f"{value}\n")
        agent.refresh_theta()
        assert fusion_values(agent) == FUSION_DEFAULT
        (agent.s.sysctl_root / "mult_decrease").write_text("65\n")  # not the agent's any more
        for _ in range(3):
            agent.refresh_theta()
    assert fusion_values(agent) == left
    assert len(agent_lines(caplog, "back on the safe default")) == 1
    assert 850 <= params.read()["beta"] <= 900 and errors_logged(caplog) == []


def test_a_fusion_arm_on_a_cubic_policys_host_runs_its_theta_and_leaves_the_safe_default(
    db_url, tmp_path, caplog
) -> None:
    """An experiment assigns a cubic policy's host an arm that runs Fusion at a fixed θ: the
    agent installs that θ (the policy's own plan has none of Fusion's). The experiment stops:
    the host's CC comes back and Fusion's table goes back to the safe default rather than
    keeping the arm's θ. This kernel offers no Fusion, so the namespace's CC sysctls are a
    directory standing in for /proc/sys/net/ipv4."""
    caplog.set_level(logging.INFO, logger="gemini_agent")
    params = ModuleParams(CUBIC, module_dir(tmp_path))
    net = net_ipv4(tmp_path, "reno cubic fusion")
    fixed = FUSION_DEFAULT | {"mult_decrease": 70}
    arms = [
        {"name": "stock", "cc": "cubic"},
        {"name": "fixed", "cc": "fusion", "params": "fixed", "theta": fixed},
    ]
    with serve(db_url) as b:
        cubic_policy(b.http)
        host = host_on_arm(b.http, "fusion", arms, "fixed")
        agent = cubic_agent(tmp_path, b.grpc_target, params, host_id=host, net_ipv4_root=net)
        agent.refresh_theta()
        assert agent.arm is not None and agent.arm.cc == "fusion"
        assert (net / "tcp_congestion_control").read_text().strip() == "fusion"
        assert fusion_values(agent) == fixed
        r = b.http.post("/v1/experiments/fusion/stop", headers=auth(OPERATOR))
        assert r.status_code == 200, r.text
        agent.refresh_theta()
    assert agent.arm is None and (net / "tcp_congestion_control").read_text().strip() == "cubic"
    assert fusion_values(agent) == FUSION_DEFAULT
    assert 850 <= params.read()["beta"] <= 900  # the policy's CUBIC θ all along
    assert errors_logged(caplog) == [] and agent.leaves_fusion


# -- the interval closes before CUBIC's own values come back -----------------------------------


def spooled(agent: Agent) -> list[pb.ReportRequest]:
    return [pb.ReportRequest.FromString(payload) for _, payload in agent.spool.pending()]


def test_a_policy_turned_from_cubic_reports_the_tuned_intervals_flows_as_trials(
    db_url, tmp_path
) -> None:
    """The operator points the host's cubic policy at Fusion: the refresh that puts CUBIC's own
    values back first closes the interval, whose CUBIC flows ran Booster's θ and are reported
    as trials of it; the CUBIC flows after are baselines."""
    params = ModuleParams(CUBIC, module_dir(tmp_path))
    with serve(db_url) as b:
        cubic_policy(b.http)
        agent = cubic_agent(tmp_path, b.grpc_target, params)
        agent.refresh_theta()
        tuned = params.read()
        assert 850 <= tuned["beta"] <= 900
        agent.aggregator.add(a_cubic_flow())  # ran Booster's θ
        retarget(b.http, "fusion", FUSION_REGION)
        agent.refresh_theta()
    assert params.read() == KERNEL_DEFAULTS
    agent.aggregator.add(a_cubic_flow())  # ran the kernel's own values
    agent.close_interval()
    reports = spooled(agent)
    assert [len(r.aggregates) for r in reports] == [1, 1]  # one report before, one after
    [trial], [baseline] = (r.aggregates for r in reports)
    assert trial.cc == "" and trial.datapath_theta == pb.DatapathTheta(
        datapath="cubic", values=tuned
    )
    assert baseline.cc == "cubic" and not baseline.HasField("datapath_theta")
    assert (trial.flow_count, baseline.flow_count) == (1, 1)


def test_a_kernel_default_cubic_arm_stores_the_tuned_flows_before_it_as_trials(
    db_url, tmp_path
) -> None:
    """A cubic policy's host runs Booster's θ, then joins an experiment whose arm runs CUBIC
    at the kernel's defaults: the interval closes before the kernel's values come back, and
    Booster stores the flows before as a trial of the tuned θ and the flows after as the
    cubic baseline. (The arm sets the CC in a directory standing in for /proc/sys/net/ipv4.)"""
    params = ModuleParams(CUBIC, module_dir(tmp_path))
    net = net_ipv4(tmp_path, "reno cubic")
    arms = [{"name": "stock", "cc": "cubic"}, {"name": "reno", "cc": "reno"}]
    with serve(db_url) as b:
        cubic_policy(b.http)
        host = host_on_arm(b.http, "stock", arms, "stock")
        r = b.http.post(
            "/v1/experiments/stock/leave", json={"hosts": [host]}, headers=auth(OPERATOR)
        )
        assert r.status_code == 200, r.text
        agent = cubic_agent(tmp_path, b.grpc_target, params, host_id=host, net_ipv4_root=net)
        agent.refresh_theta()
        tuned = params.read()
        assert agent.arm is None and 850 <= tuned["beta"] <= 900
        agent.aggregator.add(a_cubic_flow())  # ran Booster's θ
        r = b.http.post(
            "/v1/experiments/stock/join", json={"hosts": [host]}, headers=auth(OPERATOR)
        )
        assert r.status_code == 200, r.text
        agent.refresh_theta()
        assert agent.arm is not None and agent.arm.arm == "stock"
        assert params.read() == KERNEL_DEFAULTS
        agent.aggregator.add(a_cubic_flow())  # ran the kernel's defaults
        agent.close_interval()
        agent.reporter.drain()
        assert len(agent.spool) == 0
        rows = _stored_trials(b.engine)
    assert rows == [("", CUBIC.key(tuned), 1), ("cubic", "", 1)]
