"""The agent against a real Booster (real PostgreSQL, real gRPC): aggregation, the on-disk
spool across a Booster outage and an agent restart, and θ checks before anything is written.

The kernel cannot load modules on this machine, so write-back here targets a directory laid out
like /proc/sys/net/fusion (a stand-in, named as such); the lab tests write the real sysctls.
"""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest
from sqlalchemy import text

from gemini_agent.aggregator import Aggregator, Flow
from gemini_agent.config import AgentSettings
from gemini_agent.context import ContextResolver, MmdbTable, Place, PrefixTable
from gemini_agent.daemon import Agent, booster_peers
from gemini_agent.metrics import AgentMetrics
from gemini_agent.reporter import Reporter
from gemini_agent.spool import Spool
from gemini_agent.writeback import Kernel, Plan, ThetaApplier
from gemini_api.aggregate import FlowStats
from gemini_api.theta import load_spec
from gemini_api.v1 import booster_pb2 as pb
from gemini_booster.models import PolicyCreate
from gemini_booster.service.app import BoosterServer
from gemini_booster.storage import policies as policy_store
from tests.conftest import AGENT, free_port, make_settings
from tests.sysctls import fusion_sysctls, theta_in

SPEC = load_spec()
# Yesterday at 14:30 UTC: a fixed hour of day (the context asserts it), and recent enough that
# Booster accepts reports dated from it.
NOW = (dt.datetime.now(dt.UTC) - dt.timedelta(days=1)).replace(
    hour=14, minute=30, second=0, microsecond=0
)


def _flow(dst: str, mbytes: float = 2.0, seconds: float = 1.0, theta=None) -> Flow:
    stats = FlowStats(
        bytes_acked=int(mbytes * 1e6),
        duration_us=int(seconds * 1e6),
        rtt_avg_us=60_000,
        rtt_min_us=40_000,
    )
    return Flow(dst=dst, stats=stats, theta=theta or SPEC.default(), theta_version=7, ended=NOW)


@pytest.fixture
def csv_table(tmp_path) -> PrefixTable:
    path = tmp_path / "prefixes.csv"
    path.write_text(
        "prefix,region,isp\n10.1.0.0/16,eu-west,isp-a\n10.2.0.0/16,ap-south,isp-b\n"
        "10.2.3.0/24,ap-south,isp-c\n"
    )
    return PrefixTable(path)


def test_csv_and_mmdb_contexts_with_an_unknown_bucket(tmp_path, csv_table):
    from mmdb_writer import MMDBWriter
    from netaddr import IPSet

    writer = MMDBWriter(ip_version=4, database_type="gemini-test")
    writer.insert_network(IPSet(["10.1.0.0/16"]), {"region": "eu-west", "isp": "isp-a"})
    writer.insert_network(IPSet(["10.2.0.0/16"]), {"region": "ap-south", "isp": "isp-b"})
    writer.to_db_file(str(tmp_path / "geo.mmdb"))
    mmdb = MmdbTable(tmp_path / "geo.mmdb", "region", "isp")
    for table in (csv_table, mmdb):
        r = ContextResolver(Place("us-east", "own"), table)
        ctx = r.context("10.1.9.9", NOW)
        assert (ctx.src_region, ctx.dst_region, ctx.dst_isp, ctx.hour) == (
            "us-east",
            "eu-west",
            "isp-a",
            14,
        )
        assert r.place("192.0.2.1") == Place("unknown", "unknown")
    assert csv_table.lookup("10.2.3.4") == Place("ap-south", "isp-c")  # longest prefix wins
    assert {str(net) for net in mmdb.networks()} == {
        "10.1.0.0/16",
        "10.2.0.0/16",
    }


def test_aggregates_per_theta_and_context_with_exact_sums(csv_table):
    agg = Aggregator(ContextResolver(Place("us-east", "own"), csv_table), "host-1", "cdn")
    for _ in range(3):
        agg.add(_flow("10.1.0.5", mbytes=2.0, seconds=1.0))  # 16 Mbit/s
    agg.add(_flow("10.2.0.5", mbytes=0.05, seconds=1.0))  # 0.4 Mbit/s: slow
    agg.add(_flow("10.1.0.5", theta=SPEC.default() | {"mult_decrease": 60}))
    agg.add(Flow("10.1.0.5", FlowStats(0, 0, 0, 0), SPEC.default(), 7, NOW))  # handshake only
    report = agg.close_interval(1_000, 301_000)
    assert len(report.aggregates) == 3 and agg.skipped == 1
    eu = next(
        a
        for a in report.aggregates
        if a.context.dst_region == "eu-west" and a.theta.mult_decrease == 85
    )
    assert eu.flow_count == 3 and eu.throughput_mbps_sum == pytest.approx(48.0)
    assert eu.queue_delay_ms_sum == pytest.approx(60.0)
    assert eu.throughput_queue_delay_sum == pytest.approx(3 * 16 * 20)
    assert list(eu.size_bucket_counts) == [0, 0, 3, 0, 0] and eu.theta_version == 7
    ap = next(a for a in report.aggregates if a.context.dst_region == "ap-south")
    assert ap.slow_flow_count == 1
    # the same interval always gets the same idempotency key
    again = Aggregator(agg.resolver, "host-1", "cdn")
    again.add(_flow("10.1.0.5"))
    assert again.close_interval(1_000, 301_000).report_id == report.report_id
    assert agg.close_interval(301_000, 601_000) is None


def test_flows_of_another_cc_aggregate_apart_without_theta(csv_table):
    agg = Aggregator(ContextResolver(Place("us-east", "own"), csv_table), "host-1", "cdn")
    agg.add(_flow("10.1.0.5", mbytes=2.0))
    for mbytes in (1.0, 3.0):
        agg.add(
            Flow(
                "10.1.0.5",
                FlowStats(int(mbytes * 1e6), 1_000_000, 50_000, 40_000),
                {},
                0,
                NOW,
                cc="cubic",
            )
        )
    report = agg.close_interval(0, 300_000)
    (fusion,) = [a for a in report.aggregates if not a.cc]
    (cubic,) = [a for a in report.aggregates if a.cc]
    assert fusion.HasField("theta") and fusion.flow_count == 1
    assert cubic.cc == "cubic" and not cubic.HasField("theta") and cubic.flow_count == 2
    assert cubic.throughput_mbps_sum == pytest.approx(32.0)
    assert cubic.context.dst_region == fusion.context.dst_region == "eu-west"


def test_a_typical_report_stays_under_1kb_per_minute(csv_table):
    """Two contexts, one θ, 200 flows of varied throughput over a 5-minute interval."""
    agg = Aggregator(ContextResolver(Place("us-east", "own"), csv_table), "host-1", "cdn")
    for i in range(200):
        agg.add(_flow("10.1.0.5" if i % 2 else "10.2.0.5", mbytes=0.5 + i * 0.05))
    size = len(agg.close_interval(0, 300_000).SerializeToString())
    assert size / 5 < 1024, f"{size} bytes per 5 minutes"


def test_spool_is_ordered_atomic_and_bounded(tmp_path):
    spool = Spool(tmp_path / "spool", max_bytes=250)
    (tmp_path / "spool" / "00000000000000000009.tmp").write_bytes(b"torn")
    spool = Spool(tmp_path / "spool", max_bytes=250)  # a restart clears torn writes
    assert not list((tmp_path / "spool").glob("*.tmp"))
    for i in range(4):
        spool.put(bytes([i]) * 100)
    assert [p[1][0] for p in spool.pending()] == [2, 3] and spool.dropped == 2


def _settings(tmp_path, target: str, **kw) -> AgentSettings:
    """An agent's settings for ``target`` with fast retries; ``kw`` adds or overrides. The call
    deadline is one a busy host cannot miss: Booster away or a refused handshake fails at once,
    so only a call that should succeed waits."""
    given = {"retry_initial_s": 0.01, "retry_max_s": 0.02, "rpc_deadline_s": 30.0} | kw
    return AgentSettings(
        host_id="host-1",
        policy="default",
        booster_address=target,
        token=AGENT,
        spool_dir=tmp_path / "spool",
        **given,
    )


def _stored(engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(text("SELECT report_id FROM reports ORDER BY id")).scalars())


def _report(i: int) -> pb.ReportRequest:
    agg = Aggregator(ContextResolver(Place("us-east", "own"), None), "host-1", "default")
    agg.add(_flow("10.1.0.5"))
    start = int(NOW.timestamp() * 1000) + i * 300_000
    return agg.close_interval(start, start + 300_000)


def test_reports_survive_booster_outage_and_agent_restart_in_order_once(tmp_path, db_url):
    server = BoosterServer(make_settings(db_url)).start()
    policy_store.create_policy(server.engine, PolicyCreate(name="default"), actor="test")
    server.booster.reload_policies()
    target = f"127.0.0.1:{server.grpc_port}"
    reporter = Reporter(
        _settings(tmp_path, target), Spool(tmp_path / "spool", 1 << 20), AgentMetrics()
    )
    reporter.submit(_report(0))
    assert reporter.drain() == 1
    server.stop()  # Booster goes away
    for i in (1, 2, 3):
        reporter.submit(_report(i))
        assert reporter.drain() == 0  # spooled, not lost
    # the agent restarts: a new process finds the spool on disk
    reporter = Reporter(
        _settings(tmp_path, target), Spool(tmp_path / "spool", 1 << 20), AgentMetrics()
    )
    assert len(reporter.spool) == 3
    server = BoosterServer(make_settings(db_url, grpc_listen=target)).start()
    try:
        while reporter.drain() == 0 and len(reporter.spool):
            pass
        reporter.drain()
        assert len(reporter.spool) == 0
        ids = [_report(i).report_id for i in range(4)]
        assert _stored(server.engine) == ids  # each once, in order
        reporter.submit(_report(3))  # a retry of a delivered report
        reporter.drain()
        assert _stored(server.engine) == ids
    finally:
        server.stop()


class _NoSources(Agent):
    """The daemon's loop without kernel flow sources (this machine cannot load Fusion)."""

    def make_sources(self) -> list:
        return []


def _booster_and_agent(tmp_path, booster_settings) -> tuple[BoosterServer, Agent]:
    """Booster with policy "default", and an agent of 60 s intervals that reports to it."""
    server = BoosterServer(booster_settings).start()
    policy_store.create_policy(server.engine, PolicyCreate(name="default"), actor="test")
    server.booster.reload_policies()
    settings = _settings(
        tmp_path,
        f"127.0.0.1:{server.grpc_port}",
        interval_s=60,
        apply_to_kernel=False,
        metrics_listen=f"127.0.0.1:{free_port()}",
    )
    agent = _NoSources(settings, kernel=Kernel(tmp_path, use_netlink=False))
    return server, agent


def test_a_clean_stop_delivers_the_last_interval(tmp_path, db_url):
    """Flows that ended after the last interval closed reach Booster when the agent stops (a
    rolling update's SIGTERM, a host leaving the fleet), not only at a next start that a
    retired host never has; the spool is left empty."""
    server, agent = _booster_and_agent(tmp_path, make_settings(db_url))
    agent.aggregator.add(_flow("10.1.0.5"))  # ended within the first, still open, interval
    agent.stopped.set()  # SIGTERM's handler, before the first interval closes
    try:
        agent.run()
        assert len(_stored(server.engine)) == 1
        assert len(agent.reporter.spool) == 0
    finally:
        server.stop()


def test_a_report_through_after_an_outage_brings_theta_at_once(tmp_path, db_url):
    """Booster back from an outage: the first spooled report that gets through is followed by
    GetParameters at once, not at the end of the (600 s) interval, so a host that fell back
    to the safe default takes Booster's θ again within seconds."""
    server = BoosterServer(make_settings(db_url)).start()
    policy_store.create_policy(server.engine, PolicyCreate(name="default"), actor="test")
    target = f"127.0.0.1:{server.grpc_port}"
    server.stop()  # Booster goes away before the agent starts
    settings = _settings(
        tmp_path,
        target,
        interval_s=600,
        apply_to_kernel=False,
        metrics_listen=f"127.0.0.1:{free_port()}",
    )
    agent = _NoSources(settings, kernel=Kernel(tmp_path, use_netlink=False))
    agent.reporter.submit(_report(0))  # an interval closed during the outage
    runner = threading.Thread(target=agent.run)
    runner.start()
    server = None
    try:
        deadline = time.monotonic() + 60  # a tenth of the interval: only the drain can ask
        while not agent.booster_silent and time.monotonic() < deadline:
            time.sleep(0.05)
        assert agent.booster_silent  # the agent's first GetParameters failed
        server = BoosterServer(make_settings(db_url, grpc_listen=target)).start()
        registry = server.booster.metrics.registry
        labels = {"method": "GetParameters", "code": "OK"}
        while time.monotonic() < deadline and not registry.get_sample_value(
            "gemini_booster_grpc_request_seconds_count", labels
        ):
            time.sleep(0.05)
        assert _stored(server.engine) == [_report(0).report_id]
        assert registry.get_sample_value("gemini_booster_grpc_request_seconds_count", labels)
        assert not agent.booster_silent
    finally:
        agent.stopped.set()
        runner.join(timeout=30)
        if server is not None:
            server.stop()


def test_agent_asks_for_theta_as_often_as_booster_says(tmp_path, db_url):
    """Booster's refresh_after_seconds (1 s here) paces GetParameters between 60 s intervals."""
    server, agent = _booster_and_agent(tmp_path, make_settings(db_url, refresh_after_s=1))
    registry = server.booster.metrics.registry

    def asked() -> float:
        labels = {"method": "GetParameters", "code": "OK"}
        return registry.get_sample_value("gemini_booster_grpc_request_seconds_count", labels) or 0

    runner = threading.Thread(target=agent.run)
    start = time.monotonic()
    # half the 60 s interval: only the 1 s pacing can ask three times before it
    deadline = start + 30
    try:
        runner.start()
        while asked() < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        count, elapsed = asked(), time.monotonic() - start
    finally:
        agent.stopped.set()
        runner.join(timeout=10)
        server.stop()
    assert agent.refresh_after_s == 1.0
    # at start, then again after each second: three asks before half an interval is over
    assert count >= 3, count
    # never a busy loop: no more than the one at start and one per second since (whatever
    # the host's speed, elapsed grows with it)
    assert count <= 2 + elapsed / agent.refresh_after_s, (count, elapsed)


@pytest.fixture
def sysctl_dir(tmp_path):
    """Stand-in for /proc/sys/net/fusion (no loadable modules on this machine)."""
    return fusion_sysctls(tmp_path)


def test_theta_outside_the_region_is_refused_and_never_written(sysctl_dir):
    metrics = AgentMetrics()
    applier = ThetaApplier(Kernel(sysctl_dir, use_netlink=False), metrics, staleness_s=60)
    good = SPEC.default() | {"mult_decrease": 60}
    resp = pb.GetParametersResponse(default_theta=pb.Theta(**good))
    applier.apply(applier.plan_from(resp, []), [])
    assert theta_in(sysctl_dir) == good
    bad = pb.GetParametersResponse(default_theta=pb.Theta(**(good | {"mult_decrease": 100})))
    applier.apply(applier.plan_from(bad, []), [])
    assert theta_in(sysctl_dir) == good  # last good θ kept
    assert metrics.theta_refused._value.get() == 1
    place = Place("eu-west", "isp-a")
    per_ctx = pb.GetParametersResponse(
        default_theta=pb.Theta(**good),
        parameters=[pb.ContextParameters(theta=pb.Theta(**(good | {"window_intervals": 0})))],
    )
    plan = applier.plan_from(per_ctx, [place])
    assert place not in plan.per_place and metrics.theta_refused._value.get() == 2


def test_falls_back_to_the_safe_default_after_the_staleness_limit(sysctl_dir):
    metrics = AgentMetrics()
    applier = ThetaApplier(Kernel(sysctl_dir, use_netlink=False), metrics, staleness_s=60)
    tuned = SPEC.default() | {"add_increase": 9}
    applier.apply(Plan(tuned, {}), [])
    applier.check_staleness([])
    assert theta_in(sysctl_dir) == tuned  # within the limit: keep the last good θ
    applier.last_ok -= 61  # Booster last answered a minute and a second ago
    applier.check_staleness([])
    assert theta_in(sysctl_dir) == SPEC.default()
    assert metrics.registry.get_sample_value("gemini_agent_fallbacks_total", {"reason": "stale"})


def test_a_report_interval_ends_after_it_starts_when_the_clock_steps_back(tmp_path, sysctl_dir):
    """The wall clock stepped back a minute since the interval began (or a change of θ closes
    it within the millisecond the last close began it): the report still ends after it starts,
    so Booster does not refuse it and its flows are not set aside."""
    settings = _settings(tmp_path, "127.0.0.1:1", apply_to_kernel=False, sysctl_root=sysctl_dir)
    agent = Agent(settings, kernel=Kernel(sysctl_dir, use_netlink=False), module_params={})
    agent.interval_start_ms = int(time.time() * 1000) + 60_000
    agent.aggregator.add(_flow("10.1.0.5"))
    agent.close_interval()
    [(_, payload)] = agent.spool.pending()
    report = pb.ReportRequest.FromString(payload)
    assert report.interval_end_unix_ms > report.interval_start_unix_ms
    assert agent.interval_start_ms == report.interval_end_unix_ms


def test_booster_peers_name_both_of_boosters_ports(tmp_path) -> None:
    """Sock_diag leaves the agent's own connections out: to the agent port and, when the
    agent asks for θ on a read port, to that one too."""
    alone = booster_peers(_settings(tmp_path, "127.0.0.1:50051"))
    assert alone == {("127.0.0.1", 50051)}
    both = booster_peers(
        _settings(tmp_path, "127.0.0.1:50051", parameters_address="127.0.0.1:50052")
    )
    assert both == {("127.0.0.1", 50051), ("127.0.0.1", 50052)}


def test_completion_sums_are_sent_only_for_a_policy_whose_objective_needs_them(csv_table):
    """Booster's GetParameters says whether the policy's objective is completion time; an
    eq. 9 policy's reports leave the completion sums out (about 40 bytes an aggregate)."""
    sizes = {}
    for wanted in (False, True):
        agg = Aggregator(ContextResolver(Place("us-east", "own"), csv_table), "host-1", "cdn")
        agg.completion_sums = wanted
        agg.add(_flow("10.1.0.5", mbytes=2.0, seconds=1.0))
        agg.add(_flow("10.1.0.5", mbytes=1.0, seconds=0.5))
        (a,) = agg.close_interval(1_000, 301_000).aggregates
        assert a.HasField("completion") == wanted
        sizes[wanted] = a.ByteSize()
        if wanted:
            assert a.completion.flow_count == 2 and a.completion.bytes_sum == 3_000_000
    assert sizes[True] - sizes[False] >= 20
