"""Tuned θ against the paper's θ on held-out draws: FlashPass only, both θs in one UML boot.

    python -m gemini_lab.flashpass.compare --tuned var/flashpass-tune/tuned.json \
        --seeds 4 5 --repeats 1

Each held-out seed (never run by gemini_lab.flashpass.tune) is run at the paper's θ and at the
tuned θ, ``repeats`` times each, on the evaluation's workload (gemini_lab.flashpass.evaluate).
Per run: utilisation, data-queue and emulation loss, mean and slowest FCT, and eq. 9's mean
utility over the run's flow records at σ (gemini_lab.flashpass.tune.flow_sums).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from gemini_lab.flashpass import evaluate, tune
from gemini_lab.uml import run_in_uml

SIGMA = 0.1


def plan(seeds: list[int], thetas: dict[str, dict[str, int]], repeats: int) -> list[dict]:
    runs = []
    for seed in seeds:
        (base,) = [x for x in evaluate.seed_runs(seed) if x["transport"] == "flashpass"]
        for label, theta in thetas.items():
            runs += [base | {"theta": theta, "seed": seed, "label": label}] * repeats
    return runs


def figures(run: dict, result: dict, run_dir: Path) -> dict:
    """One run's figures (evaluate.summary's, the slowest FCT, eq. 9 over its records)."""
    if "error" in result:
        raise RuntimeError(f"seed {run['seed']} {run['label']}: {result['error']}")
    sums = tune.flow_sums(tune.read_records(run_dir), run["theta"])
    return evaluate.summary(result) | {
        "seed": run["seed"], "label": run["label"], "max_fct_s": max(result["fct_s"]),
        "utility": sums.utility(SIGMA).mean, "mbps": sums.mean_throughput,
        "queue_ms": sums.mean_delay,
    }  # fmt: skip


def table(rows: list[dict]) -> list[str]:
    lines = [
        "| seed | θ | utilisation | mean FCT (s) | slowest FCT (s) | data-queue loss "
        "| emulation loss | eq. 9 utility (Mbit/s) | queueing (ms) | complete |",
        "|---:|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['seed']} | {r['label']} | {r['utilisation']:.1%} | {r['mean_fct_s']:.2f} "
            f"| {r['max_fct_s']:.2f} | {r['data_loss']:.2%} | {r['emulation_loss']:.1%} "
            f"| {r['utility']:.3f} | {r['queue_ms']:.1f} | {r['complete']} |"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tuned", type=Path, required=True, help="tune's tuned.json")
    ap.add_argument("--seeds", type=int, nargs="+", default=[4, 5])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--work", type=Path, default=Path("var/flashpass-compare"))
    a = ap.parse_args()
    if set(a.seeds) & set(tune.DEV_SEEDS):
        ap.error(f"seeds {sorted(set(a.seeds) & set(tune.DEV_SEEDS))} were tuned on")
    (tuned,) = json.loads(a.tuned.read_text())["theta"].values()
    thetas = {"paper": evaluate.THETA, "tuned": tuned}
    runs = plan(a.seeds, thetas, a.repeats)
    a.work.mkdir(parents=True, exist_ok=True)
    (a.work / "plan.json").write_text(json.dumps({"runs": runs}))
    files = '"$GEMINI_LAB_OUT/plan.json" "$GEMINI_LAB_OUT/result.json"'
    run_in_uml(f"{sys.executable} -m gemini_lab.flashpass.lab {files}", a.work, timeout_s=1500)
    results = json.loads((a.work / "result.json").read_text())
    rows = [
        figures(run, res, a.work / f"run{i}")
        for i, (run, res) in enumerate(zip(runs, results, strict=True))
    ]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    lines = [
        f"Paper's θ {evaluate.THETA}; tuned θ {tuned}.",
        "",
        *table(rows),
        "",
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC at commit {commit.stdout.strip()}.",
    ]
    print("\n".join(lines))
    (a.work / "raw.json").write_text(json.dumps(rows, indent=1))
    (a.work / "table.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
