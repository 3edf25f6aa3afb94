"""An A/B experiment compared by completion time (real gRPC, real PostgreSQL): its hosts are
asked for the completion sums whatever their policy's objective, the sums reach the arms' per-day
rows, results rank the arms by Σbits/Σduration where eq. 9 ranks them the other way, and
migration 0016 up and down."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import IntegrityError

from gemini_api.aggregate import AggregateBuilder, FlowStats
from gemini_api.sums import FlowSums, Objective
from gemini_api.theta import load_spec
from gemini_api.v1 import booster_pb2 as pb
from gemini_booster import simulation as sim

from .conftest import OPERATOR, agent_md, at_revision, auth
from .test_experiment_ingest import HOSTS, OUTSIDER, cubic_against_fusion

SPEC = load_spec()
MB = 1_000_000
# Every flow carries 1 MB with no queueing. The control's run at a steady 80 Mbit/s; the arm's
# four fast flows run at 400 Mbit/s and one waits out a timeout (8 Mbit/s): a higher mean rate
# per flow (eq. 9), a longer time for all the bytes (completion).
STEADY = [FlowStats(MB, 100_000, 40_000, 40_000)] * 5
TIMEOUT = [FlowStats(MB, 20_000, 40_000, 40_000)] * 4 + [FlowStats(MB, 1_000_000, 40_000, 40_000)]


def aggregate(flows: list[FlowStats], cc: str) -> pb.Aggregate:
    b = AggregateBuilder()
    for f in flows:
        b.add(f)
    return b.to_proto(SPEC.default(), 1, sim.ETHERNET.message(), cc)


def sums(flows: list[FlowStats]) -> FlowSums:
    return FlowSums.total(
        FlowSums.of_record(f.bytes_acked, f.duration_us, f.queue_delay_ms) for f in flows
    )


def create_experiment(booster, objective: str) -> None:
    made = cubic_against_fusion(booster, "incast-ab", sigma=0.5, objective=objective)
    assert made["objective"] == objective


def test_a_completion_experiment_asks_its_hosts_for_the_sums_and_ranks_by_them(booster) -> None:
    create_experiment(booster, "completion")
    stub = booster.stub()

    def asks(host: str) -> bool:
        req = pb.GetParametersRequest(host_id=host, policy="cdn", contexts=[])
        return stub.GetParameters(req, metadata=agent_md()).completion_sums

    # The hosts' policy optimises eq. 9: only the experiment's hosts are asked for the sums.
    assert [asks(h) for h in HOSTS] == [True] * 4 and not asks(OUTSIDER)
    arms = {}
    for h in HOSTS:
        got = booster.http.get(f"/v1/hosts/{h}/experiment", headers=auth(OPERATOR)).json()
        arms[h] = got["experiment"]["arm"]["name"]
    assert sorted(arms.values()) == ["control", "control", "fusion", "fusion"]
    for h in HOSTS:
        mine = [aggregate(STEADY, "cubic"), aggregate(TIMEOUT, "")]
        req = sim.make_report(h, "cdn", mine)
        assert stub.ReportAggregates(req, metadata=agent_md()).aggregates_stored == 2
    out = booster.http.get("/v1/experiments/incast-ab/results", headers=auth(OPERATOR)).json()
    assert out["objective"] == "completion" and out["sigma"] == 0.5
    by_arm = {a["arm"]: a for a in out["overall"]["arms"]}
    for arm, flows in (("control", STEADY), ("fusion", TIMEOUT)):
        want = (sums(flows) + sums(flows)).utility(0.5, Objective.COMPLETION).mean
        assert by_arm[arm]["utility"]["mean"] == pytest.approx(want), arm
        assert (by_arm[arm]["flows"], by_arm[arm]["hosts"]) == (10, 2), arm
    (diff,) = out["overall"]["differences"]
    assert diff["arm"] == "fusion" and diff["utility"]["mean"] < 0
    # By eq. 9 the same flows rank the other way round: the objective decides the verdict.
    assert sums(TIMEOUT).utility(0.5).mean > sums(STEADY).utility(0.5).mean


def test_an_experiment_without_an_objective_compares_by_eq9(booster) -> None:
    create_experiment(booster, "flow-mean")
    req = pb.GetParametersRequest(host_id=HOSTS[0], policy="cdn", contexts=[])
    assert not booster.stub().GetParameters(req, metadata=agent_md()).completion_sums
    body = {"name": "bad", "arms": [{"name": "a", "cc": "cubic"}, {"name": "b", "cc": "reno"}],
            "population": {"hosts": ["x", "y"]}, "objective": "fct",
            "start": datetime.now(UTC).isoformat(),
            "end": (datetime.now(UTC) + timedelta(days=1)).isoformat()}  # fmt: skip
    r = booster.http.post("/v1/experiments", json=body, headers=auth(OPERATOR))
    assert r.status_code == 422 and "objective" in r.text and "completion" in r.text


def _insert_experiment_with_a_host_day(conn) -> None:
    conn.execute(
        text(
            "INSERT INTO experiments (id, name, salt, arms, control, split, start_at, end_at,"
            " sigma, created_by) VALUES (1, 'old', 's', '[]', 'a', '[0.5, 0.5]', now(),"
            " now() + interval '1 day', 1.0, 'test')"
        )
    )
    conn.execute(
        text(
            "INSERT INTO experiment_host_days (experiment_id, arm, host_id, day, flow_count,"
            " tpt_sum, tpt_sq_sum, delay_sum, delay_sq_sum, tpt_delay_sum, slow_flows,"
            " report_count) VALUES (1, 'a', 'h', current_date, 7, 70, 700, 1, 1, 10, 0, 1)"
        )
    )


def test_migration_0016_keeps_every_experiment_and_sum_and_downgrades(db_url) -> None:
    from alembic import command

    from gemini_booster.storage import database

    engine = create_engine(db_url)
    at_revision(engine, "0015")
    with engine.begin() as conn:
        _insert_experiment_with_a_host_day(conn)
    database.migrate(engine)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT objective FROM experiments")).scalar_one() == "flow-mean"
        row = conn.execute(
            text("SELECT flow_count, tpt_sum, completion_flow_count FROM experiment_host_days")
        ).one()
        assert tuple(row) == (7, 70.0, 0)
    with pytest.raises(IntegrityError, match="experiments_objective_known"), engine.begin() as c:
        c.execute(text("UPDATE experiments SET objective = 'fct'"))
    command.downgrade(database.alembic_config(db_url), "0015")
    with engine.connect() as conn:
        columns = {
            r[0]
            for r in conn.execute(
                text(
                    "SELECT column_name FROM information_schema.columns WHERE table_name IN"
                    " ('experiments', 'experiment_host_days')"
                )
            )
        }
        assert "objective" not in columns and "completion_flow_count" not in columns
        n = conn.execute(text("SELECT flow_count FROM experiment_host_days")).scalar_one()
        assert n == 7
    engine.dispose()
