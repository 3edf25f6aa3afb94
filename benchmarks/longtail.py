"""Long-tail benchmark: Booster against per-context baselines on fleet-shaped landscapes.

Each method drives the same simulated fleet (``longtail_landscapes``): Zipf traffic (one or two
hosts in most contexts), optima from latent path features, two peaks, 30 % per-flow noise, 20
flows per host per round, one simulated hour per round. Who explores is decided for every
method alike by ``policy.assignment`` at the round's clock (with ``--fixed-explorers``, at slot
0: the assignment without rotation). Booster runs as the service drives ``Planner.plan``
(trials per context, θ and hour; published incumbents and candidates passed back).

Methods: ``contextual`` and ``independent`` (Booster's modes) and ``tpe`` (Optuna TPE per
context). Booster's incumbent rule is its own; TPE's incumbent is chosen by the same switching
rule on its flows' means: the best-measured θ replaces the incumbent only when it is better by
``SWITCH_Z`` standard errors of the difference.

Figures, % below the context's optimum utility, each the median over seeds:
  - regret @k, traffic-weighted: the incumbent after k rounds, weighted by the context's hosts;
  - tail @30: hosts-weighted over contexts with 1–2 hosts; busiest 5 @30: over the 5 with
    the most hosts;
  - at default @30: contexts whose incumbent is still the default θ;
  - fleet regret: flow-weighted regret of every θ hosts ran, exploration included.

    python -m benchmarks.longtail [--seeds 8] [--first-seed 100] [--rounds 30]
        [--landscapes fleet-b fleet-c] [--methods contextual independent tpe]
        [--fixed-explorers] [--save-json PATH] [--merge PATH ...] [--output PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import statistics
import sys
import time
import zlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

from gemini_api.theta import SPEC_PATH, load_spec
from gemini_booster.policy import assignment
from gemini_booster.policy.incumbent import SWITCH_Z
from gemini_booster.policy.planner import ContextPlan

from .longtail_landscapes import FLEET_FLOW_NOISE, FLEET_LANDSCAPES, HELD_OUT, TUNING, Fleet
from .optimiser import planner_commit, regret_pct
from .optimiser_landscapes import (
    EXPLORATION_SHARE,
    FLOWS_PER_HOST,
    MIN_NOISE_FACTOR,
    SIGMA,
    bucket_time,
    run_flows,
)
from .optimiser_methods import BoosterMethod, HostRun, Method, RoundPlan, TpeMethod

CHECKPOINTS = (10, 20, 30)
TAIL_HOSTS = 2  # a context with at most this many hosts is in the tail
BUSIEST = 5
METHOD_NAMES = ("contextual", "independent", "tpe")
INPUT_SOURCES = (
    "longtail.py",
    "longtail_landscapes.py",
    "optimiser_landscapes.py",
    "optimiser_methods.py",
)
ROTATES = "now" in inspect.signature(assignment.assign).parameters  # planners before rotation


def fleet_factors(seed: int, landscape: str, round_index: int, context_id: int, host: str):
    """One host's per-flow noise factors in one round: the same draws for every method."""
    rng = np.random.default_rng(
        [seed, zlib.crc32(landscape.encode()), round_index, context_id, zlib.crc32(host.encode())]
    )
    m = 1.0 + FLEET_FLOW_NOISE * rng.standard_normal(FLOWS_PER_HOST)
    return np.maximum(m, MIN_NOISE_FACTOR)


def host_names(hosts: int) -> list[str]:
    return [f"host-{i}" for i in range(hosts)]


def explorers(fleet: Fleet, c: int, now: datetime, share: float, fixed: bool) -> set[str]:
    """The hosts of context ``c`` that explore at ``now`` (at slot 0 when ``fixed``)."""
    key = fleet.landscape.contexts[c]
    slot = 0 if fixed or not ROTATES else assignment.rotation_slot(now)
    return {
        h
        for h in host_names(fleet.hosts[c])
        if (assignment.explores(h, key, share, slot) if ROTATES else _fixed(h, key, share))
    }


def _fixed(host: str, key, share: float) -> bool:
    return assignment.exploration_position(host, key) < share


class FleetBooster(BoosterMethod):
    """Booster as the service drives it, on the fleet's hosts."""

    def __init__(self, fleet: Fleet, seed: int, mode: str, fixed: bool):
        super().__init__(fleet.landscape, seed, mode)
        self.fleet, self.fixed = fleet, fixed

    def host_runs(self, c: int, p: ContextPlan, now: datetime) -> dict[str, dict[str, int]]:
        """The fleet's hosts, explorers by the rotation at ``now`` (or the fixed window)."""
        exploring = explorers(self.fleet, c, now, self.policy.exploration_share, self.fixed)
        key = self.landscape.contexts[c]
        runs = {}
        for h in host_names(self.fleet.hosts[c]):
            slot = assignment.candidate_slot(h, key, max(len(p.candidates), 1))
            explore = h in exploring and bool(p.candidates)
            runs[h] = p.candidates[slot] if explore else p.incumbent
        return runs


class FleetTpe(TpeMethod):
    """Optuna TPE per context on the fleet's hosts; incumbent by the confidence switch."""

    name = "tpe"

    def __init__(self, fleet: Fleet, seed: int, fixed: bool):
        super().__init__(fleet.landscape, seed)
        self.fleet, self.fixed = fleet, fixed
        self.current: dict[int, str] = {}

    def incumbent(self, context_id: int) -> dict[str, int]:
        """The θ with the best mean over its flows, replacing the current one only when better
        by SWITCH_Z standard errors of the difference (Booster's rule, on means)."""
        seen = self.totals[context_id]
        if not seen:
            return self.default
        means = {k: s.utility(SIGMA) for k, (_, s) in seen.items()}
        best = max(means, key=lambda k: means[k].mean)
        cur = self.current.get(context_id)
        if cur in means and cur != best:
            a, b = means[best], means[cur]
            if a.mean - b.mean < SWITCH_Z * float(np.sqrt(a.var_of_mean + b.var_of_mean)):
                best = cur
        self.current[context_id] = best
        return seen[best][0]

    def plan(self, round_index: int, now: datetime) -> dict[int, RoundPlan]:
        out = {}
        for c in self.landscape.contexts:
            exploring = explorers(self.fleet, c, now, self.policy.exploration_share, self.fixed)
            inc = self.incumbent(c)
            hosts = host_names(self.fleet.hosts[c])
            picks = iter(self.propose(c, len(exploring)))
            out[c] = RoundPlan(inc, {h: next(picks) if h in exploring else inc for h in hosts})
        return out


def make_fleet_method(name: str, fleet: Fleet, seed: int, fixed: bool) -> Method:
    if name == "tpe":
        return FleetTpe(fleet, seed, fixed)
    return FleetBooster(fleet, seed, name, fixed)


@dataclass
class Run:
    """One method, landscape and seed: per context its regret after k rounds, what ran."""

    regrets: dict[int, list[float]]
    at_default: int
    fleet: float
    seconds: float


def simulate(fleet: Fleet, name: str, seed: int, rounds: int, fixed: bool) -> Run:
    spec = load_spec()
    land = fleet.landscape
    method = make_fleet_method(name, fleet, seed, fixed)
    regrets: dict[int, list[float]] = defaultdict(list)
    flows = weighted = 0.0
    spent = 0.0
    last: dict[int, RoundPlan] = {}
    for r in range(rounds + 1):
        t0 = time.perf_counter()
        plans = method.plan(r, bucket_time(r))
        spent += time.perf_counter() - t0
        last = plans
        for c, p in plans.items():
            regrets[c].append(
                regret_pct(land.optimum_utility(c, r), land.true_utility(c, r, p.incumbent))
            )
        if r == rounds:
            break
        runs: dict[int, list[HostRun]] = defaultdict(list)
        for c, p in plans.items():
            surface = land.surface(c, r)
            for host, theta in p.runs.items():
                x = land.normalise([theta])
                sums, slow = run_flows(surface, x, fleet_factors(seed, land.name, r, c, host))
                runs[c].append(HostRun(host, theta, sums, slow))
                flows += FLOWS_PER_HOST
                weighted += FLOWS_PER_HOST * regret_pct(surface.peak, float(surface.utility(x)[0]))
        t0 = time.perf_counter()
        method.observe(r, runs)
        spent += time.perf_counter() - t0
    default = spec.key(spec.default())
    at_default = sum(spec.key(p.incumbent) == default for p in last.values())
    return Run(dict(regrets), at_default, weighted / flows, spent / rounds)


@dataclass(frozen=True)
class Summary:
    at: dict[int, float]  # k → traffic-weighted regret %
    tail: float
    tail_explored: float  # over the tail contexts whose hosts explore in some round
    busiest: float
    at_default: int
    fleet: float
    seconds: float


def weighted(regrets: dict[int, list[float]], hosts: dict[int, int], ids, k: int) -> float:
    ids = list(ids)
    total = sum(hosts[c] for c in ids)
    return sum(hosts[c] * regrets[c][k] for c in ids) / total if total else float("nan")


def summarise(fleet: Fleet, run: Run, rounds: int, fixed: bool) -> Summary:
    hosts = fleet.hosts
    ks = [k for k in CHECKPOINTS if k <= rounds] or [rounds]
    tail = [c for c in hosts if hosts[c] <= TAIL_HOSTS]
    busiest = sorted(hosts, key=lambda c: (-hosts[c], c))[:BUSIEST]
    explored = [c for c in tail if _ever_explores(fleet, c, rounds, fixed)]
    return Summary(
        {k: weighted(run.regrets, hosts, hosts, k) for k in ks},
        weighted(run.regrets, hosts, tail, rounds),
        weighted(run.regrets, hosts, explored, rounds) if explored else float("nan"),
        weighted(run.regrets, hosts, busiest, rounds),
        run.at_default,
        run.fleet,
        run.seconds,
    )


def _ever_explores(fleet: Fleet, c: int, rounds: int, fixed: bool) -> bool:
    return any(explorers(fleet, c, bucket_time(r), EXPLORATION_SHARE, fixed) for r in range(rounds))


def median(sums: list[Summary]) -> Summary:
    med = statistics.median
    return Summary(
        {k: med(s.at[k] for s in sums) for k in sums[0].at},
        med(s.tail for s in sums),
        med(s.tail_explored for s in sums),
        med(s.busiest for s in sums),
        int(med(s.at_default for s in sums)),
        med(s.fleet for s in sums),
        med(s.seconds for s in sums),
    )


def table(title: str, rows: dict[str, list[Summary]], rounds: int) -> list[str]:
    first = next(iter(rows.values()))[0]
    ks = list(first.at)
    head = [f"regret @{k}" for k in ks]
    head += [f"tail @{rounds} (all / explored)", f"busiest {BUSIEST} @{rounds}"]
    head += [f"at default @{rounds}", "fleet regret", "plan s/round", "seeds"]
    out = [f"### {title}", "", "| method | " + " | ".join(head) + " |"]
    out.append("| --- |" + " ---: |" * len(head))
    for m, sums in rows.items():
        s = median(sums)
        cells = [f"{s.at[k]:.2f}" for k in ks]
        cells += [f"{s.tail:.2f} / {s.tail_explored:.2f}", f"{s.busiest:.2f}"]
        cells += [str(s.at_default), f"{s.fleet:.2f}", f"{s.seconds:.2f}", str(len(sums))]
        out.append(f"| {m} | " + " | ".join(cells) + " |")
    return [*out, ""]


def run_all(args) -> dict:
    out: dict[str, dict[str, list[dict]]] = {}
    for name in args.landscapes:
        fleet = FLEET_LANDSCAPES[name]()
        out[name] = {}
        for m in args.methods:
            label = m + (" (fixed explorers)" if args.fixed_explorers else "") + args.label
            out[name][label] = []
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                with threadpool_limits(1):
                    run = simulate(fleet, m, seed, args.rounds, args.fixed_explorers)
                s = summarise(fleet, run, args.rounds, args.fixed_explorers)
                out[name][label].append(asdict(s) | {"seed": seed})
                print(
                    f"{name} {label} seed {seed}: @{args.rounds} {s.at[max(s.at)]:.2f} "
                    f"tail {s.tail:.2f} busiest {s.busiest:.2f} default {s.at_default} "
                    f"fleet {s.fleet:.2f} ({s.seconds:.2f} s/round)",
                    flush=True,
                )
    return out


def inputs_fingerprint() -> str:
    """A digest of what fixes a run's figures besides the planner: the θ spec (its defaults are
    every context's starting θ) and the landscapes', flows' and methods' source. Runs started at
    different times in a shared checkout can read different files; parts whose digests differ
    are not one experiment and are not merged."""
    here = Path(__file__).resolve().parent
    files = [SPEC_PATH, *(here / f for f in INPUT_SOURCES)]
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.read_bytes())
    return digest.hexdigest()[:12]


def check_same_inputs(parts: list[dict]) -> None:
    """Refuse to merge saved runs made from different inputs (or saved before digests)."""
    seen = {p.get("inputs", "none (saved before input digests)") for p in parts}
    if len(seen) > 1:
        raise SystemExit(
            "--merge: the saved runs were made from different θ specs or benchmark sources "
            f"(input digests {', '.join(sorted(seen))}); rerun them from one checkout"
        )


def from_plain(d: dict) -> Summary:
    fields = {k: v for k, v in d.items() if k != "seed"}
    fields["at"] = {int(k): v for k, v in d["at"].items()}
    return Summary(**fields)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--first-seed", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=30)
    # Default: every landscape, or none when only merging saved runs (--merge without
    # --landscapes prints their table without running anything again).
    ap.add_argument("--landscapes", nargs="*", default=None)
    ap.add_argument("--methods", nargs="*", default=list(METHOD_NAMES))
    ap.add_argument("--fixed-explorers", action="store_true")
    ap.add_argument("--label", default="")
    ap.add_argument("--save-json", type=Path)
    ap.add_argument("--merge", type=Path, nargs="*", default=[])
    ap.add_argument("--output", type=Path)
    args = ap.parse_args(argv)
    args.label = f" ({args.label})" if args.label else ""
    if args.landscapes is None:
        args.landscapes = [] if args.merge else [*TUNING, *HELD_OUT]
    parts = [json.loads(p.read_text()) for p in args.merge]
    inputs = inputs_fingerprint()
    check_same_inputs([*parts, {"inputs": inputs}])
    results = run_all(args)
    this = {
        "planner": planner_commit(),
        "inputs": inputs,
        "rounds": args.rounds,
        "results": results,
    }
    if args.save_json:
        args.save_json.write_text(json.dumps(this))
    parts.append(this)
    merged: dict[str, dict[str, list[Summary]]] = defaultdict(lambda: defaultdict(list))
    for part in parts:
        for name, methods in part["results"].items():
            for m, sums in methods.items():
                merged[name][m] += [from_plain(s) for s in sums]
    lines = ["Planners: " + "; ".join(sorted({p["planner"] for p in parts})) + ".", ""]
    lines[-1:-1] = [f"Inputs (θ spec and benchmark sources): {inputs}.", ""]
    for group, names in (("Tuning landscape", TUNING), ("Held-out landscapes", HELD_OUT)):
        for name in names:
            if name in merged:
                fleet = FLEET_LANDSCAPES[name]()
                hosts = fleet.hosts.values()
                title = (
                    f"{group}: {name} ({len(hosts)} contexts, {sum(hosts)} hosts, "
                    f"{sum(h <= TAIL_HOSTS for h in hosts)} with ≤ {TAIL_HOSTS})"
                )
                lines += table(title, merged[name], args.rounds)
    argv_text = " ".join(sys.argv[1:] if argv is None else argv)
    text = "\n".join([f"Command: `python -m benchmarks.longtail {argv_text}`", "", *lines])
    if args.output:
        args.output.write_text(text + "\n")
    print(text, flush=True)


if __name__ == "__main__":
    main()
