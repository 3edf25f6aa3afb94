"""Fusion's datapath before and after a change, beside the baselines, on four paths of the lab.

    python -m benchmarks.fusion_datapath run --tag after [--out var/fusion-datapath]
    python -m benchmarks.fusion_datapath report [--out var/fusion-datapath]

`run` boots the lab once and runs one flow of every arm (Fusion at its default θ, Fusion with a
loss tolerance above the path's loss rate where the path is lossy, and the baselines) on Table
IV's Ethernet, satellite and cellular paths and on a deep-buffer access link; its results land
in `<out>/<tag>-<time>.json`. Run it several times per tag (each boot is one sample of every
arm, so a drift of the emulator's speed falls on all arms alike) under the heavy-work lock.
`report` folds every file into benchmarks/results/fusion-datapath.md: per path and arm, mean
throughput (% of capacity), queueing delay, retransmits and utility (Mbit/s − σ · ms of
queueing, eq. 9) at σ = 0.1 and 1, each with its spread over the runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

from benchmarks.common import write_result
from gemini_lab import scenario
from gemini_lab.host import REPO, run_plan

SIGMAS = (0.1, 1.0)
SHORT_S = 20
# an 800 ms path needs about ten round trips of slow start alone
LONG_S = 40
# l = 1.0 % tolerates satellite's 0.74 % random loss (l is in tenths of a percent)
TOLERANT = {"loss_threshold": 10}
ARMS: dict[str, list[tuple[str, str, dict[str, int]]]] = {
    "ethernet": [("fusion", "fusion", {}), ("vegas", "vegas", {}), ("bbr", "bbr", {})],
    "satellite": [
        ("fusion", "fusion", {}),
        ("fusion l=1%", "fusion", TOLERANT),
        ("bbr", "bbr", {}),
    ],
    "cellular": [("fusion", "fusion", {}), ("vegas", "vegas", {}), ("bbr", "bbr", {})],
    "deep-buffer": [("fusion", "fusion", {}), ("cubic", "cubic", {}), ("bbr", "bbr", {})],
}
DEFAULT_OUT = REPO / "var" / "fusion-datapath"
# What the builds are (tags of the runs), for the reader of the results file.
NOTES = [
    "Builds: `before` is fusion_cc.c as of 5b98de0 (a tolerated loss still froze the window "
    "for the whole of Recovery: PRR toward ssthresh = W). `probe-ungated` repairs tolerated "
    "losses while eqs. 2 and 4 keep growing the window (PRR only for Fusion's own reduction) "
    "and doubles eq. 4's additive step each round trip without a congestion signal. `after` "
    "is the committed datapath: the same recovery, with the step doubling only while the "
    "latest interval shows no queue (minimum RTT within T^min/32, at least 1 ms, of T^min); "
    "its rows appear once `run --tag after` has been measured (none yet where the table has "
    "no `after` row).",
    "",
    "Reading: on satellite at a loss tolerance above its loss rate (l = 1 %) Fusion went "
    "from 14 % to 59 % of capacity (bbr 60 %) with 14 ms of queueing against bbr's 118 ms; "
    "these runs do not separate the recovery change's share from the probe's. Fusion's "
    "default l = 0.5 % reads satellite's 0.74 % as congestion, so the default row does not "
    "move: that is for Booster to tune. The ungated probe bought a few per cent of "
    "throughput on the loss-free paths for several times the queueing, which is why the "
    "step is gated on the queue. One run per build only (the shared lock allowed no more "
    "in this session), so no spread is shown; repeats are still to be recorded.",
]


def paths() -> list[scenario.Scenario]:
    return [scenario.load(n) for n in ("ethernet", "satellite", "cellular", "deep-buffer")]


def plan(fusion_only: bool = False) -> dict:
    """One flow per arm and path, in one boot; only Fusion's arms with ``fusion_only``."""
    experiments = []
    for i, p in enumerate(paths()):
        for arm, cc, theta in ARMS[p.name]:
            if fusion_only and cc != "fusion":
                continue
            experiments.append(
                {
                    "label": f"{p.name}/{arm}",
                    "kind": "flow",
                    "path": i,
                    "cc": cc,
                    "theta": theta,
                    "duration_s": LONG_S if p.rtt_ms >= 500 else SHORT_S,
                }
            )
    return {"paths": [p.to_dict() for p in paths()], "experiments": experiments}


def cmd_run(tag: str, out: Path, fusion_only: bool) -> None:
    stamp = time.strftime("%Y%m%dT%H%M%S")
    results = run_plan(plan(fusion_only), out / f"boot-{tag}-{stamp}")
    rows = {}
    for label, res in results["experiments"].items():
        keep = ("throughput_mbps", "queue_delay_ms", "retransmits", "min_rtt_ms", "error")
        rows[label] = {k: res[k] for k in keep if k in res}
    out.mkdir(parents=True, exist_ok=True)
    meta = {"tag": tag, "kernel": results.get("kernel"), "backend": results.get("backend")}
    (out / f"{tag}-{stamp}.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    for label, row in rows.items():
        print(f"{tag} {label}: {row}")


def _spread(values: list[float], fmt: str) -> str:
    mean = statistics.fmean(values)
    if len(values) == 1:
        return format(mean, fmt)
    return f"{mean:{fmt}} ({min(values):{fmt}}–{max(values):{fmt}})"


def cmd_report(out: Path) -> None:
    runs: dict[tuple[str, str], list[dict]] = defaultdict(list)
    tags: list[str] = []
    kernels: set[str] = set()
    # in the order they were measured (the stamp ends each file's name)
    for f in sorted(out.glob("*.json"), key=lambda f: f.stem.rsplit("-", 1)[-1]):
        data = json.loads(f.read_text())
        kernels.add(str(data.get("kernel")))
        if data["tag"] not in tags:
            tags.append(data["tag"])
        for label, row in data["rows"].items():
            if "error" not in row:
                runs[(data["tag"], label)].append(row)
    capacity = {p.name: p.mean_rate_kbit / 1000 for p in paths()}
    lines = [
        "Each cell: mean over the runs, (min–max) in brackets. Throughput as iperf3's receiver "
        "counted it; queueing = mean RTT − min RTT from tcp_info; utility = Mbit/s − σ · ms of "
        "queueing (eq. 9). Paths: "
        + "; ".join(f"{p.name}: {p.description}" for p in paths())
        + f". Flows last {SHORT_S} s ({LONG_S} s on satellite), one per arm per boot; the arms "
        "take turns in each boot. Measured with the lab's default backend (kernel "
        + ", ".join(sorted(kernels))
        + "; User-Mode Linux on a simulated clock, so figures do not move with host load) "
        "while holding the lab lock. % of capacity on cellular is of the trace's mean rate; a "
        "flow sees only part of the trace, so it can exceed 100.",
        "",
        "| path | arm | build | runs | Mbit/s | % of capacity | queueing ms | retransmits | "
        + " | ".join(f"utility σ={s:g}" for s in SIGMAS)
        + " |",
        "|---|---|---|---:|---:|---:|---:|---:|" + "---:|" * len(SIGMAS),
    ]
    for p in paths():
        for arm, cc, _ in ARMS[p.name]:
            label = f"{p.name}/{arm}"
            # baselines do not change with the module: their runs of every boot are pooled
            groups = (
                [(tag, runs.get((tag, label), [])) for tag in tags]
                if cc == "fusion"
                else [("—", [r for tag in tags for r in runs.get((tag, label), [])])]
            )
            for build, rows in groups:
                if not rows:
                    continue
                tput = [r["throughput_mbps"] for r in rows]
                queue = [r["queue_delay_ms"] for r in rows]
                share = [100 * t / capacity[p.name] for t in tput]
                utils = [
                    _spread([t - s * q for t, q in zip(tput, queue, strict=True)], ".2f")
                    for s in SIGMAS
                ]
                lines.append(
                    f"| {p.name} | {arm} | {build} | {len(rows)} | {_spread(tput, '.2f')} | "
                    f"{_spread(share, '.0f')} | {_spread(queue, '.1f')} | "
                    f"{_spread([float(r['retransmits']) for r in rows], '.0f')} | "
                    + " | ".join(utils)
                    + " |"
                )
    lines += ["", *NOTES]
    write_result(
        "fusion-datapath",
        "python -m benchmarks.fusion_datapath run --tag <build> (×N, each under "
        "flock /tmp/gemini-heavy.lock), then python -m benchmarks.fusion_datapath report",
        lines,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="one boot: one flow of every arm on every path")
    run.add_argument("--tag", required=True, help="the build being measured, e.g. before/after")
    run.add_argument("--out", type=Path, default=DEFAULT_OUT)
    run.add_argument(
        "--fusion-only", action="store_true", help="skip the baselines (they do not change)"
    )
    report = sub.add_parser("report", help="write benchmarks/results/fusion-datapath.md")
    report.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    if args.cmd == "run":
        cmd_run(args.tag, args.out, args.fusion_only)
    else:
        cmd_report(args.out)


if __name__ == "__main__":
    main()
