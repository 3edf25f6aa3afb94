"""Checks on every received report, all before anything is stored.

A report is accepted whole or not at all, so every check runs first and every problem is named
with its field path (``aggregates[3].theta.mult_decrease: …``). Every number is bounded by what
storage holds and what physics allows, so that a bad report is refused here, by name, and never
fails (or poisons) the transaction that would store it: counts fit the database's integers with
room to add up, per-flow values are physically possible, sums of squares and products are within
what Cauchy–Schwarz allows for non-negative values, slow flows can't outnumber flows, size
buckets add up to the flow count, and an interval lies between an agent's spool horizon and
Booster's clock.

Cost: every report passes here, so the common case (a well-formed report) takes a fast path per
check, a few comparisons over the message's fields, and only a report that fails it pays for the
walk that names each problem. θ and contexts repeat across aggregates and reports (hosts run the
few θ Booster hands out, to the same destinations), so their checks are remembered per distinct
message (``_Memo``). Sketches are checked by C-level reductions over their fields, never by a
Python loop per bucket (gemini_api.sketch.sketch_errors). benchmarks/validation.py measures it.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Generic, TypeVar

from google.protobuf import unknown_fields
from google.protobuf.message import Message

from gemini_api import datapaths
from gemini_api import sketch as sketches
from gemini_api.sums import completion_errors
from gemini_api.theta import ThetaSpec
from gemini_api.v1 import booster_pb2 as pb

from ..domain import ContextKey, FlowSums
from ..models import Policy
from ..storage.ingest import AggregateRow, ReportRow

MAX_ID_LEN = 128
MAX_LABEL_LEN = 64
MAX_INTERVAL_MS = 24 * 3600 * 1000
SIZE_BUCKETS = 5
REL_TOL = 1e-6
# Flows in one aggregate: far above any host's flows per interval, and small enough that the
# running sums in ``trials`` (signed 64-bit) take billions of such reports without overflow.
MAX_FLOWS_PER_AGGREGATE = 2**32
# theta_version is stored as a signed 64-bit integer.
THETA_VERSION_LIMIT = 2**63
# Per-flow values no real flow reaches: 1 Tbit/s of throughput, ~17 minutes of queueing.
MAX_THROUGHPUT_MBPS = 1e6
MAX_QUEUE_DELAY_MS = 1e6
# An interval may end this far ahead of Booster's clock (agents' clocks drift)…
MAX_CLOCK_SKEW_MS = 10 * 60 * 1000
# …and start this far behind it (an agent's spool keeps reports through an outage).
MAX_REPORT_AGE_MS = 7 * 24 * 3600 * 1000
# An aggregate's sketches, each absent (an older agent's delay) or one weight per flow.
SKETCH_FIELDS = ("throughput_sketch", "queue_delay_sketch")
CC_NAME = re.compile(r"[a-z][a-z0-9_]{0,15}")  # TCP_CA_NAME_MAX is 16 with the NUL
# Distinct θ and context messages remembered (then forgotten all at once, and learnt again).
MEMO_SIZE = 65_536

K = TypeVar("K")
V = TypeVar("V")


class _Memo(Generic[K, V]):
    """What a check found for each distinct message (by its canonical bytes): its result, and
    its problems as field paths relative to the message. A bounded dict; concurrent callers at
    worst compute one entry twice."""

    def __init__(self, size: int = MEMO_SIZE) -> None:
        self.size = size
        self.found: dict[K, tuple[V, tuple[str, ...]]] = {}

    def get(self, key: K, check: Callable[[list[str]], V]) -> tuple[V, tuple[str, ...]]:
        hit = self.found.get(key)
        if hit is None:
            problems: list[str] = []
            hit = (check(problems), tuple(problems))
            if len(self.found) >= self.size:
                self.found.clear()
            self.found[key] = hit
        return hit


_CONTEXTS: _Memo[bytes, ContextKey] = _Memo()
_THETAS: _Memo[tuple[str, bytes], str | None] = _Memo()


class InvalidReport(ValueError):
    """Every problem found, one per line, each starting with its field path."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems

    @property
    def reason(self) -> str:
        return "unknown_policy" if self.problems[0].startswith("policy:") else "invalid"


def unknown_field_paths(msg: Message, path: str = "") -> list[str]:
    """Field numbers the schema does not know, anywhere in ``msg`` (e.g. from a newer client)."""
    unknown = unknown_fields.UnknownFieldSet(msg)
    found = [
        f"{path or 'request'}: unknown field number {unknown[i].field_number}"
        for i in range(len(unknown))
    ]
    for field, value in msg.ListFields():
        if field.message_type is None:
            continue
        children = value if field.is_repeated else [value]
        for i, child in enumerate(children):
            sub = f"{path}.{field.name}" if path else field.name
            found += unknown_field_paths(child, f"{sub}[{i}]" if field.is_repeated else sub)
    return found


def has_unknown_fields(req: Message, raw: bytes) -> bool:
    """Cheap test first: a message without unknown fields re-encodes to as many bytes once they
    are dropped. Only a size change (unknown fields, or a valid but non-canonical encoding) pays
    for the walk that names their paths."""
    probe = type(req)()
    probe.CopyFrom(req)
    probe.DiscardUnknownFields()
    return probe.ByteSize() != len(raw)


def _label(value: str, path: str, problems: list[str]) -> None:
    if not value:
        problems.append(f"{path}: empty (use 'unknown')")
    elif len(value) > MAX_LABEL_LEN or not value.isprintable():
        problems.append(f"{path}: not a printable label of at most {MAX_LABEL_LEN} characters")


def context_key(ctx: pb.Context, path: str, problems: list[str]) -> ContextKey:
    key, found = _CONTEXTS.get(
        ctx.SerializeToString(deterministic=True), lambda found: _context_key(ctx, found)
    )
    if found:
        problems += [f"{path}{p}" for p in found]
    return key


def _context_key(ctx: pb.Context, problems: list[str]) -> ContextKey:
    for name in ("src_region", "src_isp", "dst_region", "dst_isp"):
        _label(getattr(ctx, name), f".{name}", problems)
    if ctx.hour > 23:
        problems.append(f".hour: {ctx.hour} is not an hour of the day (0..23)")
    return ContextKey(ctx.src_region, ctx.src_isp, ctx.dst_region, ctx.dst_isp, ctx.hour)


def _at_most(bound: float) -> float:
    """``bound`` with room for rounding in sums computed in floating point."""
    return bound * (1 + REL_TOL) + 1e-9


def _moments(a: pb.Aggregate, path: str, problems: list[str]) -> None:
    """Sums over flows of non-negative per-flow values x ≤ MAX: Σx ≤ n·MAX, Σx² ≤ n·MAX²,
    (Σx)²/n ≤ Σx² ≤ (Σx)², and Σxy ≤ √(Σx²·Σy²) (Cauchy–Schwarz)."""
    n = a.flow_count
    sx, sxx = a.throughput_mbps_sum, a.throughput_mbps_sq_sum
    sy, syy, sxy = a.queue_delay_ms_sum, a.queue_delay_ms_sq_sum, a.throughput_queue_delay_sum
    slack, lt, ld = 1 + REL_TOL, MAX_THROUGHPUT_MBPS, MAX_QUEUE_DELAY_MS
    # The same bounds as below in one expression (NaN fails every comparison); a report that
    # fails it is walked below, which names each problem.
    if (
        1 <= n <= MAX_FLOWS_PER_AGGREGATE
        and 0 <= sx <= n * lt * slack + 1e-9
        and 0 <= sxx <= n * lt * lt * slack + 1e-9
        and sxx * slack + 1e-9 >= sx * sx / n
        and sxx <= sx * sx * slack + 1e-9
        and 0 <= sy <= n * ld * slack + 1e-9
        and 0 <= syy <= n * ld * ld * slack + 1e-9
        and syy * slack + 1e-9 >= sy * sy / n
        and syy <= sy * sy * slack + 1e-9
        and 0 <= sxy <= math.sqrt(sxx * syy) * slack + 1e-9
    ):
        return
    stats = {
        "throughput_mbps_sum": a.throughput_mbps_sum,
        "throughput_mbps_sq_sum": a.throughput_mbps_sq_sum,
        "queue_delay_ms_sum": a.queue_delay_ms_sum,
        "queue_delay_ms_sq_sum": a.queue_delay_ms_sq_sum,
        "throughput_queue_delay_sum": a.throughput_queue_delay_sum,
    }
    bad = False
    for name, v in stats.items():
        if not math.isfinite(v):
            problems.append(f"{path}.{name}: {v} is not finite")
            bad = True
        elif v < 0:
            problems.append(f"{path}.{name}: {v} is negative")
            bad = True
    if bad or not 1 <= n <= MAX_FLOWS_PER_AGGREGATE:
        return
    for total, squares, limit, unit in (
        ("throughput_mbps_sum", "throughput_mbps_sq_sum", MAX_THROUGHPUT_MBPS, "Mbit/s"),
        ("queue_delay_ms_sum", "queue_delay_ms_sq_sum", MAX_QUEUE_DELAY_MS, "ms"),
    ):
        sx, sxx = stats[total], stats[squares]
        found = len(problems)
        if sx > _at_most(n * limit):
            problems.append(f"{path}.{total}: {sx:g} > flow_count × {limit:g} {unit} per flow")
        if sxx > _at_most(n * limit * limit):
            problems.append(
                f"{path}.{squares}: {sxx:g} > flow_count × ({limit:g} {unit})² per flow"
            )
        if len(problems) == found and sxx * (1 + REL_TOL) + 1e-9 < sx**2 / n:
            problems.append(f"{path}.{squares}: smaller than ({total})²/flow_count allows")
        if len(problems) == found and sxx > _at_most(sx**2):
            problems.append(f"{path}.{squares}: larger than ({total})² allows")
        bad = bad or len(problems) > found
    if bad:
        return
    bound = math.sqrt(stats["throughput_mbps_sq_sum"] * stats["queue_delay_ms_sq_sum"])
    if stats["throughput_queue_delay_sum"] > _at_most(bound):
        problems.append(
            "{}.throughput_queue_delay_sum: {:g} > √(throughput_mbps_sq_sum × "
            "queue_delay_ms_sq_sum) = {:g} (Cauchy–Schwarz)".format(
                path, stats["throughput_queue_delay_sum"], bound
            )
        )


def _counts(a: pb.Aggregate, path: str, problems: list[str]) -> tuple[int, ...]:
    """Flow, slow-flow and size-bucket counts within the flow count and storage's integers."""
    n = a.flow_count
    buckets = tuple(a.size_bucket_counts)
    if (
        1 <= n <= MAX_FLOWS_PER_AGGREGATE
        and a.theta_version < THETA_VERSION_LIMIT
        and a.slow_flow_count <= n
        and (not buckets or (len(buckets) == SIZE_BUCKETS and sum(buckets) == n))
    ):
        return buckets  # unsigned counts adding up to n: none above it
    if n == 0:
        problems.append(f"{path}.flow_count: must be at least 1")
    elif n > MAX_FLOWS_PER_AGGREGATE:
        problems.append(f"{path}.flow_count: {n} > {MAX_FLOWS_PER_AGGREGATE} (2^32) per aggregate")
    if a.theta_version >= THETA_VERSION_LIMIT:
        problems.append(f"{path}.theta_version: {a.theta_version} ≥ 2^63")
    if a.slow_flow_count > n:
        problems.append(f"{path}.slow_flow_count: {a.slow_flow_count} > flow_count {n}")
    over = [i for i, b in enumerate(buckets) if b > n]
    if over:
        i = over[0]
        problems.append(f"{path}.size_bucket_counts[{i}]: {buckets[i]} > flow_count {n}")
    elif buckets and (len(buckets) != SIZE_BUCKETS or sum(buckets) != n):
        problems.append(
            f"{path}.size_bucket_counts: need {SIZE_BUCKETS} counts adding up to flow_count"
        )
    return buckets


def _theta_key(a: pb.Aggregate, path: str, policy: Policy, problems: list[str]) -> str | None:
    """The tuned flows' θ, checked against Θ' (the kernel's limits); a baseline's is ''.
    θ comes in the field its datapath's ``message`` names (api/gemini_api/datapaths.py):
    ``theta`` for Fusion, ``datapath_theta`` for any other.

    Not against the policy's current region: flows that ran under a θ Booster handed out
    before the operator narrowed the region are real measurements, and refusing them would
    set aside every host's next report whole (its other aggregates and baselines with it).
    They are stored, and the planner leaves θ outside the region out of its model
    (``policy.history``) for as long as they are outside it."""
    if a.cc:
        problem = _baseline_problem(a, policy)
        if problem:
            problems.append(f"{path}.{problem}")
        return ""
    spec = policy.spec
    if datapaths.datapath(policy.datapath).message is datapaths.Message.THETA:
        own, other = "theta", "datapath_theta"
    else:
        own, other = "datapath_theta", "theta"
    if not _carries_only(a, own, other, path, spec, problems):
        return None
    msg = getattr(a, own)

    def check(found: list[str]) -> str | None:
        if own == "theta":
            theta = _theta_message(msg, spec, found)
        else:
            theta = _datapath_theta(msg, spec, found)
        if theta is None:
            return None
        found += [f".theta.{v}" for v in spec.violations(theta, spec.limits)]
        return spec.key(theta)

    key, found = _THETAS.get((spec.datapath, msg.SerializeToString(deterministic=True)), check)
    if found:
        problems += [f"{path}{p}" for p in found]
    return key


def _baseline_problem(a: pb.Aggregate, policy: Policy) -> str | None:
    """What is wrong with a baseline aggregate (``cc`` set: flows not run under a θ the agent
    set), if anything. The policy's own CC is a baseline only for a host-wide datapath (CUBIC
    at the kernel's defaults, e.g. an experiment's default arm); Fusion's flow records always
    name the θ they ran, so its flows leave cc empty."""
    if not CC_NAME.fullmatch(a.cc):
        return f"cc: {a.cc[:32]!r} is not a kernel congestion-control name"
    own = a.cc == policy.target_cc
    records_theta = datapaths.datapath(policy.datapath).records is datapaths.Records.FLOW_RECORDS
    if own and (records_theta or a.HasField("datapath_theta")):
        return f"cc: {a.cc!r} flows leave cc empty and carry theta"
    if a.HasField("theta") or a.HasField("datapath_theta"):
        return f"theta: a baseline ({a.cc}) aggregate carries no theta"
    return None


def _carries_only(
    a: pb.Aggregate, own: str, other: str, path: str, spec: ThetaSpec, problems: list[str]
) -> bool:
    """A policy's own flows carry θ in the field of its datapath (``theta`` for Fusion,
    ``datapath_theta`` for any other) and not in the other one."""
    if a.HasField(other):
        problems.append(f"{path}.{other}: a {spec.datapath} policy's flows carry {own}")
        return False
    if not a.HasField(own):
        problems.append(f"{path}.{own}: missing")
        return False
    return True


def _theta_message(msg: pb.Theta, spec: ThetaSpec, problems: list[str]) -> dict[str, int] | None:
    """Fusion's θ; problems relative to the aggregate (``.theta.…``)."""
    missing = [name for name in spec.names if not msg.HasField(name)]
    if missing:
        problems += [f".theta.{name}: missing" for name in missing]
        return None
    return spec.from_message(msg)


def _datapath_theta(
    got: pb.DatapathTheta, spec: ThetaSpec, problems: list[str]
) -> dict[str, int] | None:
    """Another datapath's θ; problems relative to the aggregate (``.datapath_theta.…``)."""
    where = ".datapath_theta"
    if got.datapath != spec.datapath:
        problems.append(
            f"{where}.datapath: {got.datapath[:32]!r}, the policy tunes {spec.datapath!r}"
        )
        return None
    values = dict(got.values)
    unknown = sorted(set(values) - set(spec.names))
    problems += [f"{where}.values.{name[:32]}: not a {spec.datapath} parameter" for name in unknown]
    missing = [name for name in spec.names if name not in values]
    problems += [f"{where}.values.{name}: missing" for name in missing]
    if unknown or missing:
        return None
    return {name: values[name] for name in spec.names}


def aggregate_row(
    a: pb.Aggregate, path: str, spec: ThetaSpec, policy: Policy, problems: list[str]
) -> AggregateRow | None:
    start = len(problems)
    theta_key = _theta_key(a, path, policy, problems)
    if not a.HasField("context"):
        problems.append(f"{path}.context: missing")
    ctx = context_key(a.context, f"{path}.context", problems)
    buckets = _counts(a, path, problems)
    _moments(a, path, problems)
    n, tpt, delay = a.flow_count, a.throughput_sketch, a.queue_delay_sketch
    for name, msg in zip(SKETCH_FIELDS, (tpt, delay), strict=True):
        found = sketches.sketch_errors(msg, n)
        if found:
            problems += [f"{path}.{name}: {e}" for e in found]
    problems += [f"{path}.completion.{e}" for e in completion_errors(a)]
    if len(problems) > start or theta_key is None:
        return None
    return AggregateRow(
        context=ctx,
        cc=a.cc,
        theta_key=theta_key,
        theta_version=a.theta_version,
        sums=FlowSums.of_message(a),
        slow_flows=a.slow_flow_count,
        size_buckets=buckets or (0,) * SIZE_BUCKETS,
        sketch=tpt.SerializeToString(deterministic=True),
        delay_sketch=delay.SerializeToString(deterministic=True),
    )


def _identity(req: pb.ReportRequest, max_aggregates: int, now_ms: int, problems: list[str]) -> None:
    for name in ("report_id", "host_id"):
        v = getattr(req, name)
        if not v or len(v) > MAX_ID_LEN or not v.isprintable():
            problems.append(f"{name}: need a printable id of 1..{MAX_ID_LEN} characters")
    s, e = req.interval_start_unix_ms, req.interval_end_unix_ms
    if not 0 < s < e or e - s > MAX_INTERVAL_MS:
        problems.append("interval_end_unix_ms: interval must be positive, end after start, ≤ 1 day")
    # Relative to Booster's clock, which also keeps both ends far inside what a timestamp can
    # hold (year 9999): the datetimes are only built for reports that pass.
    if e > now_ms + MAX_CLOCK_SKEW_MS:
        problems.append(
            f"interval_end_unix_ms: {e} is more than {MAX_CLOCK_SKEW_MS // 60_000} minutes "
            "ahead of Booster's clock"
        )
    if s < now_ms - MAX_REPORT_AGE_MS:
        problems.append(
            f"interval_start_unix_ms: {s} is more than {MAX_REPORT_AGE_MS // 86_400_000} days "
            "before Booster's clock"
        )
    if not req.aggregates:
        problems.append("aggregates: empty report")
    elif len(req.aggregates) > max_aggregates:
        problems.append(f"aggregates: {len(req.aggregates)} > {max_aggregates} per report")


def report_row(
    raw: bytes,
    req: pb.ReportRequest,
    spec: ThetaSpec,
    policies: dict[str, Policy],
    max_aggregates: int,
    now_ms: int | None = None,
) -> ReportRow:
    """The checked report ready to store, or InvalidReport naming every problem.

    The digest that tells a retry from a reused key covers the parsed report in canonical
    encoding, not the bytes received: the same report encoded differently (another field
    order, unpacked repeated fields) is the same report. (Unknown fields, which canonical
    encoding would drop, are refused above.)
    """
    problems = unknown_field_paths(req) if has_unknown_fields(req, raw) else []
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    _identity(req, max_aggregates, now_ms, problems)
    policy = policies.get(req.policy)
    if policy is None:
        raise InvalidReport([f"policy: unknown policy {req.policy!r}", *problems])
    rows = [
        aggregate_row(a, f"aggregates[{i}]", spec, policy, problems)
        for i, a in enumerate(req.aggregates[:max_aggregates])
    ]
    if problems:
        raise InvalidReport(problems)
    return ReportRow(
        report_id=req.report_id,
        digest=hashlib.sha256(req.SerializeToString(deterministic=True)).digest(),
        host_id=req.host_id,
        policy_id=policy.id,
        policy_name=policy.name,
        max_contexts=policy.max_contexts,
        trial_bucket_hours=policy.trial_bucket_hours,
        target_cc=policy.target_cc,
        interval_start=datetime.fromtimestamp(req.interval_start_unix_ms / 1000, UTC),
        interval_end=datetime.fromtimestamp(req.interval_end_unix_ms / 1000, UTC),
        aggregates=tuple(r for r in rows if r is not None),
    )
