"""One history rule: ``/trials`` and ``/comparison`` (and the model's refits) cover the same
time buckets, those that began within the policy's ``history_hours`` (``Policy.history_window``).

Reports go in through real gRPC into real PostgreSQL: one host's Fusion and cubic flows in a
bucket long before the window, and in one inside it, under different θ. Both endpoints must
answer from the recent bucket only, and the trials' flows must add up to the comparison's tuned
arm. Before the rule, ``/trials`` also listed the old θ.
"""

from __future__ import annotations

import csv
import io
import time

from gemini_api.aggregate import AggregateBuilder, FlowStats
from gemini_api.theta import load_spec
from gemini_api.v1 import booster_pb2 as pb
from gemini_booster import simulation as sim

from .conftest import OPERATOR, agent_md, auth

SPEC = load_spec()
POLICY = "windowed"
HISTORY_HOURS = 3
HOUR_MS = 3_600_000
OLD_THETA = SPEC.default() | {"mult_decrease": 60}  # only before the window
NEW_THETA = SPEC.default()  # only inside it
FLOWS = {"old": 7, "new": 5, "cubic_old": 4, "cubic_new": 3}
DEADLINE_S = 30.0  # for the stored trials to show (a fold may run behind ingest)


def aggregate(flows: int, mbps: float, cc: str = "", theta=None) -> pb.Aggregate:
    b = AggregateBuilder()
    for _ in range(flows):
        b.add(FlowStats(int(mbps * 1e6 / 8), 1_000_000, 50_000, 40_000))
    return b.to_proto(theta or SPEC.default(), 1, sim.ETHERNET.message(), cc)


def send(svc, start_ms: int, aggs: list[pb.Aggregate]) -> None:
    req = sim.make_report("web-1", POLICY, aggs, start_ms)
    assert svc.stub().ReportAggregates(req, metadata=agent_md()).aggregates_stored == len(aggs)


def get(svc, path: str):
    r = svc.http.get(f"/v1/policies/{POLICY}/{path}", headers=auth(OPERATOR))
    assert r.status_code == 200, r.text
    return r


def poll_trials(svc, want_flows: int) -> list[dict]:
    """The trials once they hold ``want_flows`` flows, or their last answer at the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        rows = get(svc, "trials").json()
        if sum(t["flows"] for t in rows) >= want_flows or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


def test_trials_and_comparison_cover_the_same_history_window(booster):
    r = booster.http.post(
        "/v1/policies",
        json={"name": POLICY, "history_hours": HISTORY_HOURS, "trial_bucket_hours": 1},
        headers=auth(OPERATOR),
    )
    assert r.status_code == 201, r.text
    now_ms = int(time.time() * 1000)
    old, new = now_ms - 2 * HISTORY_HOURS * HOUR_MS, now_ms - HOUR_MS // 2
    send(booster, old, [aggregate(FLOWS["old"], 20, theta=OLD_THETA), aggregate(4, 10, "cubic")])
    send(booster, new, [aggregate(FLOWS["new"], 30, theta=NEW_THETA), aggregate(3, 10, "cubic")])

    trials = poll_trials(booster, FLOWS["new"])
    assert [(t["theta"], t["flows"]) for t in trials] == [(NEW_THETA, FLOWS["new"])]
    [context] = get(booster, "comparison").json()
    arms = {a["arm"]: a["flows"] for a in context["arms"]}
    assert arms["fusion"] == sum(t["flows"] for t in trials) == FLOWS["new"]
    assert arms["cubic"] == FLOWS["cubic_new"]
    assert context["context"] == trials[0]["context"]

    # The CSV exports carry the same rows as the JSON answers.
    rows = list(csv.DictReader(io.StringIO(get(booster, "trials?format=csv").text)))
    assert [(int(r["flows"]), float(r["utility"])) for r in rows] == [
        (t["flows"], t["utility"]) for t in trials
    ]
