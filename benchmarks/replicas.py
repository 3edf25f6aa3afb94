"""Two Booster replicas on one PostgreSQL beside one replica, in the same run.

Every replica is a real ``booster serve`` process (one gRPC process each) on one embedded
PostgreSQL. The load is ``benchmarks/loadgen`` (Go): for ingestion, distinct 2-aggregate
reports at ``--concurrency`` calls in flight, split evenly across the replicas serving; for
GetParameters, requests for 10 of 100 planned contexts as random hosts, at 16 calls in flight.
Ingestion is rows stored in PostgreSQL ÷ wall time; GetParameters latency is measured at the
client. Configurations alternate (1, 2, 1, 2, …) so that both see the same machine.

On this 2-core machine replicas, load generator and PostgreSQL share the cores, so a second
replica adds coordination, not capacity: the figures show what coordination costs.

    python -m benchmarks.replicas [--seconds 10] [--runs 3] [--concurrency 128]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from google.protobuf.internal.encoder import _VarintBytes
from sqlalchemy import create_engine, text

from gemini_api.theta import load_spec
from gemini_api.v1 import booster_pb2 as pb
from gemini_booster import simulation as sim
from gemini_booster.storage import database

from .common import AGENT, OPERATOR, write_result
from .get_parameters import CONTEXTS, HOSTS, contexts
from .ingest import loadgen_binary, reports

POLICY = "bench"
GET_CONCURRENCY = 16
GET_CONTEXTS = 10


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Replica:
    def __init__(self, name: str, url: str, workdir: Path):
        self.grpc_port, self.http_port = free_port(), free_port()
        env = os.environ | {
            "GEMINI_BOOSTER_DATABASE_URL": url,
            "GEMINI_BOOSTER_GRPC_LISTEN": f"127.0.0.1:{self.grpc_port}",
            "GEMINI_BOOSTER_HTTP_PORT": str(self.http_port),
            "GEMINI_BOOSTER_BOOTSTRAP_OPERATOR_TOKEN": OPERATOR,
            "GEMINI_BOOSTER_BOOTSTRAP_AGENT_TOKEN": AGENT,
            "GEMINI_BOOSTER_REFIT_INTERVAL_S": "3600",
            "GEMINI_BOOSTER_REPLICA_NAME": name,
            "GEMINI_BOOSTER_LOG_LEVEL": "WARNING",
        }
        log = open(workdir / f"{name}.log", "ab")  # noqa: SIM115 (lives as long as the process)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gemini_booster.cli", "serve"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        self.http = f"http://127.0.0.1:{self.http_port}"
        self.target = f"127.0.0.1:{self.grpc_port}"
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.http}/livez", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"replica {name} did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def get_requests(n: int) -> bytes:
    rng = np.random.default_rng(1)
    msgs = [c.message() for c in contexts()]
    out = bytearray()
    for _ in range(n):
        chosen = rng.choice(CONTEXTS, size=GET_CONTEXTS, replace=False)
        body = pb.GetParametersRequest(
            host_id=f"host-{rng.integers(HOSTS)}",
            policy=POLICY,
            contexts=[msgs[i] for i in chosen],
        ).SerializeToString()
        out += _VarintBytes(len(body)) + body
    return bytes(out)


def loadgen(binary: Path, target: str, data: str, method: str, seconds: int, conc: int):
    return subprocess.Popen(
        [
            str(binary),
            f"-target={target}",
            f"-requests={data}",
            f"-method=/gemini.booster.v1.Booster/{method}",
            f"-concurrency={conc}",
            f"-connections={max(conc // 8, 1)}",
            f"-duration={seconds}s",
            f"-token={AGENT}",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )


def stored(url: str) -> int:
    engine = create_engine(url)
    with engine.connect() as conn:
        n = conn.execute(text("SELECT count(*) FROM reports")).scalar_one()
    engine.dispose()
    return n


def ingest(binary: Path, replicas: list[Replica], args, url: str) -> float:
    """Reports stored per second; each run sends reports never sent before (a resent report is
    a duplicate and stores nothing)."""
    with tempfile.NamedTemporaryFile(suffix=".bin") as data:
        data.write(reports(args.seconds * 5000))
        data.flush()
        n0, t0 = stored(url), time.monotonic()
        conc = args.concurrency // len(replicas)
        procs = [
            loadgen(binary, r.target, data.name, "ReportAggregates", args.seconds, conc)
            for r in replicas
        ]
        for p in procs:
            p.communicate()
        return (stored(url) - n0) / (time.monotonic() - t0)


def get_p99(binary: Path, replicas: list[Replica], data: str, args) -> tuple[float, float]:
    conc = GET_CONCURRENCY // len(replicas)
    procs = [loadgen(binary, r.target, data, "GetParameters", args.seconds, conc) for r in replicas]
    results = [json.loads(p.communicate()[0]) for p in procs]
    calls = sum(r["calls"] for r in results)
    return max(r["p99_ms"] for r in results), calls / args.seconds


def seed(a: Replica, b: Replica) -> None:
    """A policy with a plan for each of 100 contexts, served by both replicas."""
    h = {"authorization": f"Bearer {OPERATOR}"}
    httpx.post(f"{a.http}/v1/policies", json={"name": POLICY}, headers=h).raise_for_status()
    import grpc

    from gemini_api.v1 import booster_pb2_grpc as pb_grpc

    rng = np.random.default_rng(0)
    default = load_spec().default()
    stub = pb_grpc.BoosterStub(grpc.insecure_channel(a.target))
    aggs = [sim.make_aggregate(c, default, 1.0, 20, rng) for c in contexts()]
    stub.ReportAggregates(
        sim.make_report("seed-host", POLICY, aggs), metadata=(("authorization", f"Bearer {AGENT}"),)
    )
    httpx.post(f"{a.http}/v1/policies/{POLICY}/refit", headers=h, timeout=300).raise_for_status()
    deadline = time.monotonic() + 30
    while len(httpx.get(f"{b.http}/v1/policies/{POLICY}/parameters", headers=h).json()) < CONTEXTS:
        if time.monotonic() > deadline:
            raise RuntimeError("replica B never served the plans")
        time.sleep(0.1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=128)
    args = ap.parse_args()
    binary = loadgen_binary()
    work = Path(tempfile.mkdtemp(prefix="gemini-replicas-"))
    os.environ.setdefault("XDG_RUNTIME_DIR", str(work))
    url = database.start_embedded(work / "pg")
    engine = database.make_engine(url)
    database.migrate(engine)
    engine.dispose()
    a, b = Replica("replica-a", url, work), Replica("replica-b", url, work)
    rows: list[tuple[int, float, float, float]] = []
    try:
        seed(a, b)
        with tempfile.NamedTemporaryFile(suffix=".bin") as get:
            get.write(get_requests(20_000))
            get.flush()
            for _ in range(args.runs):
                for serving in ([a], [a, b]):
                    rate = ingest(binary, serving, args, url)
                    p99, gets = get_p99(binary, serving, get.name, args)
                    rows.append((len(serving), rate, p99, gets))
    finally:
        a.stop()
        b.stop()

    def median(n: int, i: int) -> float:
        return float(np.median([r[i] for r in rows if r[0] == n]))

    lines = [
        f"Ingestion: `benchmarks/loadgen` (Go), {args.concurrency} report calls in flight split "
        f"across the replicas serving. GetParameters: {GET_CONTEXTS} of {CONTEXTS} planned "
        f"contexts per request, random host of {HOSTS:,}, {GET_CONCURRENCY} calls in flight. "
        f"Each replica one `booster serve` process; {os.cpu_count()} cores shared by replicas, "
        "load generators and PostgreSQL.",
        "",
        "| replicas | ingestion reports/s (median) | GetParameters p99 ms (median) | "
        "GetParameters calls/s |",
        "| --- | --- | --- | --- |",
    ]
    for n in (1, 2):
        lines.append(f"| {n} | {median(n, 1):,.0f} | {median(n, 2):.2f} | {median(n, 3):,.0f} |")
    lines += [
        "",
        f"Two replicas ÷ one: ingestion {median(2, 1) / median(1, 1):.2f}×, "
        f"GetParameters p99 {median(2, 2) / median(1, 2):.2f}×.",
        "",
        "| run | replicas | reports/s | GetParameters p99 ms | GetParameters calls/s |",
        "| --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {i // 2 + 1} | {n} | {rate:,.0f} | {p99:.2f} | {gets:,.0f} |"
        for i, (n, rate, p99, gets) in enumerate(rows)
    ]
    write_result(
        "replicas",
        "python -m benchmarks.replicas " + " ".join(f"--{k} {v}" for k, v in vars(args).items()),
        lines,
    )


if __name__ == "__main__":
    main()
