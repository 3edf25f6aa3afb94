"""One agent floods a policy with new contexts: what it costs another policy's refits.

A ``victim`` policy is trained on 20 contexts by a synthetic fleet; its refit time is measured
(the baseline). Then one host sends 10,000 new contexts to a ``flood`` policy in reports of
250 aggregates, as fast as Booster answers. Booster admits contexts up to the per-host daily
quota and refuses the rest with RESOURCE_EXHAUSTED naming the quota. The victim's refit time is
measured again after the flood, and while the flood policy is being refitted at the same time
on the same replica (a refit of its own, bounded by the quota and ``max_contexts_per_refit``).

    python -m benchmarks.quota [--refits 5]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import grpc
import numpy as np

from gemini_api.theta import load_spec
from gemini_api.v1 import booster_pb2 as pb
from gemini_api.v1 import booster_pb2_grpc as pb_grpc
from gemini_booster import simulation as sim
from gemini_booster.fleet import SyntheticFleet
from gemini_booster.models import PolicyCreate
from gemini_booster.storage import policies as policy_store
from gemini_booster.storage import trials as trial_store

from .common import AGENT, start_booster, write_result

FLOOD_CONTEXTS = 10_000
PER_REPORT = 250
VICTIM_CONTEXTS = 20


def victim_contexts() -> list[sim.SyntheticContext]:
    rng = np.random.default_rng(3)
    return [
        sim.SyntheticContext(
            ("eu-west", "cdn-a", f"region-{i % 4}", f"isp-{i}", 12),
            tuple(rng.uniform(0, 1, 7)),
            100.0,
            40.0,
            5.0,
        )
        for i in range(VICTIM_CONTEXTS)
    ]


def flood_report(start: int, rng: np.random.Generator) -> pb.ReportRequest:
    theta = load_spec().default()
    aggs = []
    for i in range(start, start + PER_REPORT):
        key = ("x", "y", f"flood-{i}", "isp", i % 24)
        ctx = sim.SyntheticContext(key, sim.ETHERNET.optimum, 100.0, 40.0, 5.0)
        aggs.append(sim.make_aggregate(ctx, theta, 1.0, 2, rng))
    return sim.make_report("flooding-host", "flood", aggs)


def timed_refits(server, name: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        server.booster.refit(server.booster.policies[name])
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--refits", type=int, default=5)
    args = ap.parse_args()
    server = start_booster()
    target = f"127.0.0.1:{server.grpc_port}"
    try:
        for name in ("victim", "flood"):
            policy_store.create_policy(server.engine, PolicyCreate(name=name), actor="bench")
        server.booster.reload_policies()
        fleet = SyntheticFleet(
            target, AGENT, "victim", contexts=victim_contexts(), hosts_per_context=4
        )
        for i in range(12):
            fleet.run_round(i)
            server.booster.refit(server.booster.policies["victim"])
        fleet.close()
        baseline = timed_refits(server, "victim", args.refits)

        stub = pb_grpc.BoosterStub(grpc.insecure_channel(target))
        md = (("authorization", f"Bearer {AGENT}"),)
        rng = np.random.default_rng(0)
        codes: dict[str, int] = {}
        message = ""
        t0 = time.perf_counter()
        for start in range(0, FLOOD_CONTEXTS, PER_REPORT):
            try:
                stub.ReportAggregates(flood_report(start, rng), metadata=md, timeout=30)
                codes["OK"] = codes.get("OK", 0) + 1
            except grpc.RpcError as e:
                codes[e.code().name] = codes.get(e.code().name, 0) + 1
                message = e.details()
        flood_s = time.perf_counter() - t0
        flood_id = server.booster.policies["flood"].id
        admitted = len(trial_store.admitted_contexts(server.engine, flood_id))

        after = timed_refits(server, "victim", args.refits)
        flood_refits: list[float] = []
        stop = threading.Event()

        def refit_flood() -> None:
            while not stop.is_set():
                flood_refits.extend(timed_refits(server, "flood", 1))

        other = threading.Thread(target=refit_flood)
        other.start()
        during = timed_refits(server, "victim", args.refits)
        stop.set()
        other.join()
    finally:
        server.stop()

    base = statistics.median(baseline)

    def row(name: str, times: list[float]) -> str:
        m = statistics.median(times)
        return f"| {name} | {len(times)} | {m:.2f} | {max(times):.2f} | **{m / base:.2f}×** |"

    write_result(
        "quota",
        f"python -m benchmarks.quota --refits {args.refits}",
        [
            f"Flood: one host sent {FLOOD_CONTEXTS:,} new contexts to policy `flood` in "
            f"{FLOOD_CONTEXTS // PER_REPORT} reports of {PER_REPORT} aggregates in "
            f"{flood_s:.1f} s: answers {codes}; {admitted} contexts admitted. "
            "The refusal agents got:",
            "",
            f"> {message}",
            "",
            f"Victim: policy `victim`, {VICTIM_CONTEXTS} contexts trained by 12 rounds of a "
            "synthetic fleet. Refit times (s), one Booster (its refits in a pool of 2 worker "
            "processes):",
            "",
            "| victim refits | n | median s | max s | ÷ baseline |",
            "| --- | --- | --- | --- | --- |",
            row("baseline, before the flood", baseline),
            row("after the flood", after),
            row("while `flood` refits at the same time", during),
            "",
            f"`flood` refits meanwhile: {len(flood_refits)}, median "
            f"{statistics.median(flood_refits):.2f} s (its contexts capped by the host quota, "
            "its planning by max_contexts_per_refit).",
        ],
    )


if __name__ == "__main__":
    main()
