"""Agent cost: CPU and memory to turn flow records into aggregates, and bytes per report.

Records are real netlink datagrams in the module's format (encoded with the same message class
the agent decodes with), fed through the agent's parsing (`_records_in`), context lookup (CSV
prefix table) and aggregation, as the socket would deliver them. CPU is process time per
record, expressed as the share of one core at 1,000 and 10,000 records/s; memory is the growth
of peak RSS over the run.

    python -m benchmarks.agent [--seconds 10]
"""

from __future__ import annotations

import argparse
import datetime as dt
import resource
import tempfile
import time
from pathlib import Path

from benchmarks.common import write_result
from gemini_agent.aggregator import Aggregator
from gemini_agent.context import ContextResolver, Place, PrefixTable
from gemini_agent.sources import flow_from_record
from gemini_api.fusion_genl import CMD_FLOW_RECORD, _pack_theta, _records_in, fusion_msg
from gemini_api.theta import load_spec

FAMILY_ID = 0x1F
N_PREFIXES = 50
THETA_VERSIONS = 2


def datagram(i: int, theta: bytes) -> bytes:
    msg = fusion_msg()
    msg["cmd"] = CMD_FLOW_RECORD
    msg["version"] = 1
    msg["header"]["type"] = FAMILY_ID
    msg["attrs"] = [
        ("FUSION_ATTR_REC_FAMILY", 2),
        ("FUSION_ATTR_REC_SADDR", bytes([10, 0, 0, 2])),
        ("FUSION_ATTR_REC_DADDR", bytes([10, i % N_PREFIXES, (i // 7) % 250, 9])),
        ("FUSION_ATTR_REC_SPORT", 40000 + i % 20000),
        ("FUSION_ATTR_REC_DPORT", 443),
        ("FUSION_ATTR_REC_BYTES_ACKED", 50_000 + (i * 7919) % 5_000_000),
        ("FUSION_ATTR_REC_DURATION_US", 100_000 + (i * 104729) % 3_000_000),
        ("FUSION_ATTR_REC_RTT_AVG_US", 40_000 + i % 20_000),
        ("FUSION_ATTR_REC_RTT_MIN_US", 30_000),
        ("FUSION_ATTR_REC_RETRANS", i % 5),
        ("FUSION_ATTR_REC_SEGS_OUT", 100),
        ("FUSION_ATTR_REC_PROFILE_ID", 1),
        ("FUSION_ATTR_REC_PROFILE_VERSION", 1 + i % THETA_VERSIONS),
        ("FUSION_ATTR_REC_THETA", theta),
    ]
    msg.encode()
    return bytes(msg.data)


def resolver(tmp: Path) -> ContextResolver:
    rows = [f"10.{i}.0.0/16,region-{i % 10},isp-{i % 5}" for i in range(N_PREFIXES)]
    (tmp / "prefixes.csv").write_text("\n".join(rows) + "\n")
    return ContextResolver(Place("here", "own"), PrefixTable(tmp / "prefixes.csv"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10)
    args = ap.parse_args()
    spec = load_spec()
    theta = _pack_theta(spec.default())
    pool = [datagram(i, theta) for i in range(4096)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        agg = Aggregator(resolver(Path(tmp)), "bench-host", "cdn")
        now = dt.datetime.now(dt.UTC)
        for rate in (1_000, 10_000):
            n = int(rate * args.seconds)
            rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            t0 = time.process_time()
            for i in range(n):
                for rec in _records_in(pool[i % len(pool)], FAMILY_ID):
                    agg.add(flow_from_record(rec, now))
            cpu = time.process_time() - t0
            report = agg.close_interval(0, int(args.seconds * 1000))
            rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            share = cpu / n * rate
            rows.append(
                f"| {rate:,} | {n:,} | {cpu / n * 1e6:.1f} | **{share * 100:.1f} %** | "
                f"{(rss1 - rss0) / 1024:.1f} | {len(report.aggregates)} | "
                f"{len(report.SerializeToString()):,} |"
            )
            print(rows[-1], flush=True)
    write_result(
        "agent",
        f"python -m benchmarks.agent --seconds {args.seconds:g}",
        [
            f"Records from {N_PREFIXES} destination prefixes (10 regions × 5 ISPs) and "
            f"{THETA_VERSIONS} θ versions, {args.seconds:g} s of records per rate, one process.",
            "",
            "| records/s | records | CPU µs per record | share of one core at that rate | "
            "peak RSS growth MiB | aggregates in the report | report bytes |",
            "| --- | --- | --- | --- | --- | --- | --- |",
            *rows,
            "",
            "A report covers one interval for every context and θ version seen; at the default "
            "5-minute interval the bytes per minute are the report bytes / 5.",
        ],
    )


if __name__ == "__main__":
    main()
