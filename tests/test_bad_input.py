"""Hostile and broken reports against a real Booster and real PostgreSQL.

Every bad report is refused by name (INVALID_ARGUMENT naming the field), nothing of it is
stored, and a well-formed report from another host sent at the same moment is stored: one
report never fails another. Quotas and storage refusals are checked at the writer (the group
commit), with both reports queued into one batch; the writer lingers long enough for that.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.protobuf.message import Message
from sqlalchemy import Engine, text

from gemini_agent.config import AgentSettings
from gemini_agent.metrics import AgentMetrics
from gemini_agent.reporter import Reporter
from gemini_agent.spool import Spool
from gemini_api import sketch as sketches
from gemini_api.theta import load_spec
from gemini_api.v1 import booster_pb2 as pb
from gemini_booster import simulation as sim
from gemini_booster.models import PolicyCreate, PolicyUpdate
from gemini_booster.storage import policies as policy_store
from gemini_booster.storage.ingest import IngestOutcome, ReportRow

from .conftest import AGENT, Running, agent_md, end_other_sessions, serve

POLICY = "p1"
LINGER_MS = 200  # long enough that reports sent together share one group commit
GOOD_HOST = "host-good"
BAD_HOST = "host-bad"


@pytest.fixture
def svc(db_url: str) -> Iterator[Running]:
    with serve(db_url, ingest_linger_ms=LINGER_MS) as running:
        policy_store.create_policy(running.server.engine, PolicyCreate(name=POLICY), actor="test")
        running.booster.reload_policies()
        yield running


def now_ms() -> int:
    return int(time.time() * 1000)


def report(
    host: str,
    seed: int = 0,
    flows: int = 20,
    contexts: tuple[sim.SyntheticContext, ...] = sim.DEFAULT_CONTEXTS,
    start_ms: int | None = None,
) -> pb.ReportRequest:
    """A well-formed report of the interval that ended just now."""
    rng = np.random.default_rng(seed)
    theta = load_spec().default()
    aggs = [sim.make_aggregate(c, theta, 1.0, flows, rng) for c in contexts]
    start = now_ms() - 300_000 if start_ms is None else start_ms
    return sim.make_report(host, POLICY, aggs, start)


def context(dst_isp: str) -> sim.SyntheticContext:
    """A context of its own (for admission quotas), shaped like the Ethernet one."""
    s, si, d, _, h = sim.ETHERNET.key
    return sim.SyntheticContext(
        key=(s, si, d, dst_isp, h),
        optimum=sim.ETHERNET.optimum,
        peak_mbps=sim.ETHERNET.peak_mbps,
        curvature=sim.ETHERNET.curvature,
        base_delay_ms=sim.ETHERNET.base_delay_ms,
    )


def scalar(engine: Engine, sql: str, **params: object) -> int:
    with engine.connect() as conn:
        return conn.execute(text(sql), params).scalar_one()


def stored_ids(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(text("SELECT report_id FROM reports")).scalars())


def trial_flows(engine: Engine) -> int:
    return scalar(engine, "SELECT coalesce(sum(flow_count), 0) FROM trials")


def aggregate_count(engine: Engine) -> int:
    return scalar(engine, "SELECT count(*) FROM report_aggregates")


def assert_only_stored(engine: Engine, *good: pb.ReportRequest) -> None:
    """Exactly ``good`` is stored: its reports, aggregates and flows, nothing else."""
    assert stored_ids(engine) == {r.report_id for r in good}
    assert aggregate_count(engine) == sum(len(r.aggregates) for r in good)
    assert trial_flows(engine) == sum(a.flow_count for r in good for a in r.aggregates)


def send_together(
    svc: Running, bad: pb.ReportRequest | bytes, good: pb.ReportRequest
) -> tuple[grpc.RpcError | pb.ReportResponse, pb.ReportResponse]:
    """Send both at the same moment; the bad one's error (or response) and the good one's."""
    channel = grpc.insecure_channel(svc.grpc_target)
    call = channel.unary_unary("/gemini.booster.v1.Booster/ReportAggregates")

    def bad_call() -> grpc.RpcError | pb.ReportResponse:
        payload = bad if isinstance(bad, bytes) else bad.SerializeToString()
        try:
            return pb.ReportResponse.FromString(call(payload, metadata=agent_md(), timeout=10))
        except grpc.RpcError as e:
            return e

    try:
        with ThreadPoolExecutor(2) as pool:
            bad_future = pool.submit(bad_call)
            good_future = pool.submit(
                lambda: svc.stub().ReportAggregates(good, metadata=agent_md(), timeout=10)
            )
            return bad_future.result(), good_future.result()
    finally:
        channel.close()


def assert_refused(svc: Running, bad: pb.ReportRequest | bytes, *expected: str) -> grpc.RpcError:
    """``bad`` gets INVALID_ARGUMENT naming ``expected``; a concurrent good report is stored."""
    good = report(GOOD_HOST, seed=99)
    err, ok = send_together(svc, bad, good)
    assert isinstance(err, grpc.RpcError), f"accepted: {err}"
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    for part in expected:
        assert part in err.details()
    assert ok.aggregates_stored == len(good.aggregates) and not ok.duplicate
    assert_only_stored(svc.engine, good)
    return err


def mutated(fn: Callable[[pb.ReportRequest], object]) -> pb.ReportRequest:
    req = report(BAD_HOST, seed=5)
    fn(req)
    return req


# -- numbers storage cannot hold or physics does not allow --------------------------------------


def test_flow_count_beyond_storage_is_refused_and_the_trial_stays_usable(svc: Running) -> None:
    def huge(r: pb.ReportRequest) -> None:
        a = r.aggregates[0]
        a.flow_count = 2**63 - 1
        a.slow_flow_count = 0
        a.ClearField("size_bucket_counts")
        a.ClearField("throughput_sketch")

    assert_refused(svc, mutated(huge), "aggregates[0].flow_count: 9223372036854775807 > ")
    # The same (context, θ) takes further reports: nothing of the refused one is in its sums.
    later = report(BAD_HOST, seed=6, flows=30)
    resp = svc.stub().ReportAggregates(later, metadata=agent_md())
    assert resp.aggregates_stored == 2
    assert trial_flows(svc.engine) == 20 * 2 + 30 * 2  # the good companion's and this one's


def test_theta_version_beyond_storage_is_refused(svc: Running) -> None:
    bad = mutated(lambda r: setattr(r.aggregates[1], "theta_version", 2**63))
    assert_refused(svc, bad, "aggregates[1].theta_version: 9223372036854775808 ≥ 2^63")


def test_largest_theta_version_storage_holds_is_stored(svc: Running) -> None:
    req = report(GOOD_HOST)
    req.aggregates[0].theta_version = 2**63 - 1
    assert svc.stub().ReportAggregates(req, metadata=agent_md()).aggregates_stored == 2
    stored = scalar(svc.engine, "SELECT max(theta_version) FROM report_aggregates")
    assert stored == 2**63 - 1


def _set(field: str, value: Callable[[pb.Aggregate], float]) -> Callable[[pb.ReportRequest], None]:
    return lambda r: setattr(r.aggregates[1], field, value(r.aggregates[1]))


IMPOSSIBLE_SUMS = {
    "throughput sum beyond 10^6 Mbit/s per flow": (
        _set("throughput_mbps_sum", lambda a: 1e300),
        "aggregates[1].throughput_mbps_sum: 1e+300 > flow_count × 1e+06 Mbit/s per flow",
    ),
    "delay square sum beyond (10^6 ms)² per flow": (
        _set("queue_delay_ms_sq_sum", lambda a: a.flow_count * 1e12 * 2),
        "aggregates[1].queue_delay_ms_sq_sum: ",
    ),
    "square sum above the squared sum": (
        _set("throughput_mbps_sq_sum", lambda a: a.throughput_mbps_sum**2 * 1.5),
        "aggregates[1].throughput_mbps_sq_sum: larger than (throughput_mbps_sum)² allows",
    ),
    "Σxy beyond Cauchy–Schwarz": (
        _set(
            "throughput_queue_delay_sum",
            lambda a: 1.01 * math.sqrt(a.throughput_mbps_sq_sum * a.queue_delay_ms_sq_sum),
        ),
        "aggregates[1].throughput_queue_delay_sum: ",
    ),
    "completion sums for other flows than the aggregate's": (
        lambda r: setattr(r.aggregates[1].completion, "flow_count", 7),
        "aggregates[1].completion.flow_count: 7, not the aggregate's 20",
    ),
    "completion time not finite": (
        lambda r: setattr(r.aggregates[1].completion, "seconds_sq_sum", math.inf),
        "aggregates[1].completion.seconds_sq_sum: inf is not a finite non-negative sum",
    ),
    "slow flows beyond flows": (
        _set("slow_flow_count", lambda a: a.flow_count + 1),
        "aggregates[1].slow_flow_count: 21 > flow_count 20",
    ),
}


def test_size_bucket_beyond_flow_count_is_refused(svc: Running) -> None:
    def bucket(r: pb.ReportRequest) -> None:
        r.aggregates[0].size_bucket_counts[3] = 2**64 - 1

    assert_refused(svc, mutated(bucket), "aggregates[0].size_bucket_counts[3]: ")


# -- timestamps -----------------------------------------------------------------------------------

YEAR_3000_MS = 32_503_680_000_000
PAST_9999_MS = 253_402_300_800_000  # 10000-01-01: datetime cannot hold it


def _interval(start: int, end: int) -> Callable[[pb.ReportRequest], None]:
    def fn(r: pb.ReportRequest) -> None:
        r.interval_start_unix_ms, r.interval_end_unix_ms = start, end

    return fn


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (1_000, 301_000, "interval_start_unix_ms: 1000 is more than 7 days before"),
        (YEAR_3000_MS, YEAR_3000_MS + 300_000, "interval_end_unix_ms: "),
        (PAST_9999_MS, PAST_9999_MS + 300_000, "minutes ahead of Booster's clock"),
        (2**62, 2**62 + 1, "interval_end_unix_ms: "),
    ],
    ids=["1970", "year 3000", "past 9999", "2^62"],
)
def test_intervals_far_from_booster_clock_are_refused(
    svc: Running, start: int, end: int, expected: str
) -> None:
    assert_refused(svc, mutated(_interval(start, end)), expected)


def test_a_week_old_report_is_refused_and_a_six_day_old_one_stored(svc: Running) -> None:
    day = 86_400_000
    old = mutated(_interval(now_ms() - 8 * day, now_ms() - 8 * day + 300_000))
    assert_refused(svc, old, "interval_start_unix_ms: ")
    spooled = report(BAD_HOST, seed=7, start_ms=now_ms() - 6 * day)
    assert svc.stub().ReportAggregates(spooled, metadata=agent_md()).aggregates_stored == 2


def test_interval_a_little_ahead_is_within_clock_skew(svc: Running) -> None:
    req = report(GOOD_HOST, start_ms=now_ms() - 60_000)  # ends 4 minutes ahead
    assert svc.stub().ReportAggregates(req, metadata=agent_md()).aggregates_stored == 2


# -- sketches -------------------------------------------------------------------------------------


def _sketch(fn: Callable[[pb.QuantileSketch], object]) -> Callable[[pb.ReportRequest], object]:
    return lambda r: fn(r.aggregates[0].throughput_sketch)


def _empty_with_accuracy(s: pb.QuantileSketch) -> None:
    s.Clear()
    s.relative_accuracy = sketches.RELATIVE_ACCURACY


MALFORMED_SKETCHES = {
    "other accuracy": (
        _sketch(lambda s: setattr(s, "relative_accuracy", 0.02)),
        "aggregates[0].throughput_sketch: relative_accuracy 0.02 != 0.01",
    ),
    "keys beyond the mapping": (
        _sketch(lambda s: setattr(s, "offset", 2**31 - 10)),
        "aggregates[0].throughput_sketch: keys 2147483638..",
    ),
    "weight other than the flow count": (
        _sketch(lambda s: setattr(s, "zero_count", s.zero_count + 5)),
        "aggregates[0].throughput_sketch: total weight 25 != flow_count 20",
    ),
    "empty but not absent": (
        _sketch(_empty_with_accuracy),
        "aggregates[0].throughput_sketch: no weight",
    ),
    "infinite count": (
        _sketch(lambda s: s.counts.append(float("inf"))),
        "aggregates[0].throughput_sketch: bucket count inf",
    ),
}


# Sums no flows could have produced, and sketches malformed: each refused naming its field.
REFUSED_AGGREGATES = IMPOSSIBLE_SUMS | MALFORMED_SKETCHES
assert len(REFUSED_AGGREGATES) == len(IMPOSSIBLE_SUMS) + len(MALFORMED_SKETCHES)


@pytest.mark.parametrize("case", list(REFUSED_AGGREGATES))
def test_impossible_sums_and_malformed_sketches_are_refused_by_name(
    svc: Running, case: str
) -> None:
    fn, expected = REFUSED_AGGREGATES[case]
    assert_refused(svc, mutated(fn), expected)


def test_an_absent_sketch_is_stored(svc: Running) -> None:
    req = report(GOOD_HOST)
    req.aggregates[0].ClearField("throughput_sketch")
    assert svc.stub().ReportAggregates(req, metadata=agent_md()).aggregates_stored == 2


# -- θ presence -----------------------------------------------------------------------------------


def test_theta_with_a_parameter_left_out_is_refused_naming_each(svc: Running) -> None:
    def leave_out(r: pb.ReportRequest) -> None:
        r.aggregates[1].theta.ClearField("rtt_threshold")
        r.aggregates[1].theta.ClearField("init_cwnd")

    err = assert_refused(
        svc,
        mutated(leave_out),
        "aggregates[1].theta.rtt_threshold: missing",
        "aggregates[1].theta.init_cwnd: missing",
    )
    assert "aggregates[0]" not in err.details()


def test_theta_parameter_explicitly_zero_is_judged_by_its_value(svc: Running) -> None:
    """Present and 0 is a value (outside Θ' here), not a missing parameter."""
    bad = mutated(lambda r: setattr(r.aggregates[0].theta, "add_increase", 0))
    err = assert_refused(svc, bad, "aggregates[0].theta.add_increase: 0 outside")
    assert "missing" not in err.details()


# -- duplicates compare content -------------------------------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _reversed_fields(msg: Message) -> bytes:
    """``msg`` encoded with its fields in reverse order (valid protobuf, other bytes); repeated
    messages keep their order and are encoded the same way, one by one."""
    out = b""
    for field, value in reversed(msg.ListFields()):
        if field.message_type is not None:
            items = value if field.is_repeated else [value]
            tag = _varint(field.number << 3 | 2)
            for item in items:
                body = _reversed_fields(item)
                out += tag + _varint(len(body)) + body
        else:
            single = type(msg)()
            if field.is_repeated:
                getattr(single, field.name).extend(value)
            else:
                setattr(single, field.name, value)
            out += single.SerializeToString()
    return out


def test_identical_report_encoded_differently_is_a_duplicate(svc: Running) -> None:
    req = report(BAD_HOST, seed=3)
    first = svc.stub().ReportAggregates(req, metadata=agent_md())
    assert first.aggregates_stored == 2
    raw = _reversed_fields(req)
    assert raw != req.SerializeToString() and pb.ReportRequest.FromString(raw) == req
    good = report(GOOD_HOST, seed=4)
    again, ok = send_together(svc, raw, good)
    assert isinstance(again, pb.ReportResponse), again
    assert again.duplicate and again.aggregates_stored == 0
    assert ok.aggregates_stored == 2
    assert_only_stored(svc.engine, req, good)


# -- admission quotas (at the writer: one group commit) -------------------------------------------


def rows(svc: Running, *reqs: pb.ReportRequest) -> list[ReportRow]:
    return [svc.booster.validate_report(r.SerializeToString()) for r in reqs]


def store_together(svc: Running, *reqs: pb.ReportRequest) -> list[IngestOutcome]:
    """Queue all at once, as concurrent handlers would; with the writer lingering they share
    one batch (checked through the batch-size histogram)."""
    writer = svc.booster.writer
    batches = _batches(svc)

    async def submit() -> list[IngestOutcome]:
        return list(await asyncio.gather(*(writer.submit(r) for r in rows(svc, *reqs))))

    outcomes = asyncio.run(submit())
    assert _batches(svc) == batches + 1, "the reports did not share one batch"
    return outcomes


def _batches(svc: Running) -> float:
    return _sample(svc, "gemini_booster_ingest_batch_reports_count")


def refusals(svc: Running) -> float:
    return _sample(svc, "gemini_booster_ingest_failures_total", kind="refused")


def _sample(svc: Running, name: str, **labels: str) -> float:
    return svc.booster.metrics.registry.get_sample_value(name, labels) or 0.0


def admitted(svc: Running) -> int:
    return scalar(svc.engine, "SELECT count(*) FROM policy_contexts")


def test_policy_quota_refuses_a_report_adding_contexts_whole(svc: Running) -> None:
    svc.booster.writer.max_new_contexts_per_host_day = 100
    policy_store.update_policy(svc.engine, POLICY, PolicyUpdate(max_contexts=3), actor="test")
    svc.booster.reload_policies()
    first = report("host-a", contexts=sim.DEFAULT_CONTEXTS)
    assert store_together(svc, first)[0].stored == 2
    assert admitted(svc) == 2
    # One slot left: of two reports each adding one context, the first in the batch takes it.
    takes = report("host-b", seed=1, contexts=(sim.ETHERNET, context("isp-3")))
    over = report("host-c", seed=2, contexts=(context("isp-4"), sim.SATELLITE))
    known = report("host-d", seed=3, contexts=sim.DEFAULT_CONTEXTS)
    took, refused, ok = store_together(svc, takes, over, known)
    assert took.stored == 2 and ok.stored == 2
    assert refused.stored == 0 and refused.rejection is not None
    assert refused.rejection.code == "quota"
    assert refused.rejection.message == (
        f"policy {POLICY!r} admits at most 3 contexts (3 admitted); this report adds 1"
    )
    assert_only_stored(svc.engine, first, takes, known)
    assert admitted(svc) == 3
    assert scalar(svc.engine, "SELECT count(*) FROM contexts WHERE dst_isp = 'isp-4'") == 0


def test_host_quota_refuses_a_host_adding_too_many_contexts_in_a_day(svc: Running) -> None:
    svc.booster.writer.max_new_contexts_per_host_day = 2
    many = report(BAD_HOST, contexts=(context("isp-1"), context("isp-2"), context("isp-3")))
    good = report(GOOD_HOST, seed=1, contexts=sim.DEFAULT_CONTEXTS)
    refused, ok = store_together(svc, many, good)
    assert ok.stored == 2
    assert refused.rejection is not None and refused.rejection.code == "quota"
    assert refused.rejection.message == (
        f"host {BAD_HOST!r} may add at most 2 new contexts to policy {POLICY!r} in 24 hours "
        "(0 added); this report adds 3"
    )
    assert_only_stored(svc.engine, good)
    # Within its quota the host may add contexts, and contexts others admitted cost it nothing.
    two = report(BAD_HOST, seed=2, contexts=(context("isp-1"), sim.ETHERNET))
    assert store_together(svc, two)[0].stored == 2
    third = report(BAD_HOST, seed=3, contexts=(context("isp-2"), context("isp-3")))
    (again,) = store_together(svc, third)
    assert again.rejection is not None
    assert "(1 added); this report adds 2" in again.rejection.message
    assert_only_stored(svc.engine, good, two)
    with svc.engine.connect() as conn:
        hosts = dict(
            conn.execute(
                text(
                    "SELECT c.dst_isp, pc.first_host FROM policy_contexts pc "
                    "JOIN contexts c ON c.id = pc.context_id"
                )
            ).all()
        )
    assert hosts == {
        sim.ETHERNET.key[3]: GOOD_HOST,
        sim.SATELLITE.key[3]: GOOD_HOST,
        "isp-1": BAD_HOST,
    }


def test_quota_refusal_over_grpc_is_resource_exhausted_marked_quota(svc: Running) -> None:
    """End to end: the agent sets aside only a RESOURCE_EXHAUSTED marked as a quota."""
    svc.booster.writer.max_new_contexts_per_host_day = 1
    many = report(BAD_HOST, contexts=(context("isp-1"), context("isp-2")))
    good = report(GOOD_HOST, seed=1, contexts=(context("isp-3"),))
    err, ok = send_together(svc, many, good)
    assert isinstance(err, grpc.RpcError), err
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert ("gemini-rejection", "quota") in (err.trailing_metadata() or ())
    assert err.details() == (
        f"host {BAD_HOST!r} may add at most 1 new contexts to policy {POLICY!r} in 24 hours "
        "(0 added); this report adds 2"
    )
    assert ok.aggregates_stored == 1
    assert_only_stored(svc.engine, good)


def test_known_contexts_cost_no_admission_query_once_cached(svc: Running) -> None:
    req = report(GOOD_HOST)
    assert store_together(svc, req)[0].stored == 2
    writer = svc.booster.writer
    pid = svc.booster.policies[POLICY].id
    assert {(p, c.dst_isp) for p, c in writer.admissions.known} == {
        (pid, c.key[3]) for c in sim.DEFAULT_CONTEXTS
    }


# -- storage refusing one report ------------------------------------------------------------------


def refuse_bad_hosts_reports(svc: Running) -> None:
    """A constraint of this test's database that refuses BAD_HOST's report rows: a report
    that passes every check of Booster's but that storage refuses all the same."""
    with svc.engine.begin() as conn:
        conn.execute(
            text(
                "ALTER TABLE reports ADD CONSTRAINT refuse_bad_host "
                f"CHECK (host_id <> '{BAD_HOST}')"
            )
        )


def test_a_report_storage_refuses_fails_alone(svc: Running) -> None:
    """A report that passes every check but that storage refuses (here a constraint of this
    test's database) is refused for good; the report sharing its batch is stored."""
    refuse_bad_hosts_reports(svc)
    bad = report(BAD_HOST, seed=1)
    good = report(GOOD_HOST, seed=2)
    before = refusals(svc)
    refused, ok = store_together(svc, bad, good)
    assert ok.stored == 2 and ok.rejection is None and ok.error is None
    assert refused.stored == 0 and refused.error is None
    assert refused.rejection is not None and refused.rejection.code == "invalid"
    assert bad.report_id in refused.rejection.message
    assert "refuse_bad_host" not in refused.rejection.message  # no driver text
    assert refusals(svc) == before + 1
    assert_only_stored(svc.engine, good)
    # The writer goes on with group commits.
    more = report(GOOD_HOST, seed=3)
    assert store_together(svc, more)[0].stored == 2


def _trigger_on_bad_host(svc: Running, errcode: str) -> None:
    """Aggregates of BAD_HOST's reports raise ``errcode`` (a trigger of this test's database)."""
    with svc.engine.begin() as conn:
        conn.execute(
            text(
                "CREATE FUNCTION refuse_bad_host() RETURNS trigger LANGUAGE plpgsql AS $$ "
                "BEGIN IF (SELECT host_id FROM reports WHERE id = NEW.report_pk) = "
                f"'{BAD_HOST}' THEN RAISE EXCEPTION 'refused' USING ERRCODE = '{errcode}'; "
                "END IF; RETURN NEW; END $$"
            )
        )
        conn.execute(
            text(
                "CREATE TRIGGER refuse_bad_host BEFORE INSERT ON report_aggregates "
                "FOR EACH ROW EXECUTE FUNCTION refuse_bad_host()"
            )
        )


def test_a_trigger_refusing_data_fails_only_its_report(svc: Running) -> None:
    _trigger_on_bad_host(svc, "P0001")  # raise_exception: a refusal of the data
    bad, good = report(BAD_HOST, seed=1), report(GOOD_HOST, seed=2)
    refused, ok = store_together(svc, bad, good)
    assert ok.stored == 2
    assert refused.rejection is not None and refused.rejection.code == "invalid"
    assert_only_stored(svc.engine, good)


def test_a_failure_that_is_no_reports_fault_is_retried_not_refused(svc: Running) -> None:
    """A failure outside the data classes (here a permission error, as a misconfigured or
    mismatched database would raise) refuses nothing for good: the batch is retried."""
    _trigger_on_bad_host(svc, "42501")
    bad, good = report(BAD_HOST, seed=1), report(GOOD_HOST, seed=2)
    outcomes = store_together(svc, bad, good)
    assert all(o.error is not None and o.rejection is None for o in outcomes)
    assert stored_ids(svc.engine) == set()
    assert store_together(svc, good)[0].stored == 2  # its agent's retry


def test_storage_refusal_over_grpc_is_invalid_argument_without_driver_text(svc: Running) -> None:
    refuse_bad_hosts_reports(svc)
    bad = report(BAD_HOST, seed=1)
    err, ok = send_together(svc, bad, report(GOOD_HOST, seed=2))
    assert isinstance(err, grpc.RpcError), err
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad.report_id in err.details() and "refuse_bad_host" not in err.details()
    assert ok.aggregates_stored == 2


def test_database_away_fails_the_batch_for_retry_then_recovers(svc: Running) -> None:
    first = report(GOOD_HOST, seed=1)
    assert store_together(svc, first)[0].stored == 2
    with svc.engine.connect() as conn:  # drop every other connection, the writer's among them
        end_other_sessions(conn)
    a, b = report("host-a", seed=2), report("host-b", seed=3)
    outcomes = store_together(svc, a, b)
    assert all(o.error is not None and o.rejection is None for o in outcomes)
    for _ in range(3):  # agents retry with the same ids; the pool reconnects
        outcomes = store_together(svc, a, b)
        if all(o.error is None for o in outcomes):
            break
    assert [o.stored for o in outcomes] == [2, 2]
    assert_only_stored(svc.engine, first, a, b)


# -- the agent's side ------------------------------------------------------------------------------


def reporter(svc: Running, tmp_path: Path) -> Reporter:
    settings = AgentSettings(
        host_id=BAD_HOST,
        policy=POLICY,
        booster_address=svc.grpc_target,
        token=AGENT,
        spool_dir=tmp_path / "spool",
        retry_initial_s=0.01,
        retry_max_s=0.02,
        rpc_deadline_s=5,
    )
    return Reporter(settings, Spool(tmp_path / "spool", 8 << 20), AgentMetrics())


def set_aside(r: Reporter, reason: str) -> float:
    return (
        r.metrics.registry.get_sample_value(
            "gemini_agent_reports_set_aside_total", {"reason": reason}
        )
        or 0.0
    )


def test_agent_sets_aside_only_what_can_never_be_accepted(svc: Running, tmp_path: Path) -> None:
    """Invalid and over-quota reports are set aside and counted; a report for a policy not
    created yet (NOT_FOUND) stays spooled and is delivered once the policy exists."""
    svc.booster.writer.max_new_contexts_per_host_day = 2
    agent = reporter(svc, tmp_path)
    invalid = mutated(lambda r: r.aggregates[0].theta.ClearField("loss_threshold"))
    over = report(BAD_HOST, seed=1, contexts=tuple(context(f"isp-{i}") for i in range(3)))
    good = report(BAD_HOST, seed=2)
    early = report(BAD_HOST, seed=3)
    early.policy = "later"
    after = report(BAD_HOST, seed=4)
    for r in (invalid, over, good, early, after):
        agent.submit(r)
    assert agent.drain() == 1  # good; stops at `early`, to retry with backoff
    assert set_aside(agent, "INVALID_ARGUMENT") == 1 and set_aside(agent, "quota") == 1
    assert len(agent.spool) == 2 and len(list((tmp_path / "spool" / "rejected").iterdir())) == 2
    policy_store.create_policy(svc.engine, PolicyCreate(name="later"), actor="test")
    svc.booster.reload_policies()
    deadline = time.monotonic() + 10
    while len(agent.spool) and time.monotonic() < deadline:
        agent.drain()
        time.sleep(0.02)
    assert len(agent.spool) == 0
    assert stored_ids(svc.engine) == {good.report_id, early.report_id, after.report_id}


def test_agent_keeps_a_report_refused_for_size_not_quota(svc: Running, tmp_path: Path) -> None:
    """RESOURCE_EXHAUSTED without the quota mark (gRPC's message limit) may pass later (a
    limit raised): the report is kept, nothing is set aside."""
    agent = reporter(svc, tmp_path)
    big = report(BAD_HOST)
    big.aggregates[0].throughput_sketch.counts.extend([1.0] * 200_000)  # > 1 MiB
    agent.submit(big)
    assert agent.drain() == 0
    assert len(agent.spool) == 1 and set_aside(agent, "quota") == 0
    assert (
        agent.metrics.registry.get_sample_value("gemini_agent_reports_total", {"outcome": "failed"})
        == 1
    )
