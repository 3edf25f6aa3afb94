"""Sustained report ingestion: many concurrent gRPC clients → Booster → PostgreSQL.

The load comes from ``benchmarks/loadgen`` (Go, grpc-go), which keeps ``--concurrency`` calls
in flight over ``--connections`` connections. Python gRPC clients cost about as much CPU per
call as the server under test, and on a two-core machine they would take their share from
Booster; the Go client sends pre-built bytes and costs little. Every call is a distinct report
of 2 aggregates, the typical size of one host's 5-minute report, so every one is a real insert
(appended: the refit owner folds the aggregates into the trial sums later, storage/fold.py);
the rows in PostgreSQL are counted afterwards. Target: ≥ 2,000 reports/s.

    python -m benchmarks.ingest [--seconds 15] [--concurrency 128] [--connections 16]
                                [--processes 2]

Needs Go (the load generator is built with ``go build`` on first use).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
from google.protobuf.internal.encoder import _VarintBytes
from sqlalchemy import text

from gemini_api.theta import load_spec
from gemini_booster import simulation as sim
from gemini_booster.models import PolicyCreate
from gemini_booster.storage import policies as policy_store

from .common import AGENT, start_booster, write_result

POLICY = "bench"
MAX_RATE = 5000  # reports per second the pre-built set covers before any would repeat
LOADGEN = Path(__file__).parent / "loadgen"


def loadgen_binary() -> Path:
    out = Path(tempfile.gettempdir()) / "gemini-loadgen"
    subprocess.run(["go", "build", "-o", str(out), "."], cwd=LOADGEN, check=True)
    return out


def reports(n: int) -> bytes:
    """``n`` distinct serialized reports, each prefixed with its length."""
    rng = np.random.default_rng(0)
    default = load_spec().default()
    aggs = [sim.make_aggregate(c, default, 1.0, 30, rng) for c in (sim.ETHERNET, sim.SATELLITE)]
    out = bytearray()
    for i in range(n):
        req = sim.make_report(f"host-{i % 5000}", POLICY, aggs)
        body = req.SerializeToString()
        out += _VarintBytes(len(body)) + body
    return bytes(out)


def run_load(binary: Path, target: str, args: argparse.Namespace) -> dict:
    with tempfile.NamedTemporaryFile("wb", suffix=".bin") as data:
        data.write(reports(args.seconds * MAX_RATE))
        data.flush()
        out = subprocess.run(
            [
                str(binary),
                f"-target={target}",
                f"-requests={data.name}",
                f"-concurrency={args.concurrency}",
                f"-connections={args.connections}",
                f"-duration={args.seconds}s",
                f"-token={AGENT}",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    return json.loads(out)


def stored_rows(server) -> tuple[int, int]:
    with server.engine.connect() as conn:
        return (
            conn.execute(text("SELECT count(*) FROM reports")).scalar_one(),
            conn.execute(text("SELECT count(*) FROM report_aggregates")).scalar_one(),
        )


def transactions(server) -> float:
    families = server.booster.metrics.families()
    batches = next(f for f in families if f.name == "gemini_booster_ingest_batch_reports")
    return next(s.value for s in batches.samples if s.name.endswith("_count"))


def measure(server, binary: Path, args: argparse.Namespace) -> dict:
    """One run: rows and transactions counted as differences, so runs can share a Booster."""
    rows0, aggs0 = stored_rows(server)
    tx0 = transactions(server)
    result = run_load(binary, f"127.0.0.1:{server.grpc_port}", args)
    time.sleep(2.5)  # two syncs, so the fronts' metrics are in
    rows, aggs = stored_rows(server)
    result.update(
        stored=rows - rows0, aggregates=aggs - aggs0, transactions=transactions(server) - tx0
    )
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=15)
    ap.add_argument("--concurrency", type=int, default=128)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--processes", type=int, default=2, help="Booster's grpc_processes")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    binary = loadgen_binary()
    server = start_booster(grpc_processes=args.processes)
    try:
        policy_store.create_policy(server.engine, PolicyCreate(name=POLICY), actor="bench")
        server.booster.reload_policies()
        time.sleep(2.5)  # front processes pick the new policy up at their next sync
        runs = [measure(server, binary, args) for _ in range(args.runs)]
    finally:
        server.stop()
    rates = sorted(r["stored"] / r["seconds"] for r in runs)
    lines = [
        f"Load: `benchmarks/loadgen` (Go), {args.concurrency} calls in flight over "
        f"{args.connections} connections; Booster with {args.processes} process(es) on the gRPC "
        f"port; {os.cpu_count()} cores shared by the load generator, Booster and PostgreSQL. "
        "Throughput is rows stored in PostgreSQL ÷ wall time.",
        "",
        f"**Median {rates[len(rates) // 2]:,.0f} reports/s** over {len(runs)} runs "
        f"(range {rates[0]:,.0f}–{rates[-1]:,.0f}; target ≥ 2,000).",
        "",
        "| run | reports/s | calls answered | reports stored | aggregates stored "
        "| reports per transaction | latency p50 / p99 ms |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for i, r in enumerate(runs, 1):
        lines.append(
            f"| {i} | {r['stored'] / r['seconds']:,.0f} | {r['calls']} {r['codes']} "
            f"| {r['stored']} | {r['aggregates']} | {r['stored'] / max(r['transactions'], 1):.1f} "
            f"| {r['p50_ms']:.1f} / {r['p99_ms']:.1f} |"
        )
    write_result(
        "ingest",
        "python -m benchmarks.ingest " + " ".join(f"--{k} {v}" for k, v in vars(args).items()),
        lines,
    )


if __name__ == "__main__":
    main()
