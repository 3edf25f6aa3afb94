"""Experiment days of ``day_seconds``: 86,400 gives exactly the UTC calendar days (boundaries at
midnight, labels the dates); a compressed day of 120 s is labelled the start's date + k for
day k, its crossover swaps the arms at that day's first instant (assignment, the arm cache, the
agent's ``until_unix_ms``), reports sent through real gRPC count for the compressed day their
interval starts in, and results come per compressed day. Bad values are a 422 naming the field.
Every instant is explicit (derived from the experiment's own start): nothing waits for a clock.
"""

from __future__ import annotations

import random
from datetime import UTC, date, datetime, time, timedelta, timezone
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import create_engine, text
from sqlalchemy.exc import IntegrityError

from gemini_api.theta import load_spec
from gemini_api.v1 import booster_pb2 as pb
from gemini_booster import simulation as sim
from gemini_booster.experiments.assignment import assignment
from gemini_booster.experiments.domain import (
    ArmSpec,
    Days,
    Experiment,
    ExperimentCreate,
    Member,
)
from gemini_booster.storage import database
from gemini_booster.storage import experiments as store

from .conftest import OPERATOR, agent_md, at_revision, auth
from .test_experiment_ingest import aggregate

SPEC = load_spec()
SECOND = timedelta(seconds=1)
MICRO = timedelta(microseconds=1)
SHORT = 120  # a compressed day: two minutes
SHORT_DAY = timedelta(seconds=SHORT)
# The example of the domain's docstring: day 0 is [08:00:00, 08:02:00), labelled 2026-11-23.
STARTED = datetime(2026, 11, 23, 8, 1, 10, tzinfo=UTC)
HOSTS = [f"eu-{i}" for i in range(4)]
POLICY = "default"
LATE = 100  # flows of the report sent on day 1's last millisecond


def midnight(day: date) -> datetime:
    return datetime.combine(day, time(0), tzinfo=UTC)


def boundary_before(at: datetime, seconds: int) -> datetime:
    """The last multiple of ``seconds`` since the epoch at or before ``at``, computed apart
    from ``Days`` (whole seconds since the epoch, floored)."""
    whole = int((at - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds())
    return datetime.fromtimestamp(whole - whole % seconds, UTC)


def experiment(
    crossover: date | None = None,
    start: datetime = STARTED,
    end: datetime | None = None,
    seconds: int = 86_400,
) -> Experiment:
    """Two arms on four hosts, two per group."""
    return Experiment(
        id=1,
        name="days",
        description="",
        salt="days",
        arms=(ArmSpec(name="arm0", cc="cubic"), ArmSpec(name="arm1", cc="reno")),
        control="arm0",
        split=(0.5, 0.5),
        hosts={h: Member("eu", i % 2) for i, h in enumerate(HOSTS)},
        start=start,
        end=end or start + timedelta(days=3),
        crossover_day=crossover,
        sigma=1.0,
        guardrail=None,
        created_at=start,
        created_by="test",
        day_seconds=seconds,
    )


def create_body(now: datetime, seconds: int, **overrides: Any) -> dict[str, Any]:
    """Cubic against Fusion at a fixed θ on four hosts, days of ``seconds``; it started 70 s
    after a boundary an hour before ``now`` and ends an hour after."""
    start = boundary_before(now - timedelta(hours=1), seconds) + 70 * SECOND
    return {
        "name": "compressed",
        "arms": [
            {"name": "control", "cc": "cubic"},
            {"name": "fusion", "cc": "fusion", "params": "fixed", "theta": SPEC.default()},
        ],
        "population": {"regions": {"eu": HOSTS}},
        "day_seconds": seconds,
        "start": start.isoformat(),
        "end": (now + timedelta(hours=1)).isoformat(),
        "salt": "days",
    } | overrides


# --- the mapping --------------------------------------------------------------------------


def test_calendar_days_are_utc_dates_and_midnights() -> None:
    """With 86,400 s a day's label is the UTC date of any instant in it, for any start, and it
    begins at that date's 00:00 UTC: what experiments had before days had a length."""
    rng = random.Random(86_400)
    base = datetime(2026, 1, 1, tzinfo=UTC)
    starts = [base + timedelta(seconds=rng.uniform(-5e8, 5e8)) for _ in range(50)]
    starts += [midnight(date(2026, 11, 23)), midnight(date(2026, 11, 23)) - MICRO]
    for start in starts:
        days = Days(start)
        assert days.first == start.date()
        for _ in range(40):
            at = start + timedelta(seconds=rng.uniform(-4e7, 4e7))
            assert days.day_of(at) == at.astimezone(UTC).date(), (start, at)
        for d in (start.date() + timedelta(days=k) for k in range(-400, 400, 37)):
            assert days.day_start(d) == midnight(d)
            assert days.day_of(midnight(d)) == d and days.day_of(midnight(d) - MICRO) < d
    # An instant given in another zone is placed by its UTC date, not its local one.
    local = datetime(2026, 11, 24, 0, 30, tzinfo=timezone(timedelta(hours=1)))
    assert Days(STARTED).day_of(local) == date(2026, 11, 23)


def test_calendar_experiment_days_and_crossover_are_as_before() -> None:
    e = experiment(crossover=date(2026, 12, 3), start=datetime(2026, 12, 1, 7, tzinfo=UTC))
    assert e.day_seconds == 86_400
    assert e.days() == [date(2026, 12, 1) + timedelta(days=k) for k in range(4)]
    assert e.crossover_at == midnight(date(2026, 12, 3))


def test_compressed_days_are_labelled_from_the_start_date() -> None:
    days = Days(STARTED, SHORT)
    day0 = datetime(2026, 11, 23, 8, 0, tzinfo=UTC)
    assert days.day_start(date(2026, 11, 23)) == day0
    assert days.day_start(date(2026, 11, 24)) == day0 + SHORT_DAY
    assert days.day_start(date(2026, 12, 3)) == day0 + 10 * SHORT_DAY
    assert days.day_of(STARTED) == date(2026, 11, 23)
    assert days.day_of(day0 + SHORT_DAY - MICRO) == date(2026, 11, 23)
    assert days.day_of(day0 + SHORT_DAY) == date(2026, 11, 24)
    assert days.day_of(day0 - MICRO) == date(2026, 11, 22)  # before the start: earlier labels
    # Across midnight the labels keep counting days of the experiment, not dates.
    assert days.day_of(datetime(2026, 11, 24, 0, 1, tzinfo=UTC)) == date(2026, 11, 23) + (
        timedelta(days=(16 * 3600 + 60) // SHORT)
    )
    e = experiment(start=STARTED, end=day0 + 5 * SHORT_DAY - SECOND, seconds=SHORT)
    assert e.days() == [date(2026, 11, 23) + timedelta(days=k) for k in range(5)]
    assert e.days_begun(day0 + 2 * SHORT_DAY) == e.days()[:3]


def test_crossover_swaps_arms_at_the_compressed_boundary() -> None:
    day0 = datetime(2026, 11, 23, 8, 0, tzinfo=UTC)
    end = day0 + 10 * SHORT_DAY
    e = experiment(crossover=date(2026, 11, 26), start=STARTED, end=end, seconds=SHORT)
    swap = day0 + 3 * SHORT_DAY
    assert e.crossover_at == swap == datetime(2026, 11, 23, 8, 6, tzinfo=UTC)
    for host, m in e.hosts.items():
        before, after = assignment(e, host, swap - MICRO), assignment(e, host, swap)
        assert before is not None and after is not None
        assert (before.arm.name, before.period, before.until) == (f"arm{m.group}", 0, swap)
        assert (after.arm.name, after.period, after.until) == (f"arm{1 - m.group}", 1, end)


def test_day_seconds_must_be_in_range_and_divide_a_day() -> None:
    body = create_body(datetime.now(UTC), SHORT)
    for seconds in (60, 90, 120, 300, 3600, 86_400):
        assert ExperimentCreate.model_validate(body | {"day_seconds": seconds}).day_seconds == (
            seconds
        )
    body.pop("day_seconds")
    assert ExperimentCreate.model_validate(body).day_seconds == 86_400
    for seconds in (0, 59, 77, 86_401, 172_800):
        with pytest.raises(ValidationError) as info:
            ExperimentCreate.model_validate(body | {"day_seconds": seconds})
        assert [e["loc"] for e in info.value.errors()] == [("day_seconds",)]


# --- through a real Booster ---------------------------------------------------------------


def start_of(body: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(body["start"])


def label(body: dict[str, Any], k: int) -> str:
    """The label of day k of the experiment ``body`` declares: its start's date + k days."""
    return str(start_of(body).date() + timedelta(days=k))


def with_crossover(body: dict[str, Any], k: int) -> dict[str, Any]:
    return body | {"crossover_day": label(body, k)}


def post(booster, body: dict[str, Any]):
    return booster.http.post("/v1/experiments", json=body, headers=auth(OPERATOR))


def create(booster, body: dict[str, Any]) -> dict[str, Any]:
    r = post(booster, body)
    assert r.status_code == 201, r.text
    return r.json()


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"day_seconds": 30}, "day_seconds"),
        ({"day_seconds": 86_401}, "day_seconds"),
        ({"day_seconds": 7_000}, "day_seconds"),  # does not divide a day
        ({"day_seconds": "two minutes"}, "day_seconds"),
        # a 120 s experiment may last 366 of its days, 12.2 hours: this one 14 (from its start)
        ({"end": timedelta(hours=14)}, "end"),
    ],
)
def test_bad_day_seconds_is_a_422_naming_the_field(booster, overrides, field) -> None:
    body = create_body(datetime.now(UTC), SHORT)
    if "end" in overrides:
        overrides = {"end": (start_of(body) + overrides["end"]).isoformat()}
    r = post(booster, body | overrides)
    assert r.status_code == 422, r.text
    assert [e["loc"][-1] for e in r.json()["detail"]] == [field]


def test_compressed_crossover_must_begin_strictly_inside(booster) -> None:
    """The experiment lasts about two hours, 60 days of 120 s: day 0 begins 70 s before the
    start, day 70 after the end, and day −1 before both."""
    body = create_body(datetime.now(UTC), SHORT)
    for k in (0, 70, -1):
        r = post(booster, with_crossover(body, k))
        assert r.status_code == 422, r.text
        [error] = r.json()["detail"]
        assert error["loc"][-1] == "crossover_day" and "day_seconds = 120" in error["msg"]
    assert post(booster, with_crossover(body, 1)).status_code == 201


def test_experiment_shows_its_days(booster) -> None:
    body = create_body(datetime.now(UTC), SHORT)
    e = create(booster, with_crossover(body, 3))
    assert e["day_seconds"] == SHORT
    swap = boundary_before(start_of(body), SHORT) + 3 * SHORT_DAY
    assert datetime.fromisoformat(e["crossover_at"]) == swap
    calendar = create_body(datetime.now(UTC), 86_400, name="calendar", population={"hosts": ["x"]})
    calendar.pop("day_seconds")
    e = create(booster, calendar)
    assert e["day_seconds"] == 86_400 and e["crossover_at"] is None


def send(booster, host: str, at: datetime, fusion: int, cubic: int) -> None:
    """A one-minute report starting at ``at``: ``fusion`` Fusion flows, ``cubic`` cubic ones."""
    aggs = [aggregate(10.0, fusion, ""), aggregate(20.0, cubic, "cubic")]
    req = sim.make_report(host, POLICY, aggs, int(at.timestamp() * 1000), interval_ms=60_000)
    assert booster.stub().ReportAggregates(req, metadata=agent_md()).aggregates_stored == 2


def start_policy(booster) -> None:
    r = booster.http.post("/v1/policies", json={"name": POLICY}, headers=auth(OPERATOR))
    assert r.status_code == 201, r.text


def test_reports_count_for_their_compressed_day(booster) -> None:
    """Through gRPC: each report's flows of its host's arm land on the compressed day its
    interval starts in, the arms swap at the crossover's boundary, and results come per
    compressed day with the swap between periods."""
    start_policy(booster)
    body = with_crossover(create_body(datetime.now(UTC), SHORT), 3)
    create(booster, body)
    day0 = boundary_before(start_of(body), SHORT)
    stored = store.get_experiment(booster.engine, "compressed")
    groups = {}  # host → its arm on day 0 (the first period)
    for h in HOSTS:
        found = store.host_assignment(booster.engine, h, start_of(body))
        assert found is not None
        groups[h] = found.arm.name
    assert sorted(groups.values()) == ["control", "control", "fusion", "fusion"]
    # Day k gets k + 1 Fusion flows and 10 + k cubic flows from every host, sent 80 s into it
    # (day 0: 10 s after the start), and day 1 a report on its last millisecond.
    for k in range(5):
        for h in HOSTS:
            send(booster, h, day0 + k * SHORT_DAY + 80 * SECOND, k + 1, 10 + k)
    for h in HOSTS:
        send(booster, h, day0 + 2 * SHORT_DAY - timedelta(milliseconds=1), LATE, LATE)
    swapped = {"control": "fusion", "fusion": "control"}
    expected = {}
    for k in range(5):
        for h in HOSTS:
            arm = groups[h] if k < 3 else swapped[groups[h]]
            flows = (k + 1 if arm == "fusion" else 10 + k) + (LATE if k == 1 else 0)
            expected[(arm, h, label(body, k))] = flows
    got = {
        (r.arm, r.host, str(r.day)): r.sums.flow_count
        for r in store.host_days(booster.engine, stored.id)
    }
    assert got == expected
    out = booster.http.get(
        "/v1/experiments/compressed/results?sigma=0", headers=auth(OPERATOR)
    ).json()
    days = out["days"]
    # Every compressed day begun so far: about 31 in the hour since the start.
    assert [d["day"] for d in days] == [label(body, k) for k in range(len(days))]
    assert len(days) >= 30
    assert [d["period"] for d in days[:5]] == [0, 0, 0, 1, 1]
    for k, d in enumerate(days):
        flows = {a["arm"]: a["flows"] for a in d["arms"]}
        late = 2 * LATE if k == 1 else 0
        want = {"control": 2 * (10 + k) + late, "fusion": 2 * (k + 1) + late}
        assert flows == (want if k < 5 else {"control": 0, "fusion": 0}), d["day"]
    one = booster.http.get(
        f"/v1/experiments/compressed/results?day={label(body, 3)}", headers=auth(OPERATOR)
    ).json()
    assert [(d["day"], d["period"]) for d in one["days"]] == [(label(body, 3), 1)]


def test_agents_learn_the_compressed_crossover(booster) -> None:
    """GetParameters (from the arm cache) and REST hand each host its arm until the crossover's
    compressed boundary (half an hour ahead); the cache swaps the arms at that instant."""
    start_policy(booster)
    now = datetime.now(UTC)
    body = create_body(now, SHORT)
    day0 = boundary_before(start_of(body), SHORT)
    today = (now - day0) // SHORT_DAY
    e = create(booster, with_crossover(body, today + 15))
    swap = datetime.fromisoformat(e["crossover_at"])
    assert swap == day0 + (today + 15) * SHORT_DAY and swap > now
    for h in HOSTS:
        resp = booster.stub().GetParameters(
            pb.GetParametersRequest(host_id=h, policy=POLICY), metadata=agent_md(), timeout=10
        )
        assert resp.experiment_arm.until_unix_ms == int(swap.timestamp() * 1000)
        rest = booster.http.get(f"/v1/hosts/{h}/experiment", headers=auth(OPERATOR)).json()
        assert datetime.fromisoformat(rest["experiment"]["until"]) == swap
        assert rest["experiment"]["arm"]["name"] == resp.experiment_arm.arm
        assert label(body, today) <= rest["experiment"]["day"] < label(body, today + 15)
        before = booster.booster.arms.assignment(h, swap - MICRO)
        after = booster.booster.arms.assignment(h, swap)
        assert before is not None and after is not None
        assert before.arm.name == resp.experiment_arm.arm and before.period == 0
        assert after.arm.name != before.arm.name and after.period == 1
        assert after.until == datetime.fromisoformat(e["end"])


def test_migration_gives_existing_experiments_calendar_days(db_url) -> None:
    """0007 → head: an experiment stored before has days of 86,400 s, the days it had."""
    engine = create_engine(db_url)
    at_revision(engine, "0007")
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO experiments (name, salt, arms, control, split, start_at, end_at,"
                " crossover_day, sigma, created_by) VALUES ('old', 's',"
                ' \'[{"name": "a", "cc": "cubic"}, {"name": "b", "cc": "reno"}]\','
                " 'a', '[0.5, 0.5]', '2026-12-01T07:00Z', '2026-12-04T07:00Z', '2026-12-03', 1,"
                " 'test')"
            )
        )
    database.migrate(engine)
    old = store.get_experiment(engine, "old")
    with pytest.raises(IntegrityError, match="experiments_day_seconds"), engine.begin() as conn:
        conn.execute(text("UPDATE experiments SET day_seconds = 7000"))
    engine.dispose()
    assert old.day_seconds == 86_400
    assert old.days() == [date(2026, 12, 1) + timedelta(days=k) for k in range(4)]
    assert old.crossover_at == midnight(date(2026, 12, 3))
