"""The datapaths' evaluation widened (issue #31, item 5): what ``gemini-lab datapath-tune`` and
``gemini-lab datapath-eval`` do not run, in the UML lab on its simulated clock.

    python -m gemini_lab.datapath_sweeps {gemini-dc,dcvegas-incast,dcvegas-query,
        dcvegas-completion,gear-pair,k-sweep} --out DIR

- ``gemini-dc``: Booster's planner tunes GEMINI on the datacenter path (K and H searched over
  Θ, the rest pinned at the paper's defaults scaled by s = 10, T = 50 ms included: the
  ``datapath-tune`` command pins the unscaled spec defaults, T = 5 ms, which would compare the
  tuned θ against defaults at another T); then GEMINI at its defaults and tuned beside dctcp
  and cubic on the held-out datacenter path (datacenter-heldout), which no setting was chosen on.
- ``dcvegas-incast`` and ``dcvegas-query``: the planner tunes DC-Vegas' K_dcv with incast as
  its objective. Each host's round is one 40 × 4 MB incast at its θ on dc-incast. What the
  planner is given for it (``Objective``): ``dcvegas-incast`` what an agent reports today, each
  of the 40 short flows as one flow (its bytes over its completion time; queueing delay the
  smoothed RTT over the minimum at its end); ``dcvegas-query`` the query as one flow (all its
  bytes over the slowest completion), which needs the application's query boundaries;
  ``dcvegas-completion`` all the flows' bits over all their completion times (Σbits / ΣFCT),
  which an agent can report from its per-flow records. Held
  out: incasts of other sizes (20 × 4 MB, 60 × 3 MB) and the held-out datacenter path's long
  flow, default against tuned beside dctcp, reno and vegas.
- ``gear-pair``: Booster's planner tunes Gear's η, W_AI and maxStage (k pinned at 10) on its
  intra/cross pair behind the lab's INT switch, the objective the pair's fair goodput
  (gemini_lab.gear_tune); then the paper's defaults against the tuned θ on a held-out port
  (60 Mbit/s, 2 and 30 ms), three runs each.
- ``k-sweep``: the GEMINI paper's G4 (Fig. 8), scaled: 8 inter-datacenter flows (100 ms) through
  a datacenter switch (100 Mbit/s, 450 packets) marking at K ∈ {20, 40, 80, 160, 320}, GEMINI
  (told the switch's K) against DCTCP: throughput and queueing.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from functools import partial
from pathlib import Path

from gemini_api.sums import FlowSums
from gemini_api.sums import Objective as PolicyObjective
from gemini_lab import gear_tune, plannertune, scenario
from gemini_lab.datapath_eval import (
    C_MBIT,
    DC_HELDOUT,
    DCVEGAS,
    _arm,
    heldout_plan,
    heldout_table,
)
from gemini_lab.datapath_signals import GEMINI, scaled_theta
from gemini_lab.host import run_plan
from gemini_lab.plannertune import TuneConfig, Tuner

RUN_TIMEOUT_S = 4 * 3600  # of host time for one boot (the guest's clock is simulated)
ROUNDS, HOSTS, EXPLORERS = 3, 3, 2  # the budget of datapath-eval.md's commands 3 and 4
INCAST_TRAIN = (40, 4_000_000)  # (senders, total bytes): the case whose timeouts the record saw
INCAST_HELDOUT = ((20, 4_000_000), (60, 3_000_000))
INCAST_ARMS_BASE = ("dctcp", "reno", "vegas")
K_SWEEP = (20, 40, 80, 160, 320)  # DATAPATHS-SPEC.md G4, packets (unchanged by the scaling)
K_SWEEP_FLOWS, K_SWEEP_RTT_MS = 8, 100.0
K_SWEEP_S, K_SWEEP_OMIT_S = 40, 10
US_PER_MS = 1000


def _config(
    name: str, path: str, tuned: tuple[str, ...], extra: tuple[tuple[str, int], ...] = ()
) -> TuneConfig:
    """The planner's rounds at datapath-eval.md's budget: ``tuned`` searched over Θ, the rest
    pinned at the scaled defaults."""
    pinned = tuple(scaled_theta(name).items())
    return TuneConfig(scenarios=(path,), rounds=ROUNDS, hosts=HOSTS, explorers=EXPLORERS,
                      datapath=name, tuned=tuned, pinned=pinned, module_extra=extra)  # fmt: skip


def gemini_dc_config() -> TuneConfig:
    extra = (("capacity_mbit", C_MBIT),)
    return _config(GEMINI, "datacenter", ("ecn_k", "increase_h"), extra)


def dcvegas_incast_config() -> TuneConfig:
    return _config(DCVEGAS, "dc-incast", ("queue_threshold",))


def gear_pair_config() -> TuneConfig:
    """Gear's pair at datapath-eval.md's budget: η, W_AI, maxStage over Θ, k pinned."""
    return TuneConfig(scenarios=(gear_tune.TUNE_PAIR.name,), rounds=ROUNDS, hosts=HOSTS,
                      explorers=EXPLORERS, datapath=gear_tune.GEAR, tuned=gear_tune.SEARCHED,
                      pinned=gear_tune.PINNED)  # fmt: skip


# --- DC-Vegas tuned on incast ------------------------------------------------------------------


def incast_experiment(label: str, arm: dict, path: int, n: int, total: int) -> dict:
    kind = "datapath_incast" if "datapath" in arm else "incast"
    return {"label": label, "kind": kind, "path": path, "flows": n, "total_bytes": total, **arm}


def incast_round_plan(runs: dict[str, dict[str, int]]) -> dict:
    """One boot: each host's incast at its θ, one after another."""
    arm = _arm(DCVEGAS)
    ex = [
        incast_experiment(f"dc-incast/{h}", {**arm, "theta": theta}, 0, *INCAST_TRAIN)
        for h, theta in runs.items()
    ]
    return {"paths": [scenario.load("dc-incast").to_dict()], "experiments": ex}


class Objective(StrEnum):
    """What the planner is given for one incast.

    PER_FLOW is what Booster's service can be given today: the agent reports TCP flows, so an
    incast is its N short flows, each at its bytes over its completion time. Their mean rewards
    a θ whose timeouts leave a few flows late while the rest finish early at high rates; the
    incast's goal is the query's completion (its slowest flow). QUERY gives the planner that:
    the incast as one flow of all its bytes over the slowest completion, which an agent would
    need the application's query boundaries to report (it has none). COMPLETION is what an
    agent can report from the same per-flow records: all the flows' bits over all their
    completion times (Σbits / ΣFCT, the inverse of the mean completion time per bit), so a
    timeout adds its whole RTO to the denominator however fast the other flows finish. It is
    the product's ``Objective.COMPLETION``: each flow's sums as the agent builds them
    (``FlowSums.of_record``), the planner's policy naming that objective."""

    @property
    def policy_objective(self) -> PolicyObjective:
        """The objective the planner's policy names: the lab's own two are given as eq. 9."""
        if self == Objective.COMPLETION:
            return PolicyObjective.COMPLETION
        return PolicyObjective.FLOW_MEAN

    PER_FLOW = "per-flow"
    QUERY = "query"
    COMPLETION = "completion"


def incast_sums(result: dict, asked: dict[str, int], objective: Objective) -> FlowSums | None:
    """The incast as the planner is given it (``objective``; queueing delay: each flow's
    smoothed RTT over its minimum at its end, ms); None if it failed. Refuses a result whose
    θ read back from the module is not the one asked."""
    if "error" in result or "per_flow" not in result:
        return None
    full = {**scaled_theta(DCVEGAS), **asked}
    ran = {k: result["params_ran"][k] for k in full}
    if ran != full:
        raise RuntimeError(f"the kernel ran {ran}, not the planned θ {full}")
    done = [f for f in result["per_flow"] if "fct_ms" in f]
    if not done:
        return None
    queue_ms = [(f["rtt_us"] - f["min_rtt_us"]) / US_PER_MS for f in done]
    if objective == Objective.QUERY:
        bits = result["bytes_each"] * 8 * len(done)
        slowest = max(f["fct_ms"] for f in done)
        return FlowSums.of_flow(bits / slowest / US_PER_MS, sum(queue_ms) / len(done))
    size = result["bytes_each"]
    total = FlowSums()
    for f, q in zip(done, queue_ms, strict=True):
        total = total + FlowSums.of_record(size, round(f["fct_ms"] * US_PER_MS), q)
    return total


def _incast_row(
    host: str, theta: dict[str, int], r: dict, sums: FlowSums | None, objective: Objective
) -> dict:
    """A host's round as the record shows it: its rate and delay at the planner's objective
    (so that rate − σ·delay is the utility the planner was given)."""
    if sums is None or not sums.flow_count:
        return {"host": host, "theta": theta, "error": str(r.get("error", "no flow completed"))}
    n = sums.flow_count
    done = sums.completion
    completion = objective == Objective.COMPLETION
    return {
        "host": host,
        "theta": theta,
        "mbps": done.mbit_sum / done.seconds_sum if completion else sums.tpt_sum / n,
        "queue_ms": sums.delay_sum / n,
        "retransmits": r["retransmits"],
        "timeouts": r["timeouts"],
    }


def tune_incast(cfg: TuneConfig, out: Path, objective: Objective) -> dict[str, list[dict]]:
    """plannertune.tune's rounds with an incast as each host's run."""
    tuner = Tuner(cfg)
    tuner.policy = tuner.policy.model_copy(update={"objective": objective.policy_objective})
    name = cfg.scenarios[0]
    history: dict[str, list[dict]] = {name: []}
    for r in range(cfg.rounds):
        incumbent, runs = tuner.plan(r)[1]
        res = run_plan(incast_round_plan(runs), out / f"round-{r}", backend="uml",
                       timeout_s=RUN_TIMEOUT_S)["experiments"]  # fmt: skip
        by_theta: dict[str, tuple[dict[str, int], FlowSums]] = {}
        rows = []
        for h, theta in runs.items():
            sums = incast_sums(res[f"{name}/{h}"], theta, objective)
            rows.append(_incast_row(h, theta, res[f"{name}/{h}"], sums, objective))
            if sums is not None and sums.flow_count:
                key = tuner.spec.key(theta)
                prev = by_theta.get(key)
                by_theta[key] = (theta, sums if prev is None else prev[1] + sums)
        for theta, total in by_theta.values():
            tuner.observe(r, 1, theta, total)
        history[name].append({"round": r, "incumbent": incumbent, "runs": rows})
        print(plannertune.progress_line(name, r, incumbent, rows, cfg.sigma), flush=True)
    history[name].append({"round": cfg.rounds, "incumbent": tuner.plan(cfg.rounds)[1][0]})
    (out / "history.json").write_text(json.dumps(history, indent=1))
    return history


def incast_heldout_plan(tuned: dict[str, int]) -> dict:
    """Default and tuned DC-Vegas beside the baselines in incasts no setting was chosen on,
    and on the held-out datacenter path's long flow (the tuned θ's cost there)."""
    arms = {DCVEGAS: _arm(DCVEGAS), f"{DCVEGAS}-tuned": {**_arm(DCVEGAS), "theta": tuned}}
    arms |= {b: {"cc": b} for b in INCAST_ARMS_BASE}
    plan = heldout_plan(tuned, name=DCVEGAS)
    plan["experiments"] = [e for e in plan["experiments"] if e["kind"] != "datapath_incast"]
    for n, total in INCAST_HELDOUT:
        for a, arm in arms.items():
            plan["experiments"].append(
                incast_experiment(f"incast-{n}x{total // 10**6}MB/{a}", arm, 1, n, total)
            )
    return plan


def incast_heldout_table(held: dict) -> str:
    """The held-out incasts (timeouts, retransmits, completion) and the per-flow objective."""
    exps = held["experiments"]
    lines = [
        "| N × total | arm | completed | timeouts | retransmits | FCT mean ms | FCT max ms | "
        "per-flow Mbit/s |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, r in exps.items():
        if not label.startswith("incast-"):
            continue
        case, arm = label.split("/")
        if "error" in r or "per_flow" not in r:
            lines.append(f"| {case[7:]} | {arm} | error |")
            continue
        done = [f for f in r["per_flow"] if "fct_ms" in f]
        mbps = sum(r["bytes_each"] * 8 / f["fct_ms"] / US_PER_MS for f in done) / len(done)
        lines.append(
            f"| {case[7:]} | {arm} | {r['completed']}/{r['flows']} | {r['timeouts']} | "
            f"{r['retransmits']} | {r['fct_ms_mean']:.0f} | {r['fct_ms_max']:.0f} | {mbps:.2f} |"
        )
    return "\n".join(lines) + "\n"


# --- G4: the K sweep ---------------------------------------------------------------------------


def k_sweep_plan() -> dict:
    """8 inter-datacenter flows through a switch marking at K, GEMINI (told K) and DCTCP."""
    ex: list[dict] = [{"label": f"load/{GEMINI}", "kind": "datapath_load", "datapath": GEMINI}]
    for k in K_SWEEP:
        gemini = _arm(GEMINI)
        gemini["theta"] = {**gemini["theta"], "ecn_k": k}
        for a, arm in ((GEMINI, gemini), ("dctcp", {"cc": "dctcp"})):
            ex.append(
                {
                    "label": f"k{k}/{a}",
                    "kind": "datapath_pair",
                    "rate_kbit": C_MBIT * 1000,
                    "queue_packets": 450,
                    "ecn_k": k,
                    "rtts_ms": [K_SWEEP_RTT_MS],
                    "parallel": K_SWEEP_FLOWS,
                    "duration_s": K_SWEEP_S,
                    "omit_s": K_SWEEP_OMIT_S,
                    "sample_s": 1.0,
                    **arm,
                }
            )
    return {"paths": [scenario.load("datacenter").to_dict()], "experiments": ex}


@dataclass(frozen=True)
class KCell:
    mbps: float
    queue_ms: float
    retransmits: int
    marked: int


def k_cell(r: dict) -> KCell:
    (f,) = r["flows"]
    return KCell(f["throughput_mbps"], f["queue_delay_ms"], f["retransmits"], r["marked"])


def k_sweep_table(results: dict) -> str:
    exps = results["experiments"]
    lines = [
        "| K | arm | goodput Mbit/s (8 flows) | of capacity | queueing ms | retransmits | marks |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    cap = C_MBIT * 1448 / 1514
    for k in K_SWEEP:
        for a in (GEMINI, "dctcp"):
            r = exps.get(f"k{k}/{a}")
            if not r or "error" in r or "flows" not in r:
                lines.append(f"| {k} | {a} | error |")
                continue
            c = k_cell(r)
            lines.append(
                f"| {k} | {a} | {c.mbps:.1f} | {100 * c.mbps / cap:.0f} % | {c.queue_ms:.1f} | "
                f"{c.retransmits} | {c.marked} |"
            )
    return "\n".join(lines) + "\n"


# --- entry -------------------------------------------------------------------------------------


def _tuned_of(history: dict[str, list[dict]]) -> dict[str, int]:
    (theta,) = plannertune.tuned_theta(history).values()
    return theta


def cmd_gemini_dc(out: Path, command: str) -> str:
    cfg = gemini_dc_config()
    history = plannertune.tune(cfg, out)
    tuned = _tuned_of(history)
    plan = heldout_plan(tuned, name=GEMINI, path=DC_HELDOUT)
    held = run_plan(plan, out / "heldout", backend="uml", timeout_s=RUN_TIMEOUT_S)
    (out / "heldout.json").write_text(json.dumps(held, indent=1))
    text = plannertune.render(history, cfg, command)
    return text + "\n" + heldout_table(held, tuned, GEMINI, path=DC_HELDOUT)


def cmd_dcvegas_incast(out: Path, command: str, objective: Objective) -> str:
    cfg = dcvegas_incast_config()
    history = tune_incast(cfg, out, objective)
    tuned = _tuned_of(history)
    held = run_plan(incast_heldout_plan(tuned), out / "heldout", backend="uml",
                    timeout_s=RUN_TIMEOUT_S)  # fmt: skip
    (out / "heldout.json").write_text(json.dumps(held, indent=1))
    text = plannertune.render(history, cfg, command).replace(
        "for long flows", f"for incast ({objective} objective)"
    )
    return "\n".join(
        [
            text,
            heldout_table(held, tuned, DCVEGAS),
            "Held-out incasts (dc-incast), the same θ:",
            "",
            incast_heldout_table(held),
        ]
    )


def cmd_gear_pair(out: Path, command: str) -> str:
    cfg = gear_pair_config()
    history = plannertune.tune(cfg, out)
    tuned = _tuned_of(history)
    held = run_plan(gear_tune.heldout_plan(tuned), out / "heldout", backend="uml",
                    timeout_s=RUN_TIMEOUT_S)  # fmt: skip
    (out / "heldout.json").write_text(json.dumps(held, indent=1))
    text = plannertune.render(history, cfg, command).replace(
        "for long flows", "for its intra/cross pair (fair-goodput objective)"
    )
    return text + "\n" + gear_tune.heldout_table(held, tuned, cfg.sigma)


def cmd_k_sweep(out: Path, command: str) -> str:
    results = run_plan(k_sweep_plan(), out / "k-sweep", backend="uml", timeout_s=RUN_TIMEOUT_S)
    (out / "k-sweep.json").write_text(json.dumps(results, indent=1))
    return f"Command: `{command}`\n\n" + k_sweep_table(results)


COMMANDS: dict[str, Callable[[Path, str], str]] = {
    "gemini-dc": cmd_gemini_dc,
    "dcvegas-incast": partial(cmd_dcvegas_incast, objective=Objective.PER_FLOW),
    "dcvegas-query": partial(cmd_dcvegas_incast, objective=Objective.QUERY),
    "dcvegas-completion": partial(cmd_dcvegas_incast, objective=Objective.COMPLETION),
    "gear-pair": cmd_gear_pair,
    "k-sweep": cmd_k_sweep,
}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m gemini_lab.datapath_sweeps", description=__doc__)
    p.add_argument("study", choices=sorted(COMMANDS))
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python -m gemini_lab.datapath_sweeps " + shlex.join(argv or sys.argv[1:])
    text = COMMANDS[args.study](args.out, command)
    (args.out / "summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
