"""Booster's planner tunes FlashPass's θ on the evaluation's development workload (UML lab).

    python -m gemini_lab.flashpass.tune [--rounds 4] [--hosts 3] [--explorers 2]

The driver is gemini_lab.plannertune's (the service's Planner, its trials as FlowSums per
(context, θ, hour bucket), its host assignment); what this module adds is the round: one UML
boot in which every lab host of the round runs the FlashPass workload of
gemini_lab.flashpass.evaluate (4 senders, 1 MB each, 10 Mbit/s, 16-packet data buffer) at its
planned θ, one after another. Round r draws development seed DEV_SEEDS[r % 3] (every host of
the round alike, so a round compares θs on one draw); the held-out seeds are never run here.

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
from gemini_lab.flashpass import evaluate
from gemini_lab.plannertune import RoundKind, TuneConfig, Tuner
from gemini_lab.uml import run_in_uml

DEV_SEEDS = (1, 2, 3)  # evaluate's development seeds; its held-out seed 4 is not tuned on
SCENARIO = "flashpass-dev"  # the context's name (one context: the dev workload)
ROUND_TIMEOUT_S = 1500
US_PER_S = 1_000_000


def config(rounds: int = 4, hosts: int = 3, explorers: int = 2, sigma: float = 0.1) -> TuneConfig:
    """The tuning run: ``rounds`` boots of ``hosts`` FlashPass runs each, over Θ at σ."""
    return TuneConfig(
        scenarios=(SCENARIO,), sigma=sigma, rounds=rounds, hosts=hosts, explorers=explorers,
        datapath="flashpass", kind=RoundKind.FLASHPASS,
    )  # fmt: skip


def dev_seed(r: int) -> int:
    return DEV_SEEDS[r % len(DEV_SEEDS)]


def round_plan(r: int, runs: dict[str, dict[str, int]]) -> dict:
    """One boot: each host's FlashPass run of round ``r``'s development draw at its θ."""
    (base,) = [x for x in evaluate.seed_runs(dev_seed(r)) if x["transport"] == "flashpass"]
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


def tune(cfg: TuneConfig, work: Path) -> dict[str, list[dict]]:
    tuner = Tuner(cfg)
    history: list[dict] = []
    for r in range(cfg.rounds):
        ((incumbent, runs),) = tuner.plan(r).values()
        out = work / f"round-{r}"
        out.mkdir(parents=True, exist_ok=True)
        (out / "plan.json").write_text(json.dumps(round_plan(r, runs)))
        files = '"$GEMINI_LAB_OUT/plan.json" "$GEMINI_LAB_OUT/result.json"'
        run_in_uml(f"{sys.executable} -m gemini_lab.flashpass.lab {files}", out,
                   timeout_s=ROUND_TIMEOUT_S)  # fmt: skip
        rows = observe(tuner, r, runs, out)
        history.append({"round": r, "incumbent": incumbent, "runs": rows})
        print(plannertune.progress_line(SCENARIO, r, incumbent, rows, cfg.sigma), flush=True)
    ((final, _),) = tuner.plan(cfg.rounds).values()
    history.append({"round": cfg.rounds, "incumbent": final})
    result = {SCENARIO: history}
    (work / "history.json").write_text(json.dumps(result, indent=1))
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--explorers", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("var/flashpass-tune"))
    a = ap.parse_args()
    cfg = config(a.rounds, a.hosts, a.explorers)
    history = tune(cfg, a.work)
    command = "python -m gemini_lab.flashpass.tune " + " ".join(sys.argv[1:])
    (a.work / "record.md").write_text(plannertune.render(history, cfg, command))
    plannertune.write_tuned(history, cfg, command, a.work / "tuned.json")
    print(json.dumps(plannertune.tuned_theta(history)))


if __name__ == "__main__":
    main()
