"""Optimiser benchmark: Booster's planner against per-context baselines on known landscapes.

Each method drives the same simulated fleet (``optimiser_landscapes``): per context 8 hosts,
half of them exploring, 20 flows per host per round, one simulated hour per round, per-flow
utility noise of 15 % (relative std) drawn identically for every method (the same draw for the
same seed, round, context and host). Methods (``optimiser_methods``): Booster in its modes,
per-context scikit-optimize, Optuna TPE and random search, in this process, on the same seeds.

Figures, as % of the context's optimum utility (at that round, for the drifting landscape):
  - incumbent regret @k: the incumbent after k rounds of data, mean and worst context;
  - rounds to 2 %: the first round after which the incumbent stays within 2 % (median and
    worst context; "> R" when it is not within 2 % at the end);
  - fleet regret: flow-weighted mean regret of every θ hosts ran, exploration included;
  - changes: incumbent changes per context in the last 10 rounds (median context);
  - drift recovery: rounds of data on the moved surface until the incumbent stays within 5 %;
  - best θ run: at the end, the regret of the truly best θ the fleet ran in the context, of any
    θ and of those run for at least WELL_MEASURED_FLOWS flows (mean over contexts): the first
    is what searching left, the second above it what the search did not measure well, and
    the incumbent's regret above the second what choosing among well-measured θ cost (on
    the drifting landscape, flows from before the move count too);
  - plan s/round: the method's own time per round (plan or ask, plus tell).
Every figure is the median over seeds. ``--timing`` also times one Booster refit at 1,000 /
10,000 / 100,000 aggregated trials over 1,000 contexts.

    python -m benchmarks.optimiser [--seeds 5] [--rounds 30]
        [--landscapes lab shared24 drift plateau hourly] [--methods ...] [--timing] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError
from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

from gemini_api.theta import load_spec
from gemini_booster.policy import planner as planner_module
from gemini_booster.policy.planner import Planner, PolicyState

from .common import write_result
from .optimiser_landscapes import (
    DRIFT_ROUND,
    FLOWS_PER_HOST,
    LANDSCAPES,
    Landscape,
    bucket_time,
    flow_factors,
    hour_factor,
    make_trial,
    run_flows,
    shared_landscape,
)
from .optimiser_methods import METHODS, HostRun, make_method, make_policy

CHECKPOINTS = (10, 20, 30)
CONVERGED_PCT = 2.0
RECOVERED_PCT = 5.0
LAST_ROUNDS = 10
WELL_MEASURED_FLOWS = 5 * FLOWS_PER_HOST  # five host-rounds: a mean within ±1.5 % (1 sd)
BASELINES = ("booster-standard", "skopt", "tpe", "random")  # what contextual must match
TIMING_CONTEXTS = (20, 25, 2)  # regions × ISPs × time blocks = 1,000 contexts
TIMING_SIZES = (1_000, 10_000, 100_000)
TIMING_TARGETS = 200  # the service's default max_contexts_per_refit
TIMING_HOURS = 300  # trials spread over this many hourly buckets (inside the history window)
REPO = Path(__file__).resolve().parent.parent
SETUP = [
    "Landscapes (`benchmarks/optimiser_landscapes.py`): `lab`, two contexts after the lab's "
    "wired and lossy paths (lab-loop.md, fusion-datapath.md), 4 parameters (ω, λ, l, δ); "
    "`shared24`, 4 regions × 3 ISPs × 2 time blocks, 6 parameters, optimum = region part + ISP "
    "part + time-block part; `drift`, one context, 4 parameters, optimum and peak move at "
    f"round {DRIFT_ROUND + 1} (after {DRIFT_ROUND} rounds of data); `plateau`, lab's two "
    "contexts with every θ within 1 % of the best, where an incumbent change is noise "
    "(its changes are the churn a switching rule lets noise cause); `hourly`, lab's two "
    "contexts with each hour (round) at a level of its own shared by the context's flows "
    "(±20 %, drawn per seed, round and context). Parameters outside a "
    "landscape are pinned at the spec's default through a custom region (lo = hi), so every "
    "method searches the same dimensions. Policy: defaults except σ 0.1, that region, "
    "exploration share 0.5 and two time blocks.",
    "",
    "Baselines, one optimiser per context on the same hosts: `skopt` (Optimizer, its GP with "
    "one hyperparameter start per fit, GP-Hedge, LHS start, batch ask by constant liar; "
    "incumbent: the observed θ with the best GP-predicted utility), `tpe` (Optuna TPESampler, "
    "ask/tell, the incumbent's rounds added as trials; incumbent: the best trial), `random` "
    "(incumbent: the best mean over all of a θ's flows). Regret @k is the incumbent after k "
    "rounds of data; 'changes last 10' counts changes over the last 10 plans; 'recovery' is "
    "rounds of data on the moved surface until the incumbent stays within 5 %.",
    "",
]


# -- metrics (pure functions of a history) -----------------------------------------------------


def regret_pct(optimum: float, utility: float) -> float:
    return 100.0 * (optimum - utility) / optimum


def rounds_to(regrets: Sequence[float], threshold: float) -> int | None:
    """The first k after which regrets[k:] all stay ≤ threshold; None if the last is above."""
    k = None
    for i in range(len(regrets) - 1, -1, -1):
        if regrets[i] > threshold:
            break
        k = i
    return k


def changes_in_last(keys: Sequence[str], window: int = LAST_ROUNDS) -> int:
    """How often the incumbent changed over the last ``window`` plans."""
    start = max(1, len(keys) - window)
    return sum(keys[i] != keys[i - 1] for i in range(start, len(keys)))


def fleet_regret(runs: Sequence[tuple[int, float]]) -> float:
    """Flow-weighted mean regret of (flows, regret %) pairs."""
    flows = sum(n for n, _ in runs)
    return sum(n * r for n, r in runs) / flows if flows else float("nan")


@dataclass
class History:
    """One method on one landscape and seed: per context the incumbent after k = 0..R rounds."""

    keys: dict[int, list[str]] = field(default_factory=lambda: defaultdict(list))
    regrets: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    runs: list[tuple[int, float]] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    model_points: int | None = None
    ran: dict[int, dict[str, int]] = field(default_factory=lambda: defaultdict(dict))  # flows
    best_run: tuple[float, float] | None = None  # see best_run()


def best_run(landscape: Landscape, hist: History, round_index: int) -> tuple[float, float]:
    """(mean over contexts of the lowest true regret of any θ run, and of any θ run for at
    least WELL_MEASURED_FLOWS flows) on the surface of ``round_index``."""
    spec = load_spec()
    anything, measured = [], []
    for c, flows in hist.ran.items():
        opt = landscape.optimum_utility(c, round_index)
        regret = {
            k: regret_pct(opt, landscape.true_utility(c, round_index, spec.from_key(k)))
            for k in flows
        }
        anything.append(min(regret.values()))
        well = [r for k, r in regret.items() if flows[k] >= WELL_MEASURED_FLOWS]
        measured.append(min(well, default=float("nan")))
    return float(np.mean(anything)), float(np.mean(measured))


def simulate(landscape: Landscape, method_name: str, seed: int, rounds: int) -> History:
    spec = load_spec()
    method = make_method(method_name, landscape, seed)
    hist = History()

    def record(plans, k: int) -> None:
        for c, p in plans.items():
            opt = landscape.optimum_utility(c, k)
            hist.keys[c].append(spec.key(p.incumbent))
            hist.regrets[c].append(regret_pct(opt, landscape.true_utility(c, k, p.incumbent)))

    for r in range(rounds):
        t0 = time.perf_counter()
        plans = method.plan(r, bucket_time(r))
        spent = time.perf_counter() - t0
        record(plans, r)
        runs: dict[int, list[HostRun]] = defaultdict(list)
        for c, p in plans.items():
            surface = landscape.surface(c, r)
            opt = surface.peak
            for host, theta in p.runs.items():
                key = spec.key(theta)
                hist.ran[c][key] = hist.ran[c].get(key, 0) + FLOWS_PER_HOST
                x = landscape.normalise([theta])
                factors = flow_factors(seed, landscape.name, r, c, host)
                factors = factors * hour_factor(seed, landscape, r, c)
                sums, slow = run_flows(surface, x, factors)
                runs[c].append(HostRun(host, theta, sums, slow))
                hist.runs.append((FLOWS_PER_HOST, regret_pct(opt, float(surface.utility(x)[0]))))
        t0 = time.perf_counter()
        method.observe(r, runs)
        hist.seconds.append(spent + time.perf_counter() - t0)
    record(method.plan(rounds, bucket_time(rounds)), rounds)
    hist.model_points = method.model_points
    hist.best_run = best_run(landscape, hist, rounds)
    return hist


@dataclass(frozen=True)
class Summary:
    at: dict[int, tuple[float, float]]  # k → (mean, worst context) regret %
    to_2pct: tuple[float, float]  # median, worst context (inf: not reached)
    fleet: float
    changes: float
    recovery: float | None
    seconds: float
    model_points: int | None
    best_run: tuple[float, float] | None = None  # runs saved before the figure: None


def summarise(hist: History, checkpoints: Sequence[int], drift: bool) -> Summary:
    ctxs = sorted(hist.regrets)
    at = {
        k: (
            float(np.mean([hist.regrets[c][k] for c in ctxs])),
            max(hist.regrets[c][k] for c in ctxs),
        )
        for k in checkpoints
    }
    to = [rounds_to(hist.regrets[c], CONVERGED_PCT) for c in ctxs]
    to_f = [float("inf") if v is None else float(v) for v in to]
    recovery = None
    if drift and len(hist.regrets[ctxs[0]]) > DRIFT_ROUND:
        rec = [rounds_to(hist.regrets[c][DRIFT_ROUND:], RECOVERED_PCT) for c in ctxs]
        recovery = max(float("inf") if v is None else float(v) for v in rec)
    return Summary(
        at,
        (float(np.median(to_f)), max(to_f)),
        fleet_regret(hist.runs),
        float(np.median([changes_in_last(hist.keys[c]) for c in ctxs])),
        recovery,
        float(np.mean(hist.seconds)),
        hist.model_points,
        hist.best_run,
    )


def median_summary(sums: list[Summary]) -> Summary:
    med = statistics.median
    return Summary(
        {k: _medians([s.at[k] for s in sums]) for k in sums[0].at},
        _medians([s.to_2pct for s in sums]),
        med(s.fleet for s in sums),
        med(s.changes for s in sums),
        None if sums[0].recovery is None else med(s.recovery or 0.0 for s in sums),
        med(s.seconds for s in sums),
        sums[-1].model_points,
        _median_pair([s.best_run for s in sums]),
    )


def _medians(pairs: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """The median of each element of the pairs."""
    return statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)


def _median_pair(pairs: list[tuple[float, float] | None]) -> tuple[float, float] | None:
    """``_medians``, or None when any seed lacks the figure (saved before it existed)."""
    present = [p for p in pairs if p is not None]
    return _medians(present) if len(present) == len(pairs) else None


# -- tables ------------------------------------------------------------------------------------


def _rounds(v: float, total: int) -> str:
    return f"> {total}" if v == float("inf") else f"{v:g}"


def table(name: str, rows: dict[str, Summary], rounds: int, drift: bool) -> list[str]:
    ks = list(next(iter(rows.values())).at)
    head = [f"regret @{k} mean / worst" for k in ks]
    head += ["rounds to 2 % median / worst", "fleet regret", f"changes last {LAST_ROUNDS}"]
    head += ["recovery ≤ 5 %"] if drift else []
    head += [f"best θ run @{rounds} any / ≥ {WELL_MEASURED_FLOWS} flows"]
    head += ["plan s/round", "model points"]
    out = [f"### {name}", "", "| method | " + " | ".join(head) + " |"]
    out.append("| --- |" + " ---: |" * len(head))
    for m, s in rows.items():
        cells = [f"{s.at[k][0]:.2f} / {s.at[k][1]:.2f}" for k in ks]
        cells.append(f"{_rounds(s.to_2pct[0], rounds)} / {_rounds(s.to_2pct[1], rounds)}")
        cells += [f"{s.fleet:.2f}", f"{s.changes:g}"]
        if drift:
            cells.append("n/a" if s.recovery is None else _rounds(s.recovery, rounds))
        best = "n/a" if s.best_run is None else f"{s.best_run[0]:.2f} / {s.best_run[1]:.2f}"
        cells.append(best)
        pts = "n/a" if s.model_points is None else str(s.model_points)
        cells += [f"{s.seconds:.3f}", pts]
        out.append(f"| {m} | " + " | ".join(cells) + " |")
    return [*out, ""]


def acceptance(name: str, rows: dict[str, Summary], drift: bool) -> list[str]:
    """The issue's acceptance, checked on these medians (PASS/FAIL lines)."""
    b = rows.get("booster-contextual")
    if b is None:
        return []
    changes = "PASS" if b.changes <= 1 else "FAIL"
    stable = f"- {name}: ≤ 1 incumbent change per context in the last 10 rounds: {changes}"
    if name == "plateau":  # every θ within 1 %: regrets are noise, churn is the figure
        return [stable]
    lines = []
    others = [m for m in BASELINES if m in rows]
    for k in (20, 30):
        if k in b.at:
            better = [m for m in others if b.at[k][0] > rows[m].at[k][0]]
            ok = "PASS" if not better else f"FAIL (lower: {', '.join(better)})"
            lines.append(
                f"- {name}: contextual mean regret @{k} ≤ {', '.join(others)}: {ok} "
                f"({b.at[k][0]:.2f} %)"
            )
    if "tpe" in rows:
        ok = "PASS" if b.fleet <= rows["tpe"].fleet else "FAIL"
        lines.append(f"- {name}: contextual fleet regret ≤ TPE's: {ok}")
    if name == "shared24" and 30 in b.at:
        ok = "PASS" if b.at[30][1] <= 3.0 else "FAIL"
        lines.append(f"- {name}: worst context within 3 % @30: {ok} ({b.at[30][1]:.2f} %)")
    if drift and b.recovery is not None:
        ok = "PASS" if b.recovery <= 10 else "FAIL"
        lines.append(f"- {name}: back within 5 % ≤ 10 rounds after the move: {ok}")
    return [*lines, stable]


# -- planning time at scale --------------------------------------------------------------------


def timing_trials(landscape: Landscape, n: int, rng: np.random.Generator) -> list:
    """``n`` aggregated trials: random θ, contexts in turn, buckets over TIMING_HOURS hours."""
    spec = load_spec()
    ctx_ids = sorted(landscape.contexts)
    bounds = landscape.bounds()
    trials = []
    for i in range(n):
        c = ctx_ids[i % len(ctx_ids)]
        theta = {p: int(rng.integers(lo, hi + 1)) for p, (lo, hi) in bounds.items()}
        factors = np.maximum(1.0 + 0.15 * rng.standard_normal(FLOWS_PER_HOST), 0.05)
        sums, slow = run_flows(landscape.surfaces[c], landscape.normalise([theta]), factors)
        trials.append(
            make_trial(c, spec.key(theta), sums, slow, 1, int(rng.integers(TIMING_HOURS)))
        )
    return trials


def _refit_seconds(planner, policy, trials, contexts, targets, blas_threads) -> tuple[float, int]:
    state = PolicyState()
    with threadpool_limits(blas_threads):
        t0 = time.perf_counter()
        planner.plan(policy, trials, contexts, targets, state, now=bucket_time(TIMING_HOURS))
        spent = time.perf_counter() - t0
    return spent, getattr(state, "model_points", None)


def timing(sizes: Sequence[int]) -> list[str]:
    """One cold refit per row, on one BLAS thread; one row also with the library's default
    threads (two here), which on a loaded two-core machine is several times slower."""
    landscape = shared_landscape(*TIMING_CONTEXTS, name="timing")
    policy = make_policy(landscape, "contextual", 0)
    planner = Planner(load_spec())
    contexts = landscape.contexts
    out = [
        f"### Booster contextual refit at scale ({len(contexts):,} contexts)",
        "",
        "| trials | targets | BLAS threads | refit s | model points |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    runs = [(n, t, 1) for n in sizes for t in (len(contexts), TIMING_TARGETS)]
    if len(sizes) > 1:  # one row with the default threads, beside the smallest's
        runs.insert(1, (sizes[0], TIMING_TARGETS, None))
    cache: dict[int, list] = {}
    for n, targets, threads in runs:
        trials = cache.setdefault(n, timing_trials(landscape, n, np.random.default_rng(n)))
        chosen = sorted(contexts)[:targets]
        spent, pts = _refit_seconds(planner, policy, trials, contexts, chosen, threads)
        shown = "default" if threads is None else threads
        out.append(f"| {n:,} | {targets:,} | {shown} | {spent:.2f} | {pts or 'n/a'} |")
        print(out[-1], flush=True)
        cache = {n: trials}
    return [*out, ""]


# -- command line ------------------------------------------------------------------------------


def planner_commit() -> str:
    """The commit of the planner this process imported: this checkout's (with a note when the
    policy package has uncommitted changes), or an exported tree's COMMIT file."""
    here = Path(planner_module.__file__).resolve()
    for parent in here.parents:
        marker = parent / "COMMIT"
        if marker.exists():
            return f"{marker.read_text().strip()[:60]}… (exported to {parent})"
    policy_dir = here.parent

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=policy_dir, capture_output=True, text=True, check=False
        ).stdout.strip()

    dirty = " (with uncommitted changes)" if git("status", "--porcelain", ".") else ""
    return f"{git('log', '-1', '--format=%h %s', '--', '.')[:60]}…{dirty}"


def available(methods: Sequence[str]) -> tuple[list[str], list[str]]:
    """Methods that can run here, and a note for each that cannot (a mode the policy refuses)."""
    ok, notes = [], []
    for m in methods:
        try:
            make_method(m, LANDSCAPES["drift"](), 0)
            ok.append(m)
        except ValidationError as e:
            notes.append(f"{m}: skipped, the policy refuses it ({e.errors()[0]['msg']})")
    return ok, notes


def run_landscapes(args, methods: Sequence[str], label: str) -> dict:
    """Per landscape and method, each seed's summary (as plain data, for --save-json)."""
    checkpoints = [k for k in CHECKPOINTS if k <= args.rounds] or [args.rounds]
    out: dict[str, dict[str, list[dict]]] = {}
    for name in args.landscapes:
        landscape = LANDSCAPES[name]()
        drift = bool(landscape.drifted)
        out[name] = {}
        for m in methods:
            sums = []
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                with threadpool_limits(1):  # every method on one BLAS thread (2 shared cores)
                    hist = simulate(landscape, m, seed, args.rounds)
                sums.append(summarise(hist, checkpoints, drift))
                k = checkpoints[-1]
                print(f"{name} {m} seed {seed}: regret @{k} {sums[-1].at[k][0]:.2f} %", flush=True)
            seeds = range(args.first_seed, args.first_seed + args.seeds)
            out[name][m + label] = [
                dataclasses.asdict(s) | {"seed": seed} for seed, s in zip(seeds, sums, strict=True)
            ]
    return out


def from_plain(d: dict) -> Summary:
    fields = {k: v for k, v in d.items() if k != "seed"}
    fields["at"] = {int(k): tuple(v) for k, v in d["at"].items()}
    fields["to_2pct"] = tuple(d["to_2pct"])
    if fields.get("best_run") is not None:
        fields["best_run"] = tuple(fields["best_run"])
    return Summary(**fields)


def refuse_other_rounds(paths: Sequence[Path], parts: Sequence[dict], rounds: int) -> None:
    """Exit with one line naming a saved run of another length: fleet regret, churn over the
    last 10 rounds and drift recovery all depend on the number of rounds, so runs of different
    lengths must not share a table. (Runs saved before the count was kept are taken as given.)"""
    for path, part in zip(paths, parts, strict=True):
        if part.get("rounds", rounds) != rounds:
            sys.exit(
                f"{path}: saved over {part['rounds']} rounds, this run is over {rounds} "
                f"(pass --rounds {part['rounds']} to merge it)"
            )


def merge(parts: Sequence[dict]) -> dict[str, dict[str, list[Summary]]]:
    """Runs split by landscape, method or seed, joined: seeds of the same method add up."""
    out: dict[str, dict[str, list[Summary]]] = defaultdict(lambda: defaultdict(list))
    for part in parts:
        for name, methods in part["results"].items():
            for m, sums in methods.items():
                out[name][m] += [from_plain(s) for s in sums]
    return out


def report(merged: dict[str, dict[str, list[Summary]]], rounds: int) -> list[str]:
    lines: list[str] = []
    checks: list[str] = []
    for name in LANDSCAPES:
        if name not in merged:
            continue
        landscape = LANDSCAPES[name]()
        drift = bool(landscape.drifted)
        seeds = {m: len(s) for m, s in merged[name].items()}
        ordered = sorted(merged[name], key=lambda m: "(" in m)  # other planners' rows last
        rows = {m: median_summary(merged[name][m]) for m in ordered}
        n = len(landscape.contexts)
        title = f"{name} ({n} context{'s' * (n != 1)}, {len(landscape.dims)} parameters)"
        lines += table(title, rows, rounds, drift)
        if len(set(seeds.values())) > 1:
            lines += ["Seeds per method: " + ", ".join(f"{m} {n}" for m, n in seeds.items()), ""]
        checks += acceptance(name, rows, drift)
    if checks:
        lines += ["### Acceptance (Booster contextual against the baselines)", "", *checks, ""]
    return lines


def included(text: str) -> list[str]:
    """Another run's output (e.g. timing under another planner): its sections from the first
    heading on, after the planner it ran."""
    planner = re.search(r"^Planner: (.*?)\. Fleet", text, re.MULTILINE)
    start = text.find("### ")
    body = text[start:] if start >= 0 else text
    head = [f"Planner of the next section: {planner.group(1)}.", ""] if planner else []
    return [*head, body.strip(), ""]


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=None, help="5 (1 with --quick)")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=None, help="30 (12 with --quick)")
    ap.add_argument("--landscapes", nargs="*", default=list(LANDSCAPES), choices=list(LANDSCAPES))
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--timing", action="store_true", help="refit time at 1k/10k/100k trials")
    ap.add_argument("--timing-sizes", type=int, nargs="+", help="trials per timed refit")
    ap.add_argument("--quick", action="store_true", help="1 seed, 12 rounds, 1k/10k timing")
    ap.add_argument("--label", default="", help="appended to method names (another planner)")
    ap.add_argument("--save-json", type=Path, help="also keep every seed's figures here")
    ap.add_argument("--merge", type=Path, nargs="*", default=[], help="add saved runs' figures")
    ap.add_argument("--include", type=Path, nargs="*", default=[], help="append these files")
    ap.add_argument("--output", type=Path, help="write here instead of results/optimiser.md")
    args = ap.parse_args(argv)
    args.seeds = args.seeds or (1 if args.quick else 5)
    args.rounds = args.rounds or (12 if args.quick else 30)
    label = f" ({args.label})" if args.label else ""
    if args.merge and not any(a.startswith("--landscapes") for a in (argv or sys.argv[1:])):
        args.landscapes = []  # only the saved runs
    methods, notes = available(args.methods) if args.landscapes else ([], [])
    for n in notes:
        print(n, flush=True)
    parts = [json.loads(p.read_text()) for p in args.merge]
    refuse_other_rounds(args.merge, parts, args.rounds)
    this: dict[str, Any] = {
        "planner": planner_commit(),
        "label": label,
        "notes": notes,
        "rounds": args.rounds,
    }
    this["results"] = run_landscapes(args, methods, label)
    if args.save_json:
        args.save_json.write_text(json.dumps(this))
    if this["results"] or args.timing:
        parts.append(this)
    planners = sorted({f"{p['planner']}{' as' + p['label'] if p['label'] else ''}" for p in parts})
    lines = [
        f"Planner: {'; '.join(planners)}. Fleet: 8 hosts per context (4 exploring), "
        f"{FLOWS_PER_HOST} flows per host per round, per-flow utility noise 15 %, σ = 0.1, "
        f"{args.rounds} rounds of one simulated hour; every figure is the median over seeds; "
        "regrets in % of the context's optimum utility; plan s/round with one BLAS thread.",
        "",
        *sorted({f"- {n}" for p in parts for n in p["notes"]}),
        "",
        *SETUP,
        *report(merge(parts), args.rounds),
    ]
    if args.timing:
        sizes = args.timing_sizes or (TIMING_SIZES[:2] if args.quick else TIMING_SIZES)
        lines += timing(sizes)
    for path in args.include:
        lines += included(path.read_text())
    argv_text = " ".join(sys.argv[1:] if argv is None else argv)
    command = f"python -m benchmarks.optimiser {argv_text}".strip()
    if args.output is None:
        write_result("optimiser", command, lines)
    else:
        args.output.write_text("\n".join([f"Command: `{command}`", "", *lines]) + "\n")
        print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
