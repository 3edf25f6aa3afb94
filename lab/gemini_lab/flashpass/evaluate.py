"""FlashPass against CUBIC and BBR on a shallow buffer with mixed RTTs, at the lab's scale.

The paper's static experiment (§4.5.2: a dumbbell, 10 Gbit/s, N senders whose one-way delay
to the bottleneck is drawn from U(0, 20 ms), flows starting within 0.2 s, a 20 KB/Gbit/s
buffer) scaled by 1/1000 in rate: 10 Mbit/s, the same delays, and "shallow" redefined in
packets (the paper's buffer is 200 KB = 133 packets at 10 Gbit/s; at 10 Mbit/s the same
20 KB/Gbit/s is 200 bytes, less than a packet, so the data buffer is 16 packets, about half
the longest path's BDP). Each seed draws the senders' delays and the flows' start offsets; one
UML boot per seed runs FlashPass, CUBIC and BBR on the same draw, each on a fresh topology.

    python -m gemini_lab.flashpass.evaluate --seeds 1 2 3 --held-out 4
(the table on stdout and in var/flashpass-eval/table.md, every run's figures in raw.json).
``--senders 20`` runs the paper's headline N = 20 (the same path, 20 senders, one 1 MB flow
each); ``--transports`` picks the arms, among them ``gemini``: the lab's tcp_gemini module at
its scaled defaults (gemini_lab.datapath_signals.scaled_theta, C = the link's rate), loaded in
the guest from the UML module build. The data queue is a bfifo that marks no ECN, so dctcp
has no arm here.
FlashPass runs the paper's θ unless ``--theta NAME=UNITS ...`` changes some of it (spec units;
a θ outside Θ' is refused before any boot).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from gemini_api.datapaths import datapath
from gemini_api.theta import ThetaError
from gemini_lab.flashpass.switch import DATA_QDISC, EMULATION_QDISC
from gemini_lab.uml import run_in_uml

TRANSPORTS = ("flashpass", "cubic", "bbr")
ALL_TRANSPORTS = (*TRANSPORTS, "gemini")
GEMINI = "gemini"
RATE_KBIT = 10_000
BUFFER_PACKETS = 16
RETURN_MS = 10.0
MAX_ONE_WAY_MS = 20.0  # the paper's U(0, 20 ms)
STARTS_WITHIN_MS = 200.0
SENDERS = 4
FLOW_BYTES = 1_000_000
THETA = {"min_target_loss": 10, "max_target_loss": 100, "t_wait": 400}  # the paper's defaults


def gemini_arm() -> dict:
    """GEMINI's fields in a run: its scaled defaults and C, the bottleneck's rate."""
    from gemini_lab.datapath_signals import gemini_extra, scaled_theta

    return {"datapath": GEMINI, "gemini_theta": scaled_theta(GEMINI)} | {
        "module_extra": gemini_extra(RATE_KBIT / 1000)
    }


def seed_runs(
    seed: int,
    theta: dict[str, int] | None = None,
    senders: int = SENDERS,
    transports: tuple[str, ...] = TRANSPORTS,
) -> list[dict]:
    rng = random.Random(seed)
    delays = [round(rng.uniform(0, MAX_ONE_WAY_MS), 1) for _ in range(senders)]
    flows = [
        {
            "flow": i + 1,
            "bytes": FLOW_BYTES,
            "sender": i,
            "start_ms": rng.uniform(0, STARTS_WITHIN_MS),
        }
        for i in range(senders)
    ]
    base = {
        "rate_kbit": RATE_KBIT,
        "data_buffer_packets": BUFFER_PACKETS,
        "return_ms": RETURN_MS,
        "sender_delays_ms": delays,
        "flows": flows,
        "theta": theta or THETA,
    }
    return [base | {"transport": t} | (gemini_arm() if t == GEMINI else {}) for t in transports]


def _qdisc(result: dict, handle: str) -> dict:
    (q,) = [q for q in result["qdiscs"] if q["handle"] == handle]
    return q


def summary(result: dict) -> dict:
    """Utilisation over the run, the data queue's loss, the mean and slowest FCT."""
    data = _qdisc(result, DATA_QDISC)
    delivered = len(result["fct_s"]) * FLOW_BYTES
    row = {
        "utilisation": delivered * 8 / (RATE_KBIT * 1000 * result["makespan_s"]),
        "data_loss": data["drops"] / max(1, data["packets"] + data["drops"]),
        "mean_fct_s": sum(result["fct_s"]) / len(result["fct_s"]),
        "max_fct_s": max(result["fct_s"]),
        "complete": all(rc == 0 for rc in result["sender_rc"]),
    }
    if result["transport"] == "flashpass":
        emu = _qdisc(result, EMULATION_QDISC)
        row["emulation_loss"] = emu["drops"] / max(1, emu["packets"] + emu["drops"])
        row["complete"] &= all(s["finished"] for s in result["senders"])
    return row


def run_seed(
    seed: int,
    out: Path,
    theta: dict[str, int] | None = None,
    senders: int = SENDERS,
    transports: tuple[str, ...] = TRANSPORTS,
) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    runs = seed_runs(seed, theta, senders, transports)
    plan: dict = {"runs": runs}
    if GEMINI in transports:  # the guest's datapath_guest.load_module finds it by "module"
        from gemini_lab.uml import build_kernel, build_module

        plan["module"] = str(build_module(build_kernel()))
    (out / "plan.json").write_text(json.dumps(plan))
    files = '"$GEMINI_LAB_OUT/plan.json" "$GEMINI_LAB_OUT/result.json"'
    cmd = f"{sys.executable} -m gemini_lab.flashpass.lab {files}"
    run_in_uml(cmd, out, timeout_s=1500)
    results = json.loads((out / "result.json").read_text())
    rows = {}
    for run, res in zip(runs, results, strict=True):
        if "error" in res:
            raise RuntimeError(f"seed {seed} {run['transport']}: {res['error']}")
        rows[run["transport"]] = summary(res)
    return {"seed": seed, "delays_ms": runs[0]["sender_delays_ms"], "rows": rows}


def _span(values: list[float], fmt: str) -> str:
    return f"{format(min(values), fmt)}–{format(max(values), fmt)}"


def table(seeds: list[dict]) -> list[str]:
    if not seeds:
        return ["(none)"]
    lines = [
        "| transport | utilisation | data-queue loss | mean FCT (s) | slowest FCT (s) "
        "| emulation loss | complete |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in [t for t in ALL_TRANSPORTS if t in seeds[0]["rows"]]:
        rows = [s["rows"][t] for s in seeds]
        slowest = _span([r.get("max_fct_s", float("nan")) for r in rows], ".2f")
        emu = _span([r["emulation_loss"] for r in rows], ".1%") if t == "flashpass" else "—"
        lines.append(
            f"| {t} | {_span([r['utilisation'] for r in rows], '.1%')} "
            f"| {_span([r['data_loss'] for r in rows], '.2%')} "
            f"| {_span([r['mean_fct_s'] for r in rows], '.2f')} | {slowest} | {emu} "
            f"| {sum(r['complete'] for r in rows)}/{len(rows)} |"
        )
    return lines


def options(ap: argparse.ArgumentParser) -> None:
    """The study's options (also for a row of the lab CLI's STUDIES table)."""
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--held-out", type=int, nargs="*", default=[4])
    ap.add_argument("--work", type=Path, default=Path("var/flashpass-eval"))
    ap.add_argument("--theta", nargs="*", default=[], metavar="NAME=UNITS", type=_setting)
    ap.add_argument("--senders", type=int, default=SENDERS)
    ap.add_argument("--transports", nargs="+", default=list(TRANSPORTS), choices=ALL_TRANSPORTS)


def _setting(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    if not sep or not value.strip().lstrip("-").isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=UNITS (an integer)")
    return name.strip(), int(value)


def flashpass_theta(settings: list[tuple[str, int]]) -> dict[str, int]:
    """The paper's θ with ``settings`` in place; ThetaError naming a parameter outside Θ'."""
    spec = datapath("flashpass").spec
    unknown = {n for n, _ in settings} - set(spec.names)
    if unknown:
        raise ThetaError(f"no FlashPass parameter {sorted(unknown)}; have {list(spec.names)}")
    return spec.validate(THETA | dict(settings), spec.limits)


def run(a: argparse.Namespace) -> None:
    """Every seed in UML, then the tables (stdout and ``work``/table.md)."""
    theta = flashpass_theta(a.theta)
    arms = tuple(a.transports)
    main_runs = [run_seed(s, a.work / f"seed{s}", theta, a.senders, arms) for s in a.seeds]
    held = [run_seed(s, a.work / f"seed{s}", theta, a.senders, arms) for s in a.held_out]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    lines = [
        f"FlashPass's θ {theta} (the paper's: {THETA}); {a.senders} senders.",
        "",
        f"Seeds {a.seeds} (min–max over seeds):",
        "",
        *table(main_runs),
        "",
        f"Held-out seeds {a.held_out} (no setting was looked at on them):",
        "",
        *table(held),
        "",
        "Per seed (senders' one-way delays, ms): "
        + "; ".join(f"{s['seed']}: {s['delays_ms']}" for s in main_runs + held),
        "",
        f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC at commit {commit.stdout.strip()}.",
    ]
    print("\n".join(lines))
    (a.work / "raw.json").write_text(json.dumps(main_runs + held, indent=1))
    (a.work / "table.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    options(ap)
    run(ap.parse_args())


if __name__ == "__main__":
    main()
