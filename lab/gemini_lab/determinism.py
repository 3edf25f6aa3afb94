"""Does a lab figure hold under host load? The same plan, idle and with every host core busy.

    gemini-lab determinism [--repeats 2] [--duration 20] [--backend uml]

Runs one flow of cubic and of fusion on each Table IV path, ``repeats`` times with the host
idle and ``repeats`` times while this command keeps every host core busy with spinning
processes of its own (the load another job would bring), and records, per flow, the bytes,
throughput and retransmits of every run and their largest deviation from the first idle run.
Results: benchmarks/results/lab-determinism.md.
"""

from __future__ import annotations

import datetime as dt
import multiprocessing
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gemini_lab import plans, scenario
from gemini_lab.host import REPO, Backend, run_plan

RESULTS_PATH = REPO / "benchmarks" / "results" / "lab-determinism.md"
TABLE_IV = ("ethernet", "satellite", "cellular")
CCS = ("cubic", "fusion")
FIGURES = ("bytes_received", "throughput_mbps", "retransmits")


def _spin() -> None:
    while True:
        pass


@contextmanager
def busy_host(cores: int | None = None) -> Iterator[int]:
    """Every host core (or ``cores``) kept 100 % busy by a spinning process, for the block."""
    n = cores or os.cpu_count() or 1
    procs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(n)]
    for p in procs:
        p.start()
    try:
        yield n
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.join()


def flow_figures(results: dict) -> dict[str, dict]:
    """label → the compared figures of one run; an experiment that failed raises."""
    out = {}
    for label, r in results["experiments"].items():
        if "error" in r:
            raise RuntimeError(f"{label} failed:\n{r['error']}")
        out[label] = {k: r[k] for k in FIGURES}
    return out


def max_deviation(runs: list[dict[str, dict]], label: str, figure: str) -> float:
    """The largest |run − first run| / first run over the runs, for one flow's figure."""
    ref = runs[0][label][figure]
    if ref == 0:
        return 0.0 if all(r[label][figure] == 0 for r in runs) else float("inf")
    return max(abs(r[label][figure] - ref) / ref for r in runs)


def measure(repeats: int, duration_s: int, backend: Backend, out: Path) -> dict:
    plan = plans.repeat_plan([scenario.load(n) for n in TABLE_IV], CCS, duration_s)
    runs: dict[str, list[dict[str, dict]]] = {"idle": [], "loaded": []}
    wall: dict[str, list[float]] = {"idle": [], "loaded": []}
    for i in range(repeats):
        for load in ("idle", "loaded"):
            t0 = time.monotonic()
            if load == "loaded":
                with busy_host():
                    results = run_plan(plan, out / f"{load}-{i}", backend=backend)
            else:
                results = run_plan(plan, out / f"{load}-{i}", backend=backend)
            wall[load].append(time.monotonic() - t0)
            runs[load].append(flow_figures(results))
            print(f"{load} run {i + 1}: {wall[load][-1]:.0f} s wall", flush=True)
    return {"plan": plan, "runs": runs, "wall": wall, "kernel": results.get("kernel")}


def render(m: dict, command: str, backend: Backend) -> str:
    everything = m["runs"]["idle"] + m["runs"]["loaded"]
    labels = list(everything[0])
    rows = []
    for label in labels:
        cells = " / ".join(f"{r[label]['bytes_received']:,}" for r in everything)
        rows.append(
            f"| {label} | {cells} | "
            + " / ".join(f"{r[label]['throughput_mbps']:.3f}" for r in everything)
            + " | "
            + " / ".join(str(r[label]["retransmits"]) for r in everything)
            + " | "
            + " | ".join(f"{100 * max_deviation(everything, label, f):.2f} %" for f in FIGURES)
            + " |"
        )
    n = len(m["runs"]["idle"])
    idle_wall = sum(m["wall"]["idle"]) / n
    loaded_wall = sum(m["wall"]["loaded"]) / n
    simulated = sum(e["duration_s"] for e in m["plan"]["experiments"])
    return "\n".join(
        [
            "# Lab figures idle vs with every host core busy",
            "",
            f"Command: `{command}` (recorded {dt.date.today().isoformat()}, backend {backend}, "
            f"guest kernel {m['kernel']}, {os.cpu_count()} host cores).",
            "",
            f"Each run boots the guest once and runs one flow of {' and '.join(CCS)} on each "
            f"Table IV path ({', '.join(TABLE_IV)}). Runs alternate: idle, then loaded (this "
            f"command keeps all {os.cpu_count()} cores busy with spinning processes of its own "
            f"for the whole boot); {n} of each. Columns list the runs in the order idle 1.."
            f"{n}, loaded 1..{n}; deviation is the largest difference from idle run 1.",
            "",
            "| flow | bytes received | throughput Mbit/s | retransmits | "
            "max dev. bytes | max dev. throughput | max dev. retransmits |",
            "|---|---|---|---|---:|---:|---:|",
            *rows,
            "",
            f"Wall time per boot: idle {idle_wall:.0f} s, loaded {loaded_wall:.0f} s, for "
            f"{simulated} s of flows on the guest's clock ({simulated / idle_wall:.1f}× real "
            f"time idle, {simulated / loaded_wall:.1f}× loaded).",
            "",
        ]
    )


def run(repeats: int, duration_s: int, backend: Backend, out: Path, command: str) -> str:
    m = measure(repeats, duration_s, backend, out)
    text = render(m, command, backend)
    RESULTS_PATH.write_text(text)
    return text
