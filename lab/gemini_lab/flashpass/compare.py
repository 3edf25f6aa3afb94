"""Tuned θ against the paper's θ on held-out draws: FlashPass only, both θs in one UML boot.

    python -m gemini_lab.flashpass.compare --tuned var/flashpass-tune/tuned.json \
        --seeds 4 5 --repeats 1

Each held-out seed (never run by gemini_lab.flashpass.tune) is run at the paper's θ and at the
tuned θ, ``repeats`` times each, on the evaluation's workload (gemini_lab.flashpass.evaluate).
Per run: utilisation, data-queue and emulation loss, mean and slowest FCT, and eq. 9's mean
utility over the run's flow records at σ (gemini_lab.flashpass.tune.flow_sums).

With ``--workload fctmix`` the runs are the flow-size mix of gemini_lab.flashpass.fctmix
(FlashPass only), and a run's figures are the mix's: small-flow mean and p99, large-flow and
1–10 MB mean, overall mean, utilisation, losses, with eq. 9 as above. ``--arms`` runs only
some of the θs (``paper`` needs no ``--tuned``), so the arms can run in separate boots;
``--tables DIR ...`` prints the per-run and min–max tables of such runs' raw.json files.

    python -m gemini_lab.flashpass.compare --workload fctmix --arms paper --seeds 4 5 \
        --repeats 3 --work DIR
    python -m gemini_lab.flashpass.compare --tables DIR ...
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from gemini_lab.flashpass import evaluate, fctmix, tune
from gemini_lab.uml import run_in_uml

SIGMA = 0.1


def plan(
    seeds: list[int], thetas: dict[str, dict[str, int]], repeats: int, workload: str = "static"
) -> list[dict]:
    runs = []
    for seed in seeds:
        base = tune.base_run(seed, workload)
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


def mix_figures(run: dict, result: dict, run_dir: Path) -> dict:
    """One mix run's figures (fctmix.figures) and eq. 9 over its flow records."""
    if "error" in result:
        raise RuntimeError(f"seed {run['seed']} {run['label']}: {result['error']}")
    sums = tune.flow_sums(tune.read_records(run_dir), run["theta"])
    f = fctmix.figures(result, run["flows"])
    return {
        "seed": run["seed"], "label": run["label"], "theta": run["theta"],
        "small_mean_ms": f.class_mean_ms[0], "small_p99_ms": f.small_p99_ms,
        "mid_mean_ms": f.class_mean_ms[2], "large_mean_ms": f.class_mean_ms[3],
        "overall_mean_ms": f.overall_mean_ms, "utilisation": f.utilisation,
        "data_loss": f.data_loss, "emulation_loss": f.emulation_loss,
        "complete": f.complete, "flows": f.flows,
        "utility": sums.utility(SIGMA).mean, "mbps": sums.mean_throughput,
        "queue_ms": sums.mean_delay,
    }  # fmt: skip


# a mix table's columns: heading, key, format, scale
MIX_COLUMNS = (
    ("small < 100 KB mean ms", "small_mean_ms", ".0f", 1),
    ("small p99 ms", "small_p99_ms", ".0f", 1),
    ("> 10 MB mean ms", "large_mean_ms", ".0f", 1),
    ("1–10 MB mean ms", "mid_mean_ms", ".0f", 1),
    ("overall mean ms", "overall_mean_ms", ".0f", 1),
    ("utilisation %", "utilisation", ".1f", 100),
    ("data-queue loss %", "data_loss", ".2f", 100),
    ("emulation loss %", "emulation_loss", ".1f", 100),
    ("eq. 9 utility Mbit/s", "utility", ".3f", 1),
    ("queueing ms", "queue_ms", ".1f", 1),
)


def mix_table(rows: list[dict]) -> list[str]:
    """One line per mix run."""
    lines = [
        "| seed | θ | " + " | ".join(h for h, *_ in MIX_COLUMNS) + " | complete |",
        "|---:|---|" + "---:|" * (len(MIX_COLUMNS) + 1),
    ]
    for r in rows:
        cells = [format(r[k] * m, f) for _, k, f, m in MIX_COLUMNS]
        lines.append(
            f"| {r['seed']} | {r['label']} | " + " | ".join(cells)
            + f" | {r['complete']}/{r['flows']} |"
        )  # fmt: skip
    return lines


def mix_spans(rows: list[dict]) -> list[str]:
    """Min–max over the runs of each (seed, θ), with eq. 9's mean over them."""
    lines = [
        "| seed | θ | runs | " + " | ".join(h for h, *_ in MIX_COLUMNS) + " | utility, mean |",
        "|---:|---|---:|" + "---:|" * (len(MIX_COLUMNS) + 1),
    ]
    keys = sorted({(r["seed"], r["label"]) for r in rows})
    for seed, label in keys:
        rs = [r for r in rows if (r["seed"], r["label"]) == (seed, label)]
        cells = []
        for _, k, f, m in MIX_COLUMNS:
            lo, hi = format(min(r[k] for r in rs) * m, f), format(max(r[k] for r in rs) * m, f)
            cells.append(lo if lo == hi else f"{lo}–{hi}")
        mean = sum(r["utility"] for r in rs) / len(rs)
        lines.append(f"| {seed} | {label} | {len(rs)} | " + " | ".join(cells) + f" | {mean:.3f} |")
    return lines


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
    ap.add_argument("--tuned", type=Path, help="tune's tuned.json (needed for the tuned arm)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[4, 5])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--workload", choices=sorted(tune.WORKLOADS), default="static")
    ap.add_argument("--arms", nargs="+", choices=("paper", "tuned"), default=["paper", "tuned"])
    ap.add_argument(
        "--theta",
        nargs="*",
        default=[],
        metavar="NAME=UNITS",
        type=evaluate._setting,
        help="the paper arm's θ with these settings in place (e.g. T_wait by the paper's rule)",
    )
    ap.add_argument("--tables", type=Path, nargs="+", help="print the tables of these runs")
    ap.add_argument("--work", type=Path, default=Path("var/flashpass-compare"))
    a = ap.parse_args()
    if a.tables:
        rows = [r for d in a.tables for r in json.loads((d / "raw.json").read_text())]
        print("\n".join([*mix_table(rows), "", *mix_spans(rows)]))
        return
    if set(a.seeds) & set(tune.DEV_SEEDS):
        ap.error(f"seeds {sorted(set(a.seeds) & set(tune.DEV_SEEDS))} were tuned on")
    if "tuned" in a.arms and a.tuned is None:
        ap.error("the tuned arm needs --tuned")
    thetas = {"paper": evaluate.flashpass_theta(a.theta)}
    if a.tuned is not None:
        (thetas["tuned"],) = json.loads(a.tuned.read_text())["theta"].values()
    thetas = {k: v for k, v in thetas.items() if k in a.arms}
    runs = plan(a.seeds, thetas, a.repeats, a.workload)
    a.work.mkdir(parents=True, exist_ok=True)
    (a.work / "plan.json").write_text(json.dumps({"runs": runs}))
    files = '"$GEMINI_LAB_OUT/plan.json" "$GEMINI_LAB_OUT/result.json"'
    run_in_uml(
        f"{sys.executable} -m gemini_lab.flashpass.lab {files}",
        a.work,
        timeout_s=tune.timeout(a.workload),
    )
    results = json.loads((a.work / "result.json").read_text())
    mix = a.workload in tune.MIX_WORKLOADS
    each = mix_figures if mix else figures
    rows = [
        each(run, res, a.work / f"run{i}")
        for i, (run, res) in enumerate(zip(runs, results, strict=True))
    ]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    lines = [
        "; ".join(f"{k} θ {v}" for k, v in thetas.items()) + ".",
        "",
        *(mix_table(rows) if mix else table(rows)),
        "",
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC at commit {commit.stdout.strip()}.",
    ]
    print("\n".join(lines))
    (a.work / "raw.json").write_text(json.dumps(rows, indent=1))
    (a.work / "table.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
