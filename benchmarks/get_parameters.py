"""GetParameters latency at fleet scale: 10,000 hosts × 100 contexts, answered from the cache.

Booster gets one report per context (100 contexts) and a refit, so every context has a plan with
exploration candidates. Then a client process asks as random hosts of 10,000: either for all 100
contexts in one request (a host that serves everything) or for one context. Latency is measured
at the client, over real gRPC on loopback. Target: p99 ≤ 10 ms.

    python -m benchmarks.get_parameters [--requests 3000]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time

import numpy as np

from gemini_api.theta import load_spec
from gemini_booster import simulation as sim
from gemini_booster.models import PolicyCreate
from gemini_booster.storage import policies as policy_store

from .common import AGENT, start_booster, write_result

POLICY = "bench"
HOSTS = 10_000
CONTEXTS = 100


def contexts() -> list[sim.SyntheticContext]:
    out = []
    for i in range(CONTEXTS):
        key = ("eu-west", "cdn-a", f"region-{i // 10}", f"isp-{i}", 12)
        out.append(sim.SyntheticContext(key, sim.ETHERNET.optimum, 100.0, 40.0, 5.0))
    return out


def client(target: str, n: int, per_request: int, q: mp.Queue) -> None:
    import grpc

    from gemini_api.v1 import booster_pb2 as pb
    from gemini_api.v1 import booster_pb2_grpc as pb_grpc

    stub = pb_grpc.BoosterStub(grpc.insecure_channel(target))
    md = (("authorization", f"Bearer {AGENT}"),)
    ctx_msgs = [c.message() for c in contexts()]
    rng = np.random.default_rng(1)
    reqs = []
    for _ in range(n):
        chosen = rng.choice(CONTEXTS, size=per_request, replace=False)
        reqs.append(
            pb.GetParametersRequest(
                host_id=f"host-{rng.integers(HOSTS)}",
                policy=POLICY,
                contexts=[ctx_msgs[i] for i in chosen],
            )
        )
    for r in reqs[:200]:  # warm the channel
        stub.GetParameters(r, metadata=md)
    lat = []
    for r in reqs:
        t0 = time.perf_counter()
        resp = stub.GetParameters(r, metadata=md, timeout=5)
        lat.append(time.perf_counter() - t0)
        assert len(resp.parameters) == per_request
    q.put(lat)


def measure(target: str, n: int, per_request: int) -> np.ndarray:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=client, args=(target, n, per_request, q))
    p.start()
    lat = np.asarray(q.get()) * 1000
    p.join()
    return lat


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=3000)
    args = ap.parse_args()
    server = start_booster()
    try:
        policy_store.create_policy(
            server.engine, PolicyCreate(name=POLICY, n_initial_points=1000), actor="bench"
        )
        server.booster.reload_policies()
        rng = np.random.default_rng(0)
        from gemini_booster.fleet import SyntheticFleet

        fleet = SyntheticFleet(
            f"127.0.0.1:{server.grpc_port}", AGENT, POLICY, contexts=contexts(), hosts_per_context=1
        )
        default = load_spec().default()
        report = sim.make_report(
            "seed-host",
            POLICY,
            [sim.make_aggregate(c, default, 1.0, 20, rng) for c in fleet.contexts],
        )
        fleet.stub.ReportAggregates(report, metadata=fleet.metadata)
        fleet.close()
        server.booster.refit(server.booster.policies[POLICY])
        planned = len(server.booster.plan_snapshot(server.booster.policies[POLICY].id))
        target = f"127.0.0.1:{server.grpc_port}"
        all_ctx = measure(target, args.requests, CONTEXTS)
        one_ctx = measure(target, args.requests, 1)
    finally:
        server.stop()

    def row(name, lat):
        p50, p99, pmax = np.percentile(lat, [50, 99, 100])
        return f"| {name} | {len(lat)} | {p50:.2f} | **{p99:.2f}** | {pmax:.2f} |"

    write_result(
        "get_parameters",
        f"python -m benchmarks.get_parameters --requests {args.requests}",
        [
            f"{HOSTS:,} hosts (random host id per request) × {CONTEXTS} planned contexts "
            f"({planned} plans in cache); sequential requests from one client process over "
            "loopback gRPC. Target: p99 ≤ 10 ms.",
            "",
            "| request | n | p50 ms | p99 ms | max ms |",
            "| --- | --- | --- | --- | --- |",
            row(f"all {CONTEXTS} contexts per request", all_ctx),
            row("1 context per request", one_ctx),
        ],
    )


if __name__ == "__main__":
    main()
