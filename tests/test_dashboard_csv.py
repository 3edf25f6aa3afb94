"""The dashboard's CSV buttons save the API's ``?format=csv`` exports (fetched with the
operator's token) and the saved files parse to the values of the JSON the page draws: the
comparison and the trials of a policy, and an experiment's results.

Real Booster (embedded PostgreSQL, reports through gRPC), headless Chromium saving into a
temporary folder (the DevTools download behaviour), polled for each file against a deadline.
"""

from __future__ import annotations

import csv
import io
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from .conftest import OPERATOR, auth
from .test_dashboard import Page, base_url, browser  # noqa: F401 (a fixture)
from .test_experiment_days import HOSTS, POLICY, create, create_body, send, start_of, start_policy

DEADLINE_S = 20.0
CALENDAR = 86_400


def saved(folder: Path, name: str) -> list[dict[str, str]]:
    """The rows of the file ``name`` once Chromium has finished saving it."""
    path = folder / name
    deadline = time.monotonic() + DEADLINE_S
    while not path.exists() or any(folder.glob("*.crdownload")):
        assert time.monotonic() < deadline, f"{name} not saved; have {list(folder.iterdir())}"
        time.sleep(0.1)
    return list(csv.DictReader(io.StringIO(path.read_text())))


def api(svc, path: str):
    r = svc.http.get(path, headers=auth(OPERATOR))
    assert r.status_code == 200, r.text
    return r.json()


def number(text: str) -> float | None:
    return float(text) if text else None


def test_csv_buttons_save_what_the_api_answers(booster, browser, tmp_path) -> None:  # noqa: F811
    start_policy(booster)
    body = create_body(datetime.now(UTC), CALENDAR, name="calendar")
    create(booster, body)
    for h in HOSTS:
        send(booster, h, start_of(body) + timedelta(minutes=5), 3, 4)
    folder = tmp_path / "downloads"
    folder.mkdir()
    browser.execute_cdp_cmd(
        "Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(folder)}
    )
    page = Page(browser, base_url(booster), "?experiment=calendar")
    page.sign_in(OPERATOR)
    page.wait.until(lambda _: page.rows("comparison"))

    page.el("comparison-csv").click()
    rows = saved(folder, f"{POLICY}-comparison.csv")
    comparison = api(booster, f"/v1/policies/{POLICY}/comparison")
    arms = [(c["label"], a["arm"], a["flows"], a["utility"]) for c in comparison for a in c["arms"]]
    assert [
        (r["label"], r["arm"], int(r["flows"]), float(r["utility"]))
        for r in rows
        if r["row"] == "arm"
    ] == arms
    assert {a for _, a, _, _ in arms} >= {"fusion", "cubic"}

    page.el("trials-csv").click()
    rows = saved(folder, f"{POLICY}-trials.csv")
    trials = api(booster, f"/v1/policies/{POLICY}/trials")
    assert [(int(r["flows"]), float(r["utility"])) for r in rows] == [
        (t["flows"], t["utility"]) for t in trials
    ]

    page.wait.until(lambda _: page.el("experiment").get_attribute("value") == "calendar")
    page.el("experiment-csv").click()
    rows = saved(folder, "calendar-results.csv")
    results = api(booster, "/v1/experiments/calendar/results")
    json_arms = {
        (str(d["day"]), a["arm"]): (a["flows"], a["utility"]["mean"])
        for d in [*results["days"], {"day": "overall", **results["overall"]}]
        for a in d["arms"]
    }
    csv_arms = {
        (r["day"], r["arm"]): (int(r["flows"]), number(r["utility.mean"]))
        for r in rows
        if r["row"] == "arm"
    }
    assert csv_arms == json_arms
    assert sum(f for (day, _), (f, _) in csv_arms.items() if day == "overall") == 2 * 3 + 2 * 4
