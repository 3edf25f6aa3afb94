"""The closed loop for real: Booster on this host (real PostgreSQL), the agent and tcp_fusion in
the lab guest, bulk fusion flows over two emulated paths that an .mmdb maps to two regions.

The guest reaches Booster at 10.0.2.2 through qemu's user-mode network. Optionally Booster is
stopped mid-run and restarted on the same port, to show the agent spools and nothing is lost
or doubled. Afterwards: utility (eq. 9) per reporting round per context from the stored raw
aggregates, Booster's incumbent θ per context, and a convergence plot like the paper's Fig. 6.
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from gemini_api.theta import load_spec
from gemini_booster.config import Settings
from gemini_booster.models import PolicyCreate, PolicyUpdate
from gemini_booster.service import runs
from gemini_booster.service.app import BoosterServer
from gemini_lab import scenario
from gemini_lab.driver import GuestDriver, fresh_guest_dir
from gemini_lab.netem import receiver_prefix
from gemini_lab.scenario import Scenario


@dataclass(frozen=True)
class LabPath:
    """One emulated path behind its own destination prefix (10.<i+1>.0.0/16), which the run's
    .mmdb maps to a destination region and ISP: a context of its own for Booster."""

    scenario: Scenario
    region: str
    isp: str


PATHS = (
    LabPath(scenario.load("wired"), "wired", "isp-a"),
    LabPath(scenario.load("lossy"), "lossy", "isp-b"),
)
# The loop tunes the start and the loss response and holds the rest at the spec's defaults:
# ω over Θ, λ over Θ' (so a start can be far off) and l over 0–3 %. Θ's 1 % cap on l equals the
# lossy path's random loss rate, which would put that path's optimum on the boundary. The fixed-θ
# landscape (lab-loop.md) shows what there is to find: ω 40 against 10 gives +1.6 on the wired
# path and +2.8 on the lossy one, l 3 % against 0 another +1.5 there. A small custom region an
# operator might choose, and one a single lab host can search in minutes.
TUNED_UNITS: dict[str, str | tuple[int, int]] = {
    "init_cwnd": "production",
    "mult_decrease": "wide",
    "loss_threshold": (0, 30),
}
METRICS_PORT = 9465
HOST_ID = "lab-host"
ACTOR = "gemini-lab"  # whom Booster's audit log names for the lab's writes


@dataclass
class LoopConfig:
    """The run is paced by reports stored, not by the clock: the guest's boot time varies.

    Search: the lone host explores in every plan (exploration share 1), i.e. it runs Booster's
    sequence of Bayesian-optimisation proposals, first its space-filling initial design. Evaluation:
    the operator then turns exploration off, as for a fleet that has converged, and the host
    runs the incumbent for ``eval_reports`` intervals. Fig. 6's question is the utility the host
    gets at the end against what it got in the first rounds (FIRST_ROUNDS). With
    ``default_reports``, Booster is then stopped: after ``staleness_s`` the agent falls back to
    Fusion's default θ, as it would in production, and the host runs it for that many intervals,
    agent and all, before Booster returns. The tuned and the default θ are measured in the same
    boot under the same load (under TCG the guest's own CPU load shows in its flows)."""

    interval_s: float = 8
    sigma: float = 0.1  # throughput-leaning, as the paper's σ = 0.1: loss tolerance pays
    flow_bytes: str = "3M"
    search_reports: int = 32
    eval_reports: int = 10
    kill_after_reports: int | None = None  # stop Booster once this many reports are stored
    outage_s: float = 20
    n_initial_points: int = 12  # two contexts: about their first seven rounds are the design
    duration_s: float = 900  # the guest's cap on flows, should the run stall
    default_reports: int = 0
    staleness_s: float = 600  # the agent's: without Booster this long, the default θ


def lab_bounds() -> dict[str, tuple[int, int]]:
    spec = load_spec()
    bounds = {p.name: (p.default, p.default) for p in spec.params}
    for name, region in TUNED_UNITS.items():
        if isinstance(region, str):
            bounds[name] = spec.param(name).bounds(region)
        else:
            bounds[name] = region
    return bounds


@dataclass(frozen=True)
class Search:
    """What one closed-loop run searches and records: its paths (a context each), the policy's
    region (``production`` Θ, ``wide`` Θ′, or ``custom`` with ``bounds``), the parameters
    listed per θ tried, and the name of its guest experiment and JSON record."""

    paths: tuple[LabPath, ...]
    region: str
    recorded: tuple[str, ...]
    name: str
    title: str
    bounds: dict[str, tuple[int, int]] | None = None

    def resolved_bounds(self) -> dict[str, tuple[int, int]]:
        return self.bounds if self.bounds is not None else load_spec().region_bounds(self.region)


@dataclass
class LoopResult:
    guest: dict
    rounds: dict[str, list[float]]  # region → utility per round
    evaluation: dict[str, list[float]]  # region → utility per round with exploration off
    incumbents: dict[str, dict[str, int]]  # region → Booster's incumbent θ
    trials: dict[str, list[dict]]  # region → θ tried (recorded part), flows, utility
    report_ids: list[str]
    duplicate_ids: int
    intervals: list[tuple[int, int]]  # (start, end) unix ms of each stored report
    plot: Path | None = None
    notes: list[str] = field(default_factory=list)
    plans: list[dict] = field(default_factory=list)  # each plan Booster published, in order
    round_log: dict[str, list[dict]] = field(default_factory=dict)  # region → round, incumbent
    tuned: dict[str, dict[str, int] | None] = field(default_factory=dict)  # run in evaluation
    default: dict[str, list[float]] = field(default_factory=dict)  # region → per round
    record: Path | None = None


def _plan_paths(paths: tuple[LabPath, ...] = PATHS) -> list[dict]:
    return [p.scenario.to_dict() for p in paths]


def landscape_plan(thetas: list[dict[str, int]], flows: int, flow_bytes: str, sigma: float) -> dict:
    """Fixed θ (spec units, the rest at defaults) on the loop's paths, ``flows`` each: what a
    search over the loop's region has to find, and how much one flow varies."""
    return {
        "paths": _plan_paths(),
        "experiments": [
            {
                "label": "landscape",
                "kind": "landscape",
                "paths": [0, 1],
                "sigma": sigma,
                "thetas": thetas,
                "flow_bytes": flow_bytes,
                "flows": flows,
                "max_s": 60,
            }
        ],
    }


def landscape_table(results: dict) -> str:
    """Markdown: one row per θ, utility mean ± per-flow std (flows) per path."""
    spec, cells = load_spec(), results["experiments"]["landscape"]["cells"]
    rows: dict[str, dict[str, str]] = {}
    for cell in cells:
        theta = cell["theta"]
        changed = (
            ", ".join(f"{n} {theta[n]}" for n in spec.names if theta[n] != spec.param(n).default)
            or "defaults"
        )
        u = cell["utilities"]
        std = statistics.stdev(u) if len(u) > 1 else 0.0
        rows.setdefault(changed, {})[PATHS[cell["path"]].region] = (
            f"{statistics.mean(u):.2f} ± {std:.2f} ({len(u)})"
        )
    regions = [p.region for p in PATHS]
    lines = [
        "| θ (spec units, others at default) | " + " | ".join(regions) + " |",
        "|---|" + "---:|" * len(regions),
    ]
    lines += [
        f"| {k} | " + " | ".join(v.get(r, "—") for r in regions) + " |" for k, v in rows.items()
    ]
    return "\n".join(lines)


def write_mmdb(path: Path, paths: tuple[LabPath, ...] = PATHS) -> Path:
    from mmdb_writer import MMDBWriter
    from netaddr import IPSet

    writer = MMDBWriter(ip_version=4, database_type="gemini-lab")
    for i, p in enumerate(paths):
        writer.insert_network(IPSet([receiver_prefix(i)]), {"region": p.region, "isp": p.isp})
    writer.to_db_file(str(path))
    return path


def agent_toml(port: int, token: str, policy: str, mmdb: Path, cfg: LoopConfig) -> str:
    return "\n".join(
        [
            f'host_id = "{HOST_ID}"',
            f'policy = "{policy}"',
            f'booster_address = "10.0.2.2:{port}"',
            f'token = "{token}"',
            'src_region = "lab"',
            'src_isp = "lab"',
            f'geo_mmdb = "{mmdb}"',
            f"interval_s = {cfg.interval_s}",
            'spool_dir = "/tmp/gemini-agent-spool"',
            f"staleness_s = {cfg.staleness_s}",
            f'metrics_listen = "127.0.0.1:{METRICS_PORT}"',
            "retry_initial_s = 0.5",
            "retry_max_s = 2.0",
            "",
        ]
    )


def utility_rounds(
    engine, policy_id: int, sigma: float
) -> dict[str, list[tuple[dt.datetime, float]]]:
    """Eq. 9 per context per reporting interval."""
    out: dict[str, list[tuple[dt.datetime, float]]] = {}
    for g in runs.fusion_sums_by(engine, policy_id, "interval"):
        interval = cast(dt.datetime, g.group)  # grouped by reporting interval
        out.setdefault(g.dst_region, []).append((interval, g.sums.utility(sigma).mean))
    return out


def trial_table(
    engine, policy_id: int, sigma: float, names: tuple[str, ...] = tuple(TUNED_UNITS)
) -> dict[str, list[dict]]:
    """Per context, each θ tried in the order first run (``names`` of it): its flows and eq. 9
    utility. What the model was fit on, for reading a run's incumbent against the evidence. The
    θ are those of the kernel's flow records, as the agent reported them."""
    spec, out = load_spec(), dict[str, list[dict]]()
    for g in runs.fusion_sums_by(engine, policy_id, "theta"):
        theta = spec.from_key(str(g.group))
        out.setdefault(g.dst_region, []).append(
            {
                **{n: theta[n] for n in names},
                "flows": g.sums.flow_count,
                "utility": g.sums.utility(sigma).mean,
            }
        )
    return out


Window = tuple[dt.datetime, dt.datetime]  # of reporting intervals, host clock


def plot_rounds(
    rounds: dict[str, list[tuple[dt.datetime, float]]],
    phases: dict[str, Window | None],
    interval_s: float,
    path: Path,
    title: str,
) -> Path:
    """Fig. 6: utility per reporting interval per context. The x axis counts the host's
    intervals, so contexts without flows in some intervals stay aligned with the others; the
    evaluation and default-θ phases are shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    starts = sorted({start for values in rounds.values() for start, _ in values})
    index = {start: i for i, start in enumerate(starts, 1)}
    fig, ax = plt.subplots(figsize=(7, 4))
    for region, values in sorted(rounds.items()):
        ax.plot([index[s] for s, _ in values], [u for _, u in values], marker="o", label=region)
    length = dt.timedelta(seconds=interval_s)
    for (name, window), color in zip(phases.items(), ("tab:green", "tab:grey"), strict=False):
        inside = [index[s] for s in starts if window and _inside(s, window, length)]
        if inside:
            ax.axvspan(min(inside) - 0.5, max(inside) + 0.5, color=color, alpha=0.12)
            ax.text(min(inside) - 0.3, ax.get_ylim()[1], f" {name}", color=color, va="top")
    ax.set_xlabel("reporting interval of the host")
    ax.set_ylabel("utility: mean(throughput − σ·delay), Mbit/s")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(title="destination region")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


class _PlanLog:
    """Each plan Booster publishes for the run's policy, as it appears: the proposals
    (candidates) the exploring host runs next and the incumbent, per context and time.
    Booster keeps only the latest plan per context, so the run's history is read as it goes."""

    def __init__(self, server: BoosterServer, policy_id: int) -> None:
        self.server, self.policy_id, self.spec = server, policy_id, load_spec()
        self.versions: dict[object, int] = {}
        self.entries: list[dict] = []

    def poll(self) -> None:
        for key, plan in self.server.booster.plan_snapshot(self.policy_id).items():
            if self.versions.get(key) == plan.version:
                continue
            self.versions[key] = plan.version
            self.entries.append(
                {
                    "at": dt.datetime.now(dt.UTC).isoformat(),
                    "region": key.dst_region,
                    "hour": key.hour,
                    "version": plan.version,
                    "incumbent": self.spec.from_key(plan.incumbent_key),
                    "incumbent_utility": plan.incumbent_utility,
                    "candidates": [self.spec.from_key(k) for k in plan.candidate_keys],
                }
            )


POLL_S = 0.25  # often enough to see every plan the agent could have fetched (refits: 2 s)


class _Timeline:
    """Polls the stored reports of the lab host, and Booster's plans meanwhile."""

    def __init__(self, server: BoosterServer, guest: GuestDriver, plans: _PlanLog) -> None:
        self.server, self.guest, self.plans = server, guest, plans

    def reports(self, since: dt.datetime | None = None) -> int:
        return runs.count_reports(self.server.engine, HOST_ID, since or EPOCH)

    def wait_for(self, n: int, since: dt.datetime | None = None) -> bool:
        """Until ``n`` reports are stored (False if the guest ended first)."""
        while self.reports(since) < n:
            self.plans.poll()
            if not self.guest.alive():
                return False
            time.sleep(POLL_S)
        self.plans.poll()
        return True

    def restart(self, settings: Settings) -> None:
        self.server = BoosterServer(settings).start()
        self.plans.server = self.server


def round_log(
    rounds: dict[str, list[tuple[dt.datetime, float]]],
    plans: list[dict],
    interval_s: float,
    phases: dict[str, Window | None],
) -> dict[str, list[dict]]:
    """Per context, each round's utility, its phase (the first of ``phases`` whose window holds
    it wholly, else "transition"), and the incumbent Booster had published by the round's end
    (None before its first plan; while Booster is away the host may not run it)."""
    out: dict[str, list[dict]] = {}
    length = dt.timedelta(seconds=interval_s)
    for region, values in rounds.items():
        mine = [p for p in plans if p["region"] == region]
        for i, (start, utility) in enumerate(values, 1):
            known = [p for p in mine if dt.datetime.fromisoformat(p["at"]) <= start + length]
            last = known[-1] if known else None
            phase = next(
                (name for name, w in phases.items() if w and _inside(start, w, length)),
                "transition",
            )
            out.setdefault(region, []).append(
                {
                    "round": i,
                    "start": start.isoformat(),
                    "phase": phase,
                    "utility": utility,
                    "incumbent": last and last["incumbent"],
                    "incumbent_utility": last and last["incumbent_utility"],
                }
            )
    return out


def evaluated_theta(log: dict[str, list[dict]]) -> dict[str, dict[str, int] | None]:
    """Per context, the incumbent the host ran in the last round of the evaluation: the tuned
    θ that the evaluation's utility belongs to (a refit afterwards may prefer another)."""
    out: dict[str, dict[str, int] | None] = {}
    for region, rows in log.items():
        evaluated = [r for r in rows if r["phase"] == "evaluation"]
        out[region] = evaluated[-1]["incumbent"] if evaluated else None
    return out


FIRST_ROUNDS = 6  # rounds that surely ran the initial design (n_initial_points = 12)
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
END = dt.datetime.max.replace(tzinfo=dt.UTC)


def run_loop(
    make_settings: Callable[[str], Settings], port: int, token: str, out_dir: Path, cfg: LoopConfig
) -> LoopResult:
    """The loop's two paths, ω, λ and l searched (lab_bounds); see run_closed_loop."""
    search = Search(
        PATHS,
        "custom",
        tuple(TUNED_UNITS),
        "loop",
        f"Booster + Fusion in the lab (σ = {cfg.sigma})",
        lab_bounds(),
    )
    return run_closed_loop(make_settings, port, token, out_dir, cfg, search)


def _guest_plan(search: Search, cfg: LoopConfig, agent: str) -> dict:
    """The agent with back-to-back flows on every path until the host says stop."""
    experiment = {
        "label": search.name,
        "kind": "agent",
        "paths": list(range(len(search.paths))),
        "duration_s": cfg.duration_s,
        "flow_bytes": cfg.flow_bytes,
        "agent_toml": agent,
        "metrics_port": METRICS_PORT,
    }
    return {"paths": _plan_paths(search.paths), "experiments": [experiment]}


def _default_phase(timeline: _Timeline, settings: Settings, cfg: LoopConfig) -> Window:
    """Booster away: the agent falls back to the default θ at its first refresh past
    ``staleness_s`` (refreshes come at interval ends), so intervals starting one interval
    later run wholly on it; Booster returns after ``default_reports`` of them, the spooled
    reports are stored and the host takes Booster's θ again. Returns the window of intervals
    on the default θ."""
    stopped = dt.datetime.now(dt.UTC)
    timeline.server.stop()
    start = stopped + dt.timedelta(seconds=cfg.staleness_s + cfg.interval_s + 1)
    time.sleep((start - stopped).total_seconds() + (cfg.default_reports + 1) * cfg.interval_s)
    restarted = dt.datetime.now(dt.UTC)
    timeline.restart(settings)
    timeline.wait_for(cfg.default_reports, since=start)
    # the host runs Booster's θ again: the agent asks for it as soon as a report gets
    # through, also mid-interval (gemini_agent.daemon, Agent.drain_between_intervals), and
    # at each interval's end after its report. The first ask may still fail while gRPC
    # reconnects to the new server; the second report since the restart is sent by the
    # tick after one that asked, so by then the agent has applied an answer or failed twice.
    timeline.wait_for(2, since=restarted)
    return start, restarted


def _inside(start: dt.datetime, window: Window, length: dt.timedelta) -> bool:
    return window[0] <= start and start + length <= window[1]


def _within(
    rounds: dict[str, list[tuple[dt.datetime, float]]], window: Window | None, interval_s: float
) -> dict[str, list[float]]:
    """Per context, the utility of the rounds that ran wholly inside ``window``."""
    length = dt.timedelta(seconds=interval_s)
    return {
        region: [u for start, u in values if window and _inside(start, window, length)]
        for region, values in rounds.items()
    }


def run_closed_loop(
    make_settings: Callable[[str], Settings],
    port: int,
    token: str,
    out_dir: Path,
    cfg: LoopConfig,
    search: Search,
) -> LoopResult:
    """Booster here (make_settings(grpc_listen) gives its settings; it listens on
    127.0.0.1:port), the agent and flows in the qemu guest, one policy over ``search``'s
    region; search, then evaluation, then the optional default phase. Writes
    ``<search.name>.json`` and the convergence plot in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = make_settings(f"127.0.0.1:{port}")
    server = BoosterServer(settings).start()
    policy_name = f"lab-{uuid.uuid4().hex[:8]}"
    custom = search.region == "custom"
    policy = runs.create_policy(
        server.engine,
        PolicyCreate(
            name=policy_name,
            sigma=cfg.sigma,
            exploration_share=1.0,
            n_initial_points=cfg.n_initial_points,
            region=search.region,
            bounds=search.bounds if custom else None,
        ),
        ACTOR,
    )
    server.booster.reload_policies()
    guest_dir = fresh_guest_dir(out_dir)  # the guest sees this directory as {out}
    write_mmdb(guest_dir / "paths.mmdb", search.paths)
    agent = agent_toml(port, token, policy_name, Path("{out}/paths.mmdb"), cfg)
    guest = GuestDriver(_guest_plan(search, cfg, agent), guest_dir, cfg.duration_s + 900)
    guest.start()
    timeline = _Timeline(server, guest, _PlanLog(server, policy.id))
    notes: list[str] = []
    eval_from = None
    evaluated: Window | None = None
    on_default: Window | None = None
    try:
        if cfg.kill_after_reports is not None and timeline.wait_for(cfg.kill_after_reports):
            timeline.server.stop()
            notes.append(
                f"Booster stopped after {cfg.kill_after_reports} reports for {cfg.outage_s:.0f} s"
            )
            time.sleep(cfg.outage_s)
            timeline.restart(settings)
        if timeline.wait_for(cfg.search_reports):
            runs.update_policy(
                timeline.server.engine, policy_name, PolicyUpdate(exploration_share=0.0), ACTOR
            )
            timeline.server.booster.reload_policies()
            # the agent asks for θ at the end of each interval: the one after next is the
            # first to run wholly on the incumbent
            eval_from = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=cfg.interval_s)
            notes.append(f"exploration off after {cfg.search_reports} reports")
            if timeline.wait_for(cfg.eval_reports, since=eval_from):
                evaluated = (eval_from, dt.datetime.now(dt.UTC))
                if cfg.default_reports:
                    on_default = _default_phase(timeline, settings, cfg)
                    notes.append(
                        f"then Booster stopped: the agent ran the default θ for "
                        f"{cfg.default_reports} reports"
                    )
    finally:
        guest.stop()
    server = timeline.server
    try:
        results = guest.results()
        server.booster.refit(server.booster.policies[policy_name])
        timeline.plans.poll()
        spec = load_spec()
        incumbents = {
            key.dst_region: spec.from_key(p.incumbent_key)
            for key, p in sorted(server.booster.plan_snapshot(policy.id).items())
        }
        rounds = utility_rounds(server.engine, policy.id, cfg.sigma)
        trials = trial_table(server.engine, policy.id, cfg.sigma, search.recorded)
        rows = runs.host_reports(server.engine, HOST_ID)
    finally:
        server.stop()
    ids = [r[0] for r in rows]
    duplicates = len(ids) - len(set(ids))
    intervals = [(int(r[1].timestamp() * 1000), int(r[2].timestamp() * 1000)) for r in rows]
    evaluation = _within(rounds, evaluated, cfg.interval_s)
    phases = {
        "search": (EPOCH, eval_from or END),
        "evaluation": evaluated,
        "default": on_default,
    }
    log = round_log(rounds, timeline.plans.entries, cfg.interval_s, phases)
    utilities = {region: [u for _, u in values] for region, values in rounds.items()}
    png = (
        plot_rounds(
            rounds,
            {"evaluation": evaluated, "default θ": on_default},
            cfg.interval_s,
            out_dir / f"{search.name}-convergence.png",
            search.title,
        )
        if rounds
        else None
    )
    record = out_dir / f"{search.name}.json"
    result = LoopResult(
        guest=results,
        rounds=utilities,
        evaluation=evaluation,
        incumbents=incumbents,
        trials=trials,
        report_ids=ids,
        duplicate_ids=duplicates,
        intervals=intervals,
        plot=png,
        notes=notes,
        plans=timeline.plans.entries,
        round_log=log,
        tuned=evaluated_theta(log),
        default=_within(rounds, on_default, cfg.interval_s),
        record=record,
    )
    record.write_text(json.dumps(_record(result, search, cfg), indent=1))
    return result


def _record(result: LoopResult, search: Search, cfg: LoopConfig) -> dict:
    """The run as JSON: set-up, per-round convergence per context, plans, tuned θ, phases."""
    return {
        "paths": {p.region: p.scenario.to_dict() for p in search.paths},
        "region": search.region,
        "bounds": search.resolved_bounds(),
        "config": dict(vars(cfg)),
        "rounds": result.rounds,
        "round_log": result.round_log,
        "evaluation": result.evaluation,
        "default": result.default,
        "incumbents": result.incumbents,
        "tuned": result.tuned,
        "reports": len(result.report_ids),
        "duplicates": result.duplicate_ids,
        "notes": result.notes,
        "trials": result.trials,
        "plans": result.plans,
        "agent_metrics": result.guest["experiments"][search.name].get("agent_metrics"),
    }
