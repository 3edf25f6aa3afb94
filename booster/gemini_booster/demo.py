"""``booster demo``: a real Booster on embedded PostgreSQL, driven by a simulated fleet.

The fleet (``fleet.py``) is labelled as what it is: simulated hosts with a known utility surface,
talking to Booster over the real gRPC API. An A/B experiment (the tuned policy against CUBIC, on
hosts of their own) is declared through the real REST API, as an operator would.

So that every chart of the dashboard has something to show at once, the fleet first replays
``hours`` of simulated history, four rounds an hour, each round an interval of its own dated in
the past (Booster accepts reports up to a week old); the experiment's "day" lasts an hour so
those hours are days of results. Then it follows the clock, one short round every
``LIVE_ROUND_S``, until Ctrl-C or ``--rounds``. A round's refit runs when the round is sent, so
the plan's history (the incumbent line and its changes) is dated by the wall clock: it starts
when the demo started.

Each run starts from a fresh database in its own directory (``<data_dir>/demo``) unless told to
keep it; the demo never touches the database ``booster serve`` uses.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import signal
import sys
import threading
import urllib.error
import urllib.request
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from . import simulation as sim
from .config import Settings, runtime_dir
from .domain import ContextKey
from .fleet import SyntheticFleet
from .models import Policy, PolicyCreate
from .progress import Progress
from .service.app import BoosterServer
from .service.refit import RefitElsewhere
from .storage import credentials as token_store
from .storage import policies as policy_store

DEMO_POLICY = "demo"
EXPERIMENT = "demo-fusion-vs-cubic"
# The experiment's arms, as data an operator would POST (and so no datapath named in code):
# the demo policy's tuned Fusion against the kernel's default CC.
EXPERIMENT_FILE = Path(__file__).with_name("demo_experiment.json")
TUNING_HOSTS = 8  # hosts that only run the policy's plan
EXPERIMENT_HOSTS = 8  # hosts of the A/B experiment, half of them on CUBIC
ROUNDS_PER_HOUR = 4  # of the simulated history
ROUND_S = 3600 // ROUNDS_PER_HOUR
LIVE_ROUND_S = 10  # once the history has been replayed: a round this often, of this length
EXPERIMENT_DAY_S = 3600  # an experiment "day" of the demo: one hour of its clock
EXPERIMENT_AFTER = timedelta(days=1)  # planned end, after the demo starts
HTTP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class DemoOptions:
    port: int = 8080
    hours: int = 12
    rounds: int | None = None  # None: until interrupted
    keep_serving: bool = False  # after the last of --rounds, serve until interrupted
    keep_state: bool = False


def demo_hosts() -> tuple[list[str], list[str]]:
    """(tuning hosts, experiment hosts) of the demo fleet."""
    tuning = [f"demo-host-{i:03d}" for i in range(TUNING_HOSTS)]
    ab = [f"demo-ab-{i:03d}" for i in range(EXPERIMENT_HOSTS)]
    return tuning, ab


def database_dir(data_dir: Path) -> Path:
    """Where the embedded server keeps its data (``service.app.database_url``'s choice)."""
    return data_dir / "postgres"


def _running_postgres(data_dir: Path) -> int | None:
    """The pid of a PostgreSQL still running on ``data_dir`` (a demo not stopped), or None."""
    pidfile = database_dir(data_dir) / "postmaster.pid"
    try:
        pid = int(pidfile.read_text().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return None
    return pid


def fresh_state(data_dir: Path, keep: bool, progress: Progress) -> None:
    """Remove the previous demo's database and credentials, unless asked to keep them."""
    if keep or not data_dir.exists():
        progress.say(f"state: {'kept' if keep else 'new'} in {data_dir}")
        return
    pid = _running_postgres(data_dir)
    if pid is not None:
        raise ValueError(
            f"a demo's PostgreSQL (pid {pid}) still runs in {data_dir}: stop that demo first, "
            "or pass --keep-state to use it"
        )
    shutil.rmtree(data_dir)
    progress.say(f"state: fresh in {data_dir} (the previous demo's removed; --keep-state keeps it)")


def demo_settings(settings: Settings, options: DemoOptions) -> Settings:
    """The demo's own settings: its own embedded database, the dashboard on ``port``, the
    agent port on any free loopback port."""
    return settings.model_copy(
        update={
            "database_url": None,
            "data_dir": settings.data_dir / "demo",
            "http_host": "127.0.0.1",
            "http_port": options.port,
            "grpc_listen": "127.0.0.1:0",
        }
    )


def _new_value() -> str:
    return "gmn_demo_" + secrets.token_urlsafe(24)


def _tokens(server: BoosterServer, settings: Settings, hosts: list[str]) -> dict[str, Any]:
    """Demo credentials, created once and kept in a 0600 file beside the database: an operator
    token, and one agent token per demo host, bound to it as a real host's would be."""
    path = settings.data_dir / "demo-tokens.json"
    if path.exists():
        tokens: dict[str, Any] = json.loads(path.read_text())
        if isinstance(tokens.get("hosts"), dict) and set(tokens["hosts"]) == set(hosts):
            return tokens
    tokens = {"operator": _new_value(), "hosts": {h: _new_value() for h in hosts}}
    token_store.ensure_token(server.engine, "demo-operator", "operator", tokens["operator"])
    for host, value in tokens["hosts"].items():
        token_store.ensure_token(server.engine, f"demo-agent-{host}", "agent", value, host_id=host)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(tokens, f)
    return tokens


def rest(base: str, token: str, method: str, path: str, body: object = None) -> Any:
    """One call of Booster's REST API as an operator; ValueError with Booster's answer if it
    refuses."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        base + path,
        data=data,
        method=method,
        headers={"authorization": f"Bearer {token}", "content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as r:
            return json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        answer = e.read()[:300].decode(errors="replace")
        raise ValueError(f"{method} {path}: {e.code} {answer}") from None


def experiment_body(hosts: list[str], start: datetime, now: datetime) -> dict[str, Any]:
    """The demo's A/B experiment: the tuned policy against CUBIC on hosts of their own, days
    of an hour, declared as an operator would POST it."""
    declared = json.loads(EXPERIMENT_FILE.read_text())
    for arm in declared["arms"]:
        if arm.get("params") == "policy":  # the arm that runs the demo's tuned policy
            arm["policy"] = DEMO_POLICY
    return {
        "name": EXPERIMENT,
        **declared,
        "population": {"regions": {"eu-west": hosts}},
        "day_seconds": EXPERIMENT_DAY_S,
        "start": start.isoformat(),
        "end": (now + EXPERIMENT_AFTER).isoformat(),
    }


def declare(server: BoosterServer, base: str, operator: str, ab: list[str], start: datetime):
    """The demo policy and experiment, unless a kept state has them already."""
    if DEMO_POLICY not in server.booster.policies:
        policy_store.create_policy(
            server.engine,
            PolicyCreate(name=DEMO_POLICY, sigma=1.0, exploration_share=0.75),
            actor="demo",
        )
        server.booster.reload_policies()
    names = {e["name"] for e in rest(base, operator, "GET", "/v1/experiments")}
    if EXPERIMENT not in names:
        now = datetime.now(UTC)
        rest(base, operator, "POST", "/v1/experiments", experiment_body(ab, start, now))


def history_start(hours: int, now: datetime) -> datetime:
    """The simulated history's first instant: ``hours`` before the hour that ``now`` is in, so
    that its rounds fill whole hourly buckets."""
    return now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=hours)


class Clock:
    """The fleet's rounds: ROUND_S intervals from ``start`` while they lie in the past; then one
    round for the rest up to now, and from there rounds of LIVE_ROUND_S that end now (each
    waited for)."""

    def __init__(self, start: datetime) -> None:
        self.at = start

    def next_interval(self, stop: threading.Event) -> tuple[datetime, int] | None:
        """(start, length in ms) of the next round; None if ``stop`` was set while waiting."""
        now = datetime.now(UTC)
        end = self.at + timedelta(seconds=ROUND_S)
        if end > now:  # live: up to now, at least LIVE_ROUND_S long
            end = max(now, self.at + timedelta(seconds=LIVE_ROUND_S))
            wait = (end - now).total_seconds()
            if wait > 0 and stop.wait(wait):
                return None
        start, self.at = self.at, end
        return start, int((end - start).total_seconds() * 1000)


def _row(server: BoosterServer, fleet: SyntheticFleet, policy_id: int) -> str:
    """Each context's incumbent utility against its known optimum."""
    snap = server.booster.plan_snapshot(policy_id)
    cells = []
    for ctx in fleet.contexts:
        plan = snap.get(ContextKey(*ctx.key))
        if plan is None:
            cells.append("no plan yet")
            continue
        u = sim.true_utility(ctx, server.booster.spec.from_key(plan.incumbent_key))
        cells.append(f"{u:6.1f} of {sim.best_utility(ctx):5.1f} Mbit/s")
    return "  ".join(f"{c:>22}" for c in cells)


def one_round(
    server: BoosterServer, fleet: SyntheticFleet, policy: Policy, start: datetime, length_ms: int
) -> None:
    """The fleet reports the interval from ``start``; then the policy is refitted."""
    fleet.run_round(0, int(start.timestamp() * 1000), length_ms)
    with suppress(RefitElsewhere):  # the background refit has it this time
        server.booster.refit(policy)


def simulate(
    server: BoosterServer,
    fleet: SyntheticFleet,
    clock: Clock,
    options: DemoOptions,
    progress: Progress,
) -> None:
    """Rounds until ``--rounds`` or Ctrl-C: the fleet reports, the policy is refitted, and a
    line per round shows the simulated time and each context's incumbent against its optimum."""
    policy = server.booster.policies[DEMO_POLICY]
    print("round  simulated time (UTC)  " + "  ".join(f"{c.key[3]:>22}" for c in fleet.contexts))
    stop, r = threading.Event(), 0
    while options.rounds is None or r < options.rounds:
        interval = clock.next_interval(stop)
        if interval is None:
            return
        start, length_ms = interval
        if r == 0:  # the first refit also starts the refit workers: seconds of silence else
            with progress.step("the first round and refit (the refit workers start)"):
                one_round(server, fleet, policy, start, length_ms)
        else:
            one_round(server, fleet, policy, start, length_ms)
        r += 1
        when = start.strftime("%Y-%m-%d %H:%M")
        print(f"{r:>5}  {when:<20}  {_row(server, fleet, policy.id)}", flush=True)


def _announce(settings: Settings, server: BoosterServer, tokens: dict[str, Any]) -> str:
    base = f"http://{settings.http_host}:{server.http_port}"
    dashboard = f"{base}/dashboard/?policy={DEMO_POLICY}&experiment={EXPERIMENT}"
    print(
        f"\nBooster serving (demo):\n  dashboard  {dashboard}\n  REST API   {base}/docs\n"
        f"  gRPC       127.0.0.1:{server.grpc_port}\n"
        f"  sign in with the demo's operator token: {tokens['operator']}\n"
        f"  (this demo's credentials: {settings.data_dir / 'demo-tokens.json'}, mode 0600)\n"
        f"demo fleet: {TUNING_HOSTS + EXPERIMENT_HOSTS} SIMULATED hosts over real gRPC, utility "
        "from a known synthetic surface (not a network); experiment "
        f"{EXPERIMENT!r} on {EXPERIMENT_HOSTS} of them, days of {EXPERIMENT_DAY_S // 60} min\n",
        flush=True,
    )
    return base


def quiet_logs(settings: Settings) -> None:
    """The demo's own lines are its progress: the service's INFO logs (a line per refit, per
    migration) only when a log level was asked for."""
    if "log_level" not in settings.model_fields_set:
        logging.getLogger().setLevel(logging.WARNING)


def stop_on_ctrl_c() -> None:
    """Ctrl-C (SIGINT) stops the demo however it was started. A shell starts a background job
    with SIGINT ignored, and Python then never raises KeyboardInterrupt: a demo started that
    way and sent SIGINT served on for ever (``serve`` installs its own handlers likewise)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def run_demo(settings: Settings, options: DemoOptions, progress: Progress | None = None) -> int:
    progress = progress or Progress()
    stop_on_ctrl_c()
    quiet_logs(settings)
    if settings.database_url is not None:
        progress.say("the demo ignores database_url: it runs its own embedded PostgreSQL")
    settings = demo_settings(settings, options)
    fresh_state(settings.data_dir, options.keep_state, progress)
    os.environ.pop("XDG_RUNTIME_DIR", None)  # the demo's own, not the outer data_dir's
    runtime_dir(settings.data_dir)
    with progress.step("starting Booster: embedded PostgreSQL, schema, gRPC and REST"):
        server = BoosterServer(settings, migrate=True).start()
    try:
        tuning, ab = demo_hosts()
        tokens = _tokens(server, settings, tuning + ab)
        start = history_start(options.hours, datetime.now(UTC))
        base = _announce(settings, server, tokens)
        declare(server, base, tokens["operator"], ab, start)
        fleet = SyntheticFleet(
            f"127.0.0.1:{server.grpc_port}", tokens["hosts"], DEMO_POLICY, hosts=tuning + ab
        )
        clock = Clock(datetime.now(UTC) if options.keep_state else start)
        if not options.keep_state:
            progress.say(
                f"replaying simulated history from {start:%H:%M} UTC ({options.hours} h before "
                f"this hour) in rounds of {ROUND_S // 60} min, then a round every "
                f"{LIVE_ROUND_S} s"
            )
        try:
            simulate(server, fleet, clock, options, progress)
        finally:
            fleet.close()
        if options.rounds is not None and not options.keep_serving:
            return 0
        print("serving until interrupted (Ctrl-C)", flush=True)
        threading.Event().wait()
    except KeyboardInterrupt:
        print("\nstopping", file=sys.stderr)
    finally:
        server.stop()
    return 0
