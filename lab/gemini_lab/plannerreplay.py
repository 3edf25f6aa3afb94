"""Replay a recorded planner tuning refit by refit through the service's Planner, offline.

    python -m gemini_lab.plannerreplay var/lab/fpmix-tune [--workload fctmix]

A tuning run by ``gemini_lab.flashpass.tune`` keeps every round's flow records
(``round-<r>/run<i>/flashpass.flows``) and its history (``history.json``: each round's published
incumbent and each host's θ). This module gives the same trials to the same ``Planner`` in the
same order and asks, at every refit, what the record cannot show:

- **drift**: every split ``history.py`` tested (the θ, its last bucket before and first after,
  Welch's z against ``DRIFT_Z``), and the regime start it found, if any: a detected change of
  path drops the context's data before it and lifts the incumbent's ``SWITCH_Z`` protection;
- **kept**: the observations the model saw (θ, flows, mean utility, the rounds they came from);
- **switch**: the test that kept or moved the incumbent, with its z: in the initial design
  (fewer than ``n_initial_points`` distinct θ) ``planner._measured_better`` on the two θ's
  measured means (over the buckets both ran in, where they share some); with a model,
  ``incumbent.own_incumbent``'s posterior z of the best rival against the published
  incumbent (``SWITCH_Z``); for a context with no data of its own,
  ``incumbent.transferred``'s z of the best fleet θ against the default (``TRANSFER_Z``).

Two protocols over the same trials:

- ``rotation`` (what the tuning ran): one context, round r in hour bucket r, its development
  seed ``tune.dev_seed(r)``. The replay first checks that every refit publishes the recorded
  incumbent and hands each host its recorded θ (``Mismatch`` otherwise); ``drift=False``
  replays it with drift detection off, to see what the change-of-path rule did.
- ``seed_contexts`` (the protocol ``tune --seed-contexts`` runs): each development seed its own
  context (its own destination region), round r's trials in seed r's context, and at the end
  the θ the planner serves a new context with no data of its own (a held-out seed). This
  re-decides on data gathered under the rotation protocol: under seed contexts the planner
  would have explored other θ, so it says what the evidence supports, not what a tuning under
  that protocol would have found.

The probes wrap the planner's own functions for the length of one refit (``_probes``) and call
through to them unchanged: the replay's decisions are the service's.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from gemini_api.sums import FlowSums
from gemini_booster.domain import Trial
from gemini_booster.policy import history
from gemini_booster.policy import planner as planner_module
from gemini_booster.policy.history import DRIFT_Z, Observation, Split
from gemini_booster.policy.incumbent import MIN_VARIANCE, SWITCH_Z, TRANSFER_Z
from gemini_lab.flashpass import tune as fptune
from gemini_lab.plannertune import T0, TuneConfig, Tuner

NEW_CONTEXT = "new"  # the suffix of the held-out context's name (a seed no round ran)


class Mismatch(RuntimeError):
    """The replay's refit published another incumbent or θ than the record shows."""


@dataclass(frozen=True)
class RecordedRun:
    host: str
    theta: dict[str, int]
    sums: FlowSums


@dataclass(frozen=True)
class RecordedRound:
    round: int
    seed: int  # the development seed every host of the round ran
    incumbent: dict[str, int]  # the incumbent the tuning published for the round
    runs: tuple[RecordedRun, ...]


@dataclass(frozen=True)
class Recording:
    scenario: str
    rounds: tuple[RecordedRound, ...]
    final: dict[str, int]  # the incumbent published after the last round (the tuned θ)


def load_flashpass(work: Path) -> Recording:
    """A ``gemini_lab.flashpass.tune`` work directory: the history and each run's flow records
    (run ``i`` of a round is the round's ``i``-th host, as ``tune.observe`` reads them)."""
    ((scenario, rows),) = json.loads((work / "history.json").read_text()).items()
    rounds = []
    for row in rows[:-1]:
        r = int(row["round"])
        runs = []
        for i, x in enumerate(row["runs"]):
            records = fptune.read_records(work / f"round-{r}" / f"run{i}")
            runs.append(RecordedRun(x["host"], x["theta"], fptune.flow_sums(records, x["theta"])))
        rounds.append(RecordedRound(r, fptune.dev_seed(r), row["incumbent"], tuple(runs)))
    return Recording(scenario, tuple(rounds), rows[-1]["incumbent"])


def by_theta(spec_key: Callable[[dict[str, int]], str], runs: tuple[RecordedRun, ...]) -> list:
    """The round's runs summed per θ, in first-run order (as ``tune.observe`` does)."""
    out: dict[str, tuple[dict[str, int], FlowSums]] = {}
    for run in runs:
        key = spec_key(run.theta)
        prev = out.get(key)
        out[key] = (run.theta, run.sums if prev is None else prev[1] + run.sums)
    return list(out.values())


# -- what one refit showed -------------------------------------------------------------------


@dataclass(frozen=True)
class DriftTest:
    context: int
    theta_key: str
    split: Split | None  # None: too few flows on a side, or a shift under DRIFT_MIN_SHIFT

    @property
    def detected(self) -> bool:
        return self.split is not None and abs(self.split.z) >= DRIFT_Z


@dataclass(frozen=True)
class Switch:
    """The incumbent test of one context's refit: ``rule`` says which (see the module's
    docstring); ``z`` is the rival's lead in std of the difference (its bar: ``bar``)."""

    rule: str
    previous: str | None  # the published incumbent tested against (None: protection lifted)
    rival: str | None  # the best other θ
    z: float | None
    bar: float


@dataclass
class Refit:
    """One refit (the plan for round ``round``) of one context."""

    round: int
    context: int
    incumbent: dict[str, int]
    candidates: tuple[dict[str, int], ...]
    drift_tests: list[DriftTest]
    change: dt.datetime | None  # the regime start the planner holds for the context after it
    new_change: bool  # found at this refit
    kept: list[Observation]  # the context's observations the model saw
    switches: list[Switch]


@dataclass
class _Probe:
    splits: list[DriftTest] = field(default_factory=list)
    kept: list[Observation] = field(default_factory=list)
    observed: bool = False  # the refit's observations taken (``kept``)
    switches: dict[int, list[Switch]] = field(default_factory=dict)
    context: int | None = None  # the context being planned (own_incumbent, _measured_better)


def _z(model: Any, new: np.ndarray, old: np.ndarray) -> float:
    """``incumbent.beats``'s statistic: old's loss minus new's in std of the difference."""
    mu, cov = model.joint(np.vstack([new, old]))
    sd = float(np.sqrt(max(cov[0, 0] + cov[1, 1] - 2 * cov[0, 1], MIN_VARIANCE)))
    return float((mu[1] - mu[0]) / sd)


@contextmanager
def _patched(module: Any, name: str, wrapper: Callable) -> Iterator[None]:
    original = getattr(module, name)
    setattr(module, name, wrapper(original))
    try:
        yield
    finally:
        setattr(module, name, original)


@contextmanager
def _probes(probe: _Probe, drift: bool = True) -> Iterator[None]:
    """The planner's own functions, wrapped to record what they were given and found."""

    def split(f: Callable) -> Callable:
        def wrapped(buckets: list[Trial], *a: Any, **kw: Any) -> Split | None:
            out = f(buckets, *a, **kw)
            probe.splits.append(DriftTest(buckets[0].context_id, buckets[0].theta_key, out))
            return out

        return wrapped

    def changes(f: Callable) -> Callable:
        def wrapped(*a: Any, **kw: Any) -> dict:
            out = f(*a, **kw)
            return out if drift else {}

        return wrapped

    def observations(f: Callable) -> Callable:
        def wrapped(*a: Any, **kw: Any) -> list[Observation]:
            out = f(*a, **kw)
            if not probe.observed:  # the refit's own; later calls pair two θ' shared buckets
                probe.kept, probe.observed = list(out), True
            return out

        return wrapped

    def own(f: Callable) -> Callable:
        def wrapped(space: Any, model: Any, eligible: list, previous: str | None, default: dict):
            out = f(space, model, eligible, previous, default)
            uniq = {o.theta_key: o for o in eligible}
            if uniq and previous in uniq:
                keys = list(uniq)
                X = space.encode([uniq[k].theta for k in keys])
                p = keys.index(previous)
                others = [i for i in range(len(keys)) if i != p]
                if others:
                    loss, _ = model.posterior(X[others])
                    best = others[int(np.argmin(loss))]
                    z = _z(model, X[best], X[p])
                    sw = Switch("posterior", previous, keys[best], z, SWITCH_Z)
                    probe.switches.setdefault(_current(), []).append(sw)
            elif uniq:  # nothing published (or a change of path unseated it): no test
                best_key = next(k for k, o in uniq.items() if o.theta == out.theta)
                sw = Switch("posterior, no published incumbent", None, best_key, None, SWITCH_Z)
                probe.switches.setdefault(_current(), []).append(sw)
            return out

        return wrapped

    def measured(f: Callable) -> Callable:
        def wrapped(best: Observation, published: Observation | None) -> bool:
            out = f(best, published)
            if published is None:
                sw = Switch("measured means, published θ not measured", None, best.theta_key,
                            None, SWITCH_Z)  # fmt: skip
            else:
                sd = float(np.sqrt(max(best.noise_var + published.noise_var, MIN_VARIANCE)))
                z = (best.utility - published.utility) / sd
                sw = Switch("measured means", published.theta_key, best.theta_key, z, SWITCH_Z)
            probe.switches.setdefault(_current(), []).append(sw)
            return out

        return wrapped

    def transfer(f: Callable) -> Callable:
        def wrapped(spec: Any, space: Any, model: Any, fleet: tuple, own: list, inc: dict):
            out = f(spec, space, model, fleet, own, inc)
            keys, X = fleet
            run = {o.theta_key for o in own} | {spec.key(inc)}  # the best rival of ``inc``
            new = [i for i, k in enumerate(keys) if k not in run]
            if new:
                loss, _ = model.posterior(X[new])
                best = new[int(np.argmin(loss))]
                z = _z(model, X[best], space.encode([inc])[0])
                sw = Switch("transfer", spec.key(inc), keys[best], z, TRANSFER_Z)
                probe.switches.setdefault(_current(), []).append(sw)
            return out

        return wrapped

    def plan_context(f: Callable) -> Callable:
        def wrapped(self: Any, context_id: int) -> Any:
            probe.context = context_id
            return f(self, context_id)

        return wrapped

    def _current() -> int:
        assert probe.context is not None
        return probe.context

    refit = planner_module._Refit
    with (
        _patched(history, "best_split", split),
        _patched(history, "change_points", changes),
        _patched(history, "observations", observations),
        _patched(planner_module, "own_incumbent", own),
        _patched(planner_module, "_measured_better", measured),
        _patched(planner_module, "transferred", transfer),
        _patched(refit, "_plan_context", plan_context),
        _patched(refit, "_initial", plan_context),
    ):
        yield


# -- the two protocols -----------------------------------------------------------------------


def _refits(
    r: int, tuner: Tuner, probe: _Probe, before: dict[int, dt.datetime]
) -> dict[int, Refit]:
    """What the refit for round ``r`` showed, per context it planned."""
    out = {}
    for c in tuner.contexts:
        change = tuner.state.changes.get(c)
        out[c] = Refit(
            round=r,
            context=c,
            incumbent=tuner.spec.from_key(tuner.incumbents[c]),
            candidates=tuple(tuner.spec.from_key(k) for k in tuner.candidates[c]),
            drift_tests=[t for t in probe.splits if t.context == c],
            change=change,
            new_change=change is not None and change != before.get(c),
            kept=[o for o in probe.kept if o.context_id == c],
            switches=probe.switches.get(c, []),
        )
    return out


def _refit(tuner: Tuner, r: int, drift: bool) -> tuple[dict, dict[int, Refit]]:
    before = dict(tuner.state.changes)
    probe = _Probe()
    with _probes(probe, drift):
        plans = tuner.plan(r)
    return plans, _refits(r, tuner, probe, before)


def replay_rotation(
    rec: Recording, cfg: TuneConfig, drift: bool = True, check: bool = True
) -> list[Refit]:
    """The tuning as it ran (one context, the seed turning with the round): every refit, with
    a check that it publishes the recorded incumbent and θ (``drift`` and ``check`` on only:
    otherwise the planner may decide otherwise, and the recorded trials are given to it as
    they ran)."""
    check = check and drift
    tuner = Tuner(cfg)
    out = []
    for r in range(len(rec.rounds) + 1):
        plans, refits = _refit(tuner, r, drift)
        ((c, (incumbent, runs)),) = plans.items()
        out.append(refits[c])
        recorded = rec.rounds[r].incumbent if r < len(rec.rounds) else rec.final
        if check and incumbent != recorded:
            raise Mismatch(f"refit {r}: incumbent {incumbent}, recorded {recorded}")
        if r == len(rec.rounds):
            break
        asked = {x.host: x.theta for x in rec.rounds[r].runs}
        if check and runs != asked:
            raise Mismatch(f"refit {r}: θ {runs}, recorded {asked}")
        for theta, sums in by_theta(tuner.spec.key, rec.rounds[r].runs):
            tuner.observe(r, c, theta, sums)
    return out


def replay_seed_contexts(rec: Recording, cfg: TuneConfig) -> tuple[TuneConfig, list[dict]]:
    """The same trials with each development seed its own context (``tune --seed-contexts``'s
    contexts: round r's trials in seed ``dev_seed(r)``'s context, bucket r) and the held-out
    context planned beside them; per refit, each context's ``Refit``."""
    names = (*fptune.seed_context_names(rec.scenario), fptune.held_out_name(rec.scenario))
    sc = replace(cfg, scenarios=names)
    seeds = fptune.context_seeds(sc)
    context_of = {s: c for c, s in seeds.items()}
    tuner = Tuner(sc)
    out = []
    for r in range(len(rec.rounds) + 1):
        out.append(_refit(tuner, r, True)[1])
        if r == len(rec.rounds):
            break
        c = context_of[rec.rounds[r].seed]
        for theta, sums in by_theta(tuner.spec.key, rec.rounds[r].runs):
            tuner.observe(r, c, theta, sums)
    return sc, out


# -- the record ------------------------------------------------------------------------------


def _kept_text(kept: list[Observation], rounds: dict[str, list[int]], span: range) -> str:
    """The observations, best mean first: θ key, mean utility, flows, and the rounds (with
    their seed) that gave them, of those in ``span``."""
    parts = []
    for o in sorted(kept, key=lambda o: -o.utility):
        rs = " ".join(
            f"r{r}/s{fptune.dev_seed(r)}" for r in rounds.get(o.theta_key, []) if r in span
        )
        parts.append(f"{o.theta_key}: {o.utility:.2f} ({o.flows} flows; {rs})")
    return "; ".join(parts)


def _drift_text(tests: list[DriftTest]) -> str:
    if not tests:
        return "no θ with 2+ buckets"
    parts = []
    for t in tests:
        if t.split is None:
            parts.append(f"{t.theta_key}: no split")
        else:
            mark = " **drift**" if t.detected else ""
            parts.append(f"{t.theta_key}: z {t.split.z:+.1f}{mark}")
    return "; ".join(parts)


def _switch_text(switches: list[Switch]) -> str:
    if not switches:
        return "–"
    parts = []
    for s in switches:
        if s.z is None:
            parts.append(f"{s.rule}: {s.rival} (no test)")
        elif s.rival == s.previous:
            parts.append(f"{s.rule}: the published {s.previous} is the best measured")
        else:
            verdict = "moves" if s.z >= s.bar else "stays"
            parts.append(f"{s.rule}: {s.rival} vs {s.previous}, z {s.z:+.2f} (bar {s.bar:g}: "
                         f"{verdict})")  # fmt: skip
    return "; ".join(parts)


def _round_of(t: dt.datetime) -> int:
    return int((t - T0) / dt.timedelta(hours=1))


def theta_rounds(rec: Recording, spec_key: Callable[[dict[str, int]], str]) -> dict[str, list]:
    """Per θ key, the rounds that ran it."""
    out: dict[str, list[int]] = {}
    for rnd in rec.rounds:
        for key in dict.fromkeys(spec_key(x.theta) for x in rnd.runs):
            out.setdefault(key, []).append(rnd.round)
    return out


def _levels(rec: Recording, sigma: float) -> list[str]:
    """Each round's seed and the utility of each θ it ran (what the seed does to the level)."""
    lines = ["| round | seed | θ run: mean utility over its flows |", "|---:|---:|---|"]
    for rnd in rec.rounds:
        us = ", ".join(f"{x.host} {x.sums.utility(sigma).mean:.2f}" for x in rnd.runs)
        lines.append(f"| {rnd.round} | {rnd.seed} | {us} |")
    return lines


def render_rotation(rec: Recording, refits: list[Refit], key: Callable) -> list[str]:
    rounds = theta_rounds(rec, key)
    lines = [
        "| refit (plans round) | drift tests (θ: best split's z; DRIFT_Z "
        f"{DRIFT_Z:g}) | regime from | observations kept (θ: mean utility) | incumbent test "
        "| published |",
        "|---:|---|---|---|---|---|",
    ]
    for f in refits:
        cut = 0 if f.change is None else _round_of(f.change)
        regime = "all" if f.change is None else f"round {cut}"
        regime += " (found now)" if f.new_change else ""
        lines.append(
            f"| {f.round} | {_drift_text(f.drift_tests)} | {regime} | "
            f"{_kept_text(f.kept, rounds, range(cut, f.round))} | {_switch_text(f.switches)} | "
            f"{key(f.incumbent)} |"
        )
    return lines


def render_contexts(
    rec: Recording, sc: TuneConfig, refits: list[dict[int, Refit]], key: Callable
) -> list[str]:
    rounds = theta_rounds(rec, key)
    last = refits[-1]
    lines = ["| context | rounds with data | observations kept (θ: mean utility) | incumbent test "
             "| published after the last round |", "|---|---|---|---|---|"]  # fmt: skip
    seeds = fptune.context_seeds(sc)
    for c, f in last.items():
        name = sc.scenarios[c - 1]
        own = [r.round for r in rec.rounds if seeds.get(c) == r.seed]
        ran = ",".join(map(str, own)) if own else "none"
        by_round = {k: [r for r in v if r in own] for k, v in rounds.items()}
        lines.append(
            f"| {name} | {ran} | {_kept_text(f.kept, by_round, range(f.round)) or '–'} | "
            f"{_switch_text(f.switches)} | {key(f.incumbent)} |"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("work", type=Path, help="a gemini_lab.flashpass.tune work directory")
    ap.add_argument("--workload", choices=sorted(fptune.WORKLOADS), default="fctmix")
    ap.add_argument("--explorers", type=int, default=2, help="the tuning's --explorers")
    ap.add_argument("--policy-ids", type=int, nargs="*", default=[1, 2, 3, 4, 5, 6, 7, 8],
                    help="planner seeds (the policy's id) for the seed-context replay")  # fmt: skip
    a = ap.parse_args()
    rec = load_flashpass(a.work)
    hosts = len(rec.rounds[0].runs)  # the tuning's --hosts
    cfg = fptune.config(len(rec.rounds), hosts, a.explorers, workload=a.workload)
    key = cfg.spec().key
    print(f"θ keys: {', '.join(cfg.spec().names)}; σ = {cfg.sigma:g}\n")
    print("Round levels (each θ's mean eq. 9 utility over its flows):\n")
    print("\n".join(_levels(rec, cfg.sigma)))
    try:
        rotation = replay_rotation(rec, cfg)
        head = "every refit published the recorded incumbent and θ"
    except Mismatch as exc:  # a planner since the tuning: its decisions on the same trials
        rotation = replay_rotation(rec, cfg, check=False)
        head = f"the planner at this commit decides otherwise ({exc})"
    print(f"\nThe tuning as it ran (one context, the seed turning with the round); {head}:\n")
    print("\n".join(render_rotation(rec, rotation, key)))
    print("\nThe same trials, drift detection off:\n")
    print("\n".join(render_rotation(rec, replay_rotation(rec, cfg, drift=False), key)))
    sc, refits = replay_seed_contexts(rec, cfg)
    print("\nThe same trials, each development seed its own context, after the last round:\n")
    print("\n".join(render_contexts(rec, sc, refits, key)))
    held_out = fptune.held_out_context(sc)
    assert held_out is not None
    served = ", ".join(f"r{f[held_out].round} {key(f[held_out].incumbent)}" for f in refits)
    print(f"\nThe held-out context's incumbent at every refit: {served}")
    if a.policy_ids:
        print("\nThe seed-context replay's last refit by planner seed (the policy's id; the "
              "rotation replay is of the tuning's, 1):\n")  # fmt: skip
        print("\n".join(render_policy_ids(rec, cfg, a.policy_ids, key)))


def render_policy_ids(rec: Recording, cfg: TuneConfig, ids: list[int], key: Callable) -> list[str]:
    """The seed-context replay's published θ after the last round, per planner seed, with the
    held-out context's best rival and its z against the θ it is served."""
    names = (*fptune.seed_context_names(rec.scenario), fptune.held_out_name(rec.scenario))
    lines = [f"| policy id | {' | '.join(names)} | new context's best rival (z) |",
             "|---:|" + "---|" * (len(names) + 1)]  # fmt: skip
    for pid in ids:
        sc, refits = replay_seed_contexts(rec, replace(cfg, seed=pid))
        last = refits[-1]
        held_out = fptune.held_out_context(sc)
        assert held_out is not None
        rival = [f"{s.rival} ({s.z:+.2f})" for s in last[held_out].switches if s.z is not None]
        cells = " | ".join(key(last[c].incumbent) for c in sorted(last))
        lines.append(f"| {pid} | {cells} | {', '.join(rival) or '–'} |")
    return lines


if __name__ == "__main__":
    main()
