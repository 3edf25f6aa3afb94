"""Booster tunes Fusion on the lab's scenarios: the closed loop of gemini_lab.loop over all seven
parameters of θ, in Θ (production) or Θ′ (wide).

Each scenario is a path behind its own destination prefix, which the run's .mmdb maps to a
destination region named after the scenario: several scenarios in one run are several contexts
tuned at once on one host, as a fleet's host serves several networks. The record per context:
the utility of the host's flows per round beside the incumbent Booster had published then
(Fig. 6), the tuned θ, and the evaluation: the tuned θ's rounds with exploration off against
flows at Fusion's default θ in the same boot.
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

from gemini_api.theta import load_spec
from gemini_booster.config import Settings
from gemini_lab import scenario
from gemini_lab.loop import FIRST_ROUNDS, LabPath, LoopConfig, LoopResult, Search, run_closed_loop

INITIAL_POINTS_PER_CONTEXT = 6  # the space-filling design: about six rounds per context
RECORD_MD = "tune.md"


def tune_paths(names: Sequence[str]) -> tuple[LabPath, ...]:
    """One lab path per scenario, its destination region and ISP named after it."""
    if len(set(names)) != len(names):
        raise ValueError(f"a scenario given twice: {', '.join(names)}")
    return tuple(LabPath(scenario.load(n), n, f"isp-{n}") for n in names)


def tune_search(names: Sequence[str], region: str, sigma: float) -> Search:
    """All seven parameters over the whole region, recorded in full."""
    return Search(
        paths=tune_paths(names),
        region=region,
        recorded=load_spec().names,
        name="tune",
        title=f"Booster tunes Fusion: {', '.join(names)} (σ = {sigma}, {region} region)",
    )


def run_tune(
    make_settings: Callable[[str], Settings],
    port: int,
    token: str,
    out_dir: Path,
    names: Sequence[str],
    region: str,
    cfg: LoopConfig,
    command: str = "",
) -> LoopResult:
    """One tuning run (see gemini_lab.loop.run_closed_loop); writes tune.json, the
    convergence plot and the Markdown record tune.md in ``out_dir``."""
    search = tune_search(names, region, cfg.sigma)
    result = run_closed_loop(make_settings, port, token, out_dir, cfg, search)
    (out_dir / RECORD_MD).write_text(markdown(result, search, cfg, command))
    return result


def format_theta(theta: dict[str, int] | None) -> str:
    """θ in natural units with the paper's symbols: 'ω 10, α 1.00, …'."""
    if theta is None:
        return "—"
    spec = load_spec()
    parts = []
    for p in spec.params:
        value = p.to_natural(theta[p.name])
        text = f"{value:g}" if p.scale == 1 else f"{value:.2f}"
        parts.append(f"{p.symbol} {text}{' %' if p.unit == 'percent' else ''}")
    return ", ".join(parts)


def _spread(values: list[float]) -> str:
    if not values:
        return "—"
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.2f} ± {std:.2f} ({len(values)})"


def summary_rows(result: LoopResult) -> list[str]:
    """Per context: first rounds, evaluation rounds, default-θ rounds, the tuned θ (run in the
    evaluation) and the incumbent of a refit on all the run's data, when it differs."""
    lines = [
        f"| context | first {FIRST_ROUNDS} rounds | tuned θ, rounds with exploration off | "
        "default θ, rounds | tuned θ (run in the evaluation) | incumbent after the run |",
        "|---|---:|---:|---:|---|---|",
    ]
    for region, values in sorted(result.rounds.items()):
        tuned, final = result.tuned.get(region), result.incumbents.get(region)
        lines.append(
            f"| {region} | {_spread(values[:FIRST_ROUNDS])} | "
            f"{_spread(result.evaluation.get(region, []))} | "
            f"{_spread(result.default.get(region, []))} | {format_theta(tuned)} | "
            f"{'same' if final == tuned else format_theta(final)} |"
        )
    return lines


def round_rows(rounds: list[dict]) -> list[str]:
    """One row per round: phase, utility, the incumbent published by then and its predicted
    utility."""
    lines = [
        "| round | phase | utility | incumbent's predicted utility | incumbent θ |",
        "|---:|---|---:|---:|---|",
    ]
    for r in rounds:
        predicted = r["incumbent_utility"]
        lines.append(
            f"| {r['round']} | {r['phase']} | {r['utility']:.2f} | "
            f"{'—' if predicted is None else f'{predicted:.2f}'} | "
            f"{format_theta(r['incumbent'])} |"
        )
    return lines


def _hours_note(plans: list[dict]) -> str:
    """Contexts include the hour of day: a run across an hour's end is two contexts per path."""
    hours = sorted({p["hour"] for p in plans})
    if len(hours) < 2:
        return ""
    return (
        f"- The run crossed an hour (plans for hours {', '.join(map(str, hours))}): from then on "
        "the host asked for a new context per path, whose plans lean on the first through "
        "Booster's context kernel. Rounds are listed per path whatever the hour."
    )


def markdown(result: LoopResult, search: Search, cfg: LoopConfig, command: str) -> str:
    """The run's record: set-up, summary per context, then every round per context."""
    paths = "; ".join(f"{p.region}: {p.scenario.description}" for p in search.paths)
    lines = [
        f"# Booster tunes Fusion: {', '.join(p.region for p in search.paths)}",
        "",
        f"Command: `{command}`" if command else "",
        "",
        f"Recorded {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, guest under qemu (the agent "
        "needs the host's Booster), one host, one flow at a time per path.",
        "",
        f"- Paths: {paths}.",
        f"- σ = {cfg.sigma}; region {search.region}: {search.resolved_bounds()} (spec units).",
        f"- {cfg.search_reports} reports of search (the host explores every plan; initial "
        f"design of {cfg.n_initial_points} points), then exploration off for "
        f"{cfg.eval_reports} reports; then Booster stopped, the agent falls back to Fusion's "
        f"default θ after {cfg.staleness_s:g} s and runs it for {cfg.default_reports} reports; "
        f"{cfg.interval_s:g} s intervals, back-to-back {cfg.flow_bytes} flows on each path.",
        f"- Reports stored: {len(result.report_ids)}, duplicates {result.duplicate_ids}; "
        f"plans seen: {len(result.plans)}. {' '.join(result.notes)}",
        _hours_note(result.plans),
        "",
        "Utility = mean(throughput − σ·queueing delay), Mbit/s, per round from the stored "
        "aggregates; mean ± std over rounds (rounds).",
        "",
        *summary_rows(result),
    ]
    for region, rounds in sorted(result.round_log.items()):
        lines += ["", f"## {region}: every round", "", *round_rows(rounds)]
    return "\n".join(lines) + "\n"


def initial_points(contexts: int) -> int:
    return INITIAL_POINTS_PER_CONTEXT * contexts
