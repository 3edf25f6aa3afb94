"""Report size per host-minute: the dense sketches agents sent before against the compact ones
they send now, on reports built by the agent's own Aggregator (and AggregateBuilder) from a
realistic flow mix over an uneven fleet.

The fleet (seeded; each seed is ``--hosts`` hosts, one report per host-minute):

- flows per host-minute: log-normal, median 200, σ 1.1, within 5..30,000 (mean ≈ 370,
  p99 ≈ 2,600): a few busy hosts, many quiet ones;
- destination places per host-minute: 1 + Poisson(2.5), at most 12 (3–4 typical), the flows
  shared among them unevenly (Dirichlet(1)); 60 places (10 regions × 6 ISPs, CSV prefix table);
- per place: base RTT log-normal median 30 ms (σ 0.8), per-flow bottleneck log-normal median
  30 Mbit/s (σ 1.0 between places, 0.9 between flows), queueing delay log-normal median 1.5 ms
  (σ 0.8 between places, 1.2 between flows), a quarter of flows without queue;
- flow sizes: log-normal median 20 KB (σ 2.3), 3 % elephants of median 50 MB (σ 1.5); a flow
  lasts its slow-start rounds plus its bytes at its bottleneck, so short flows are slow and
  per-flow throughput spans four to six orders of magnitude;
- one host-minute in ten sees its θ change (two θ versions), one host in ten runs CUBIC as an
  experiment's baseline on one of its places (a ``cc`` aggregate).

Seeds 0–4 are the ones the compact encoding's stride, layout and span were chosen on; seeds
1000–1004 were printed beside them while choosing (so not held out from the choice); seeds
2000–2004 were first run for the record, after it. Each set is printed separately. For each
report the sizes are: old (dense v1 sketches, what agents sent before), new (compact v2, what
they send now), and for comparison the same bins in DDSketch's own protobuf (``ddsketch.pb``: a
sparse ``binCounts`` map, and its contiguous store, whichever is smaller per sketch). The
worst relative error of p10/p50/p90/p99 of throughput and queueing delay read back from the
compact sketches, against the exact per-aggregate quantiles, is printed with the bound it must
stay within.

    python -m benchmarks.report_size [--hosts 400] [--write]
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from ddsketch.pb import ddsketch_pb2 as ddpb
from google.protobuf.internal.encoder import _VarintBytes

from benchmarks.common import write_result
from gemini_agent.aggregator import Aggregator, Flow
from gemini_agent.context import ContextResolver, Place, PrefixTable
from gemini_api import sketch as sketches
from gemini_api.aggregate import FlowStats
from gemini_api.theta import load_spec
from gemini_api.v1 import booster_pb2 as pb

TUNED_SEEDS = (0, 1, 2, 3, 4)
SEEN_SEEDS = (1000, 1001, 1002, 1003, 1004)  # printed beside the tuned ones while choosing
HELD_OUT_SEEDS = (2000, 2001, 2002, 2003, 2004)
REGIONS = (
    "eu-west",
    "eu-central",
    "us-east",
    "us-west",
    "ap-southeast",
    "ap-northeast",
    "sa-east",
    "af-south",
    "me-central",
    "cn-east",
)
ISPS = ("deutsche-telekom", "comcast", "china-telecom", "vodafone", "orange", "reliance-jio")
N_PLACES = len(REGIONS) * len(ISPS)
SOURCE = Place("eu-west", "cdn-edge")
POLICY = "cdn"
QUANTILES = (0.1, 0.5, 0.9, 0.99)
INTERVAL_MS = 60_000
# The minute every report covers (the hour is part of the context).
ENDED = dt.datetime(2026, 11, 27, 14, 30, 30, tzinfo=dt.UTC)


def prefix_table(directory: Path) -> PrefixTable:
    rows = [
        f"10.{i}.0.0/16,{REGIONS[i % len(REGIONS)]},{ISPS[i // len(REGIONS)]}"
        for i in range(N_PLACES)
    ]
    path = directory / "prefixes.csv"
    path.write_text("\n".join(rows) + "\n")
    return PrefixTable(path)


@dataclass(frozen=True)
class HostMinute:
    host_id: str
    flows: list[Flow]
    ended: dt.datetime = ENDED

    def report(
        self, resolver: ContextResolver, *, dense: bool = False, completion: bool = False
    ) -> pb.ReportRequest:
        """The report the agent sends for this minute (dense: as agents before v2 did;
        completion: for a policy whose objective needs the completion sums)."""
        agg = Aggregator(resolver, self.host_id, POLICY)
        agg.completion_sums = completion
        for f in self.flows:
            agg.add(f)
        start = int(self.ended.timestamp() * 1000) // INTERVAL_MS * INTERVAL_MS
        req = agg.close_interval(start, start + INTERVAL_MS, dense_sketches=dense)
        assert req is not None
        return req


def host_minute(
    rng: np.random.Generator, host_id: str, theta: dict[str, int], ended: dt.datetime = ENDED
) -> HostMinute:
    """One host's finished flows in the minute of ``ended``, drawn from the mix in the module's
    doc."""
    n = int(np.clip(rng.lognormal(math.log(200), 1.1), 5, 30_000))
    k = min(1 + int(rng.poisson(2.5)), 12)
    places = rng.choice(N_PLACES, size=k, replace=False)
    which = rng.choice(k, size=n, p=rng.dirichlet(np.ones(k)))
    base_rtt_us = rng.lognormal(math.log(30_000), 0.8, size=k)
    capacity = rng.lognormal(math.log(30), 1.0, size=k)  # Mbit/s
    queue_ms = rng.lognormal(math.log(1.5), 0.8, size=k)
    size = rng.lognormal(math.log(20_000), 2.3, size=n)
    elephant = rng.random(n) < 0.03
    size[elephant] = rng.lognormal(math.log(50e6), 1.5, size=int(elephant.sum()))
    size = np.maximum(size, 200)
    mbps = capacity[which] * rng.lognormal(0, 0.9, size=n)
    rtt = base_rtt_us[which] * rng.lognormal(0, 0.1, size=n)
    rounds = np.ceil(np.log2(size / (10 * 1448) + 1)) + 1
    duration = rtt * rounds + size * 8 / mbps
    queue_us = rng.lognormal(np.log(queue_ms[which] * 1000), 1.2)
    queue_us[rng.random(n) < 0.25] = 0
    version = np.ones(n, dtype=int)
    if rng.random() < 0.1:  # θ changed during the minute
        version[rng.random(n) < rng.random()] = 2
    cc = np.full(n, "", dtype=object)
    if rng.random() < 0.1:  # an experiment's baseline arm on one route
        cc[which == 0] = "cubic"
    flows = [
        Flow(
            dst=f"10.{places[which[i]]}.{i % 250}.7",
            stats=FlowStats(int(size[i]), int(duration[i]), int(rtt[i] + queue_us[i]), int(rtt[i])),
            theta={} if cc[i] else theta,
            theta_version=0 if cc[i] else int(version[i]),
            ended=ended,
            cc=str(cc[i]),
        )
        for i in range(n)
    ]
    return HostMinute(host_id, flows, ended)


def fleet(seed: int, hosts: int) -> Iterator[HostMinute]:
    rng = np.random.default_rng(seed)
    theta = load_spec().default()
    for h in range(hosts):
        yield host_minute(rng, f"edge-{seed}-{h:05d}.cdn.example.net", theta)


def _field_size(n: int) -> int:
    """Bytes of an embedded message of ``n`` bytes in field 10 or 15 (tag, length, body)."""
    return 1 + len(_VarintBytes(n)) + n if n else 0


def ddsketch_own_size(msg: pb.QuantileSketch) -> int:
    """The compact sketch's bins in DDSketch's own protobuf (ddsketch.pb: gamma^5 mapping),
    with whichever of its two stores (sparse map, contiguous doubles) is smaller."""
    if msg.ByteSize() == 0:
        return 0
    bins = sketches.compact_bins(msg)
    keys = np.asarray([b for b, _ in bins], dtype=np.int64)
    counts = [float(c) for _, c in bins]
    mapping = ddpb.IndexMapping(gamma=sketches._BIN_GAMMA)
    sparse = ddpb.Store(binCounts=dict(zip(keys.tolist(), counts, strict=True)))
    dense = ddpb.Store()
    if len(keys):
        full = np.zeros(int(keys[-1] - keys[0] + 1))
        full[keys - keys[0]] = counts
        dense = ddpb.Store(contiguousBinCounts=full.tolist(), contiguousBinIndexOffset=int(keys[0]))
    store = min(sparse, dense, key=lambda s: s.ByteSize())
    return ddpb.DDSketch(mapping=mapping, positiveValues=store, zeroCount=msg.zero_count).ByteSize()


def _group_key(f: Flow, resolver: ContextResolver) -> tuple[str, str, str, int]:
    place = resolver.place(f.dst)
    return (f.cc, place.region, place.isp, f.theta_version)


def quantile_errors(
    minute: HostMinute, req: pb.ReportRequest, resolver: ContextResolver
) -> list[float]:
    """Relative errors of QUANTILES of each aggregate's compact sketches, read back as Booster
    reads them, against the exact quantiles of its flows (the sketch's rank rule)."""
    values: dict[tuple[str, str, str, int], tuple[list[float], list[float]]] = {}
    for f in minute.flows:
        if f.stats.usable:
            tpt, delay = values.setdefault(_group_key(f, resolver), ([], []))
            tpt.append(f.stats.throughput_mbps)
            delay.append(f.stats.queue_delay_ms)
    errors = []
    for a in req.aggregates:
        key = (a.cc, a.context.dst_region, a.context.dst_isp, a.theta_version)
        for msg, exact in zip(
            (a.throughput_sketch, a.queue_delay_sketch), values[key], strict=True
        ):
            got = sketches.from_proto(msg)
            xs = sorted(exact)
            for q in QUANTILES:
                want = xs[math.floor(q * (len(xs) - 1))]
                est = got.get_quantile_value(q)
                assert est is not None
                errors.append(abs(est - want) / want if want else abs(est))
    return errors


@dataclass
class Sizes:
    old: list[int]
    new: list[int]
    own: list[int]
    flows: list[int]
    aggregates: list[int]
    worst_error: float = 0.0


def measure(
    seeds: tuple[int, ...], hosts: int, resolver: ContextResolver, completion: bool = False
) -> Sizes:
    out = Sizes([], [], [], [], [])
    for seed in seeds:
        for minute in fleet(seed, hosts):
            new = minute.report(resolver, completion=completion)
            old = minute.report(resolver, dense=True, completion=completion)
            assert len(new.aggregates) == len(old.aggregates)
            own = new.ByteSize()
            for a in new.aggregates:
                for msg in (a.throughput_sketch, a.queue_delay_sketch):
                    own += _field_size(ddsketch_own_size(msg)) - _field_size(msg.ByteSize())
            out.old.append(old.ByteSize())
            out.new.append(new.ByteSize())
            out.own.append(own)
            out.flows.append(len(minute.flows))
            out.aggregates.append(len(new.aggregates))
            out.worst_error = max(out.worst_error, *quantile_errors(minute, new, resolver))
    return out


def _stats(xs: list[int]) -> str:
    a = np.asarray(xs)
    return f"{a.mean():,.0f} / {np.percentile(a, 50):,.0f} / {np.percentile(a, 99):,.0f}"


def table(rows: list[tuple[str, Sizes]]) -> list[str]:
    lines = [
        "| seeds | host-minutes | flows mean / p99 | aggregates mean | old (dense) B mean / p50"
        " / p99 | new (compact) B mean / p50 / p99 | DDSketch's own protobuf B mean / p50 / p99"
        " | new ÷ old (mean) | worst quantile error (bound) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, s in rows:
        lines.append(
            f"| {name} | {len(s.new):,} | {np.mean(s.flows):,.0f} / "
            f"{np.percentile(s.flows, 99):,.0f} | {np.mean(s.aggregates):.2f} | "
            f"{_stats(s.old)} | {_stats(s.new)} | {_stats(s.own)} | "
            f"{np.mean(s.new) / np.mean(s.old):.3f} | {s.worst_error:.2%} "
            f"({sketches.COMPACT_READ_ERROR:.2%}) |"
        )
    return lines


def by_load(s: Sizes) -> list[str]:
    """New report size by how busy the host was."""
    flows, new = np.asarray(s.flows), np.asarray(s.new)
    lines = [
        "| flows in the minute | host-minutes | new B mean / p99 | old B mean / p99 |",
        "| --- | --- | --- | --- |",
    ]
    old = np.asarray(s.old)
    typical = np.isin(np.asarray(s.aggregates), (3, 4))
    lines.append(
        f"| any, 3–4 aggregates (a typical host) | {int(typical.sum()):,} | "
        f"{new[typical].mean():,.0f} / {np.percentile(new[typical], 99):,.0f} | "
        f"{old[typical].mean():,.0f} / {np.percentile(old[typical], 99):,.0f} |"
    )
    for lo, hi in ((0, 100), (100, 300), (300, 1000), (1000, 3000), (3000, 10**9)):
        sel = (flows >= lo) & (flows < hi)
        if sel.any():
            label = f"{lo:,}–{hi - 1:,}" if hi < 10**9 else f"≥ {lo:,}"
            lines.append(
                f"| {label} | {int(sel.sum()):,} | {new[sel].mean():,.0f} / "
                f"{np.percentile(new[sel], 99):,.0f} | {old[sel].mean():,.0f} / "
                f"{np.percentile(old[sel], 99):,.0f} |"
            )
    return lines


NOTES = [
    "Encoding (gemini_api.sketch, booster.proto QuantileSketch v2): the agent's 1 % DDSketch "
    "sent as bins of 5 keys (γ⁵: relative accuracy 4.996 %; 5.12 % once Booster reads a bin "
    "back onto the middle key of its 1 % mapping, where old and new sketches merge), only the "
    "bins that hold flows, as a bitmap from the lowest bin plus whole-flow counts as varints, "
    "over at most 128 bins (5.5 orders of magnitude; lower bins fold into the lowest). The "
    "worst quantile error column is p10/p50/p90/p99 of every aggregate's throughput and "
    "queueing delay read back as Booster reads them, against the exact quantiles of its flows.",
    "",
    "Chosen on the tuned seeds: at 1 % (stride 1) even sparse bins came to about 1.3 KB mean; "
    "key steps as varints (2 bytes a bin) at 5 % to about 1,020 B; the bitmap to the figures "
    "above. DDSketch's own protobuf (ddsketch.pb, same 5 % bins, the smaller of its sparse map "
    "and its contiguous doubles per sketch) is about 3.4× the compact form. Seeds 1000–1004 "
    "were printed beside the tuned ones during that choice; 2000–2004 first ran for this record.",
    "",
    "Reports here cover one minute (the issue's one report per host per minute); the agent's "
    "default interval is 5 minutes, whose reports carry the same contexts with more flows each, "
    "so fewer bytes per host-minute.",
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=400, help="hosts per seed")
    ap.add_argument("--write", action="store_true", help="record benchmarks/results/")
    ap.add_argument(
        "--completion-sums",
        action="store_true",
        help="reports of a policy whose objective is completion time (they carry its sums)",
    )
    args = ap.parse_args()
    c = args.completion_sums
    with tempfile.TemporaryDirectory() as tmp:
        resolver = ContextResolver(SOURCE, prefix_table(Path(tmp)))
        tuned = measure(TUNED_SEEDS, args.hosts, resolver, c)
        seen = measure(SEEN_SEEDS, args.hosts, resolver, c)
        held = measure(HELD_OUT_SEEDS, args.hosts, resolver, c)
    lines = [
        "Bytes per report of one host-minute (serialized ReportRequest), built by the agent's "
        "Aggregator from the flow mix in benchmarks/report_size.py's doc. Budget: mean ≤ 1,024 "
        "and p99 ≤ 4,096 bytes per host-minute.",
        "",
        *table(
            [
                (f"tuned {TUNED_SEEDS[0]}–{TUNED_SEEDS[-1]}", tuned),
                (f"seen while tuning {SEEN_SEEDS[0]}–{SEEN_SEEDS[-1]}", seen),
                (f"held out {HELD_OUT_SEEDS[0]}–{HELD_OUT_SEEDS[-1]}", held),
            ]
        ),
        "",
        "Held-out seeds by load:",
        "",
        *by_load(held),
        "",
        *NOTES,
    ]
    command = f"python -m benchmarks.report_size --hosts {args.hosts}"
    if args.write:
        write_result("report-size", command, lines)
    else:
        print("\n".join(lines))


if __name__ == "__main__":
    main()
