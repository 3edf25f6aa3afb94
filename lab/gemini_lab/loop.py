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
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gemini_api.theta import load_spec
from gemini_booster.config import Settings
from gemini_booster.models import PolicyCreate, PolicyUpdate
from gemini_booster.service.app import BoosterServer
from gemini_booster.storage import repository as repo
from gemini_lab.host import run_plan
from gemini_lab.scenario import Scenario

PATHS = (
    (
        Scenario(
            name="wired",
            description="40 ms, 20 Mbit/s, no loss",
            rtt_ms=40,
            rate_mbit=20,
            queue_bdp=1.0,
        ),
        "wired",
        "isp-a",
    ),
    (
        Scenario(
            name="lossy",
            description="100 ms, 20 Mbit/s, 1 % loss",
            rtt_ms=100,
            rate_mbit=20,
            loss_percent=1.0,
            queue_bdp=1.0,
        ),
        "lossy",
        "isp-b",
    ),
)
# The loop tunes the start and the loss response and holds the rest at the spec's defaults:
# ω over Θ, λ over Θ' (so a start can be far off) and l over 0–3 %. Θ's 1 % cap on l equals the
# lossy path's random loss rate, which would put that path's optimum on the boundary. The fixed-θ
# landscape (lab-loop.md) shows what there is to find: ω 40 against 10 gives +1.6 on the wired
# path and +2.8 on the lossy one, l 3 % against 0 another +1.5 there. A small custom region an
# operator might choose, and one a single lab host can search in minutes.
TUNED_UNITS = {"init_cwnd": "production", "mult_decrease": "wide", "loss_threshold": (0, 30)}
METRICS_PORT = 9465
HOST_ID = "lab-host"


@dataclass
class LoopConfig:
    """The run is paced by reports stored, not by the clock: the guest's boot time varies.

    Search: the lone host explores in every plan (exploration share 1), i.e. it runs Booster's
    sequence of Bayesian-optimisation proposals, first its space-filling initial design. Evaluation:
    the operator then turns exploration off, as for a fleet that has converged, and the host
    runs the incumbent for ``eval_reports`` intervals. Fig. 6's question is the utility the host
    gets at the end against what it got in the first rounds (FIRST_ROUNDS)."""

    interval_s: float = 8
    sigma: float = 0.1  # throughput-leaning, as the paper's σ = 0.1: loss tolerance pays
    flow_bytes: str = "3M"
    search_reports: int = 32
    eval_reports: int = 10
    kill_after_reports: int | None = None  # stop Booster once this many reports are stored
    outage_s: float = 20
    n_initial_points: int = 12  # two contexts: about their first seven rounds are the design
    duration_s: float = 900  # the guest's cap on flows, should the run stall


def lab_bounds() -> dict[str, tuple[int, int]]:
    spec = load_spec()
    bounds = {p.name: (p.default, p.default) for p in spec.params}
    for name, region in TUNED_UNITS.items():
        bounds[name] = spec.param(name).bounds(region) if isinstance(region, str) else region
    return bounds


@dataclass
class LoopResult:
    guest: dict
    rounds: dict[str, list[float]]  # region → utility per round
    evaluation: dict[str, list[float]]  # region → utility per round with exploration off
    incumbents: dict[str, dict[str, int]]  # region → Booster's incumbent θ
    trials: dict[str, list[dict]]  # region → θ tried (tuned part), flows, utility
    report_ids: list[str]
    duplicate_ids: int
    intervals: list[tuple[int, int]]  # (start, end) unix ms of each stored report
    plot: Path | None = None
    notes: list[str] = field(default_factory=list)


def _plan_paths() -> list[dict]:
    return [p.to_dict() for p, _, _ in PATHS]


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
        rows.setdefault(changed, {})[PATHS[cell["path"]][1]] = (
            f"{statistics.mean(u):.2f} ± {std:.2f} ({len(u)})"
        )
    regions = [region for _, region, _ in PATHS]
    lines = [
        "| θ (spec units, others at default) | " + " | ".join(regions) + " |",
        "|---|" + "---:|" * len(regions),
    ]
    lines += [
        f"| {k} | " + " | ".join(v.get(r, "—") for r in regions) + " |" for k, v in rows.items()
    ]
    return "\n".join(lines)


def write_mmdb(path: Path) -> Path:
    from mmdb_writer import MMDBWriter
    from netaddr import IPSet

    writer = MMDBWriter(ip_version=4, database_type="gemini-lab")
    for i, (_, region, isp) in enumerate(PATHS):
        writer.insert_network(IPSet([f"10.{i + 1}.0.0/16"]), {"region": region, "isp": isp})
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
            "staleness_s = 600",
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
    for g in repo.fusion_sums_by(engine, policy_id, "interval"):
        out.setdefault(g.dst_region, []).append((g.group, g.sums.utility(sigma).mean))
    return out


def trial_table(engine, policy_id: int, sigma: float) -> dict[str, list[dict]]:
    """Per context, each θ tried in the order first run: its flows and eq. 9 utility. What the
    model was fit on, for reading a run's incumbent against the evidence."""
    spec, out = load_spec(), {}
    for g in repo.fusion_sums_by(engine, policy_id, "theta"):
        theta = spec.from_key(str(g.group))
        out.setdefault(g.dst_region, []).append(
            {
                **{n: theta[n] for n in TUNED_UNITS},
                "flows": g.sums.flow_count,
                "utility": g.sums.utility(sigma).mean,
            }
        )
    return out


def plot_rounds(
    rounds: dict[str, list[tuple[dt.datetime, float]]], eval_from, path: Path, title: str
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for region, values in sorted(rounds.items()):
        ax.plot(range(1, len(values) + 1), [u for _, u in values], marker="o", label=region)
    first = min(
        (
            i
            for values in rounds.values()
            for i, (start, _) in enumerate(values, 1)
            if eval_from is not None and start >= eval_from
        ),
        default=None,
    )
    if first is not None:
        ax.axvline(first - 0.5, color="grey", linestyle="--", linewidth=1)
        ax.text(first - 0.3, ax.get_ylim()[1], " exploration off", color="grey", va="top")
    ax.set_xlabel("reporting round")
    ax.set_ylabel("utility: mean(throughput − σ·delay), Mbit/s")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(title="destination region")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


class _Timeline:
    """Polls the stored reports of the lab host."""

    def __init__(self, engine, guest: threading.Thread) -> None:
        self.engine, self.guest = engine, guest

    def reports(self, since: dt.datetime | None = None) -> int:
        return repo.count_reports(self.engine, HOST_ID, since or EPOCH)

    def wait_for(self, n: int, since: dt.datetime | None = None) -> bool:
        """Until ``n`` reports are stored (False if the guest ended first)."""
        while self.reports(since) < n:
            if not self.guest.is_alive():
                return False
            time.sleep(1)
        return True


FIRST_ROUNDS = 6  # rounds that surely ran the initial design (n_initial_points = 12)
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def run_loop(
    make_settings: Callable[[str], Settings], port: int, token: str, out_dir: Path, cfg: LoopConfig
) -> LoopResult:
    """make_settings(grpc_listen) gives Booster's settings; Booster listens on 127.0.0.1:port."""
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = make_settings(f"127.0.0.1:{port}")
    server = BoosterServer(settings).start()
    policy_name = f"lab-{uuid.uuid4().hex[:8]}"
    policy = repo.create_policy(
        server.engine,
        PolicyCreate(
            name=policy_name,
            sigma=cfg.sigma,
            exploration_share=1.0,
            n_initial_points=cfg.n_initial_points,
            region="custom",
            bounds=lab_bounds(),
        ),
        actor="gemini-lab",
    )
    server.booster.reload_policies()
    guest_dir = out_dir / "guest"  # the guest sees this directory as {out}
    guest_dir.mkdir(exist_ok=True)
    (guest_dir / "stop").unlink(missing_ok=True)
    write_mmdb(guest_dir / "paths.mmdb")
    mmdb = Path("{out}/paths.mmdb")
    plan = {
        "paths": _plan_paths(),
        "experiments": [
            {
                "label": "loop",
                "kind": "agent",
                "paths": [0, 1],
                "duration_s": cfg.duration_s,
                "flow_bytes": cfg.flow_bytes,
                "agent_toml": agent_toml(port, token, policy_name, mmdb, cfg),
                "metrics_port": METRICS_PORT,
            }
        ],
    }
    box: dict = {}

    def guest() -> None:
        try:
            # qemu: the agent in the guest talks to Booster here; a simulated clock would jump
            # over its network deadlines while it waits on a process outside the guest
            box["results"] = run_plan(
                plan, guest_dir, timeout_s=cfg.duration_s + 900, backend="qemu"
            )
        except Exception as exc:
            box["error"] = exc

    thread = threading.Thread(target=guest)
    thread.start()
    timeline = _Timeline(server.engine, thread)
    notes: list[str] = []
    eval_from = None
    try:
        if cfg.kill_after_reports is not None and timeline.wait_for(cfg.kill_after_reports):
            server.stop()
            notes.append(
                f"Booster stopped after {cfg.kill_after_reports} reports for {cfg.outage_s:.0f} s"
            )
            time.sleep(cfg.outage_s)
            server = BoosterServer(settings).start()
            timeline.engine = server.engine
        if timeline.wait_for(cfg.search_reports):
            repo.update_policy(
                server.engine, policy_name, PolicyUpdate(exploration_share=0.0), actor="gemini-lab"
            )
            server.booster.reload_policies()
            # the agent asks for θ at the end of each interval: the one after next is the
            # first to run wholly on the incumbent
            eval_from = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=cfg.interval_s)
            notes.append(f"exploration off after {cfg.search_reports} reports")
            timeline.wait_for(cfg.eval_reports, since=eval_from)
    finally:
        (guest_dir / "stop").touch()
        thread.join()
    try:
        if "error" in box:
            raise box["error"]
        server.booster.refit(server.booster.policies[policy_name])
        spec = load_spec()
        incumbents = {
            key[2]: spec.from_key(plan.incumbent_key)
            for key, plan in server.booster.plan_snapshot(policy.id).items()
        }
        rounds = utility_rounds(server.engine, policy.id, cfg.sigma)
        trials = trial_table(server.engine, policy.id, cfg.sigma)
        rows = repo.host_reports(server.engine, HOST_ID)
    finally:
        server.stop()
    ids = [r[0] for r in rows]
    duplicates = len(ids) - len(set(ids))
    intervals = [(int(r[1].timestamp() * 1000), int(r[2].timestamp() * 1000)) for r in rows]
    evaluation = {
        region: [u for start, u in values if eval_from and start >= eval_from]
        for region, values in rounds.items()
    }
    utilities = {region: [u for _, u in values] for region, values in rounds.items()}
    png = (
        plot_rounds(
            rounds,
            eval_from,
            out_dir / "convergence.png",
            f"Booster + Fusion in the lab (σ = {cfg.sigma})",
        )
        if rounds
        else None
    )
    (out_dir / "loop.json").write_text(
        json.dumps(
            {
                "rounds": utilities,
                "evaluation": evaluation,
                "incumbents": incumbents,
                "reports": len(ids),
                "duplicates": duplicates,
                "notes": notes,
                "trials": trials,
                "agent_metrics": box["results"]["experiments"]["loop"].get("agent_metrics"),
            },
            indent=1,
        )
    )
    return LoopResult(
        guest=box["results"],
        rounds=utilities,
        evaluation=evaluation,
        incumbents=incumbents,
        trials=trials,
        report_ids=ids,
        duplicate_ids=duplicates,
        intervals=intervals,
        plot=png,
        notes=notes,
    )
