"""Booster's planner tunes FlashPass's θ on the evaluation's development workload (UML lab).

    python -m gemini_lab.flashpass.tune [--rounds 4] [--hosts 3] [--explorers 2] \
        [--workload static|fctmix]

The driver is gemini_lab.plannertune's (the service's Planner, its trials as FlowSums per
(context, θ, hour bucket), its host assignment); what this module adds is the round: one UML
boot in which every lab host of the round runs the FlashPass workload of
gemini_lab.flashpass.evaluate (4 senders, 1 MB each, 10 Mbit/s, 16-packet data buffer) at its
planned θ, one after another. Round r draws development seed DEV_SEEDS[r % 3] (every host of
the round alike, so a round compares θs on one draw); the held-out seeds are never run here.
With ``--workload fctmix`` each host runs instead the flow-size mix of
gemini_lab.flashpass.fctmix (the N = 20 path, 120 flows from the scaled web-search CDF at load
0.8) on the same development seeds, FlashPass only; the context is then ``flashpass-fctmix``.

A θ's trial is eq. 9 over its flows as the agent reports them from the flow log: throughput =
bytes delivered / FCT, queueing delay = the record's RTT mean − min. At σ = 0.1 one ms of
queueing costs 0.1 Mbit/s, so on a 10 Mbit/s link shared by 4 flows the objective rewards
short FCTs first (a flow that did not finish delivered 0 bytes: its throughput is 0) and
penalises standing queues in the credit (emulation) path only lightly.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gemini_api.sums import FlowSums
from gemini_lab import plannertune
from gemini_lab.flashpass import evaluate, fctmix
from gemini_lab.plannertune import RoundKind, TuneConfig, Tuner
from gemini_lab.uml import run_in_uml

DEV_SEEDS = (1, 2, 3)  # evaluate's development seeds; its held-out seed 4 is not tuned on
SCENARIO = "flashpass-dev"  # the context's name (one context: the dev workload)
WORKLOADS = {"static": SCENARIO, "fctmix": "flashpass-fctmix"}  # workload: its context
ROUND_TIMEOUT_S = 1500
US_PER_S = 1_000_000


def config(
    rounds: int = 4,
    hosts: int = 3,
    explorers: int = 2,
    sigma: float = 0.1,
    workload: str = "static",
) -> TuneConfig:
    """The tuning run: ``rounds`` boots of ``hosts`` FlashPass runs each, over Θ at σ."""
    return TuneConfig(
        scenarios=(WORKLOADS[workload],), sigma=sigma, rounds=rounds, hosts=hosts,
        explorers=explorers, datapath="flashpass", kind=RoundKind.FLASHPASS,
    )  # fmt: skip


def dev_seed(r: int) -> int:
    return DEV_SEEDS[r % len(DEV_SEEDS)]


def base_run(seed: int, workload: str = "static") -> dict:
    """FlashPass's run of ``seed`` on ``workload``: evaluate's 4 × 1 MB, or fctmix's mix."""
    if workload == "fctmix":
        (base,) = fctmix.mix_runs(seed, transports=("flashpass",))
        return base
    (base,) = [x for x in evaluate.seed_runs(seed) if x["transport"] == "flashpass"]
    return base


def round_plan(r: int, runs: dict[str, dict[str, int]], workload: str = "static") -> dict:
    """One boot: each host's FlashPass run of round ``r``'s development draw at its θ."""
    base = base_run(dev_seed(r), workload)
    return {"runs": [base | {"theta": theta, "host": h} for h, theta in runs.items()]}


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


def observe(tuner: Tuner, r: int, runs: dict[str, dict[str, int]], out: Path) -> list[dict]:
    """Each θ's flows of the round summed into one trial, as the service stores them."""
    by_key: dict[str, tuple[dict[str, int], FlowSums]] = {}
    rows = []
    for i, (host, theta) in enumerate(runs.items()):
        records = read_records(out / f"run{i}")
        sums = flow_sums(records, theta)
        key = tuner.spec.key(theta)
        prev = by_key.get(key)
        by_key[key] = (theta, sums if prev is None else prev[1] + sums)
        rows.append(row(host, theta, sums, records))
    for theta, total in by_key.values():
        tuner.observe(r, 1, theta, total)
    return rows


def tune(cfg: TuneConfig, work: Path, workload: str = "static") -> dict[str, list[dict]]:
    (scenario,) = cfg.scenarios
    timeout_s = fctmix.RUN_TIMEOUT_S if workload == "fctmix" else ROUND_TIMEOUT_S
    tuner = Tuner(cfg)
    history: list[dict] = []
    for r in range(cfg.rounds):
        ((incumbent, runs),) = tuner.plan(r).values()
        out = work / f"round-{r}"
        out.mkdir(parents=True, exist_ok=True)
        (out / "plan.json").write_text(json.dumps(round_plan(r, runs, workload)))
        files = '"$GEMINI_LAB_OUT/plan.json" "$GEMINI_LAB_OUT/result.json"'
        run_in_uml(f"{sys.executable} -m gemini_lab.flashpass.lab {files}", out,
                   timeout_s=timeout_s)  # fmt: skip
        rows = observe(tuner, r, runs, out)
        history.append({"round": r, "incumbent": incumbent, "runs": rows})
        print(plannertune.progress_line(scenario, r, incumbent, rows, cfg.sigma), flush=True)
    ((final, _),) = tuner.plan(cfg.rounds).values()
    history.append({"round": cfg.rounds, "incumbent": final})
    result = {scenario: history}
    (work / "history.json").write_text(json.dumps(result, indent=1))
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--explorers", type=int, default=2)
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="static")
    ap.add_argument("--work", type=Path, default=Path("var/flashpass-tune"))
    a = ap.parse_args()
    cfg = config(a.rounds, a.hosts, a.explorers, workload=a.workload)
    history = tune(cfg, a.work, a.workload)
    command = "python -m gemini_lab.flashpass.tune " + " ".join(sys.argv[1:])
    (a.work / "record.md").write_text(plannertune.render(history, cfg, command))
    plannertune.write_tuned(history, cfg, command, a.work / "tuned.json")
    print(json.dumps(plannertune.tuned_theta(history)))


if __name__ == "__main__":
    main()
