"""GEMINI and DC-Vegas are run like every other datapath, with no code of their own in Booster
or the agent: a policy names one, Booster plans in its spec's space and answers its θ in
``datapath_theta``, its own flows are trials of the θ that ran (a θ outside Θ′ refused), an A/B
experiment can set "dctcp at the kernel's defaults" against "the datapath tuned", the comparison
names the tuned arm after it, and the agent runs its θ per context through the module's own
profile table and net.<name>.* sysctls, as Fusion's (here a directory and the table last
installed standing in for them; the lab installs the real ones,
tests/test_lab_datapath_loop.py), and reports its flows with the θ each ran."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest

from gemini_agent import reporter as reporter_module
from gemini_agent.aggregator import Flow
from gemini_agent.config import AgentSettings
from gemini_agent.context import Place
from gemini_agent.daemon import Agent
from gemini_agent.datapath import ModuleParams
from gemini_agent.dryrun import would_write
from gemini_agent.sources import flow_from_record
from gemini_agent.writeback import Kernel
from gemini_api.aggregate import FlowStats
from gemini_api.datapaths import Apply, registry
from gemini_api.fusion_genl import Rule, TableFamily, _records_in
from gemini_api.theta import ThetaSpec
from gemini_api.v1 import booster_pb2 as pb
from gemini_api.v1 import booster_pb2_grpc as pb_grpc
from gemini_booster import simulation as sim
from gemini_booster.storage import trials as trial_store

from .conftest import OPERATOR, agent_md, auth
from .sysctls import fusion_sysctls
from .test_experiment_arm import Answers, _agent
from .test_experiment_ingest import HOSTS, aggregate
from .test_fusion_abi import RECORD_FAMILY_ID, record_message

NEW = ("gemini", "dcvegas")
HOST_WIDE = tuple(d.name for d in registry() if d.apply is Apply.MODULE_PARAMS)
PLACE = Place("dc-east", "backbone")
DST_NET = "192.0.2.0/24"


def _tuned(spec: ThetaSpec) -> dict[str, int]:
    """The default with its first parameter moved to the top of Θ (a θ Booster could send)."""
    first = spec.params[0]
    return spec.default() | {first.name: first.production[1]}


def own_flows(name: str, mbps: float, flows: int, theta: dict[str, int]) -> pb.Aggregate:
    """A policy's own flows under the θ its agent set: cc empty, θ as datapath_theta."""
    a = aggregate(mbps, flows, "")
    a.ClearField("theta")
    a.datapath_theta.CopyFrom(pb.DatapathTheta(datapath=name, values=theta))
    return a


@pytest.mark.parametrize("name", NEW)
def test_booster_plans_and_learns_a_new_datapath_in_its_own_space(booster, name) -> None:
    spec = registry().get(name).spec
    h = auth(OPERATOR)
    r = booster.http.post("/v1/policies", json={"name": "dc", "datapath": name}, headers=h)
    assert r.status_code == 201, r.text
    assert r.json()["target_cc"] == registry().get(name).cc
    got = booster.http.get("/v1/theta-spec", params={"datapath": name}, headers=h).json()
    assert [p["name"] for p in got["params"]] == list(spec.names)

    ctx = sim.ETHERNET.message()
    report = sim.make_report("host-1", "dc", [own_flows(name, 40.0, 3, _tuned(spec))])
    assert booster.stub().ReportAggregates(report, metadata=agent_md()).aggregates_stored == 1
    [trial] = booster.http.get("/v1/policies/dc/trials", headers=h).json()
    assert trial["flows"] == 3 and trial["theta"] == _tuned(spec)

    booster.booster.refit(booster.booster.policies["dc"])
    req = pb.GetParametersRequest(host_id="host-1", policy="dc", contexts=[ctx])
    resp = booster.stub().GetParameters(req, metadata=agent_md())
    assert resp.target_cc == name and not resp.HasField("default_theta")
    assert resp.default_datapath_theta.datapath == name
    assert dict(resp.default_datapath_theta.values) == spec.default()
    [answer] = resp.parameters
    theta = dict(answer.datapath_theta.values)
    assert answer.datapath_theta.datapath == name and not answer.HasField("theta")
    assert spec.violations(theta, spec.region_bounds("production")) == []

    wide_top = spec.params[0].wide[1]
    outside = _tuned(spec) | {spec.params[0].name: wide_top + 1}
    bad = sim.make_report("host-1", "dc", [own_flows(name, 40.0, 3, outside)])
    with pytest.raises(grpc.RpcError) as e:
        booster.stub().ReportAggregates(bad, metadata=agent_md())
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"theta.{spec.params[0].name}" in e.value.details()


@pytest.mark.parametrize("name", NEW)
def test_an_experiment_sets_dctcp_at_defaults_against_the_datapath_tuned(booster, name) -> None:
    """The issue's example arm pair; the comparison names the tuned arm after the datapath and
    dctcp's flows are its baseline."""
    spec = registry().get(name).spec
    h = auth(OPERATOR)
    r = booster.http.post("/v1/policies", json={"name": "dc", "datapath": name}, headers=h)
    assert r.status_code == 201, r.text
    now = datetime.now(UTC)
    body = {
        "name": f"dctcp-vs-{name}",
        "arms": [
            {"name": "dctcp", "cc": "dctcp"},
            {"name": "tuned", "cc": name, "params": "policy", "policy": "dc"},
        ],
        "population": {"regions": {"eu": HOSTS}},
        "start": (now - timedelta(hours=1)).isoformat(),
        "end": (now + timedelta(days=3)).isoformat(),
    }
    r = booster.http.post("/v1/experiments", json=body, headers=h)
    assert r.status_code == 201, r.text
    arms = {}
    for host in HOSTS:
        got = booster.http.get(f"/v1/hosts/{host}/experiment", headers=h).json()
        arm = got["experiment"]["arm"]
        arms[host] = arm["name"]
        own = (
            aggregate(20.0, 5, "dctcp")
            if arm["name"] == "dctcp"
            else own_flows(name, 30.0, 4, _tuned(spec))
        )
        req = sim.make_report(host, "dc", [own])
        assert booster.stub().ReportAggregates(req, metadata=agent_md()).aggregates_stored == 1
    assert set(arms.values()) == {"dctcp", "tuned"}
    out = booster.http.get(f"/v1/experiments/dctcp-vs-{name}/results?sigma=0", headers=h)
    by_arm = {a["arm"]: a for a in out.json()["overall"]["arms"]}
    assert by_arm["tuned"]["throughput_mbps"]["mean"] == pytest.approx(30.0, rel=1e-3)
    assert by_arm["dctcp"]["throughput_mbps"]["mean"] == pytest.approx(20.0, rel=1e-3)
    policy = booster.booster.policies["dc"]
    assert set(trial_store.load_baselines(booster.engine, policy.id)) == {"dctcp"}
    [context] = booster.http.get("/v1/policies/dc/comparison?sigma=0", headers=h).json()
    assert {a["arm"] for a in context["arms"]} >= {name, "dctcp"}


def _answer(
    name: str, theta: dict[str, int], per_place: dict[Place, dict[str, int]] | None = None
) -> bytes:
    """Booster's answer for a policy of ``name``: ``theta`` as the default, ``per_place`` per
    context asked (in the order the agent asks: its places by size)."""
    resp = pb.GetParametersResponse(target_cc=registry().get(name).cc)
    resp.default_datapath_theta.CopyFrom(pb.DatapathTheta(datapath=name, values=theta))
    for place, values in (per_place or {}).items():
        msg = pb.DatapathTheta(datapath=name, values=values)
        ctx = pb.Context(dst_region=place.region, dst_isp=place.isp)
        resp.parameters.append(pb.ContextParameters(context=ctx, datapath_theta=msg))
    return resp.SerializeToString()


def _module_dir(root: Path, spec: ThetaSpec, values: dict[str, int]) -> ModuleParams:
    """A stand-in for /sys/module/tcp_<name>/parameters holding ``values`` (this machine's
    kernel loads no modules; the lab test writes the real files)."""
    root.mkdir()
    for n, v in values.items():
        (root / n).write_text(f"{v}\n")
    return ModuleParams(spec, root)


@pytest.mark.parametrize("name", HOST_WIDE)
def test_the_agent_writes_reports_and_restores_a_new_datapaths_theta(
    tmp_path, monkeypatch, name
) -> None:
    """A host-wide datapath (module parameters: CUBIC, Gear) takes one θ per host, its flows
    reported as trials of that θ, its module's values restored when the policy turns away."""
    spec = registry().get(name).spec
    loaded = spec.default()  # what the module holds before the agent's first write
    tuned = _tuned(spec)
    outside = tuned | {spec.params[0].name: spec.params[0].wide[1] + 1}
    fusion = registry().default.cc
    answers = [_answer(name, tuned), _answer(name, outside)]
    answers.append(pb.GetParametersResponse(target_cc=fusion).SerializeToString())
    params = _module_dir(tmp_path / "params", spec, loaded)
    agent = _agent(tmp_path, answers, {name: params}, monkeypatch)

    agent.refresh_theta()
    assert params.read() == tuned
    ended = dt.datetime.now(dt.UTC)
    stats = FlowStats(2_000_000, 1_000_000, 50_000, 40_000)
    agent.aggregator.add(Flow("192.0.2.1", stats, {}, 0, ended, cc=name))
    agent.aggregator.add(Flow("192.0.2.1", stats, {}, 0, ended, cc="dctcp"))
    report = agent.aggregator.close_interval(0, 1)
    assert report is not None
    by_cc = {a.cc: a for a in report.aggregates}
    assert set(by_cc) == {"", "dctcp"}
    assert by_cc[""].datapath_theta.datapath == name
    assert dict(by_cc[""].datapath_theta.values) == tuned

    agent.refresh_theta()  # outside Θ′: never reaches the module
    assert params.read() == tuned and agent.metrics.theta_refused._value.get() == 1
    agent.refresh_theta()  # the policy tunes another datapath: the module's values come back
    assert params.read() == loaded and agent.aggregator.datapath_theta is None


class TableKernel(Kernel):
    """A table module's kernel side with its net.<name>.* sysctls as files in a directory and
    the netlink table kept as the last one installed: this machine's kernel loads no modules
    (the lab installs and reads back the real table, tests/test_lab_datapath_loop.py)."""

    def __init__(self, root: Path, spec: ThetaSpec) -> None:
        root.mkdir()
        for n, v in spec.default().items():
            (root / n).write_text(f"{v}\n")
        super().__init__(root, use_netlink=False)
        self.spec = spec
        self.table: tuple[dict[int, dict[str, int]], list[Rule]] | None = None

    def write_table(self, profiles: dict[int, dict[str, int]], rules: Sequence[Rule]) -> None:
        self.spec.validate(
            profiles[1], self.spec.limits
        )  # the module refuses what Θ' does not hold
        self.table = (profiles, list(rules))

    def sysctls(self) -> dict[str, int]:
        return {n: int((self.sysctl_root / n).read_text()) for n in self.spec.names}

    def theta_for(self, prefix: str) -> dict[str, int]:
        """The θ the installed table gives destination rule ``prefix``."""
        assert self.table is not None
        profiles, rules = self.table
        [pid] = [r.profile_id for r in rules if r.prefix == prefix]
        return profiles[pid]


def _fusion_answer() -> bytes:
    """A Fusion policy's answer for PLACE: the host's own policy, of another datapath."""
    fusion = registry().default
    theta = pb.Theta(**fusion.spec.default())
    ctx = pb.Context(dst_region=PLACE.region, dst_isp=PLACE.isp)
    resp = pb.GetParametersResponse(target_cc=fusion.cc, default_theta=theta)
    resp.parameters.append(pb.ContextParameters(context=ctx, theta=theta))
    return resp.SerializeToString()


def _table_agent(
    tmp: Path, name: str, answers: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> tuple[Agent, TableKernel]:
    """An agent whose Booster answers ``answers`` in turn and whose destination database puts
    DST_NET in PLACE, with ``name``'s table module stood in for by a TableKernel."""
    channel = lambda settings, address=None: Answers(answers)  # noqa: E731
    monkeypatch.setattr(reporter_module, "open_channel", channel)
    kernel = TableKernel(tmp / name, registry().get(name).spec)
    csv = tmp / "paths.csv"
    csv.write_text(f"{DST_NET},{PLACE.region},{PLACE.isp}\n")
    fusion = fusion_sysctls(tmp, version=False)
    settings = AgentSettings(
        host_id="h", policy="default", spool_dir=tmp / "spool", sysctl_root=fusion, geo_csv=csv
    )
    fusion_kernel = Kernel(fusion, use_netlink=False)
    agent = Agent(settings, kernel=fusion_kernel, module_params={}, table_kernels={name: kernel})
    return agent, kernel


@pytest.mark.parametrize("name", NEW)
def test_the_agent_runs_a_new_datapaths_theta_per_context_in_its_table(
    tmp_path, monkeypatch, name
) -> None:
    """Booster's θ per context goes into the datapath's own table (a rule per destination
    prefix, the default θ on the catch-all and in net.<name>.*), flows come back with the θ
    each ran as trials of the policy, a θ outside Θ' never reaches the table, a policy of
    another datapath puts the safe default back once, and so does a silent Booster."""
    spec = registry().get(name).spec
    tuned, default = _tuned(spec), spec.default()
    other = tuned | {spec.params[-1].name: spec.params[-1].production[0]}
    outside = tuned | {spec.params[0].name: spec.params[0].wide[1] + 1}
    answers = [_answer(name, tuned, {PLACE: other}), _answer(name, outside, {PLACE: outside})]
    answers.append(_fusion_answer())
    agent, kernel = _table_agent(tmp_path, name, answers, monkeypatch)

    agent.refresh_theta()
    assert kernel.theta_for("0.0.0.0/0") == tuned and kernel.sysctls() == tuned
    assert kernel.theta_for(DST_NET) == other and not agent.leaves[name]
    ended = dt.datetime.now(dt.UTC)
    stats = FlowStats(2_000_000, 1_000_000, 50_000, 40_000)
    for theta in (other, tuned):  # the module's records: each flow with the θ it ran
        agent.aggregator.add(Flow("192.0.2.1", stats, theta, 3, ended, datapath=name))
    agent.aggregator.add(Flow("192.0.2.1", stats, {}, 0, ended, cc="dctcp"))
    report = agent.aggregator.close_interval(0, 1)
    assert report is not None
    trials = {a.datapath_theta.datapath: [] for a in report.aggregates if not a.cc}
    for a in report.aggregates:
        if not a.cc:
            assert not a.HasField("theta") and a.theta_version == 3
            trials[a.datapath_theta.datapath].append(dict(a.datapath_theta.values))
    assert trials == {name: [other, tuned]}
    assert {a.cc for a in report.aggregates} == {"", "dctcp"}

    agent.refresh_theta()  # outside Θ′: never reaches the module
    assert kernel.theta_for("0.0.0.0/0") == tuned and kernel.theta_for(DST_NET) == other
    assert agent.metrics.theta_refused._value.get() == 2
    agent.refresh_theta()  # the policy tunes another datapath: the safe default, once
    assert agent.leaves[name] and kernel.sysctls() == default
    assert kernel.table == ({1: default}, [Rule("0.0.0.0/0", 1), Rule("::/0", 1)])
    agent.aggregator.add(Flow("192.0.2.1", stats, tuned, 3, ended, datapath=name))
    [baseline] = agent.aggregator.close_interval(1, 2).aggregates
    assert baseline.cc == registry().get(name).cc and not baseline.HasField("datapath_theta")


@pytest.mark.parametrize("name", NEW)
def test_a_silent_booster_puts_a_new_datapaths_safe_default_back(
    tmp_path, monkeypatch, name
) -> None:
    spec = registry().get(name).spec
    answer = _answer(name, _tuned(spec), {PLACE: _tuned(spec)})
    agent, kernel = _table_agent(tmp_path, name, [answer], monkeypatch)
    agent.refresh_theta()
    assert kernel.sysctls() == _tuned(spec)
    agent.applier.last_ok -= agent.s.staleness_s + 1  # Booster last answered too long ago
    agent.check_staleness()
    assert kernel.sysctls() == spec.default() and kernel.theta_for("0.0.0.0/0") == spec.default()


def test_a_policy_arm_ending_reports_its_flows_under_its_own_policy(tmp_path, monkeypatch) -> None:
    """When the arm (a policy of the datapath) ends and the host goes back to its own policy
    (Fusion's), the flows that ran the arm's θ are reported under the arm's policy, not under
    the host's, which would refuse them whole (its datapath's flows carry no datapath θ)."""
    name = NEW[0]
    spec = registry().get(name).spec
    arm = pb.ExperimentArm(cc=name, params=pb.ExperimentArm.POLICY, policy="dc")
    in_arm = pb.GetParametersResponse.FromString(_answer(name, _tuned(spec)))
    in_arm.experiment_arm.CopyFrom(arm)
    agent, _ = _table_agent(tmp_path, name, [], monkeypatch)
    sent: list[pb.ReportRequest] = []
    monkeypatch.setattr(agent.reporter, "submit", sent.append)
    assert agent.follow_arm(in_arm) and agent.aggregator.policy == "dc"
    agent.follow_datapath(registry().get(name))
    stats = FlowStats(2_000_000, 1_000_000, 50_000, 40_000)
    ended = dt.datetime.now(dt.UTC)
    agent.aggregator.add(Flow("192.0.2.1", stats, _tuned(spec), 1, ended, datapath=name))
    assert agent.follow_arm(pb.GetParametersResponse(target_cc=registry().default.cc))
    [report] = sent
    assert report.policy == "dc" and report.aggregates[0].datapath_theta.datapath == name
    assert agent.aggregator.policy == "default"


@pytest.mark.parametrize("name", NEW)
def test_a_dry_run_shows_the_new_datapaths_own_table_and_sysctls(
    tmp_path, monkeypatch, name
) -> None:
    spec = registry().get(name).spec
    agent, kernel = _table_agent(tmp_path, name, [], monkeypatch)
    resp = pb.GetParametersResponse.FromString(_answer(name, _tuned(spec), {PLACE: _tuned(spec)}))
    rank = agent.ranked_places()
    text = "\n".join(would_write(agent, resp, rank, rank))
    assert f"{name}: default θ → sysctls under {kernel.sysctl_root}:" in text
    assert f"{name}: θ per destination (1 places" in text
    assert f"{registry().default.name}:" not in text  # Fusion's table is not this policy's
    assert kernel.table is None and kernel.sysctls() == spec.default()  # nothing written


@pytest.mark.parametrize("name", NEW)
def test_a_modules_record_becomes_a_trial_of_the_theta_it_carries(tmp_path, monkeypatch, name):
    """The agent's path from the module's multicast to the report: the record parsed with the
    datapath's θ (RecordSource's parser), made a Flow of that datapath, reported as a trial of
    that θ with the table's version under a policy of the datapath."""
    d = registry().get(name)
    ran = _tuned(d.spec)
    data = record_message(ran, TableFamily.of(d))
    [rec] = _records_in(data, RECORD_FAMILY_ID, TableFamily.of(d))
    agent, _ = _table_agent(tmp_path, name, [], monkeypatch)
    agent.follow_datapath(d)
    agent.aggregator.add(flow_from_record(rec, dt.datetime.now(dt.UTC), name))
    [agg] = agent.aggregator.close_interval(0, 1).aggregates
    assert (agg.cc, agg.theta_version, agg.flow_count) == ("", 7, 1)
    assert agg.datapath_theta.datapath == name and dict(agg.datapath_theta.values) == ran


class _FlowDuringAnswer(Answers):
    """Answers in turn; before the second, a record of a flow of ``datapath`` arrives (the
    agent's record thread runs while its GetParameters waits)."""

    def __init__(self, answers: list[bytes], agent_flow) -> None:
        super().__init__(answers)
        self.calls, self.agent_flow = 0, agent_flow

    def unary_unary(self, method: str, *args, **kwargs):
        inner = super().unary_unary(method, *args, **kwargs)

        def call(request, **kw):
            self.calls += 1
            if self.calls == 2:
                self.agent_flow()
            return inner(request, **kw)

        return call


def test_flows_ending_while_the_new_policys_answer_is_awaited_are_judged_by_it(
    tmp_path, monkeypatch
) -> None:
    """The crossover from a GEMINI policy's arm to its kernel-default arm under the host's
    own (Fusion) policy: a GEMINI flow that ends while the agent asks under the host's policy
    is reported under that policy as a gemini baseline, never with a GEMINI θ (which Booster
    refuses whole: one report lost per crossover in the lab before)."""
    name = NEW[0]
    d = registry().get(name)
    default_arm = pb.ExperimentArm(cc=d.cc, params=pb.ExperimentArm.KERNEL_DEFAULT)
    answer = _answer(name, d.spec.default(), {PLACE: _tuned(d.spec)})
    under_arm = pb.GetParametersResponse.FromString(answer)
    under_arm.experiment_arm.CopyFrom(default_arm)
    host = pb.GetParametersResponse.FromString(_fusion_answer())
    host.experiment_arm.CopyFrom(default_arm)
    agent, _ = _table_agent(tmp_path, name, [], monkeypatch)
    ended = dt.datetime.now(dt.UTC)
    stats = FlowStats(2_000_000, 1_000_000, 50_000, 40_000)

    def gemini_flow() -> None:
        agent.aggregator.add(Flow("192.0.2.1", stats, _tuned(d.spec), 4, ended, datapath=name))

    channel = _FlowDuringAnswer(
        [under_arm.SerializeToString(), host.SerializeToString()], gemini_flow
    )
    monkeypatch.setattr(agent.reporter.booster, "current", lambda: pb_grpc.BoosterStub(channel))
    agent.arm = pb.ExperimentArm(cc=d.cc, params=pb.ExperimentArm.POLICY, policy="dc")
    agent.aggregator.policy = "dc"
    agent.follow_datapath(d)
    sent: list[pb.ReportRequest] = []
    monkeypatch.setattr(agent.reporter, "submit", sent.append)
    agent.refresh_theta()
    assert channel.calls == 2 and agent.policy == "default" and agent.aggregator.tuned == "fusion"
    agent.close_interval()
    [report] = sent
    [agg] = report.aggregates
    assert report.policy == "default" and agg.cc == d.cc
    assert not agg.HasField("datapath_theta") and not agg.HasField("theta")
