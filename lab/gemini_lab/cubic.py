"""Booster tunes Linux CUBIC in the lab, then the tuned θ and CUBIC's kernel defaults take
turns on one host: ``gemini-lab cubic``.

Booster runs here (embedded PostgreSQL, gRPC and REST); in the qemu guest, one lab host (a
network namespace with its own agent and token, cubic as its CC, gemini_lab.fleet) sends
back-to-back cubic flows over one path on which a CUBIC parameter matters. The host's own
policy tunes Fusion (as a fleet's hosts' would), so its cubic flows are baselines of that
policy; CUBIC is tuned by a second policy (``datapath = "cubic"``, σ, a search region narrowed
to what matters on the path, the rest at the kernel's values), which the host runs through an
experiment created over REST: arm ``cubic-tuned`` (CUBIC, tuned by that policy) against
``cubic-default`` (CUBIC, kernel defaults: the agent puts the kernel's own values back), over
two compressed days with a crossover on day 1.

CUBIC's parameters are the kernel's, one θ for every namespace of the guest, so the two arms
cannot run side by side in one guest: the one host runs one arm per day, a crossover in time.
A lone host always lands in the same sequence group (gemini_booster.experiments.assignment),
which runs the second arm listed first: the tuned arm on day 0, the default arm on day 1.

Day 0: the policy explores every plan (the agent writes each θ Booster proposes into
/sys/module/tcp_cubic/parameters and reports the host's cubic flows as trials of that θ) for
``search_reports`` reports; then exploration is turned off, as for a fleet that has converged,
and the host runs the incumbent for the rest of the day. Day 1: kernel defaults. At checkpoints
(mid-search, late day 0, mid-day 1, after the end, after the agent's exit) the guest reads the
kernel: CUBIC's parameters from sysfs, the namespace's CC, ``ss -ti``.

The comparison: the results endpoint gives the arms' days (its intervals are over hosts, and
there is one host, so it gives none, and its tuned day includes the search); the run's own
figures are per reporting interval from the stored reports: flows of the tuned θ (reported as
the cubic policy's trials) once exploration was off, against flows at the kernel's values
(reported as cubic baselines) on day 1, each a ratio over intervals with the same
cluster-robust interval the results endpoint uses over hosts
(gemini_booster.experiments.statistics), the reporting intervals as the clusters. Intervals of
one host follow each other in time, so that interval assumes the host's conditions do not drift
within a phase, and the two phases are minutes apart on a shared machine.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from gemini_api.datapaths import datapath, load_datapath
from gemini_booster.config import Settings
from gemini_booster.domain import FlowSums
from gemini_booster.experiments import statistics as st
from gemini_booster.models import PolicyCreate, PolicyUpdate
from gemini_booster.service import runs
from gemini_booster.service.app import BoosterServer
from gemini_lab import scenario
from gemini_lab.abtest import (
    REGION,
    RELAY_PORT,
    REST_TIMEOUT_S,
    AbConfig,
    ArmColumn,
    agent_toml,
    days_table,
    estimate_text,
    next_boundary,
)
from gemini_lab.driver import POLL_S, GuestDriver, fresh_guest_dir
from gemini_lab.loop import ACTOR, EPOCH, LabPath, write_mmdb
from gemini_lab.netem import receiver_addr

CUBIC = "cubic"
DEFAULT_ARM, TUNED_ARM = "cubic-default", "cubic-tuned"
HOST = "lab-host-0"
BASELINE_CC = CUBIC  # how the agent reports cubic flows that ran no policy θ
TRIAL_CC = ""  # how it reports the policy's own flows (trials of the θ that ran)

# loss-limited: the β CUBIC keeps after each loss sets its rate (scenarios/cubic-lossy.toml)
LOSSY = LabPath(scenario.load("cubic-lossy"), "lossy", "isp-b")
# The search region: β over the spec's production range, every other parameter at the kernel's
# value. On a random-loss path the others hardly act: HyStart only ends the first slow start
# (which a random loss ends anyway within a few RTTs), fast convergence only yields to
# competing flows (there are none), and tcp_friendliness off only slows the window's growth
# here. One dimension is what one lab host can search in minutes; Θ's seven would need hours.
TUNED = ("beta",)
# What the check measures before any tuning: β 0.5, 0.7 (the kernel's), 0.9.
CHECK_BETAS = (512, 717, 922)


@dataclass
class CubicConfig:
    interval_s: float = 8
    sigma: float = 0.1
    flow_bytes: str = "2M"
    search_reports: int = 16  # on day 0, before exploration is turned off
    n_initial_points: int = 5
    day_s: int = 300  # must divide a day (86 400 s), at least 60
    lead_s: float = 10
    boot_timeout_s: float = 900
    check_flows: int = 0  # flows per β of the check (CHECK_BETAS) before the agent starts
    path: LabPath = LOSSY
    tuned: tuple[str, ...] = TUNED
    # any datapath of the registry (gemini_lab.datapath_loop runs GEMINI's and DC-Vegas'):
    # its CC runs on the lab host, its spec is the policy's, and what the agent writes (module
    # parameters, or the namespace's θ table) is what the guest reads back (reading_params)
    datapath: str = CUBIC

    def arms(self) -> tuple[str, str]:
        """(default arm, tuned arm): the datapath's CC at its kernel defaults, and tuned."""
        cc = datapath(self.datapath).cc
        return f"{cc}-default", f"{cc}-tuned"

    def cc(self) -> str:
        return datapath(self.datapath).cc

    def settle_s(self) -> float:
        """How soon after a change of arm every reporting interval runs the new θ wholly: the
        agent learns of it at its next refresh (within an interval), and closes the interval
        then; one more interval for slack."""
        return 2 * self.interval_s + 5


def search_bounds(cfg: CubicConfig) -> dict[str, tuple[int, int]]:
    """``cfg.tuned`` over the datapath's production region, the rest pinned at the kernel's
    values."""
    spec = load_datapath(cfg.datapath)
    production = spec.region_bounds("production")
    return {
        p.name: production[p.name] if p.name in cfg.tuned else (p.default, p.default)
        for p in spec.params
    }


@dataclass
class CubicResult:
    policy: str
    experiment: dict
    readings: dict[str, dict]  # checkpoint → the lab host's kernel reading
    arms: dict[str, str]  # checkpoint → the arm Booster assigned ("" for none)
    incumbents: list[dict]  # each incumbent Booster published: when, θ
    trials: list[dict]  # the policy's stored trials: θ, flows
    intervals: list[dict]  # per reporting interval: start, cc, θ key, sums
    results: dict  # the results endpoint's answer
    windows: dict[str, tuple[dt.datetime, dt.datetime]]  # arm → its compared intervals
    phases: dict[str, dict]  # tuned / default: the comparison's figures
    difference: dict  # tuned − default
    guest: dict = field(default_factory=dict)
    schedule: dict[str, str] = field(default_factory=dict)
    record: Path | None = None


def guest_plan(cfg: CubicConfig, toml: str, booster_port: int) -> dict:
    check = [
        {
            "label": "check",
            "kind": "cubic_check",
            "path": 0,
            "thetas": [{"beta": b} for b in CHECK_BETAS],
            "flows": cfg.check_flows,
            "flow_bytes": cfg.flow_bytes,
        }
    ]
    # the datapath's module, where it is one of ours (a built-in CC such as cubic: nothing to do)
    load = {"label": "load", "kind": "datapath_load", "datapath": cfg.datapath}
    fleet = {
        "label": "fleet",
        "kind": "fleet",
        "hosts": [{"id": HOST, "agent_toml": toml, "paths": [0]}],
        "default_cc": cfg.cc(),
        "allowed_ccs": sorted({"reno", cfg.cc()}),
        "relay_port": RELAY_PORT,
        "booster_port": booster_port,
        "flow_bytes": cfg.flow_bytes,
        "duration_s": cfg.boot_timeout_s + 6 * cfg.day_s + 20 * cfg.interval_s * 3,  # a cap
    }
    return {
        "paths": [cfg.path.scenario.to_dict()],
        # the check first: `gemini-lab cubic --check-only` runs the plan's first experiment
        "experiments": (check if cfg.check_flows else []) + [load, fleet],
    }


def experiment_body(name: str, policy: str, start: dt.datetime, cfg: CubicConfig) -> dict:
    """Kernel defaults (control) and the policy, over two days from ``start``, crossover on
    day 1; the one host runs the tuned arm first (see the module docstring)."""
    day = dt.timedelta(seconds=cfg.day_s)
    cc, (default_arm, tuned_arm) = cfg.cc(), cfg.arms()
    return {
        "name": name,
        "description": f"lab: {cc} at the kernel's defaults vs {cc} tuned by Booster",
        "arms": [
            {"name": default_arm, "cc": cc, "params": "kernel_default"},
            {"name": tuned_arm, "cc": cc, "params": "policy", "policy": policy},
        ],
        "control": default_arm,
        "population": {"regions": {REGION: [HOST]}},
        "start": start.isoformat(),
        "end": (start + 2 * day).isoformat(),
        "crossover_day": (start.date() + dt.timedelta(days=1)).isoformat(),
        "day_seconds": cfg.day_s,
        "sigma": cfg.sigma,
    }


class _Run:
    """Booster's side while the guest runs: reports, incumbents, checkpoints."""

    def __init__(
        self,
        server: BoosterServer,
        http: httpx.Client,
        token: str,
        guest: GuestDriver,
        name: str = CUBIC,
    ):
        self.server, self.http, self.guest = server, http, guest
        self.auth = {"authorization": f"Bearer {token}"}
        self.spec = load_datapath(name)
        self.incumbents: list[dict] = []
        self.readings: dict[str, dict] = {}
        self.arms: dict[str, str] = {}
        self.schedule: dict[str, str] = {}

    def poll_plans(self, policy_id: int) -> None:
        for key, plan in self.server.booster.plan_snapshot(policy_id).items():
            theta = self.spec.from_key(plan.incumbent_key)
            if not self.incumbents or self.incumbents[-1]["theta"] != theta:
                at = dt.datetime.now(dt.UTC).isoformat()
                self.incumbents.append({"at": at, "context": key.label, "theta": theta})

    def wait_reports(
        self, n: int, policy_id: int, timeout_s: float, since: dt.datetime = EPOCH
    ) -> None:
        """Until ``n`` reports of intervals from ``since`` are stored."""
        deadline = time.monotonic() + timeout_s
        while runs.count_reports(self.server.engine, HOST, since) < n:
            if not self.guest.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the lab host stored fewer than {n} reports: {self.guest.box}")
            self.poll_plans(policy_id)
            time.sleep(POLL_S)
        self.poll_plans(policy_id)

    def sleep_until(self, at: dt.datetime, policy_id: int) -> None:
        while dt.datetime.now(dt.UTC) < at:
            self.poll_plans(policy_id)
            time.sleep(min(POLL_S, max(0.0, (at - dt.datetime.now(dt.UTC)).total_seconds())))

    def checkpoint(self, label: str) -> None:
        self.schedule[label] = dt.datetime.now(dt.UTC).isoformat()
        r = self.http.get(f"/v1/hosts/{HOST}/experiment", headers=self.auth)
        r.raise_for_status()
        held = r.json()["experiment"]
        self.arms[label] = held["arm"]["name"] if held else ""
        self.readings[label] = self.guest.reading(label)[HOST]


def run_cubic(
    make_settings: Callable[[str], Settings],
    port: int,
    operator_token: str,
    out_dir: Path,
    cfg: CubicConfig,
) -> CubicResult:
    """The whole run (see the module docstring); writes ``cubic.json`` in ``out_dir``."""
    guest_dir = fresh_guest_dir(out_dir)
    write_mmdb(guest_dir / "paths.mmdb", (cfg.path,))
    server = BoosterServer(make_settings(f"127.0.0.1:{port}")).start()
    http = httpx.Client(base_url=f"http://127.0.0.1:{server.http_port}", timeout=REST_TIMEOUT_S)
    try:
        policy_name = f"lab-{cfg.datapath}-{uuid.uuid4().hex[:6]}"
        policy = runs.create_policy(
            server.engine,
            PolicyCreate(
                name=policy_name,
                sigma=cfg.sigma,
                datapath=cfg.datapath,
                region="custom",
                bounds=search_bounds(cfg),
                exploration_share=1.0,
                n_initial_points=cfg.n_initial_points,
            ),
            ACTOR,
        )
        host_policy = f"lab-host-{uuid.uuid4().hex[:6]}"  # Fusion's, the host's own
        runs.create_policy(
            server.engine,
            PolicyCreate(name=host_policy, sigma=cfg.sigma, exploration_share=0.0),
            ACTOR,
        )
        server.booster.reload_policies()
        token = runs.agent_token(server.engine, HOST, ACTOR)
        toml = agent_toml(HOST, token, host_policy, AbConfig(interval_s=cfg.interval_s))
        timeout = cfg.boot_timeout_s + 4 * cfg.day_s + cfg.search_reports * cfg.interval_s * 3
        guest = GuestDriver(guest_plan(cfg, toml, port), guest_dir, timeout)
        run = _Run(server, http, operator_token, guest, cfg.datapath)
        guest.start()
        try:
            experiment, results, off = _schedule(run, policy.id, policy_name, cfg)
        finally:
            guest.stop()
        fleet = guest.results()["experiments"]["fleet"]
        run.readings["after-exit"] = fleet.get("after_exit", {}).get(HOST, {})
        run.arms["after-exit"] = ""
        intervals = interval_sums(server.engine, HOST)
        trials = [
            {"theta": run.spec.from_key(t.theta_key), "flows": t.sums.flow_count}
            for t in runs.trials(server.engine, policy.id)
        ]
    finally:
        http.close()
        server.stop()
    windows = compared_windows(experiment, off, cfg)
    phases = compare(intervals, windows, cfg.sigma, cfg)
    record = out_dir / f"{cfg.datapath}.json"
    result = CubicResult(
        policy=policy_name,
        experiment=experiment,
        readings=run.readings,
        arms=run.arms,
        incumbents=run.incumbents,
        trials=trials,
        intervals=intervals,
        results=results,
        windows=windows,
        phases=phases["phases"],
        difference=phases["difference"],
        guest=guest.results(),
        schedule=run.schedule,
        record=record,
    )
    record.write_text(json.dumps(_record(result, cfg), indent=1, default=str))
    return result


def _schedule(
    run: _Run, policy_id: int, policy: str, cfg: CubicConfig
) -> tuple[dict, dict, dt.datetime]:
    """The experiment once the host reports; on day 0 the search, then exploration off; day 1;
    the end. Checkpoints on the way. Returns the experiment, its results, and when
    exploration was turned off."""
    check_s = cfg.check_flows * len(CHECK_BETAS) * 60  # generous: a flow takes seconds
    run.guest.wait_job_started()  # the deadline below is the job's, not the boot's
    run.wait_reports(1, policy_id, cfg.boot_timeout_s + check_s)
    day = dt.timedelta(seconds=cfg.day_s)
    start = next_boundary(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=cfg.lead_s), cfg.day_s)
    name = f"lab-{cfg.datapath}-{uuid.uuid4().hex[:6]}"
    created = run.http.post(
        "/v1/experiments", json=experiment_body(name, policy, start, cfg), headers=run.auth
    )
    if created.status_code != 201:
        raise RuntimeError(f"creating the experiment: {created.status_code} {created.text}")
    run.sleep_until(start, policy_id)
    run.wait_reports(cfg.search_reports // 2, policy_id, cfg.day_s, since=start)
    run.checkpoint("search")
    run.wait_reports(cfg.search_reports, policy_id, cfg.day_s, since=start)
    runs.update_policy(run.server.engine, policy, PolicyUpdate(exploration_share=0.0), ACTOR)
    run.server.booster.reload_policies()
    off = dt.datetime.now(dt.UTC)
    if off + dt.timedelta(seconds=cfg.settle_s() + 2 * cfg.interval_s) > start + day:
        raise RuntimeError(f"the search took day 0 whole: {cfg.search_reports} reports")
    run.sleep_until(max(start + day - dt.timedelta(seconds=cfg.interval_s), off), policy_id)
    run.checkpoint("day-0")
    run.sleep_until(start + day + day / 2, policy_id)
    run.checkpoint("day-1")
    run.sleep_until(start + 2 * day + dt.timedelta(seconds=cfg.settle_s()), policy_id)
    run.checkpoint("ended")  # no arm: the host's own policy (Fusion's)
    results = run.http.get(f"/v1/experiments/{name}/results", headers=run.auth)
    results.raise_for_status()
    return created.json(), results.json(), off


def interval_sums(engine, host: str) -> list[dict]:
    """Per reporting interval of ``host``, per CC as reported ("" the policy's own flows) and θ
    key: the summed flows, in interval order, as the record keeps them."""
    return [
        {
            "start": i.start.isoformat(),
            "end": i.end.isoformat(),
            "cc": i.cc,
            "theta_key": i.theta_key,
            "sums": i.sums.astuple(),
        }
        for i in runs.interval_sums(engine, host)
    ]


def compared_windows(
    experiment: dict, off: dt.datetime, cfg: CubicConfig
) -> dict[str, tuple[dt.datetime, dt.datetime]]:
    """Per arm, where every reporting interval ran it wholly (host clock): the tuned θ from
    ``settle_s`` after exploration was turned off to the end of day 0, the kernel defaults from
    ``settle_s`` into day 1 to its end."""
    start = dt.datetime.fromisoformat(experiment["start"])
    day, settle = dt.timedelta(seconds=cfg.day_s), dt.timedelta(seconds=cfg.settle_s())
    default_arm, tuned_arm = cfg.arms()
    return {
        tuned_arm: (off + settle, start + day),
        default_arm: (start + day + settle, start + 2 * day),
    }


def _phase_rows(
    intervals: list[dict], window: tuple[dt.datetime, dt.datetime], cc: str
) -> list[dict]:
    lo, hi = window
    return [
        r
        for r in intervals
        if r["cc"] == cc
        and lo <= dt.datetime.fromisoformat(r["start"])
        and dt.datetime.fromisoformat(r["end"]) <= hi
    ]


def _estimate(r: st.Ratios) -> dict:
    low, high = st.interval(r)
    values = (float(r.mean), float(low), float(high))
    mean, lo, hi = (None if math.isnan(v) else v for v in values)
    return {"mean": mean, "low": lo, "high": hi}


def _ratios(rows: list[dict], sigma: float) -> dict[str, st.Ratios]:
    sums = [FlowSums(*r["sums"]) for r in rows] or [FlowSums()]
    n = np.array([s.flow_count for s in sums], dtype=float)
    tpt = np.array([s.tpt_sum for s in sums])
    delay = np.array([s.delay_sum for s in sums])
    return {
        "utility": st.ratio(tpt - sigma * delay, n),
        "throughput_mbps": st.ratio(tpt, n),
        "queue_delay_ms": st.ratio(delay, n),
    }


def compare(
    intervals: list[dict],
    windows: dict[str, tuple[dt.datetime, dt.datetime]],
    sigma: float,
    cfg: CubicConfig | None = None,
) -> dict:
    """The tuned θ's flows on the tuned day against the kernel defaults' flows on the default
    day: flows, intervals, θ that ran, and utility, throughput and queueing delay each with its
    95 % interval over reporting intervals; the difference with Welch's interval."""
    cfg = cfg or CubicConfig()
    DEFAULT_ARM, TUNED_ARM = cfg.arms()  # this datapath's arms (cubic's: the constants)
    baseline = cfg.cc()  # how the agent reports the datapath's flows that ran no policy θ
    chosen = {
        TUNED_ARM: _phase_rows(intervals, windows[TUNED_ARM], TRIAL_CC),
        DEFAULT_ARM: _phase_rows(intervals, windows[DEFAULT_ARM], baseline),
    }
    # flows of the other kind inside a day (none when the arm held): a check of the attribution
    stray = {
        TUNED_ARM: _phase_rows(intervals, windows[TUNED_ARM], baseline),
        DEFAULT_ARM: _phase_rows(intervals, windows[DEFAULT_ARM], TRIAL_CC),
    }
    ratios = {arm: _ratios(rows, sigma) for arm, rows in chosen.items()}
    phases = {
        arm: {
            "window": [w.isoformat() for w in windows[arm]],
            "intervals": len(rows),
            "flows": sum(r["sums"][0] for r in rows),
            "theta_keys": sorted({r["theta_key"] for r in rows}),
            "stray_flows": sum(r["sums"][0] for r in stray[arm]),
            **{m: _estimate(v) for m, v in ratios[arm].items()},
        }
        for arm, rows in chosen.items()
    }
    difference = {
        m: _estimate(st.parallel_difference(ratios[TUNED_ARM][m], ratios[DEFAULT_ARM][m]))
        for m in ratios[TUNED_ARM]
    }
    return {"phases": phases, "difference": difference}


def _record(result: CubicResult, cfg: CubicConfig) -> dict:
    fleet = result.guest.get("experiments", {}).get("fleet", {})
    return {
        "config": {k: v for k, v in vars(cfg).items() if k != "path"},
        "path": cfg.path.scenario.to_dict(),
        "bounds": search_bounds(cfg),
        "policy": result.policy,
        "experiment": result.experiment,
        "schedule": result.schedule,
        "arms": result.arms,
        "readings": result.readings,
        "incumbents": result.incumbents,
        "trials": result.trials,
        "phases": result.phases,
        "difference": result.difference,
        "results": result.results,
        "check": result.guest.get("experiments", {}).get("check"),
        "flows": fleet.get("flows"),
        "flow_log": fleet.get("flow_log"),
        "intervals": result.intervals,
        "agent_log_tail": fleet.get("agent_log_tails", {}).get(HOST),
    }


def from_record(path: Path) -> tuple[CubicResult, CubicConfig]:
    """A run back from its ``cubic.json`` (for rendering it again)."""
    r = json.loads(path.read_text())
    fields: dict[str, Any] = {k: tuple(v) if k == "tuned" else v for k, v in r["config"].items()}
    cfg = CubicConfig(**fields)
    result = CubicResult(
        policy=r["policy"],
        experiment=r["experiment"],
        readings=r["readings"],
        arms=r["arms"],
        incumbents=r["incumbents"],
        trials=r["trials"],
        intervals=r["intervals"],
        results=r["results"],
        windows={},
        phases=r["phases"],
        difference=r["difference"],
        guest={"experiments": {"check": r["check"], "fleet": {"flows": r["flows"]}}},
        schedule=r["schedule"],
        record=path,
    )
    return result, cfg


def reading_params(reading: dict, name: str, dst: str = receiver_addr(0)) -> dict[str, int]:
    """The θ the datapath runs in one of the guest's readings (fleet.probe): a host-wide
    datapath's module parameters; for a table datapath (GEMINI, DC-Vegas) the θ its table
    gives destination ``dst`` (the loop's path), by longest prefix, else its namespace's
    default (net.<name>.*)."""
    table = reading.get("tables", {}).get(name)
    if table is not None:
        return theta_for(table, dst)
    return reading.get("module_params", {}).get(name) or reading.get(name) or {}


def theta_for(table: dict, dst: str) -> dict[str, int]:
    """The θ of the longest rule of ``table`` (cubic_guest.table_dump) matching ``dst``."""
    addr = ipaddress.ip_address(dst)
    matching = [
        (ipaddress.ip_network(prefix).prefixlen, theta)
        for prefix, theta in table["rules"]
        if addr in ipaddress.ip_network(prefix)
    ]
    return max(matching, key=lambda m: m[0])[1] if matching else table["sysctls"]


def _theta_text(theta: dict | None, name: str = CUBIC) -> str:
    """θ in natural units, only the parameters off the kernel's defaults ("defaults": none)."""
    if not theta:
        return "—"
    spec = load_datapath(name)
    off = [
        f"{p.symbol} {p.to_natural(theta[p.name]):.3g}"
        for p in spec.params
        if p.name in theta and theta[p.name] != p.default
    ]
    return ", ".join(off) or "kernel defaults"


def check_table(check: dict | None, sigma: float) -> list[str]:
    """The check before tuning: per β, flows, mean throughput, queueing delay, utility."""
    if not check or "cells" not in check:
        return []
    lines = [
        "| β | flows | throughput Mbit/s (mean ± std) | queueing ms | utility (σ = "
        f"{sigma:g}) | retransmits per flow |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for cell in check["cells"]:
        flows = cell["flows"]
        x = np.array([f["throughput_mbps"] for f in flows])
        d = np.array([f["queue_delay_ms"] for f in flows])
        r = np.array([f["retransmits"] for f in flows])
        beta = load_datapath(CUBIC).param("beta").to_natural(cell["read_back"]["beta"])
        lines.append(
            f"| {beta:.2f} | {len(flows)} | {x.mean():.2f} ± {x.std(ddof=1):.2f} | "
            f"{d.mean():.1f} | {(x - sigma * d).mean():.2f} | {r.mean():.1f} |"
        )
    return lines


ENDPOINT_COLUMNS: list[ArmColumn] = [  # one host: flows, and no interval
    ("flows", lambda arm: str(arm["flows"])),
    ("utility", lambda arm: estimate_text(arm["utility"])),
    ("throughput Mbit/s", lambda arm: estimate_text(arm["throughput_mbps"])),
    ("queueing ms", lambda arm: estimate_text(arm["queue_delay_ms"], 1)),
]


def _turns(name: str) -> str:
    """Why the one lab host runs the arms one day each, by how the datapath applies θ."""
    if datapath(name).per_destination:
        return (
            "one lab host, so the arms take turns; the agent installs the policy's θ per "
            "context in the module's table of the host's namespace"
        )
    return f"{name}'s parameters are host-wide: one θ per guest at a time, so the arms take turns"


def _where(name: str) -> str:
    """What a reading's θ is, by how the datapath applies θ (reading_params)."""
    if datapath(name).per_destination:
        return f"{name} θ for the path's destination (the namespace's table, read back)"
    return f"{name} parameters"


def render(result: CubicResult, cfg: CubicConfig, command: str) -> str:
    """Markdown: the set-up, the check, the kernel's readings, the comparison, the endpoint."""
    e, spec = result.experiment, load_datapath(cfg.datapath)
    name, cc = cfg.datapath, cfg.cc()
    DEFAULT_ARM, TUNED_ARM = cfg.arms()  # this datapath's arms (cubic's: the constants)
    bounds = search_bounds(cfg)
    searched = ", ".join(
        f"{spec.param(n).symbol} ∈ [{spec.param(n).to_natural(bounds[n][0]):.3g}, "
        f"{spec.param(n).to_natural(bounds[n][1]):.3g}]"
        for n in cfg.tuned
    )
    tuned, default = result.phases[TUNED_ARM], result.phases[DEFAULT_ARM]
    ratio = (
        tuned["utility"]["mean"] / default["utility"]["mean"]
        if tuned["utility"]["mean"] is not None and default["utility"]["mean"]
        else None
    )
    lines = [
        f"# Booster tunes {name} in the lab: tuned θ against the kernel's defaults",
        "",
        f"Command: `{command}`",
        "",
        f"- Path: {cfg.path.scenario.description}; back-to-back {cfg.flow_bytes} {cc} flows, "
        "one at a time, from one lab host (a namespace with its own agent) in a qemu guest.",
        f"- Policy `{result.policy}`: datapath {name}, σ = {cfg.sigma:g}, custom region "
        f"{searched}, the other parameters at the kernel's values; exploration on for "
        f"{cfg.search_reports} reports ({cfg.n_initial_points} initial points), then off.",
        f"- Experiment `{e.get('name')}` through REST: {DEFAULT_ARM} (kernel defaults) vs "
        f"{TUNED_ARM} (the policy), days of {cfg.day_s} s from {e.get('start')}, crossover on "
        f"day 1: the host ran {result.arms.get('day-0')} on day 0 and "
        f"{result.arms.get('day-1')} on day 1 ({_turns(name)}).",
        "",
        "## Utility: tuned θ vs kernel defaults (mean [95 % interval over reporting intervals])",
        "",
        "| arm | θ that ran | intervals | flows | utility | throughput Mbit/s | queueing ms |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for arm, phase in ((DEFAULT_ARM, default), (TUNED_ARM, tuned)):
        ran = [spec.from_key(k) for k in phase["theta_keys"]] if arm == TUNED_ARM else []
        theta = "; ".join(_theta_text(t, name) for t in ran) if ran else "kernel defaults"
        lines.append(
            f"| {arm} | {theta} | {phase['intervals']} | {phase['flows']} | "
            f"{estimate_text(phase['utility'])} | {estimate_text(phase['throughput_mbps'])} | "
            f"{estimate_text(phase['queue_delay_ms'], 1)} |"
        )
    d = result.difference
    lines += [
        "",
        f"Tuned − default: utility {estimate_text(d['utility'])}, throughput "
        f"{estimate_text(d['throughput_mbps'])} Mbit/s, "
        f"queueing {estimate_text(d['queue_delay_ms'], 1)} ms "
        f"(Welch). Ratio of utilities tuned/default: "
        f"{'—' if ratio is None else f'{ratio:.2f}'}.",
        "",
        "## What the kernel ran (read in the guest)",
        "",
        f"| checkpoint | arm Booster assigned | {_where(name)} (off the kernel's defaults) "
        "| net.ipv4.tcp_congestion_control |",
        "|---|---|---|---|",
    ]
    for label, reading in result.readings.items():
        lines.append(
            f"| {label} | {result.arms.get(label) or '—'} | "
            f"{_theta_text(reading_params(reading, name), name)} | {reading.get('sysctl')} |"
        )
    lines += [
        "",
        "Incumbents Booster published: "
        + "; ".join(f"{i['at'][11:19]} {_theta_text(i['theta'], name)}" for i in result.incumbents)
        + ".",
    ]
    table = check_table(result.guest.get("experiments", {}).get("check"), cfg.sigma)
    if table:
        lines += ["", "## The check before tuning: fixed β, same boot", "", *table]
    lines += [
        "",
        f"## Results endpoint (σ = {result.results.get('sigma')}; one host: no interval)",
        "",
        f"The endpoint counts each arm's flows of its CC: the tuned arm's as the {name} "
        f"policy's trials (cc empty, with the θ that ran), the default arm's as {cc} "
        "baselines. Its tuned day includes the search, and its intervals are over hosts, so "
        "one host gives none: the comparison above is from the stored reports.",
        "",
        *days_table(result.results, ENDPOINT_COLUMNS, align="---:"),
    ]
    return "\n".join(lines) + "\n"
