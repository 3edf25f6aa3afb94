"""The dashboard's charts in a real browser (headless Chromium, every origin but loopback
unreachable) over real data: reports from fake hosts through real gRPC into real PostgreSQL, a
refit, and an A/B experiment declared through REST. Each chart must plot exactly what the REST
API answers (read back from the chart's data-series and its table), and screenshots of the
charts are written to docs/dashboard/. Also the read-only chart endpoints themselves, the
auto-refresh and its pause, keyboard reach of every control, and the vendored chart library in
the package. Skips where Chromium is not installed (scripts/install-browser.sh)."""

from __future__ import annotations

import fnmatch
import json
import math
import os
import random
import tempfile
import time
import tomllib
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from gemini_api import sketch as sketches
from gemini_api.aggregate import AggregateBuilder, FlowStats
from gemini_api.datapaths import load_datapath
from gemini_api.theta import load_spec
from gemini_api.v1 import booster_pb2 as pb
from gemini_booster import simulation as sim
from gemini_booster.models import PolicyCreate
from gemini_booster.service.rest import DASHBOARD_DIR
from gemini_booster.storage import policies as policy_store

from .conftest import OPERATOR, agent_md, auth
from .test_cli import booster as booster_cli
from .test_dashboard import Page, base_url, browser  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parent.parent
# The recorded screenshots (docs/dashboard/) are refreshed by `make screenshots`; a plain test
# run writes its own elsewhere, so running the tests leaves the working tree as it was.
SHOTS = Path(
    os.environ.get("GEMINI_DASHBOARD_SHOTS")
    or Path(tempfile.gettempdir()) / "gemini-dashboard-shots"
)
SPEC = load_spec()
# The agent's compact sketch as Booster reads it back (gemini_api.sketch), and a rounding.
SKETCH_REL = sketches.COMPACT_READ_ERROR + 1e-6
POLICY, EXP_POLICY, EXPERIMENT = "cdn", "exp", "cubic-vs-fusion"
TUNED = SPEC.default() | {"mult_decrease": 70}
ROUNDS = 6  # hourly buckets of Fusion reports, the newest an hour ago
FLEET = [f"web-{i}" for i in range(4)]  # web-3 explores; the others run the incumbent
EXPLORER_FINDS = (5, 4)  # rounds (hours ago) in which the explorer runs the tuned θ
FLEET_SWITCHES = 3  # from this round (hours ago) on, the fleet runs the tuned θ
FLOWS_PER_REPORT = 12
# Throughput over the default θ's by λ (its mult_decrease): the tuned θ's is better, the
# explorer's other guesses worse.
GAIN_MBPS, WORSE_MBPS = {TUNED["mult_decrease"]: 10.0, SPEC.default()["mult_decrease"]: 0.0}, -5.0
REFIT_AFTER_MS = 10 * 60_000  # each round's refit, after its reports (5 min intervals)
EXP_HOSTS = [f"eu-{i}" for i in range(8)]
EXP_DAYS = 3
HOUR_MS, DAY_MS = 3_600_000, 86_400_000
VENDOR = ("uPlot.iife.min.js", "uPlot.min.css", "uPlot.LICENSE", "VENDORED.md")
SHOT_WINDOW = (1280, 1000)


def aggregate(tpts: list[float], delay_ms: float, cc: str = "", theta=None) -> pb.Aggregate:
    """Flows of 1 s each at ``tpts`` Mbit/s with one queueing delay, of ``cc`` ('' is Fusion)."""
    b = AggregateBuilder()
    for t in tpts:
        b.add(FlowStats(int(t * 1e6 / 8), 1_000_000, int(40_000 + delay_ms * 1000), 40_000))
    return b.to_proto(theta or SPEC.default(), 1, sim.ETHERNET.message(), cc)


def report(svc, host: str, policy: str, aggs: list[pb.Aggregate], start_ms: int) -> None:
    req = sim.make_report(host, policy, aggs, start_ms)
    assert svc.stub().ReportAggregates(req, metadata=agent_md()).aggregates_stored == len(aggs)


def age_history(svc, generation: int, at_ms: int) -> None:
    """Date the incumbent change a refit recorded (if any) at ``at_ms``: the fixture's rounds
    are hours in the past, its refits are run now, one after each round's reports, and this
    puts each where it belongs on the rounds' clock (the only stored value the tests set)."""
    with svc.engine.begin() as conn:
        conn.execute(
            text("UPDATE incumbent_history SET published_at = :at WHERE plan_generation = :g"),
            {"at": datetime.fromtimestamp(at_ms / 1000, UTC), "g": generation},
        )


def refit(svc, policy: str) -> int:
    """Refit ``policy`` now; the plan generation it published."""
    svc.booster.refit(svc.booster.policies[policy])
    return policy_store.policy_generations(svc.engine)[svc.booster.policies[policy].id][1]


def round_thetas(k: int) -> list[dict[str, int]]:
    """The θ each host of ``FLEET`` runs in the round ``k`` hours ago."""
    explorer = TUNED if k in EXPLORER_FINDS else SPEC.default() | {"mult_decrease": 52 + 2 * k}
    fleet = SPEC.default() if k > FLEET_SWITCHES else TUNED
    return [fleet] * (len(FLEET) - 1) + [explorer]


def round_flows(k: int, theta: dict[str, int]) -> int:
    """Fusion flows of ``theta`` in the round ``k`` hours ago."""
    return FLOWS_PER_REPORT * round_thetas(k).count(theta)


def seed_rounds(svc, rng: random.Random, now_ms: int) -> list[float]:
    """Six hourly rounds, each followed by a refit: the fleet runs the default θ, the explorer
    finds the tuned θ (rounds 5 and 4 hours ago), the plan switches to it and the fleet
    follows; cubic flows run beside it. Returns every Fusion throughput sent."""
    sent: list[float] = []
    for k in range(ROUNDS, 0, -1):
        start = now_ms - k * HOUR_MS
        for host, theta in zip(FLEET, round_thetas(k), strict=True):
            gain = GAIN_MBPS.get(theta["mult_decrease"], WORSE_MBPS)
            tpts = [rng.uniform(15, 25) + gain for _ in range(FLOWS_PER_REPORT)]
            sent += tpts
            cubic = [rng.uniform(8, 16) for _ in range(6)]
            report(
                svc,
                host,
                POLICY,
                [aggregate(tpts, 8 + k, theta=theta), aggregate(cubic, 30, "cubic")],
                start,
            )
        age_history(svc, refit(svc, POLICY), start + REFIT_AFTER_MS)
    return sent


def crossover_day(now: datetime) -> date:
    """The experiment's middle day: the arms swap host groups at its start."""
    return (now - timedelta(days=1)).date()


def seed_experiment(svc, rng: random.Random, now: datetime) -> None:
    """Cubic against Fusion on eight hosts over three UTC days, swapping host groups on the
    second (a crossover), declared through REST."""
    policy_store.create_policy(svc.engine, PolicyCreate(name=EXP_POLICY), actor="test")
    svc.booster.reload_policies()
    body = {
        "name": EXPERIMENT,
        "description": "cubic against Fusion at a fixed θ",
        "arms": [
            {"name": "control", "cc": "cubic"},
            {"name": "fusion", "cc": "fusion", "params": "fixed", "theta": TUNED},
        ],
        "population": {"regions": {"eu": EXP_HOSTS}},
        "crossover_day": crossover_day(now).isoformat(),
        "start": experiment_start(now).isoformat(),
        "end": (now + timedelta(days=3)).isoformat(),
    }
    r = svc.http.post("/v1/experiments", json=body, headers=auth(OPERATOR))
    assert r.status_code == 201, r.text
    now_ms = int(now.timestamp() * 1000)
    for d in range(EXP_DAYS - 1, -1, -1):
        for host in EXP_HOSTS:
            fusion = [rng.uniform(18, 26) for _ in range(8)]
            cubic = [rng.uniform(15, 23) for _ in range(8)]
            aggs = [aggregate(fusion, 6, theta=TUNED), aggregate(cubic, 12, "cubic")]
            report(svc, host, EXP_POLICY, aggs, now_ms - d * DAY_MS - 10 * 60_000)


def rounds_clock(now: datetime) -> datetime:
    """The latest half past an hour at or before ``now``: the rounds start there, so each
    round's refit (REFIT_AFTER_MS later) is published within the round's own hour bucket,
    whatever the minute the test runs at (from :50 on, a refit fell into the next bucket)."""
    half_past = now.replace(minute=30, second=0, microsecond=0)
    return half_past if half_past <= now else half_past - timedelta(hours=1)


def experiment_clock(now: datetime) -> datetime:
    """``now``, or 00:10 UTC if earlier in the day: the day's reports, 10 minutes before it,
    then fall on that UTC day and not after ``now``."""
    return max(now, now.replace(hour=0, minute=10, second=0, microsecond=0))


def experiment_start(now: datetime) -> datetime:
    """Midnight UTC of the experiment's first day: EXP_DAYS UTC days begun by ``now``, whatever
    the hour (a start of ``now`` less whole days and an hour spanned one more date from 00:00
    to 01:00)."""
    first = now - timedelta(days=EXP_DAYS - 1)
    return first.replace(hour=0, minute=0, second=0, microsecond=0)


@pytest.fixture
def fleet(booster):
    """A planned policy with six rounds of Fusion and cubic flows, and a three-day experiment."""
    policy_store.create_policy(booster.engine, PolicyCreate(name=POLICY, sigma=0.5), actor="test")
    booster.booster.reload_policies()
    rng = random.Random(15)
    now = datetime.now(UTC)
    booster.sent = seed_rounds(booster, rng, int(rounds_clock(now).timestamp() * 1000))
    seed_experiment(booster, rng, experiment_clock(now))
    return booster


@pytest.mark.parametrize("minute", [0, 9, 29, 30, 49, 50, 59])
def test_the_fixtures_clocks_hold_at_any_minute_of_the_day(minute):
    """The fixture's rounds and experiment days do not depend on when the tests run."""
    for hour in (0, 13, 23):
        now = datetime(2026, 11, 24, hour, minute, 7, tzinfo=UTC)
        start = rounds_clock(now)
        assert start <= now and start.minute == 30 and now - start < timedelta(hours=1)
        refit = start + timedelta(milliseconds=REFIT_AFTER_MS)
        assert refit.hour == start.hour  # published in the round's own bucket
        exp = experiment_clock(now)
        last_report = exp - timedelta(minutes=10)
        assert last_report.date() == now.date() and last_report <= now
        start = experiment_start(exp)
        assert (exp.date() - start.date()).days + 1 == EXP_DAYS and start <= last_report


def get(svc, path: str):
    r = svc.http.get(path, headers=auth(OPERATOR))
    assert r.status_code == 200, r.text
    return r.json()


def context_label(svc) -> str:
    [plan] = get(svc, f"/v1/policies/{POLICY}/parameters")
    return plan["label"]


def test_chart_endpoints_answer_from_the_stored_sums_and_sketches(fleet):
    label = context_label(fleet)
    rounds = get(fleet, f"/v1/policies/{POLICY}/charts/rounds?context={label}")
    assert len(rounds["rounds"]) == ROUNDS
    assert rounds["incumbent_history_stored"]
    assert rounds["incumbent"]["theta"] == TUNED
    assert [r["flows"] for r in rounds["rounds"]] == [FLOWS_PER_REPORT * len(FLEET)] * ROUNDS
    # the plan began with the default θ and switched to the tuned one the explorer found
    changes = get(fleet, f"/v1/policies/{POLICY}/charts/incumbents?context={label}")["changes"]
    assert [c["theta"] for c in changes] == [SPEC.default(), TUNED]
    assert rounds["changes"] == changes  # all published after the first round began
    # each round is marked with the incumbent published at or before its start
    for j, r in enumerate(rounds["rounds"]):
        k = ROUNDS - j
        before = [c for c in changes if c["published_at"] <= r["bucket"]]
        if not before:  # the first round ran before the first refit
            assert r["incumbent_theta"] is r["incumbent_utility"] is None and k == ROUNDS
            assert r["incumbent_flows"] == 0
            continue
        assert r["incumbent_theta"] == before[-1]["theta"], k
        assert r["incumbent_published_at"] == before[-1]["published_at"]
        assert r["incumbent_flows"] == round_flows(k, before[-1]["theta"]), k
    marked = [r["incumbent_theta"] for r in rounds["rounds"]]
    assert marked[1] == SPEC.default() and marked[-1] == TUNED
    # the same sums as the trials endpoint, per bucket instead of merged
    at10 = get(fleet, f"/v1/policies/{POLICY}/charts/rounds?context={label}&sigma=10")
    assert at10["sigma"] == 10
    assert all(
        a["utility"] < b["utility"] for a, b in zip(at10["rounds"], rounds["rounds"], strict=True)
    )

    pct = get(fleet, f"/v1/policies/{POLICY}/charts/percentiles?context={label}")
    arms = {a["arm"]: a for a in pct["arms"]}
    assert list(arms) == ["fusion", "incumbent", "cubic"]
    assert arms["fusion"]["flows"] == arms["fusion"]["sketched_flows"] == len(fleet.sent)
    median = sorted(fleet.sent)[len(fleet.sent) // 2]
    p50 = arms["fusion"]["throughput_mbps"][pct["quantiles"].index(0.5)]
    # the agent's compact sketch as Booster reads it back, plus the sample's rank
    assert p50 == pytest.approx(median, rel=SKETCH_REL + 0.02)
    # queueing delay: each round's Fusion flows queued 8 + k ms (k hours ago), cubic's 30 ms
    delays = [8.0 + k for k in range(1, ROUNDS + 1) for _ in range(FLOWS_PER_REPORT * len(FLEET))]
    assert arms["fusion"]["delay_sketched_flows"] == len(delays)
    for q, got in zip(pct["quantiles"], arms["fusion"]["queue_delay_ms"], strict=True):
        want = sorted(delays)[math.floor(q * (len(delays) - 1))]  # the sketch's rank rule
        assert got == pytest.approx(want, rel=SKETCH_REL), q
    assert arms["cubic"]["queue_delay_ms"] == pytest.approx(
        [30.0] * len(pct["quantiles"]), rel=SKETCH_REL
    )

    theta = get(fleet, f"/v1/policies/{POLICY}/charts/theta")
    assert theta["flows"] == len(fleet.sent) and theta["hosts"] == len(FLEET)
    assert theta["reports"] == pct["reports"] == ROUNDS * len(FLEET) and not pct["truncated"]
    [md] = [p for p in theta["params"] if p["name"] == "mult_decrease"]
    by_value = {v["value"]: v for v in md["values"]}
    tuned_flows = sum(round_flows(k, TUNED) for k in range(1, ROUNDS + 1))
    assert by_value[0.7]["flows"] == tuned_flows
    assert by_value[0.7]["hosts"] == len(FLEET)  # the explorer ran it too
    for p in theta["params"]:
        assert sum(v["flows"] for v in p["values"]) == theta["flows"]

    # a policy tuning CUBIC shows θ in CUBIC's parameters
    cubic = fleet.http.post(
        "/v1/policies", json={"name": "cubic-tuned", "target_cc": "cubic"}, headers=auth(OPERATOR)
    )
    assert cubic.status_code == 201, cubic.text
    cubic_theta = get(fleet, "/v1/policies/cubic-tuned/charts/theta")
    assert cubic_theta["datapath"] == "cubic" and cubic_theta["flows"] == 0
    assert [p["name"] for p in cubic_theta["params"]] == list(load_datapath("cubic").names)
    assert theta["datapath"] == "fusion"

    missing = fleet.http.get(
        f"/v1/policies/{POLICY}/charts/rounds?context=x/y->z/w@3", headers=auth(OPERATOR)
    )
    assert missing.status_code == 404 and "not found" in missing.json()["detail"]
    assert fleet.http.get(f"/v1/policies/{POLICY}/charts/theta").status_code == 401


def series(page: Page, element_id: str) -> dict:
    page.wait.until(lambda _: page.el(element_id).get_attribute("data-series"))
    return json.loads(page.el(element_id).get_attribute("data-series"))


def table_text(page: Page, table: str) -> list[list[str]]:
    """A table's cells as text, also inside a closed <details> (where Selenium sees none)."""
    return page.driver.execute_script(
        "return [...document.getElementById(arguments[0]).tBodies[0].rows]"
        ".map(r => [...r.cells].map(c => c.textContent));",
        table,
    )


def drawn(page: Page, element_id: str) -> bool:
    """The chart was drawn: uPlot put a canvas with pixels of a size in the element."""
    return bool(
        page.driver.execute_script(
            "const c = document.querySelector(`#${arguments[0]} canvas`);"
            "return c !== null && c.width > 100 && c.height > 50;",
            element_id,
        )
    )


def shoot(page: Page, element_id: str, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    el = page.el(element_id)
    page.driver.execute_script("document.activeElement.blur(); arguments[0].scrollIntoView()", el)
    assert el.screenshot(str(SHOTS / name))


def signed_in(driver, svc, query: str = "", token: str = OPERATOR) -> Page:
    driver.set_window_size(*SHOT_WINDOW)
    page = Page(driver, base_url(svc), query)
    assert "booster token create" in page.el("token-help").text
    if not query:
        shoot(page, "welcome", "sign-in.png")
    page.sign_in(token)
    page.status_contains("Signed in.")
    page.wait.until(lambda _: page.rows("rounds-table") and page.rows("days-table"))
    return page


def assert_estimates(plotted: dict, days: list[dict], key: str, name, metric: str) -> None:
    """``plotted`` holds, per series name, each day's mean, low and high as the API gave them."""
    for d_i, day in enumerate(days):
        for entry in day[key]:
            n = name(entry)
            for part, suffix in (("mean", ""), ("low", " low"), ("high", " high")):
                assert plotted[f"{n}{suffix}"][d_i] == pytest.approx(entry[metric][part]), (n, part)


def test_charts_plot_what_the_api_answers_offline(fleet, browser):  # noqa: F811
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.keys import Keys

    label = context_label(fleet)
    page = signed_in(browser, fleet)

    rounds = get(fleet, f"/v1/policies/{POLICY}/charts/rounds?context={label}")
    plotted = series(page, "rounds-chart")
    assert plotted["bucket"] == [r["bucket"] for r in rounds["rounds"]]
    assert plotted["utility"] == pytest.approx([r["utility"] for r in rounds["rounds"]])
    assert plotted["utility_stderr"] == pytest.approx(
        [r["utility_stderr"] for r in rounds["rounds"]]
    )
    assert plotted["incumbent_utility"] == pytest.approx(
        [r["incumbent_utility"] for r in rounds["rounds"]]
    )
    assert plotted["incumbent_utility"][0] is None  # no incumbent yet: a gap, not a zero
    assert plotted["incumbent_since"] == [r["incumbent_published_at"] for r in rounds["rounds"]]
    assert plotted["changes"] == [c["published_at"] for c in rounds["changes"]]
    assert "Today's incumbent θ (" in page.el("rounds-note").text
    assert "λ 0.7," in page.el("rounds-note").text
    assert "(2 in these rounds)" in page.el("rounds-note").text
    assert len(page.rows("rounds-table")) == ROUNDS
    changes = table_text(page, "changes-table")
    assert [row[0] for row in changes] == ["θ1", "θ2"]
    assert "λ 0.85," in changes[0][2] and "λ 0.7," in changes[1][2]

    pct = get(fleet, f"/v1/policies/{POLICY}/charts/percentiles?context={label}")
    plotted = series(page, "percentiles-chart")
    assert plotted["quantile"] == pct["quantiles"]
    for arm in pct["arms"]:
        assert plotted[arm["arm"]] == pytest.approx(arm["throughput_mbps"]), arm["arm"]
    plotted = series(page, "delay-chart")
    assert plotted["quantile"] == pct["quantiles"]
    assert set(plotted) == {"quantile"} | {a["arm"] for a in pct["arms"]}
    for arm in pct["arms"]:
        assert plotted[arm["arm"]] == pytest.approx(arm["queue_delay_ms"]), arm["arm"]
    assert page.el("delay-note").text == ""  # every flow here came with a delay sketch
    assert [r[0] for r in table_text(page, "percentiles-table")] == ["fusion", "incumbent", "cubic"]

    theta = get(fleet, f"/v1/policies/{POLICY}/charts/theta")
    plotted = series(page, "theta-charts")
    assert set(plotted) == {p["name"] for p in theta["params"]}
    for p in theta["params"]:
        assert plotted[p["name"]]["value"] == pytest.approx([v["value"] for v in p["values"]])
        assert plotted[p["name"]]["flows"] == [v["flows"] for v in p["values"]]

    results = get(fleet, f"/v1/experiments/{EXPERIMENT}/results")
    assert len(results["days"]) == EXP_DAYS
    plotted = series(page, "days-chart")
    assert plotted["day"] == [d["day"] for d in results["days"]]
    assert set(plotted) == {"day"} | {
        f"{a}{s}" for a in ("control", "fusion") for s in ("", " low", " high")
    }
    assert_estimates(plotted, results["days"], "arms", lambda a: a["arm"], "utility")
    diff = series(page, "difference-chart")
    assert_estimates(
        diff, results["days"], "differences", lambda v: f"{v['arm']} − {v['control']}", "utility"
    )
    assert all(d["differences"][0]["utility"]["low"] is not None for d in results["days"])
    crossover = get(fleet, f"/v1/experiments/{EXPERIMENT}")["crossover_day"]
    assert page.el("days-chart").get_attribute("data-crossover") == crossover
    assert [d["period"] for d in results["days"]] == [0, 1, 1]

    by_arm = {a["arm"]: a for a in results["days"][0]["arms"]}
    page.el("metric").send_keys("t")  # throughput, chosen by keyboard
    page.wait.until(
        lambda _: (
            series(page, "days-chart")["fusion"][0]
            == pytest.approx(by_arm["fusion"]["throughput_mbps"]["mean"])
        )
    )
    for chart in (
        "rounds-chart",
        "percentiles-chart",
        "delay-chart",
        "days-chart",
        "difference-chart",
    ):
        assert drawn(page, chart), chart
    assert drawn(page, "theta-chart-mult_decrease")
    page.el("metric").send_keys(Keys.UP)  # back to utility for the picture
    page.wait.until(
        lambda _: (
            series(page, "days-chart")["fusion"][0]
            == pytest.approx(by_arm["fusion"]["utility"]["mean"])
        )
    )
    shoot(page, "rounds-figure", "rounds.png")
    shoot(page, "percentiles-figure", "percentiles.png")
    shoot(page, "theta-figure", "theta.png")
    shoot(page, "experiments-section", "experiment.png")

    # the charts follow the window's width (one column of charts in a narrow window)
    width = (
        "const e = document.getElementById('rounds-chart');"
        "return [e.clientWidth, e.querySelector('canvas').width];"
    )
    before, drawn_at = browser.execute_script(width)
    assert before == drawn_at
    browser.set_window_size(700, SHOT_WINDOW[1])
    page.wait.until(lambda d: (w := d.execute_script(width))[0] != before and w[0] == w[1])
    browser.set_window_size(*SHOT_WINDOW)

    # an exploring fleet's many distinct values are drawn as ten bins of their range
    values = [0.5 + i / 100 for i in range(30)]
    bars = browser.execute_script(
        "return thetaBars(arguments[0], arguments[1], 60)", values, [2] * 30
    )
    assert len(bars["labels"]) == 10 and bars["labels"][0] == "0.514"
    assert bars["shares"] == pytest.approx([10.0] * 10)

    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], errors

    # offline: every resource came from Booster, and other origins cannot be reached at all
    base = base_url(fleet)
    loaded = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)"
    )
    assert any(u.endswith("/dashboard/uPlot.iife.min.js") for u in loaded)
    assert all(u.startswith(base) for u in loaded), loaded
    with pytest.raises(WebDriverException, match=r"net::ERR_"):
        browser.get("http://example.com/")


def test_auto_refresh_shows_new_flows_and_pauses(fleet, browser):  # noqa: F811
    label = context_label(fleet)
    page = signed_in(browser, fleet, "?refresh=2")
    assert page.el("refresh-seconds").text == "2"
    assert browser.find_element("tag name", "body").get_attribute("data-auto-refresh") == "on"
    before = sum(
        r["flows"]
        for r in get(fleet, f"/v1/policies/{POLICY}/charts/rounds?context={label}")["rounds"]
    )
    shown = page.el("updated").text
    assert shown.endswith(" UTC")
    report(
        fleet,
        FLEET[0],
        POLICY,
        [aggregate([30.0] * 5, 4, theta=TUNED)],
        int(time.time() * 1000) - 300_000,
    )
    page.wait.until(
        lambda _: sum(int(r[1]) for r in table_text(page, "rounds-table")) == before + 5
    )
    assert page.el("updated").get_attribute("datetime")

    page.el("pause").click()
    page.status_contains("Auto-refresh paused.")
    assert page.el("pause").get_attribute("aria-pressed") == "true"
    assert page.el("pause").text == "Resume"
    assert browser.find_element("tag name", "body").get_attribute("data-auto-refresh") == "paused"
    page.el("pause").click()
    page.status_contains("Auto-refresh resumed.")


def test_every_control_is_reached_by_keyboard(fleet, browser):  # noqa: F811
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    # signed in as the sign-in help says a new viewer gets a token: from the booster CLI
    db = fleet.server.settings.database_url.get_secret_value()
    created = booster_cli("token", "create", "--name", "alice", "--role", "viewer", db=db)
    assert created.returncode == 0, created.stderr
    signed_in(browser, fleet, token=created.stdout.strip())
    reached = []
    for _ in range(60):
        ActionChains(browser).send_keys(Keys.TAB).perform()
        el = browser.switch_to.active_element
        reached.append(el.get_attribute("id") or el.tag_name)
    wanted = {
        "policy",
        "context",
        "pause",
        "refresh",
        "sigma",
        "exploration",
        "preview",
        "save",
        "experiment",
        "metric",
    }
    assert wanted <= set(reached), reached
    assert reached.count("summary") >= 4  # each chart's table alternative opens by keyboard
    for control in wanted:  # every control has a label a screen reader reads
        labelled = browser.execute_script(
            "const e = document.getElementById(arguments[0]);"
            "return (e.labels && e.labels.length > 0) || e.textContent.trim().length > 0;",
            control,
        )
        assert labelled, control


def test_vendored_chart_library_ships_in_the_package():
    globs = tomllib.loads((ROOT / "booster" / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["gemini_booster.service.dashboard"]
    for name in VENDOR:
        assert (DASHBOARD_DIR / name).is_file(), name
    for path in DASHBOARD_DIR.iterdir():  # every file the page may load ships in the wheel
        assert any(fnmatch.fnmatch(path.name, g) for g in globs), path.name
    notes = (DASHBOARD_DIR / "VENDORED.md").read_text()
    assert "uplot@1.6.32" in notes
    assert "v1.6.32" in (DASHBOARD_DIR / VENDOR[0]).read_text()[:200]
    html = (DASHBOARD_DIR / "index.html").read_text()
    assert "http://" not in html and "https://" not in html  # no other origin, no CDN


def test_a_new_booster_says_what_is_missing_without_errors(booster, browser):  # noqa: F811
    """No policy, no experiment: the page says so and draws nothing, and the browser logs no
    error (a chart fed nothing must not throw)."""
    policy_store.create_policy(booster.engine, PolicyCreate(name=POLICY), actor="test")
    booster.booster.reload_policies()
    page = Page(browser, base_url(booster))
    page.sign_in(OPERATOR)
    page.status_contains("Signed in.")
    page.wait.until(lambda _: page.el("rounds-chart").get_attribute("data-series"))
    assert page.el("no-experiments").is_displayed()
    assert "No data yet." in page.el("rounds-chart").text
    assert "No data yet." in page.el("percentiles-chart").text
    assert "No data yet." in page.el("delay-chart").text
    assert series(page, "theta-charts") == {p.name: {"value": [], "flows": []} for p in SPEC.params}
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], errors
