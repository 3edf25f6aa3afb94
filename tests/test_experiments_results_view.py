"""How an experiment's results read: each day says which stretch of time it was (its index from
the start, its first and last instant), so compressed days are not mistaken for calendar dates;
a stopped experiment shows no days after its stop; the CSV export carries the JSON's values.

The domain rule (``Experiment.days_run``) is checked on its own; the API's through real gRPC
reports into real PostgreSQL, with the one stored value a test may set: the stop's instant,
moved into the past so that days have begun since.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import text

from .conftest import OPERATOR, auth
from .test_dashboard import Page, base_url, browser  # noqa: F401 (a fixture)
from .test_experiment_days import (
    HOSTS,
    SHORT,
    SHORT_DAY,
    STARTED,
    boundary_before,
    create,
    create_body,
    experiment,
    send,
    start_of,
    start_policy,
)

STOPPED_AGO = timedelta(minutes=20)  # ten compressed days begin after the stop


def test_no_days_after_a_stop() -> None:
    e = experiment(seconds=SHORT, end=STARTED + timedelta(hours=1))
    later = STARTED + timedelta(minutes=30)
    assert (
        len(e.days_run(later)) == len(e.days_begun(later)) == 16
    )  # [08:00, 08:02) … [08:30, 08:32)
    stopped = replace(e, stopped_at=STARTED + 5 * SHORT_DAY)
    run = stopped.days_run(later)
    assert run == e.days_begun(later)[: len(run)]
    assert stopped.stopped_at is not None
    assert stopped.day_start(run[-1]) < stopped.stopped_at <= stopped.day_start(run[-1]) + SHORT_DAY
    assert len(run) == 6  # days 0..5: day 5 holds the stop
    before = replace(e, stopped_at=STARTED - SHORT_DAY)
    assert before.days_run(later) == []


def results(booster, query: str = "") -> dict:
    r = booster.http.get(f"/v1/experiments/compressed/results{query}", headers=auth(OPERATOR))
    assert r.status_code == 200, r.text
    return r.json() if "csv" not in query else {"csv": r.text}


def test_results_days_carry_their_own_time_and_stop_at_the_stop(booster) -> None:
    start_policy(booster)
    now = datetime.now(UTC)
    body = create_body(now, SHORT)
    create(booster, body)
    day0 = boundary_before(start_of(body), SHORT)
    for k in (0, 2):
        for h in HOSTS:
            send(booster, h, day0 + k * SHORT_DAY + 80 * timedelta(seconds=1), k + 1, 10 + k)
    r = booster.http.post("/v1/experiments/compressed/stop", headers=auth(OPERATOR))
    assert r.status_code == 200, r.text
    with booster.engine.begin() as conn:
        stop = conn.execute(
            text(
                "UPDATE experiments SET stopped_at = stopped_at - :ago "
                "WHERE name = 'compressed' RETURNING stopped_at"
            ),
            {"ago": STOPPED_AGO},
        ).scalar_one()

    out = results(booster, "?sigma=0")
    assert out["day_seconds"] == SHORT
    days = out["days"]
    for k, d in enumerate(days):
        start = datetime.fromisoformat(d["start"])
        assert d["index"] == k and start == day0 + k * SHORT_DAY
        assert datetime.fromisoformat(d["end"]) == start + SHORT_DAY
    last = datetime.fromisoformat(days[-1]["start"])
    assert last < stop <= last + SHORT_DAY  # the stop's own day is the last one shown
    for k, d in enumerate(days):
        flows = {a["arm"]: a["flows"] for a in d["arms"]}
        sent = k in (0, 2)  # two hosts per arm, each ran only its own arm's flows
        assert flows == {"control": 2 * (10 + k) * sent, "fusion": 2 * (k + 1) * sent}, k

    table = list(csv.DictReader(io.StringIO(results(booster, "?sigma=0&format=csv")["csv"])))
    want = [
        (str(d["day"]), str(d["index"]), a["arm"], str(a["flows"]), a["utility"]["mean"])
        for d in [*days, {"day": "overall", "index": "", **out["overall"]}]
        for a in d["arms"]
    ]
    got = [
        (
            r["day"],
            r["index"],
            r["arm"],
            r["flows"],
            float(r["utility.mean"]) if r["utility.mean"] else None,
        )
        for r in table
        if r["row"] == "arm"
    ]
    assert got == want
    diffs = [r for r in table if r["row"] == "difference"]
    assert len(diffs) == sum(len(d["differences"]) for d in days) + len(
        out["overall"]["differences"]
    )


def first_cells(page: Page, table: str) -> list[str]:
    """The first cell of each body row, as text (also inside a closed <details>)."""
    return page.driver.execute_script(
        "const b = document.getElementById(arguments[0]).tBodies[0];"
        "return b ? Array.from(b.rows, r => r.cells[0].textContent) : [];",
        table,
    )


def test_dashboard_names_compressed_days_by_their_index_and_time(booster, browser) -> None:  # noqa: F811
    """A rehearsal's days of 120 s are shown as ``day k (start–end)`` and plotted at their own
    instants, not as the calendar dates their labels are."""
    start_policy(booster)
    body = create_body(datetime.now(UTC), SHORT)
    create(booster, body)
    day0 = boundary_before(start_of(body), SHORT)
    for h in HOSTS:
        send(booster, h, day0 + 80 * timedelta(seconds=1), 1, 10)
    days = results(booster)["days"]
    # A host's arm names today by label and by index, as the results' days do.
    now = booster.http.get(f"/v1/hosts/{HOSTS[0]}/experiment", headers=auth(OPERATOR)).json()
    today = date.fromisoformat(now["experiment"]["day"])
    assert now["experiment"]["day_index"] == (today - date.fromisoformat(days[0]["day"])).days
    assert now["experiment"]["day_index"] >= days[-1]["index"] > 20  # an hour of 120 s days
    page = Page(browser, base_url(booster), "?experiment=compressed")
    page.sign_in(OPERATOR)
    page.wait.until(lambda _: len(first_cells(page, "days-table")) >= 2 * len(days))
    shown = sorted(set(first_cells(page, "days-table")), key=lambda t: int(t.split()[1]))
    # Days of 120 s keep beginning while the page loads: it shows the days of some moment
    # between the two reads of the results, all of the first's and a prefix of the second's.
    later = results(booster)["days"][: len(shown)]
    assert len(shown) >= len(days)
    assert shown == [f"day {d['index']} ({d['start'][11:19]}–{d['end'][11:19]})" for d in later]
    chart = page.el("days-chart")
    x = json.loads(chart.get_attribute("data-x"))
    assert x == [datetime.fromisoformat(d["start"]).timestamp() for d in later]
    assert chart.get_attribute("data-axis") == f"experiment day ({SHORT} s each, UTC)"
