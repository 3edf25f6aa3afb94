"""Long flows per congestion control on the lab's paths, Booster-tuned θ beside the baselines
(issue item "the evaluation, recorded"), in the UML lab on its simulated clock.

    gemini-lab evaluate [--scenario S ...] [--tuned FILE] [--runs N]

Per path, one long flow per contender and run: Fusion at the θ spec's default, Fusion at the θ
Booster tuned on that path (``--tuned``: a JSON file of scenario → θ, e.g.
benchmarks/results/tuned-theta.json), Fusion at the θ tuned on each *other* path (the paper's
robustness claim: θ tuned on one path run on the others), and cubic, bbr, vegas and reno. Each
flow starts cold; it lasts DURATION_S (LONG_DURATION_S on paths of LONG_RTT_MS or more, whose
slow start alone takes ten round trips).

Runs and their spread. The UML lab repeats an experiment exactly when nothing differs (its
netem queues draw losses from a fixed seed, lab/uml/netem-fixed-seed.patch), so a repeat of the
same flow in the same place would show no spread. The runs here differ where the path does:
- on a path with random loss, the path's one netem queue draws its losses from one sequence,
  continued from flow to flow, so run k of a contender meets later draws than run k − 1;
- on a path with a rate schedule (the cellular trace), run k starts TRACE_STEP_S × k seconds
  into the schedule, so each run meets another stretch of the trace (all contenders the same).
On a fixed, loss-free path (ethernet) the runs are the same experiment and agree to the byte;
the table shows that. A run that fails is listed under its path and left out of the means; a
failed run of the tuned θ leaves its path without a verdict. (Flows end at their duration
whatever their socket still holds, gemini_lab.bulk: before that, a vegas flow on the satellite
path at 0.25 Mbit/s did not drain in time and failed its run.)

Utility is eq. 9 per flow, throughput − σ · queueing delay (Mbit/s, ms), with queueing = mean
RTT − minimum RTT from the sender's tcp_info, at each σ of SIGMAS; a cell is the mean over runs
with (min–max).
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gemini_api.theta import load_spec
from gemini_lab import scenario
from gemini_lab.host import REPO
from gemini_lab.recorded import Contender, Measurement, flow_utility, load_theta

RESULTS_PATH = REPO / "benchmarks" / "results" / "evaluation.md"
TUNED_PATH = REPO / "benchmarks" / "results" / "tuned-theta.json"
DEFAULT_SCENARIOS = ("ethernet", "satellite", "cellular")
BASELINES = ("cubic", "bbr", "vegas", "reno")
SIGMAS = (0.1, 1.0, 10.0)
DURATION_S = 20
LONG_DURATION_S = 40
LONG_RTT_MS = 500
TRACE_STEP_S = 3.0  # run k starts 3·k s into a path's rate schedule


@dataclass(frozen=True)
class Tuned:
    """The θ Booster tuned per scenario, and where they come from (for the record)."""

    theta: Mapping[str, dict[str, int]]
    source: str = ""
    stayed_at_default: frozenset[str] = frozenset()  # the planner kept the default incumbent

    @classmethod
    def load(cls, path: Path) -> Tuned:
        """``{"source": "...", "theta": {scenario: θ}, "stayed_at_default": [scenario]}``,
        each θ checked against the spec; the last names the paths whose 'tuned' θ is the
        spec's default of the day it was tuned (it may differ from today's)."""
        data = json.loads(path.read_text())
        if not isinstance(data.get("theta"), dict):
            raise ValueError(f'{path}: no "theta" object of scenario → θ')
        theta = {name: load_theta(json.dumps(t)) for name, t in data["theta"].items()}
        at_default = data.get("stayed_at_default", [])
        if not isinstance(at_default, list) or not set(at_default) <= set(theta):
            raise ValueError(f"{path}: stayed_at_default must list scenarios of theta")
        return cls(theta, str(data.get("source", path.name)), frozenset(at_default))


@dataclass(frozen=True)
class EvalConfig:
    scenarios: tuple[str, ...] = DEFAULT_SCENARIOS
    tuned: Tuned = field(default_factory=lambda: Tuned({}))
    runs: int = 3
    cross: bool = True  # θ tuned on the other paths too
    # run only these contenders (empty: all): re-measuring Fusion on a changed datapath beside
    # baselines recorded before, which the datapath does not touch
    only: tuple[str, ...] = ()

    def contenders(self, path: str) -> list[Contender]:
        """fusion-default, fusion-tuned (this path's θ), fusion-tuned@P (path P's θ), the
        baselines; only those of ``only`` if it names any."""
        every = self._every_contender(path)
        return [c for c in every if c.name in self.only] if self.only else every

    def _every_contender(self, path: str) -> list[Contender]:
        out = [Contender("fusion-default", "fusion", {})]
        if path in self.tuned.theta:
            out.append(Contender("fusion-tuned", "fusion", dict(self.tuned.theta[path])))
        if self.cross:
            out += [
                Contender(f"fusion-tuned@{other}", "fusion", dict(theta))
                for other, theta in self.tuned.theta.items()
                if other != path
            ]
        return out + [Contender(cc, cc, {}) for cc in BASELINES]


def duration_s(p: scenario.Scenario) -> int:
    return LONG_DURATION_S if p.rtt_ms >= LONG_RTT_MS else DURATION_S


def offset_s(p: scenario.Scenario, run: int) -> float:
    """Where in the path's rate schedule run ``run`` starts (0 on a fixed-rate path)."""
    return TRACE_STEP_S * run if len(p.schedule()) > 1 else 0.0


def build_plan(cfg: EvalConfig) -> dict:
    """Run-major: every path and contender once, then again, so that on a lossy path each run
    of every contender meets later draws of the path's loss sequence."""
    paths = [scenario.load(n) for n in cfg.scenarios]
    experiments = []
    for run in range(cfg.runs):
        for i, p in enumerate(paths):
            for c in cfg.contenders(p.name):
                experiments.append(
                    {
                        "label": f"{p.name}/{c.name}/{run}",
                        "kind": "flow",
                        "path": i,
                        "cc": c.cc,
                        "theta": c.theta,
                        "duration_s": duration_s(p),
                        "offset_s": offset_s(p, run),
                    }
                )
    return {"paths": [p.to_dict() for p in paths], "experiments": experiments}


# --- host side: figures ----------------------------------------------------------------------


def utility(flow: dict, sigma: float) -> float:
    """Eq. 9 for one flow: Mbit/s − σ · ms of queueing."""
    return flow_utility(float(flow["throughput_mbps"]), float(flow["queue_delay_ms"]), sigma)


def _runs(results: dict, path: str, name: str) -> list[tuple[str, dict]]:
    prefix = f"{path}/{name}/"
    return [
        (label, r)
        for label, r in results["experiments"].items()
        if label.startswith(prefix) and label[len(prefix) :].isdigit()
    ]


def flows_of(results: dict, path: str, name: str) -> list[dict]:
    """The runs of one contender on one path that measured a flow, in run order."""
    return [r for _, r in _runs(results, path, name) if "error" not in r]


def failures_of(results: dict, path: str, name: str) -> list[str]:
    """The runs that did not: label and the error's last line."""
    return [
        f"{label}: {r['error'].strip().splitlines()[-1]}"
        for label, r in _runs(results, path, name)
        if "error" in r
    ]


def _spread(values: list[float], fmt: str) -> str:
    mean = statistics.fmean(values)
    if len(values) == 1 or max(values) == min(values):
        return format(mean, fmt)
    return f"{mean:{fmt}} ({min(values):{fmt}}–{max(values):{fmt}})"


def capacities_mbit(results: dict, p: scenario.Scenario, name: str) -> list[float]:
    """The capacity each measured run of a contender had: the path's rate over the stretch of
    its schedule that run's flow met (run k starts ``offset_s(p, k)`` in), not the whole
    trace's mean, under which one run showed 110 % of capacity."""
    prefix = f"{p.name}/{name}/"
    return [
        p.capacity_kbit(offset_s(p, int(label[len(prefix) :])), duration_s(p)) / 1000
        for label, r in _runs(results, p.name, name)
        if "error" not in r
    ]


def _row(name: str, flows: list[dict], failed: int, capacity_mbit: list[float]) -> str:
    tput = [f["throughput_mbps"] for f in flows]
    cells = [
        name,
        f"{len(flows)} of {len(flows) + failed}" if failed else str(len(flows)),
        _spread(tput, ".2f"),
        _spread([100 * t / c for t, c in zip(tput, capacity_mbit, strict=True)], ".0f"),
        _spread([f["queue_delay_ms"] for f in flows], ".1f"),
        _spread([float(f["retransmits"]) for f in flows], ".0f"),
        *(_spread([utility(f, s) for f in flows], ".2f") for s in SIGMAS),
    ]
    return "| " + " | ".join(cells) + " |"


def mean_utility(flows: list[dict], sigma: float) -> float:
    return statistics.fmean(utility(f, sigma) for f in flows)


def verdicts(results: dict, path: str, cfg: EvalConfig) -> list[str]:
    """Per σ: the tuned θ's mean utility against the best baseline's, and the margin."""
    tuned = flows_of(results, path, "fusion-tuned")
    if failures_of(results, path, "fusion-tuned"):
        return ["A run of the tuned θ failed: no verdict."]
    if not tuned:
        return ["No tuned θ for this path."]
    measured = [b for b in BASELINES if flows_of(results, path, b)]
    if not measured:
        return ["No baseline measured in these runs: no verdict."]
    lines = []
    for s in SIGMAS:
        best, best_u = max(
            ((b, mean_utility(flows_of(results, path, b), s)) for b in measured),
            key=lambda pair: pair[1],
        )
        u = mean_utility(tuned, s)
        margin = (u - best_u) / abs(best_u) if best_u else float("inf")
        mark = "at or above" if u >= best_u else ("within 5 % of" if margin >= -0.05 else "below")
        # a percentage of a utility near zero says nothing: the difference alone then
        by = f"{u - best_u:+.2f}" + (f", {100 * margin:+.1f} %" if abs(best_u) >= 1 else "")
        lines.append(
            f"- σ = {s:g}: fusion-tuned {u:.2f} against the best baseline ({best}) "
            f"{best_u:.2f}: **{mark}** ({by})."
        )
    return lines


STAYED_AT_DEFAULT = "the planner kept the default incumbent: untuned Fusion"
DEFAULT_SHARE_BAR = 0.5  # default Fusion's throughput, at least this share of the best baseline's
BAR_SIGMA = 0.1  # ...and its utility at this σ at least cubic's (issue #34)


def default_bar(results: dict, path: str) -> list[str]:
    """Issue #34's bar for the default θ on every path: mean throughput at least half the best
    baseline's, mean utility at σ = 0.1 at least cubic's (each with its runs' min–max)."""
    default = flows_of(results, path, "fusion-default")
    measured = {b: flows_of(results, path, b) for b in BASELINES}
    measured = {b: f for b, f in measured.items() if f}
    if not default or not measured or "cubic" not in measured:
        return []

    def mean_tput(flows: list[dict]) -> float:
        return statistics.fmean(f["throughput_mbps"] for f in flows)

    best = max(measured, key=lambda b: mean_tput(measured[b]))
    share = [f["throughput_mbps"] / mean_tput(measured[best]) for f in default]
    u, cubic_u = mean_utility(default, BAR_SIGMA), mean_utility(measured["cubic"], BAR_SIGMA)
    share_ok = statistics.fmean(share) >= DEFAULT_SHARE_BAR
    return [
        f"- Default θ: throughput {_spread([100 * x for x in share], '.0f')} % of the best "
        f"baseline's ({best}, {mean_tput(measured[best]):.2f} Mbit/s): "
        f"**{'holds' if share_ok else 'fails'}** (≥ {100 * DEFAULT_SHARE_BAR:.0f} %); utility at "
        f"σ = {BAR_SIGMA:g} {u:.2f} against cubic's {cubic_u:.2f}: "
        f"**{'holds' if u >= cubic_u else 'fails'}**."
    ]


TABLE_HEAD = (
    "| CC | runs | Mbit/s | % of capacity | queueing ms | retransmits | "
    + " | ".join(f"utility σ={s:g}" for s in SIGMAS)
    + " |\n|---|---:|---:|---:|---:|---:|"
    + "---:|" * len(SIGMAS)
)


def _path_line(p: scenario.Scenario) -> str:
    rate = f"{p.rate_mbit:g} Mbit/s" if p.rate_mbit else f"trace {p.rate_trace}"
    loss = f", {p.loss_percent:g} % random loss" if p.loss_percent else ""
    if p.jitter_ms:
        order = "reordering" if p.jitter_reorder else "in order"
        loss += f", ±{p.jitter_ms:g} ms jitter ({order})"
    if p.ack_burst_ms:
        loss += f", ACKs in bursts every {p.ack_burst_ms:g} ms"
    return (
        f"{p.name}: {p.rtt_ms:g} ms, {rate} (mean {p.mean_rate_kbit / 1000:.1f} Mbit/s){loss}, "
        f"queue {p.queue_limit()} packets; flows of {duration_s(p)} s"
    )


def render(results: dict, cfg: EvalConfig, command: str) -> str:
    parts = [
        "# Long flows per CC on the lab's paths: Booster-tuned Fusion beside the baselines",
        "",
        f"Command: `{command}` (recorded {dt.date.today().isoformat()}, User-Mode Linux "
        f"{results.get('kernel')} with time-travel=inf-cpu: figures on the guest's simulated "
        "clock).",
        "",
        "One flow per CC and run, from a cold start; a cell is the mean over runs with "
        "(min–max). Queueing = mean RTT − min RTT from tcp_info; utility = Mbit/s − σ · ms "
        "(eq. 9). fusion-tuned is the θ Booster tuned on the path, fusion-tuned@P the θ tuned "
        f"on path P; tuned θ from {cfg.tuned.source or 'none'}. How runs differ: "
        "`lab/gemini_lab/evaluation.py`.",
        "",
    ]
    default = load_spec().default()
    for name, theta in cfg.tuned.theta.items():
        label = f" ({STAYED_AT_DEFAULT})" if name in cfg.tuned.stayed_at_default else ""
        if theta == default:
            label = " (**the spec's default θ**: untuned Fusion)"
        parts.append(f"- θ tuned on {name}: `{json.dumps(theta)}`{label}")
    for name in cfg.scenarios:
        p = scenario.load(name)
        rows, failed = [], []
        for c in cfg.contenders(name):
            flows, failures = flows_of(results, name, c.name), failures_of(results, name, c.name)
            failed += failures
            if flows:
                caps = capacities_mbit(results, p, c.name)
                rows.append(_row(c.name, flows, len(failures), caps))
        parts += ["", f"## {name}", "", _path_line(p), "", TABLE_HEAD, *rows, ""]
        parts += [f"- Failed run (not in the means): {f}" for f in failed]
        parts += default_bar(results, name)
        parts += verdicts(results, name, cfg)
    return "\n".join(parts) + "\n"


def wrong_theta(results: dict, cfg: EvalConfig) -> list[str]:
    """Fusion flows whose kernel records do not carry the θ asked for (over the spec's
    defaults), or that left no record: a run with any of these is not a measurement."""
    default = load_spec().default()
    wrong = []
    for name in cfg.scenarios:
        for c in cfg.contenders(name):
            if c.cc != "fusion":
                continue
            asked = {**default, **c.theta}
            for i, flow in enumerate(flows_of(results, name, c.name)):
                ran = [r["theta"] for r in flow["records"]]
                if not ran or any(t != asked for t in ran):
                    wrong.append(f"{name}/{c.name}/{i}: asked {asked}, the kernel ran {ran}")
    return wrong


def progress_line(label: str, result: dict) -> str:
    if "error" in result:
        return f"{label}: ERROR {result['error'].strip().splitlines()[-1]}"
    return (
        f"{label}: {result['throughput_mbps']:.2f} Mbit/s, "
        f"{result['queue_delay_ms']:.1f} ms queueing, {result['retransmits']} retransmits"
    )


MEASUREMENT = Measurement(build_plan, render, progress_line, wrong_theta)
