"""How fast ``booster`` answers what needs no database: ``--help``, an unknown flag, and a bad
argument, against the CLI before it was split (commit 8262960's ``gemini_booster/cli.py``,
which imported the service stack before parsing and checked arguments after the embedded
PostgreSQL started), run side by side, interleaved, in fresh processes.

    python -m benchmarks.cli_startup --runs 15

The old CLI is copied into a temporary directory with its relative imports made absolute, so
both run against the same installed packages. Times are wall-clock seconds of the whole process.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BEFORE = "8262960"  # the last commit of the single-module CLI
CASES = {
    "--help": ["--help"],
    "unknown flag": ["--bogus"],
    "bad --theta (needs no database)": ["override", "pin", "cdn", "--theta", "{bad"],
}


def old_cli(workdir: Path) -> Path:
    source = subprocess.run(
        ["git", "show", f"{BEFORE}:booster/gemini_booster/cli.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    source = source.replace("from . import", "from gemini_booster import").replace(
        "from .", "from gemini_booster."
    )
    path = workdir / "old_booster_cli.py"
    path.write_text(source)
    return path


def once(cmd: list[str], data_dir: Path) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GEMINI_BOOSTER_")}
    env["GEMINI_BOOSTER_DATA_DIR"] = str(data_dir)
    began = time.perf_counter()
    subprocess.run(cmd, env=env, capture_output=True, timeout=600)
    return time.perf_counter() - began


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--old-db-runs", type=int, default=2, help="old CLI's bad --theta runs")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        old = [sys.executable, str(old_cli(work))]
        new = [sys.executable, "-m", "gemini_booster.cli"]
        print("| case | CLI | runs | median s | min s | max s | old ÷ new (median) |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for case, argv in CASES.items():
            needs_db = "theta" in case
            times: dict[str, list[float]] = {"before (8262960)": [], "now": []}
            for i in range(args.runs):
                times["now"].append(once([*new, *argv], work / f"new-{i}"))
                if not needs_db or i < args.old_db_runs:  # the old one starts PostgreSQL here
                    times["before (8262960)"].append(once([*old, *argv], work / f"old-{i}"))
            medians = {k: statistics.median(v) for k, v in times.items()}
            ratio = medians["before (8262960)"] / medians["now"]
            for name, ts in times.items():
                cell = f"{ratio:.1f}×" if name == "now" else ""
                print(
                    f"| {case} | {name} | {len(ts)} | {statistics.median(ts):.2f} | "
                    f"{min(ts):.2f} | {max(ts):.2f} | {cell} |"
                )


if __name__ == "__main__":
    main()
