"""``booster demo`` as a newcomer runs it (issue #35 item 4): it shows progress while it starts,
serves on the port it was given and prints a URL that answers, starts from a fresh state unless
told to keep it, and leaves every chart of the dashboard with data: utility per round over
several simulated hours, percentiles, θ in use, and the A/B experiment's days and differences,
counted in headless Chromium. Ctrl-C (SIGINT) stops it cleanly.

The browser test costs about a minute (the demo replays three simulated hours, 12-16 rounds)."""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gemini_booster import demo
from gemini_booster import progress as progress_lines
from gemini_booster.config import Settings

from .conftest import free_port
from .test_dashboard import Page, browser  # noqa: F401 (a fixture)
from .test_dashboard_charts import series

START_DEADLINE_S = 600  # the demo's start-up and replay on a loaded machine, at most
URL = re.compile(r"dashboard\s+(http://\S+)")
TOKEN = re.compile(r"operator token: (\S+)")


@dataclass
class Demo:
    """A running ``booster demo`` and the lines it printed, each with when it came."""

    proc: subprocess.Popen
    lines: list[tuple[float, str]] = field(default_factory=list)
    fresh: queue.Queue = field(default_factory=queue.Queue)

    def read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))
            self.fresh.put(line)

    def wait_for(self, text: str) -> None:
        deadline = time.monotonic() + START_DEADLINE_S
        while not any(text in line for _, line in self.lines):
            assert self.proc.poll() is None, "\n".join(line for _, line in self.lines)
            assert time.monotonic() < deadline, f"no {text!r} from the demo"
            with contextlib.suppress(queue.Empty):
                self.fresh.get(timeout=1)

    def found(self, pattern: re.Pattern) -> str:
        for _, line in self.lines:
            if m := pattern.search(line):
                return m.group(1)
        raise AssertionError(f"no {pattern.pattern!r} in the demo's output")

    def longest_silence(self) -> tuple[float, str]:
        """The longest wait for a line (printed, not asserted), and the line that ended it."""
        gaps = [(b[0] - a[0], b[1]) for a, b in itertools.pairwise(self.lines)]
        return max(gaps, default=(0.0, ""))


STOP_DEADLINE_S = 300  # how long a stopping demo may take before it counts as hung


def run_demo(data: Path, *args: str) -> Iterator[Demo]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GEMINI_BOOSTER_")}
    env |= {"GEMINI_BOOSTER_DATA_DIR": str(data), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gemini_booster.cli", "demo", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    running = Demo(proc)
    reader = threading.Thread(target=running.read, daemon=True)
    reader.start()
    try:
        yield running
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=STOP_DEADLINE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        reader.join(timeout=10)


@pytest.fixture
def demo_run(tmp_path) -> Iterator[Demo]:
    """A demo of three simulated hours and 14 rounds, then serving until interrupted."""
    port = free_port()
    yield from run_demo(
        tmp_path / "var", "--port", str(port), "--hours", "3", "--rounds", "14", "--keep-serving"
    )


def points(values: list) -> int:
    return sum(v is not None for v in values)


def test_the_demo_serves_every_chart_with_data(demo_run, browser):  # noqa: F811
    demo_run.wait_for("serving until interrupted")
    url, token = demo_run.found(URL), demo_run.found(TOKEN)
    gap, line = demo_run.longest_silence()
    print(f"longest silence of the demo's output: {gap:.1f} s, before {line!r}")
    with urllib.request.urlopen(url, timeout=30) as answer:
        assert answer.status == 200 and b"<html" in answer.read().lower()

    base, query = url.split("/dashboard/")
    page = Page(browser, base, query)
    page.sign_in(token)
    page.status_contains("Signed in.")
    page.wait.until(lambda _: page.el("context").get_attribute("value"))
    page.wait.until(lambda _: len(series(page, "rounds-chart").get("utility", [])) >= 3)

    rounds = series(page, "rounds-chart")
    assert points(rounds["utility"]) >= 3  # hourly buckets: several hours, not one
    for chart in ("percentiles-chart", "delay-chart"):
        plotted = series(page, chart)
        arms = {k: v for k, v in plotted.items() if k != "quantile"}
        assert {"cubic"} < set(arms), (chart, set(arms))
        assert all(points(v) == len(plotted["quantile"]) > 0 for v in arms.values()), chart
    theta = series(page, "theta-charts")
    assert theta and all(points(p["flows"]) >= 2 for p in theta.values()), theta
    page.wait.until(lambda _: series(page, "days-chart").get("day"))
    days = series(page, "days-chart")
    assert points(days["cubic"]) >= 3 and points(days["fusion"]) >= 3, days
    difference = series(page, "difference-chart")
    assert points(difference["fusion − cubic"]) >= 3, difference
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], errors

    demo_run.proc.send_signal(signal.SIGINT)  # Ctrl-C
    try:  # a refit under way is finished first: generous, for a busy host, and not a timing
        code = demo_run.proc.wait(timeout=STOP_DEADLINE_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the demo did not stop on Ctrl-C; its last lines: {demo_run.lines[-5:]}")
    assert code == 0


def test_progress_beats_while_a_step_is_slow(monkeypatch, capsys) -> None:
    """A step that takes longer than the heartbeat says it is still going (the demo's start-up
    prints a line at least every HEARTBEAT_S, well under 10 s)."""
    assert progress_lines.HEARTBEAT_S <= 5
    monkeypatch.setattr(progress_lines, "HEARTBEAT_S", 0.01)
    progress = progress_lines.Progress()
    seen: list[str] = []
    with progress.step("starting"):
        deadline = time.monotonic() + 30
        while not any("so far" in line for line in seen):
            assert time.monotonic() < deadline
            seen += capsys.readouterr().out.splitlines()
    out = "\n".join(seen) + capsys.readouterr().out
    assert "starting …" in out and "starting: done in" in out


def test_each_run_starts_fresh_unless_told_to_keep(tmp_path, capsys) -> None:
    data = tmp_path / "demo"
    demo.database_dir(data).mkdir(parents=True)
    (data / "demo-tokens.json").write_text("{}")
    demo.fresh_state(data, keep=True, progress=progress_lines.Progress())
    assert (data / "demo-tokens.json").exists()
    demo.fresh_state(data, keep=False, progress=progress_lines.Progress())
    assert not data.exists()
    assert "fresh" in capsys.readouterr().out


def test_a_running_demo_database_is_never_removed(tmp_path) -> None:
    data = tmp_path / "demo"
    demo.database_dir(data).mkdir(parents=True)
    (demo.database_dir(data) / "postmaster.pid").write_text(f"{os.getpid()}\n")  # alive: this one
    with pytest.raises(ValueError, match="still runs"):
        demo.fresh_state(data, keep=False, progress=progress_lines.Progress())
    assert (demo.database_dir(data) / "postmaster.pid").exists()


def test_the_demo_has_its_own_database_and_port() -> None:
    settings = demo.demo_settings(
        Settings(database_url="postgresql+psycopg://x@db/fleet", data_dir=Path("var/b")),
        demo.DemoOptions(port=8099),
    )
    assert settings.database_url is None and settings.data_dir == Path("var/b/demo")
    assert settings.http_port == 8099 and settings.grpc_listen == "127.0.0.1:0"


def test_the_simulated_history_fills_whole_hours() -> None:
    from datetime import UTC, datetime

    now = datetime(2026, 11, 27, 14, 37, tzinfo=UTC)
    start = demo.history_start(3, now)
    assert start == datetime(2026, 11, 27, 11, 0, tzinfo=UTC)
    clock = demo.Clock(start)
    first = clock.next_interval(threading.Event())
    assert first == (start, demo.ROUND_S * 1000)


def test_live_rounds_take_up_the_clock_where_the_replay_ends() -> None:
    """The replay's last partial quarter-hour is one round ending now; the next ones end now
    too, LIVE_ROUND_S long, instead of racing through the gap 10 s at a time."""
    from datetime import UTC, datetime, timedelta

    lag = timedelta(minutes=7)
    clock = demo.Clock(datetime.now(UTC) - lag)
    _, length_ms = clock.next_interval(threading.Event()) or (None, 0)
    assert lag.total_seconds() * 1000 <= length_ms < (lag.total_seconds() + 60) * 1000
    stop = threading.Event()
    stop.set()  # a live round waits for its end: stopped while waiting, it gives none
    assert clock.next_interval(stop) is None
