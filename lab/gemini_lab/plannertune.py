"""Booster's planner tunes Fusion for long flows on the lab's paths, in the UML lab on its
simulated clock: one guest boot per round.

    gemini-lab plannertune [--scenario S ...] [--sigma 0.1] [--rounds 12] [--hosts 5]

Why this and ``gemini-lab tune`` both exist. ``tune`` is the real loop (Booster's service,
its database, gRPC, the agent in the guest, the kernel's flow records) and has to run under
qemu: the agent talks to Booster on the host's clock, which a UML guest on a simulated clock
cannot do. Under qemu's emulation a path's figures move with the emulator's speed, and a long
flow on the satellite path takes minutes of real time, so ``tune`` searches with short
transfers. This command asks what the issue's evaluation needs: which θ Booster's optimiser
finds when the objective is a long flow on the path, measured on the simulated clock.

What is the service's own here: the planner (``gemini_booster.policy.Planner.plan``) with a
policy over all seven parameters in Θ (the production region) at the given σ; its trials are
the service's running sums of flows per (context, θ, hour bucket) (``FlowSums``, ``Trial``),
one round being one hour bucket; the published incumbent and candidates are passed back as the
service passes them; each lab host of a context gets its θ by the service's assignment
(``policy.assignment.assign``) with the policy's exploration share. What the lab adds: every
host's round is one long flow (evaluation.duration_s) of its θ on the context's path, in a UML
boot that runs the round's flows one after another; Fusion's θ is read back from the kernel's
flow record of each flow (a flow at another θ stops the run). Not exercised here: the agent,
gRPC, storage and the kernel's per-destination profile table (``tune`` and the loop tests do).

Each scenario is its own context (its own destination region and ISP). On a path with a rate
schedule, round r starts evaluation.TRACE_STEP_S × r seconds into the schedule (every host of
the round alike); on a lossy path the flows continue one loss sequence, so two hosts meet
other draws, and each round turns the hosts' order by one place (``rotated``: every boot
draws that sequence from its start). The record: per context and round the incumbent and
each θ run with its utility, and the tuned θ (the incumbent after the last round) as JSON for
``gemini-lab evaluate``.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Literal

from gemini_api.datapaths import Apply, datapath
from gemini_api.sums import FlowSums
from gemini_api.theta import ThetaSpec
from gemini_booster.domain import ContextKey, Trial
from gemini_booster.models import Policy
from gemini_booster.policy.assignment import assign
from gemini_booster.policy.planner import Planner, PolicyState
from gemini_booster.simulation import hosts_exploring
from gemini_lab import evaluation, gear_tune, scenario
from gemini_lab.host import REPO, run_plan
from gemini_lab.recorded import flow_utility

RESULTS_PATH = REPO / "benchmarks" / "results" / "planner-tune.md"
T0 = dt.datetime(2026, 1, 5, tzinfo=dt.UTC)  # round r is the hour bucket T0 + r hours
SRC = ("lab", "lab-isp")
ROUND_TIMEOUT_S = 3600  # of host time, for one boot's flows  # every lab host's own region and ISP


class RoundKind(StrEnum):
    """The experiment one lab host's round runs its θ as (the guest's experiment kind)."""

    FLOW = "flow"  # Fusion: per namespace, θ read back from its flow records
    DATAPATH_FLOW = "datapath_flow"  # a module_params datapath: θ written host-wide, read back
    GEAR_FLOW = "gear_flow"  # Gear alone behind the lab's INT switch on the context's path
    GEAR_PAIR = "gear_pair"  # Gear's intra/cross pair behind the INT switch (gemini_lab.gear_tune)
    FLASHPASS = "flashpass"  # FlashPass's workload at the host's θ (gemini_lab.flashpass.tune)


# a datapath whose θ acts only in its own experiment (Gear's needs the INT switch attached)
# A datapath whose lab experiment is not the one its apply kind implies: Gear runs behind the
# INT switch; GEMINI and DC-Vegas (per-context tables since #31 stage c) are still tuned in
# datapath_flow rounds, which set up ECN and their module options (capacity) as before.
OWN_KIND = {
    "gear": RoundKind.GEAR_PAIR,
    "gemini": RoundKind.DATAPATH_FLOW,
    "dcvegas": RoundKind.DATAPATH_FLOW,
    "flashpass": RoundKind.FLASHPASS,
}
GEAR_KINDS = (RoundKind.GEAR_FLOW, RoundKind.GEAR_PAIR)
GEAR_FLOW_S = 10  # a gear_flow round (as test_lab_gear's η runs)


@dataclass(frozen=True)
class TuneConfig:
    scenarios: tuple[str, ...] = evaluation.DEFAULT_SCENARIOS
    sigma: float = 0.1
    rounds: int = 12
    hosts: int = 5  # per context
    explorers: int = 4  # of them, exploring in every round
    seed: int = 1  # the policy's id: the planner's random draws
    region: Literal["production", "wide"] = "production"  # Θ, or Θ' (the spec's wide bounds)
    # any datapath of the registry: its spec is the policy's; a module_params one runs as
    # gemini_lab.datapath_guest's datapath_flow (θ written host-wide for each flow, read back)
    datapath: str = "fusion"
    # searched parameters (empty: all of them, over the region); the rest pinned at ``pinned``
    # (default: the spec's defaults, time-valued ones scaled by ``time_scale``)
    tuned: tuple[str, ...] = ()
    pinned: tuple[tuple[str, int], ...] = ()
    # time-valued (µs) parameters' region and defaults multiplied by this (DATAPATHS-SPEC.md
    # 0.3's s)
    time_scale: int = 1
    module_extra: tuple[tuple[str, int], ...] = ()  # non-θ module parameters (GEMINI's C)
    kind: RoundKind | None = None  # None: the datapath's own (OWN_KIND, else by how θ applies)

    def __post_init__(self) -> None:
        kind, dp = self.round_kind(), datapath(self.datapath)
        if kind == RoundKind.FLOW and dp.apply != Apply.PROFILE_TABLE:  # reads a θ table
            raise ValueError(f"experiment {kind} cannot run datapath {self.datapath}'s θ")
        if kind in GEAR_KINDS and self.datapath != "gear":
            raise ValueError(f"experiment {kind} runs Gear only, not {self.datapath}")
        if kind == RoundKind.GEAR_PAIR:
            for name in self.scenarios:
                gear_tune.pair_path(name)
        unknown = set(self.tuned) | {n for n, _ in self.pinned}
        unknown -= set(self.spec().names)
        if unknown:
            raise ValueError(f"{self.datapath} has no parameter {', '.join(sorted(unknown))}")
        self.policy()  # a pin or scaled bound outside Θ' is refused here, before any boot

    def spec(self) -> ThetaSpec:
        return datapath(self.datapath).spec

    def round_kind(self) -> RoundKind:
        if self.kind is not None:
            return self.kind
        if self.datapath in OWN_KIND:
            return OWN_KIND[self.datapath]
        if datapath(self.datapath).apply == Apply.PROFILE_TABLE:
            return RoundKind.FLOW
        return RoundKind.DATAPATH_FLOW

    def scale(self, name: str) -> int:
        """What ``time_scale`` multiplies parameter ``name`` by (1 unless it is in µs)."""
        return self.time_scale if self.spec().param(name).unit == "µs" else 1

    def pins(self) -> dict[str, int]:
        """Every parameter's value where it is not searched: ``pinned``, else the spec's
        default scaled as its region is."""
        spec = self.spec()
        return {p.name: p.default * self.scale(p.name) for p in spec.params} | dict(self.pinned)

    def start(self) -> dict[str, int]:
        """The planner's first incumbent: the spec's default clamped into the search bounds
        (``gemini_booster.policy.planner``)."""
        return Planner(self.spec()).clip_default(self.policy())

    def pinned_at_defaults(self) -> bool:
        """Whether the unsearched parameters sit at the spec's own (unscaled) defaults."""
        default = self.spec().default()
        return all(v == default[n] for n, v in self.pins().items() if n not in self.tuned)

    def search_bounds(self) -> dict[str, tuple[int, int]] | None:
        """None: the whole region; else ``tuned`` over the region (µs ones scaled), the rest
        pinned."""
        if not self.tuned and not self.pinned and self.time_scale == 1:
            return None
        spec, fixed = self.spec(), self.pins()
        region = spec.region_bounds(self.region)
        out = {}
        for p in spec.params:
            lo, hi = region[p.name]
            if not self.tuned or p.name in self.tuned:
                out[p.name] = (lo * self.scale(p.name), hi * self.scale(p.name))
            else:
                out[p.name] = (fixed[p.name], fixed[p.name])
        return out

    def policy(self) -> Policy:
        bounds = self.search_bounds()
        return Policy(
            id=self.seed,
            name="lab-plannertune",
            revision=1,
            sigma=self.sigma,
            datapath=self.datapath,
            region="custom" if bounds else self.region,
            bounds=bounds,
            exploration_share=self.explorers / self.hosts,
        )

    @property
    def region_symbol(self) -> str:
        return "Θ" if self.region == "production" else "Θ′"


def context_key(name: str) -> ContextKey:
    return ContextKey(*SRC, name, f"{name}-isp", 0)


def lab_hosts(key: ContextKey, hosts: int, explorers: int, share: float) -> list[str]:
    """``hosts`` host names of which exactly ``explorers`` explore in the service's own
    assignment (so each round explores as planned, whatever the hash)."""
    explore, exploit = hosts_exploring(key, hosts, explorers, share, prefix="lab-host-")
    return explore + exploit


@dataclass
class Tuner:
    """The planner's side of the run: trials, published incumbents and candidates."""

    cfg: TuneConfig
    planner: Planner = field(init=False)
    state: PolicyState = field(default_factory=PolicyState)
    trials: list[Trial] = field(default_factory=list)
    incumbents: dict[int, str] = field(default_factory=dict)
    candidates: dict[int, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.spec = self.cfg.spec()
        self.planner = Planner(self.spec)
        self.policy = self.cfg.policy()
        self.contexts = {i + 1: context_key(n) for i, n in enumerate(self.cfg.scenarios)}
        share = self.policy.exploration_share
        self.hosts = {
            c: lab_hosts(k, self.cfg.hosts, self.cfg.explorers, share)
            for c, k in self.contexts.items()
        }

    def plan(self, r: int) -> dict[int, tuple[dict[str, int], dict[str, dict[str, int]]]]:
        """Per context: (incumbent, host → θ) for round ``r``."""
        spec = self.spec
        plans = self.planner.plan(
            self.policy,
            self.trials,
            self.contexts,
            self.contexts.keys(),
            self.state,
            now=T0 + dt.timedelta(hours=r),
            incumbents=dict(self.incumbents),
            candidates=dict(self.candidates),
        )
        out = {}
        for c, p in plans.items():
            self.incumbents[c] = spec.key(p.incumbent)
            self.candidates[c] = tuple(spec.key(t) for t in p.candidates)
            share = self.policy.exploration_share
            runs = {
                h: assign(h, self.contexts[c], p.incumbent, p.candidates, share)[0]
                for h in self.hosts[c]
            }
            out[c] = (p.incumbent, runs)
        return out

    def observe(self, r: int, context_id: int, theta: dict[str, int], sums: FlowSums) -> None:
        """One θ's flows of round ``r`` in one context, as the service stores them."""
        t = T0 + dt.timedelta(hours=r)
        key = self.spec.key(theta)
        self.trials.append(Trial(context_id, key, sums, 0, 1, t, t))


def _path(kind: RoundKind, name: str) -> scenario.Scenario:
    if kind == RoundKind.GEAR_PAIR:
        return gear_tune.pair_path(name).scenario()
    return scenario.load(name)


def _experiment(cfg: TuneConfig, name: str, p: scenario.Scenario, r: int, port: int) -> dict:
    """What a host's round runs, by the round's kind (θ, label and path added by the caller)."""
    kind = cfg.round_kind()
    if kind == RoundKind.FLOW:  # Fusion: per namespace, its flow records
        offset = evaluation.offset_s(p, r)
        return {"kind": "flow", "cc": datapath(cfg.datapath).cc,
                "duration_s": evaluation.duration_s(p), "offset_s": offset}  # fmt: skip
    if kind == RoundKind.GEAR_PAIR:
        path = gear_tune.pair_path(name)
        return gear_tune.pair_experiment(path, {}, gear_tune.TUNE_PAIR_S)
    if kind == RoundKind.GEAR_FLOW:
        if p.rate_mbit is None:  # the INT switch reports a configured line rate
            raise ValueError(f"gear_flow needs a fixed-rate path, not {name}'s rate schedule")
        return {"kind": "gear_flow", "rate_mbit": round(p.rate_mbit), "duration_s": GEAR_FLOW_S,
                "sample_s": 1.0, "port_offset": port}  # fmt: skip
    # host-wide module parameters, written for each flow and read back
    return {"kind": "datapath_flow", "datapath": cfg.datapath,
            "module_extra": dict(cfg.module_extra), "duration_s": MODULE_FLOW_S,
            "omit_s": MODULE_OMIT_S, "sample_s": 1.0, "hops": [], "port_offset": port}  # fmt: skip


def rotated(hosts: list[str], r: int) -> list[str]:
    """The order a context's hosts run in round ``r``: turned by one place a round.

    A round is a fresh boot, and a lossy path's netem draws from its fixed seed anew in each,
    so the context's first flow meets the same losses every round (and a later one the same
    losses whenever the flows before it sent as much). A candidate keeps its host from round to
    round, so in a fixed order its second and third flows repeated its first to the byte
    (satellite, var/lab/s33-fusion/pt8: 30.17 Mbit/s in rounds 2 and 3, 30.22 in 5 and 7): not
    new evidence, yet counted as agreeing flows. Turned, a host's flow meets other draws."""
    k = r % len(hosts) if hosts else 0
    return hosts[k:] + hosts[:k]


def round_plan(cfg: TuneConfig, r: int, runs: dict[int, dict[str, dict[str, int]]]) -> dict:
    """One boot: every host's run of every context, path by path, as the round's kind, each
    context's hosts in the round's turn (``rotated``)."""
    kind = cfg.round_kind()
    paths = [_path(kind, n) for n in cfg.scenarios]
    experiments: list[dict] = []
    for i, (name, p) in enumerate(zip(cfg.scenarios, paths, strict=True)):
        for host in rotated(list(runs[i + 1]), r):
            theta = runs[i + 1][host]
            e = _experiment(cfg, name, p, r, len(experiments))
            experiments.append(e | {"label": f"{name}/{host}", "path": i, "theta": theta})
    return {"paths": [p.to_dict() for p in paths], "experiments": experiments}


MODULE_FLOW_S, MODULE_OMIT_S = 30, 5  # a module_params datapath's flow (as datapath_eval's WAN)


def failure(flow: dict) -> str | None:
    """Why a host's run gave no figures (its error's last line), or None."""
    if "error" in flow:
        return str(flow["error"]).strip().splitlines()[-1]
    if not {"params_ran", "records"} & flow.keys():
        return f"modules not loaded: {flow.get('insmod')}"
    return None


def measured(flow: dict, asked: dict[str, int], spec: ThetaSpec | None = None) -> FlowSums | None:
    """A run's sums, once the kernel shows it ran at ``asked`` (Fusion: its flow records; a
    module_params datapath: its parameters read back before the flow); None for a run that
    failed (a host whose flow failed reports nothing, as a fleet's host would not). A Gear
    pair is one flow of its fair goodput (gemini_lab.gear_tune: the objective)."""
    spec = spec or datapath("fusion").spec
    if failure(flow) is not None:
        return None
    if "records" in flow:
        ran = [rec["theta"] for rec in flow["records"]]
    else:
        ran = [{n: flow["params_ran"][n] for n in spec.names}]
    full = {**spec.default(), **asked}
    if not ran or any(t != full for t in ran):
        raise RuntimeError(f"the kernel ran {ran}, not the planned θ {full}")
    if "flows" in flow:
        return gear_tune.pair_sums(flow)
    return FlowSums.of_flow(flow["throughput_mbps"], flow["queue_delay_ms"])


def _row(host: str, theta: dict[str, int], flow: dict) -> dict:
    why = failure(flow)
    if why is not None:
        return {"host": host, "theta": theta, "error": why}
    if "flows" in flow:  # a Gear pair: its objective's figures
        return {"host": host, "theta": theta, **gear_tune.pair_row(flow)}
    return {
        "host": host,
        "theta": theta,
        "mbps": flow["throughput_mbps"],
        "queue_ms": flow["queue_delay_ms"],
        "retransmits": flow["retransmits"],
    }


def observe_round(
    tuner: Tuner, r: int, c: int, runs: dict[str, dict[str, int]], flows: dict[str, dict]
) -> list[dict]:
    """Give the planner one context's round (each θ's flows summed, as the service stores
    them); the round's rows, one per host."""
    by_theta: dict[str, tuple[dict[str, int], FlowSums]] = {}
    for host, theta in runs.items():
        sums = measured(flows[host], theta, tuner.spec)
        if sums is None:
            continue
        key = tuner.spec.key(theta)
        prev = by_theta.get(key)
        by_theta[key] = (theta, sums if prev is None else prev[1] + sums)
    for theta, total in by_theta.values():
        tuner.observe(r, c, theta, total)
    return [_row(host, theta, flows[host]) for host, theta in runs.items()]


def tune(
    cfg: TuneConfig, out: Path, progress: Callable[[str], None] = print
) -> dict[str, list[dict]]:
    """Run the rounds; per scenario, a row per round: incumbent and each host's θ, Mbit/s, ms."""
    tuner = Tuner(cfg)
    history: dict[str, list[dict]] = {n: [] for n in cfg.scenarios}
    for r in range(cfg.rounds):
        plans = tuner.plan(r)
        boot = round_plan(cfg, r, {c: runs for c, (_, runs) in plans.items()})
        results = run_plan(boot, out / f"round-{r}", backend="uml", timeout_s=ROUND_TIMEOUT_S)
        for c, (incumbent, runs) in plans.items():
            name = cfg.scenarios[c - 1]
            flows = {h: results["experiments"][f"{name}/{h}"] for h in runs}
            rows = observe_round(tuner, r, c, runs, flows)
            history[name].append({"round": r, "incumbent": incumbent, "runs": rows})
            progress(progress_line(name, r, incumbent, rows, cfg.sigma))
    final = tuner.plan(cfg.rounds)
    for c, (incumbent, _) in final.items():
        history[cfg.scenarios[c - 1]].append({"round": cfg.rounds, "incumbent": incumbent})
    (out / "history.json").write_text(json.dumps(history, indent=1))
    return history


def utility(row: dict, sigma: float) -> float:
    return flow_utility(float(row["mbps"]), float(row["queue_ms"]), sigma)


def _utility_text(row: dict, sigma: float) -> str:
    """A run's utility; a Gear pair's with its intra/cross share."""
    if "error" in row:
        return "failed"
    share = f" (share {row['share']:.2f})" if "share" in row else ""
    return f"{utility(row, sigma):.1f}{share}"


def progress_line(name: str, r: int, incumbent: dict, rows: list[dict], sigma: float) -> str:
    us = " ".join(_utility_text(row, sigma) for row in rows)
    inc = [utility(x, sigma) for x in rows if x["theta"] == incumbent and "error" not in x]
    at_inc = f"{inc[0]:.2f}" if inc else "not run"
    return f"{name} round {r}: utilities {us}; incumbent's {at_inc}"


def tuned_theta(history: dict[str, list[dict]]) -> dict[str, dict[str, int]]:
    """The incumbent after the last round, per scenario."""
    return {name: rows[-1]["incumbent"] for name, rows in history.items()}


def _theta_text(theta: dict[str, int], spec: ThetaSpec | None = None) -> str:
    spec = spec or datapath("fusion").spec
    return ", ".join(f"{spec.param(n).symbol} {theta[n]}" for n in spec.names)


FUSION_UNITS = (
    "θ in spec units (α, λ in %, l in tenths of a percent, δ in % of T^min, n in quarter round "
    "trips)."
)


def _pins_text(cfg: TuneConfig) -> str:
    """Where the unsearched parameters sit: the spec's defaults, or the values named."""
    if cfg.pinned_at_defaults():
        return "pinned at the spec's defaults"
    spec, pins = cfg.spec(), cfg.pins()
    return "pinned at " + ", ".join(
        f"{spec.param(n).symbol} {v}" for n, v in pins.items() if n not in cfg.tuned
    ) + f" (the spec's defaults: {_theta_text(spec.default(), spec)})"  # fmt: skip


def _searched(cfg: TuneConfig) -> str:
    """What the policy searched, in words."""
    if not cfg.tuned:
        n = len(cfg.spec().params)
        units = FUSION_UNITS if cfg.datapath == "fusion" else "θ in spec units."
        words = "seven" if n == 7 else str(n)
        return f"datapath {cfg.datapath}: all {words} parameters in {cfg.region_symbol}. {units}"
    spec, bounds = cfg.spec(), cfg.search_bounds() or {}
    tuned = ", ".join(f"{spec.param(n).symbol} ∈ {list(bounds[n])}" for n in cfg.tuned)
    extra = f"; module parameters {dict(cfg.module_extra)}" if cfg.module_extra else ""
    return (
        f"datapath {cfg.datapath}: {tuned} (spec units), the other parameters "
        f"{_pins_text(cfg)}{extra}; each round is a {cfg.round_kind()} experiment. The planner "
        "starts from the spec's default clamped into the bounds."
    )


def render(history: dict[str, list[dict]], cfg: TuneConfig, command: str) -> str:
    parts = [
        f"# Booster's planner tunes {cfg.datapath} for long flows (UML lab)",
        "",
        f"Command: `{command}` (recorded {dt.date.today().isoformat()}; User-Mode Linux on a "
        "simulated clock). What is the service's and what the lab adds: "
        "`lab/gemini_lab/plannertune.py`.",
        "",
        f"σ = {cfg.sigma:g}, {cfg.rounds} rounds, {cfg.hosts} lab hosts per context of which "
        f"{cfg.explorers} explore, {_searched(cfg)}",
    ]
    for name, rows in history.items():
        parts += [
            "",
            f"## {name}",
            "",
            "| round | incumbent's utility | best run | utilities run |",
        ]
        parts.append("|---:|---:|---:|---|")
        for row in rows[:-1]:
            ok = [x for x in row["runs"] if "error" not in x]
            us = [utility(x, cfg.sigma) for x in ok]
            inc = [utility(x, cfg.sigma) for x in ok if x["theta"] == row["incumbent"]]
            inc_text = f"{inc[0]:.2f}" if inc else "not run"
            best = f"{max(us):.2f}" if us else "–"
            listed = " ".join(_utility_text(x, cfg.sigma) for x in row["runs"])
            parts.append(f"| {row['round']} | {inc_text} | {best} | {listed} |")
        parts += _runs_table(rows[:-1], cfg)
        parts += [
            "",
            f"Tuned θ (the incumbent after round {cfg.rounds - 1}): "
            f"{_theta_text(rows[-1]['incumbent'], cfg.spec())}.",
        ]
        if rows[-1]["incumbent"] == cfg.start():
            parts.append(stayed_at_default_text(cfg.datapath))
    return "\n".join(parts) + "\n"


def _runs_table(rounds: list[dict], cfg: TuneConfig) -> list[str]:
    """Every θ each round ran (the searched parameters) with its utility: what the planner was
    shown, so that a reader can follow how the incumbent moved."""
    spec = cfg.spec()
    names = cfg.tuned or spec.names
    lines = ["", "| round | θ run (searched parameters) | utility |", "|---:|---|---|"]
    for row in rounds:
        for x in row["runs"]:
            theta = ", ".join(f"{spec.param(n).symbol} {x['theta'][n]}" for n in names)
            mark = " (incumbent)" if x["theta"] == row["incumbent"] else ""
            lines.append(f"| {row['round']} | {theta}{mark} | {_utility_text(x, cfg.sigma)} |")
    return lines


def stayed_at_default_text(name: str) -> str:
    """What the record says when the planner kept its starting θ (``name``: the datapath)."""
    return (
        "**The incumbent stayed at the planner's starting θ (the spec's default in the "
        "bounds)**: no explored θ beat it in these rounds, so this path's 'tuned' θ is "
        f"untuned {name}."
    )


def stayed_at_default(theta: dict[str, int], spec: ThetaSpec) -> bool:
    """The planner kept the default incumbent: its 'tuned' θ is the spec's default (issue #34:
    two recorded rows described untuned Fusion and did not say so)."""
    return theta == spec.default()


def write_tuned(history: dict[str, list[dict]], cfg: TuneConfig, command: str, path: Path) -> None:
    """The tuned θ per scenario, in the file ``gemini-lab evaluate --tuned`` reads."""
    source = (
        f"{command}: Booster's planner on UML long flows, σ = {cfg.sigma:g}, {cfg.region_symbol}"
    )
    tuned = tuned_theta(history)
    at_default = sorted(n for n, t in tuned.items() if stayed_at_default(t, cfg.spec()))
    data: dict = {"source": source, "theta": tuned}
    if at_default:
        data["stayed_at_default"] = at_default
    path.write_text(json.dumps(data, indent=1) + "\n")
