"""Sustained report ingestion: many concurrent gRPC clients → Booster → PostgreSQL.

Client processes (not threads: they must not share Booster's interpreter) keep a fixed number
of ReportAggregates calls in flight with pre-built reports of 2 aggregates each, the typical
size of one host's 5-minute report. Every report is distinct, so every one is a real insert
plus trial upserts. Target: ≥ 2,000 reports/s on a 2-core machine.

    python -m benchmarks.ingest [--seconds 15] [--clients 2] [--inflight 64]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time

import numpy as np
from sqlalchemy import text

from gemini_booster import simulation as sim
from gemini_booster.models import PolicyCreate
from gemini_booster.storage import repository as repo

from .common import AGENT, start_booster, write_result

POLICY = "bench"


def build_reports(worker: int, n: int) -> list[bytes]:
    rng = np.random.default_rng(worker)
    thetas = [sim.ETHERNET, sim.SATELLITE]
    from gemini_api.theta import load_spec

    default = load_spec().default()
    proto = [sim.make_aggregate(c, default, 1.0, 30, rng) for c in thetas]
    out = []
    for i in range(n):
        req = sim.make_report(f"host-{worker}-{i % 5000}", POLICY, proto, 1_700_000_000_000 + i)
        out.append(req.SerializeToString())
    return out


def client(target: str, worker: int, seconds: float, inflight: int, q: mp.Queue) -> None:
    import grpc

    channel = grpc.insecure_channel(target)
    call = channel.unary_unary("/gemini.booster.v1.Booster/ReportAggregates")
    md = (("authorization", f"Bearer {AGENT}"),)
    reports = build_reports(worker, 60_000)
    q.put("ready")
    done = errors = 0
    latencies = []
    pending = []
    i = 0
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end or pending:
        while len(pending) < inflight and time.monotonic() < t_end:
            pending.append((time.monotonic(), call.future(reports[i], metadata=md, timeout=30)))
            i += 1
        t0, fut = pending.pop(0)
        try:
            fut.result()
            done += 1
            latencies.append(time.monotonic() - t0)
        except grpc.RpcError:
            errors += 1
    q.put((done, errors, latencies))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--inflight", type=int, default=64)
    args = ap.parse_args()
    server = start_booster()
    try:
        repo.create_policy(server.engine, PolicyCreate(name=POLICY), actor="bench")
        server.booster.reload_policies()
        target = f"127.0.0.1:{server.grpc_port}"
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        procs = [
            ctx.Process(target=client, args=(target, w, args.seconds, args.inflight, q))
            for w in range(args.clients)
        ]
        for p in procs:
            p.start()
        for _ in procs:
            assert q.get() == "ready"
        t0 = time.monotonic()
        results = [q.get() for _ in procs]
        wall = time.monotonic() - t0
        for p in procs:
            p.join()
        with server.engine.connect() as conn:
            stored = conn.execute(text("SELECT count(*) FROM reports")).scalar_one()
            aggs = conn.execute(text("SELECT count(*) FROM report_aggregates")).scalar_one()
        batches = server.booster.metrics.ingest_batch.collect()[0].samples
        n_batches = next(s.value for s in batches if s.name.endswith("_count"))
    finally:
        server.stop()
    done = sum(r[0] for r in results)
    errors = sum(r[1] for r in results)
    lat = np.asarray([x for r in results for x in r[2]]) * 1000
    write_result(
        "ingest",
        "python -m benchmarks.ingest " + " ".join(f"--{k} {v}" for k, v in vars(args).items()),
        [
            "| figure | value |",
            "| --- | --- |",
            f"| client processes × calls in flight | {args.clients} × {args.inflight} |",
            f"| reports acknowledged | {done} in {wall:.1f} s |",
            f"| **throughput** | **{done / wall:,.0f} reports/s** (target ≥ 2,000) |",
            f"| rows in PostgreSQL | {stored} reports, {aggs} aggregates (2 per report) |",
            f"| errors | {errors} |",
            f"| mean reports per transaction | {stored / max(n_batches, 1):.1f} |",
            f"| client latency p50 / p99 | {np.percentile(lat, 50):.1f} ms / "
            f"{np.percentile(lat, 99):.1f} ms |",
        ],
    )


if __name__ == "__main__":
    main()
