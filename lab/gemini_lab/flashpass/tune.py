"""Booster's planner tunes FlashPass's θ on the evaluation's development workload (UML lab).

    python -m gemini_lab.flashpass.tune [--rounds 4] [--hosts 3] [--explorers 2] \
        [--workload static|fctmix|fctmix-wan]

The driver is gemini_lab.plannertune's (the service's Planner, its trials as FlowSums per
(context, θ, hour bucket), its host assignment); what this module adds is the round: one UML
boot in which every lab host of the round runs the FlashPass workload of
gemini_lab.flashpass.evaluate (4 senders, 1 MB each, 10 Mbit/s, 16-packet data buffer) at its
planned θ, one after another. Round r draws development seed DEV_SEEDS[r % 3] (every host of
the round alike, so a round compares θs on one draw); the held-out seeds are never run here.
With ``--workload fctmix`` each host runs instead the flow-size mix of
gemini_lab.flashpass.fctmix (the N = 20 path, 120 flows from the scaled web-search CDF at load
0.8) on the same development seeds, FlashPass only; the context is then ``flashpass-fctmix``.
``--workload fctmix-wan`` runs that mix at the paper's 40-80 ms round trips on a 4-packet data
buffer (``fctmix run --wan-rtts --buffer 4``); its context is ``flashpass-fctmix-wan``.

A θ's trial is eq. 9 over its flows as the agent reports them from the flow log: throughput =
bytes delivered / FCT, queueing delay = the record's RTT mean − min. At σ = 0.1 one ms of
queueing costs 0.1 Mbit/s, so on a 10 Mbit/s link shared by 4 flows the objective rewards
short FCTs first (a flow that did not finish delivered 0 bytes: its throughput is 0) and
penalises standing queues in the credit (emulation) path only lightly.

With ``--seed-contexts`` each development seed is its own context (``<context>-seed<s>``, its own
destination region, as plannertune gives each scenario), and every round runs every seed
context's hosts, each on its own seed, in one boot. A context added beside them,
``<context>-new``, never runs: the incumbent the planner serves it, a context with no data of
its own (the planner's transfer rule, ``TRANSFER_Z``), is the tuned θ for held-out seeds, and
it alone goes in tuned.json's ``theta`` (the seed contexts' incumbents under
``seed_contexts``). Why: by default round r is one hour bucket of one context on seed r % 3,
and the seeds' utility levels differ by a factor of about 2, so the planner sees each change
of seed as a change of the context's level, and a θ measured on a high-level seed only
outranks one measured on all (benchmarks/results/flashpass.md, the replay of the mix tuning's
refits: ``python -m gemini_lab.plannerreplay``). The default protocol is unchanged.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gemini_api.sums import FlowSums
from gemini_lab import plannertune
from gemini_lab.flashpass import evaluate, fctmix
from gemini_lab.plannertune import RoundKind, TuneConfig, Tuner, tuned_theta
from gemini_lab.uml import run_in_uml

DEV_SEEDS = (1, 2, 3)  # evaluate's development seeds; its held-out seed 4 is not tuned on
SCENARIO = "flashpass-dev"  # the context's name (one context: the dev workload)
# the flow-size mix's workloads: fctmix.mix_runs's settings for each. "fctmix-wan" is the
# configuration of the FCT headline (benchmarks/results/flashpass-wan.md): the paper's 40-80 ms
# round trips and the shallowest data buffer the lab runs
MIX_WORKLOADS: dict[str, dict] = {
    "fctmix": {},
    "fctmix-wan": {"wan_rtts": True, "buffer_packets": fctmix.MIN_BUFFER_PACKETS},
}
WORKLOADS = {"static": SCENARIO} | {w: f"flashpass-{w}" for w in MIX_WORKLOADS}  # its context
ROUND_TIMEOUT_S = 1500
US_PER_S = 1_000_000


def config(
    rounds: int = 4,
    hosts: int = 3,
    explorers: int = 2,
    sigma: float = 0.1,
    workload: str = "static",
    seed_contexts: bool = False,
) -> TuneConfig:
    """The tuning run: ``rounds`` boots of ``hosts`` FlashPass runs each (per seed context with
    ``seed_contexts``, and the held-out context last), over Θ at σ."""
    name = WORKLOADS[workload]
    scenarios = (*seed_context_names(name), held_out_name(name)) if seed_contexts else (name,)
    return TuneConfig(
        scenarios=scenarios, sigma=sigma, rounds=rounds, hosts=hosts,
        explorers=explorers, datapath="flashpass", kind=RoundKind.FLASHPASS,
    )  # fmt: skip


def seed_context_names(name: str) -> tuple[str, ...]:
    """Each development seed's context: its own destination region (plannertune.context_key)."""
    return tuple(f"{name}-seed{s}" for s in DEV_SEEDS)


def held_out_name(name: str) -> str:
    """The context that never runs: what the planner serves it is the held-out seeds' θ."""
    return f"{name}-new"


def context_seeds(cfg: TuneConfig) -> dict[int, int]:
    """Under ``--seed-contexts``, per context id (as ``Tuner`` numbers them) the development
    seed its hosts run, the held-out context absent; empty under the default protocol (one
    context, each round on ``dev_seed``)."""
    if len(cfg.scenarios) == 1:
        return {}
    return {i + 1: s for i, s in enumerate(DEV_SEEDS)}


def held_out_context(cfg: TuneConfig) -> int | None:
    """The held-out context's id, or None under the default protocol."""
    return len(cfg.scenarios) if len(cfg.scenarios) > 1 else None


def dev_seed(r: int) -> int:
    return DEV_SEEDS[r % len(DEV_SEEDS)]


def base_run(seed: int, workload: str = "static") -> dict:
    """FlashPass's run of ``seed`` on ``workload``: evaluate's 4 × 1 MB, or fctmix's mix."""
    if workload in MIX_WORKLOADS:
        (base,) = fctmix.mix_runs(seed, transports=("flashpass",), **MIX_WORKLOADS[workload])
        return base
    (base,) = [x for x in evaluate.seed_runs(seed) if x["transport"] == "flashpass"]
    return base


def round_plan(r: int, runs: dict[str, dict[str, int]], workload: str = "static") -> dict:
    """One boot: each host's FlashPass run of round ``r``'s development draw at its θ."""
    base = base_run(dev_seed(r), workload)
    return {"runs": [base | {"theta": theta, "host": h} for h, theta in runs.items()]}


def contexts_round_plan(
    runs: dict[int, dict[str, dict[str, int]]], seeds: dict[int, int], workload: str = "static"
) -> tuple[dict, list[tuple[int, str]]]:
    """One boot of ``--seed-contexts``: every seed context's hosts at their θ on the context's
    seed, context by context; and (context, host) of run ``i``, for ``observe_contexts``."""
    plan: list[dict] = []
    order: list[tuple[int, str]] = []
    for c, seed in seeds.items():
        base = base_run(seed, workload)
        for h, theta in runs[c].items():
            plan.append(base | {"theta": theta, "host": f"seed{seed}/{h}"})
            order.append((c, h))
    return {"runs": plan}, order


def flow_sums(records: list[dict], asked: dict[str, int]) -> FlowSums:
    """Eq. 9's sums over one run's flow records; RuntimeError if a flow ran another θ."""
    out = FlowSums()
    for rec in records:
        if rec["theta"] != asked:
            raise RuntimeError(f"flow {rec['flow']} ran θ {rec['theta']}, not {asked}")
        secs = rec["duration_us"] / US_PER_S
        mbps = rec["bytes_delivered"] * 8 / 1e6 / secs if secs > 0 else 0.0
        queue_ms = (rec["rtt_avg_us"] - rec["rtt_min_us"]) / 1000
        out = out + FlowSums.of_flow(mbps, queue_ms)
    return out


def read_records(run_dir: Path) -> list[dict]:
    log = run_dir / "flashpass.flows"
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def row(host: str, theta: dict[str, int], sums: FlowSums, records: list[dict]) -> dict:
    """A host's round as plannertune's record shows it: means over the run's flows."""
    return {
        "host": host, "theta": theta, "mbps": sums.mean_throughput,
        "queue_ms": sums.mean_delay, "retransmits": sum(r["retransmits"] for r in records),
    }  # fmt: skip


def observe(
    tuner: Tuner,
    r: int,
    runs: dict[str, dict[str, int]],
    out: Path,
    context: int = 1,
    dirs: list[str] | None = None,
) -> list[dict]:
    """Each θ's flows of the round summed into one trial of ``context``, as the service stores
    them; host i's records in ``dirs[i]`` (default: ``run<i>``)."""
    by_key: dict[str, tuple[dict[str, int], FlowSums]] = {}
    rows = []
    for i, (host, theta) in enumerate(runs.items()):
        records = read_records(out / (dirs[i] if dirs else f"run{i}"))
        sums = flow_sums(records, theta)
        key = tuner.spec.key(theta)
        prev = by_key.get(key)
        by_key[key] = (theta, sums if prev is None else prev[1] + sums)
        rows.append(row(host, theta, sums, records))
    for theta, total in by_key.values():
        tuner.observe(r, context, theta, total)
    return rows


def observe_contexts(
    tuner: Tuner,
    r: int,
    runs: dict[int, dict[str, dict[str, int]]],
    order: list[tuple[int, str]],
    out: Path,
) -> dict[int, list[dict]]:
    """Each seed context's round, its hosts' records read from the runs ``order`` names."""
    rows = {}
    for c in dict.fromkeys(c for c, _ in order):
        dirs = [f"run{i}" for i, (cc, _) in enumerate(order) if cc == c]
        rows[c] = observe(tuner, r, runs[c], out, c, dirs)
    return rows


def timeout(workload: str) -> float:
    """Host seconds for one boot of one context's hosts on ``workload``."""
    return fctmix.RUN_TIMEOUT_S if workload in MIX_WORKLOADS else ROUND_TIMEOUT_S


def boot(out: Path, plan: dict, timeout_s: float) -> Path:
    """One UML boot of the FlashPass lab on ``plan``, its files in ``out`` (returned)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(json.dumps(plan))
    files = '"$GEMINI_LAB_OUT/plan.json" "$GEMINI_LAB_OUT/result.json"'
    run_in_uml(f"{sys.executable} -m gemini_lab.flashpass.lab {files}", out, timeout_s=timeout_s)
    return out


def tune(cfg: TuneConfig, work: Path, workload: str = "static") -> dict[str, list[dict]]:
    if len(cfg.scenarios) > 1:
        return tune_contexts(cfg, work, workload)
    (scenario,) = cfg.scenarios
    tuner = Tuner(cfg)
    history: list[dict] = []
    for r in range(cfg.rounds):
        ((incumbent, runs),) = tuner.plan(r).values()
        out = boot(work / f"round-{r}", round_plan(r, runs, workload), timeout(workload))
        rows = observe(tuner, r, runs, out)
        history.append({"round": r, "incumbent": incumbent, "runs": rows})
        print(plannertune.progress_line(scenario, r, incumbent, rows, cfg.sigma), flush=True)
    ((final, _),) = tuner.plan(cfg.rounds).values()
    history.append({"round": cfg.rounds, "incumbent": final})
    result = {scenario: history}
    (work / "history.json").write_text(json.dumps(result, indent=1))
    return result


def tune_contexts(cfg: TuneConfig, work: Path, workload: str) -> dict[str, list[dict]]:
    """``--seed-contexts``: per round one boot of every seed context's hosts; every context,
    the held-out one included, planned at every refit (history: a row per context and round,
    the held-out context's with no runs)."""
    seeds = context_seeds(cfg)
    tuner = Tuner(cfg)
    history: dict[str, list[dict]] = {n: [] for n in cfg.scenarios}
    for r in range(cfg.rounds):
        plans = tuner.plan(r)
        runs = {c: plans[c][1] for c in seeds}
        plan, order = contexts_round_plan(runs, seeds, workload)
        out = boot(work / f"round-{r}", plan, timeout(workload) * len(seeds))
        rows = observe_contexts(tuner, r, runs, order, out)
        for c, (incumbent, _) in plans.items():
            name = cfg.scenarios[c - 1]
            history[name].append({"round": r, "incumbent": incumbent, "runs": rows.get(c, [])})
            if c in rows:
                line = plannertune.progress_line(name, r, incumbent, rows[c], cfg.sigma)
                print(line, flush=True)
    for c, (final, _) in tuner.plan(cfg.rounds).items():
        history[cfg.scenarios[c - 1]].append({"round": cfg.rounds, "incumbent": final})
    (work / "history.json").write_text(json.dumps(history, indent=1))
    return history


def write_tuned_contexts(history: dict[str, list[dict]], cfg: TuneConfig, command: str,
                         path: Path) -> None:  # fmt: skip
    """tuned.json of ``--seed-contexts``: ``theta`` holds the held-out context's θ alone (what
    ``compare --tuned`` runs on held-out seeds); ``seed_contexts`` each seed context's."""
    tuned = tuned_theta(history)
    held_out = cfg.scenarios[-1]
    data = {
        "source": f"{command}: Booster's planner, σ = {cfg.sigma:g}, {cfg.region_symbol}; the θ "
        "it serves a context with no data of its own (each development seed a context)",
        "theta": {held_out: tuned[held_out]},
        "seed_contexts": {n: tuned[n] for n in cfg.scenarios[:-1]},
    }
    path.write_text(json.dumps(data, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--explorers", type=int, default=2)
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="static")
    ap.add_argument("--work", type=Path, default=Path("var/flashpass-tune"))
    ap.add_argument(
        "--seed-contexts",
        action="store_true",
        help="each development seed its own context; the tuned θ: what a new context is served",
    )
    a = ap.parse_args()
    cfg = config(a.rounds, a.hosts, a.explorers, workload=a.workload,
                 seed_contexts=a.seed_contexts)  # fmt: skip
    history = tune(cfg, a.work, a.workload)
    command = "python -m gemini_lab.flashpass.tune " + " ".join(sys.argv[1:])
    (a.work / "record.md").write_text(plannertune.render(history, cfg, command))
    if a.seed_contexts:
        write_tuned_contexts(history, cfg, command, a.work / "tuned.json")
    else:
        plannertune.write_tuned(history, cfg, command, a.work / "tuned.json")
    print(json.dumps(plannertune.tuned_theta(history)))


if __name__ == "__main__":
    main()
