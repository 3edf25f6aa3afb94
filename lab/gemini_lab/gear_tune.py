"""Booster-tuned Gear (issue #36): the objective Booster's planner is given for Gear's
intra/cross pair, the bottlenecks it is tuned and held out on, and the held-out comparison of
the tuned θ with the paper's defaults, in the UML lab (simulated clock).

The objective. Gear's aim is that an intra-DC and a cross-DC flow through one port share it
evenly (the paper's normalised intra/cross share ≈ 1) while the port stays near η of its line.
Booster's objective (eq. 9, ``gemini_api.sums``) is a mean over reported flows of
x − σ·d; it has no term across flows, so fed the two flows as two flows it sees only their
total (a θ that starves the cross flow scores as well as a fair one). What it can express: the
pair reported as *one* flow whose x is the pair's **fair goodput** n · min_i(x_i) — the goodput
the port would carry if every flow got what the slowest got — and whose d is the flows' mean
queueing delay. Then eq. 9's mean over a θ's pairs is the mean fair goodput less σ · delay:
for two flows 2·min(x_i, x_c) = (x_i + x_c) · 2 / (1 + share), the total (utilisation) scaled
down by the imbalance (share 1.6 keeps 77 % of it, share 1 all of it). An agent does not report
this today (it reports flows, not pairs of flows sharing a port): the lab builds it from the
pair's two flows, and the planner, its trials and the service's assignment are Booster's own
(``gemini_lab.plannertune``).

The bottlenecks: ``gear-pair`` (tuned on: gemini_lab.gear's pair, 100 Mbit/s, 2 ms and 40 ms,
500 packets) and ``gear-pair-heldout`` (no setting chosen on it: 60 Mbit/s, 2 ms and 30 ms,
300 packets). k is pinned at 10 on both: it only classes the flows, and at the lab's
CRTT/IRTT (20, 15) the paper's k = 100 would class the cross-DC flow as intra-DC.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from gemini_api.sums import FlowSums
from gemini_lab import gear
from gemini_lab.scenario import Scenario

PAIR_KIND = "gear_pair"
GEAR = "gear"  # the datapath


@dataclass(frozen=True)
class PairPath:
    """One port an intra-DC and a cross-DC flow share (the pair's context)."""

    name: str
    rate_mbit: int
    rtts_ms: tuple[int, int]  # intra-DC, cross-DC
    queue_packets: int

    def scenario(self) -> Scenario:
        """The guest path that stands for this context (the pair runs in gemini_lab.fairness'
        own namespaces; the path only gives the context its name)."""
        return replace(gear.GEAR_PATH, name=self.name, rate_mbit=self.rate_mbit)


TUNE_PAIR = PairPath("gear-pair", gear.RATE_MBIT, (2, 40), gear.PAIR_QUEUE)
HELDOUT_PAIR = PairPath("gear-pair-heldout", 60, (2, 30), 300)
PAIR_PATHS = {p.name: p for p in (TUNE_PAIR, HELDOUT_PAIR)}
TUNE_PAIR_S = 10  # one host's round: one pair this long
# θ the planner does not search: k (see the module's notes); the paper's defaults otherwise
PINNED = tuple(gear.GEAR_PAIR_THETA.items())
SEARCHED = ("target_util", "ai_step_bdp", "max_stage")
# held-out runs: (duration s, the cross-DC flow's start after the intra-DC flow's, s); the
# simulated clock repeats a run, so the runs differ in length and start
HELDOUT_RUNS = ((12, 0), (15, 1), (18, 2))


def pair_path(name: str) -> PairPath:
    try:
        return PAIR_PATHS[name]
    except KeyError:
        raise ValueError(
            f"no Gear pair context {name!r}; known: {', '.join(sorted(PAIR_PATHS))}"
        ) from None


def pair_experiment(
    path: PairPath, theta: dict[str, int], duration_s: float, start_s: float = 0
) -> dict:
    """A ``gear_pair`` run of ``theta`` on ``path`` (label and port left to the caller)."""
    return {
        "kind": PAIR_KIND,
        "rate_kbit": path.rate_mbit * 1000,
        "queue_packets": path.queue_packets,
        "rtts_ms": list(path.rtts_ms),
        "starts_s": [0, start_s],
        "dc_base_rtt_us": path.rtts_ms[0] * 1000,
        "theta": theta,
        "duration_s": duration_s,
    }


def fair_goodput(result: dict) -> float:
    """n · the slowest flow's goodput (Mbit/s): the pair's total if it were shared evenly at
    the slowest flow's rate."""
    rates = [f["throughput_mbps"] for f in result["flows"]]
    return len(rates) * min(rates)


def pair_delay_ms(result: dict) -> float:
    return statistics.fmean(f["queue_delay_ms"] for f in result["flows"])


def pair_sums(result: dict) -> FlowSums:
    """The pair as Booster's objective is given it: one flow of its fair goodput."""
    return FlowSums.of_flow(fair_goodput(result), pair_delay_ms(result))


def pair_row(result: dict) -> dict:
    """A round's row for one pair: the objective's figures and what they came from."""
    return {
        "mbps": fair_goodput(result),
        "queue_ms": pair_delay_ms(result),
        "retransmits": sum(f["retransmits"] for f in result["flows"]),
        "share": gear.pair_share(result),
        "total_mbps": sum(f["throughput_mbps"] for f in result["flows"]),
    }


# --- the held-out comparison -------------------------------------------------------------------


def default_theta() -> dict[str, int]:
    from gemini_api.datapaths import datapath

    return {**datapath(GEAR).spec.default(), **dict(PINNED)}


def heldout_plan(tuned: dict[str, int], path: PairPath = HELDOUT_PAIR) -> dict:
    """The paper's defaults and the tuned θ, each in every held-out run, one boot."""
    experiments = []
    for arm, theta in (("default", default_theta()), ("tuned", tuned)):
        for d, start in HELDOUT_RUNS:
            e = pair_experiment(path, theta, d, start)
            experiments.append({"label": f"{path.name}/{arm}/{d}s", **e})
    return {"paths": [path.scenario().to_dict()], "experiments": experiments}


def _span(xs: list[float], fmt: str = ".1f") -> str:
    return f"{min(xs):{fmt}}–{max(xs):{fmt}}"


def arm_rows(results: dict, arm: str) -> list[dict]:
    ex = results["experiments"]
    return [pair_row(r) for k, r in ex.items() if f"/{arm}/" in k and "flows" in r]


def heldout_table(results: dict, tuned: dict[str, int], sigma: float,
                  path: PairPath = HELDOUT_PAIR) -> str:  # fmt: skip
    """Default against tuned on the held-out port: share, fair goodput, eq. 9, use of the line."""
    lines = [
        f"Held out: `{path.name}` ({path.rate_mbit} Mbit/s, RTTs {path.rtts_ms[0]} and "
        f"{path.rtts_ms[1]} ms, {path.queue_packets} packets), runs (s, cross start) "
        f"{list(HELDOUT_RUNS)}; tuned θ {tuned}, default {default_theta()}.",
        "",
        "| θ | runs | intra / cross | fair goodput Mbit/s | eq. 9 (σ = "
        f"{sigma:g}) | total Mbit/s | of the line | queue ms | retransmits |",
        "|---|---:|---|---|---|---|---|---|---|",
    ]
    means = {}
    for arm in ("default", "tuned"):
        rows = arm_rows(results, arm)
        if not rows:
            lines.append(f"| {arm} | 0 | error |")
            continue
        u = [r["mbps"] - sigma * r["queue_ms"] for r in rows]
        means[arm] = (min(u), max(u))
        line = [r["total_mbps"] * gear.PACKET_BYTES / 1448 / path.rate_mbit for r in rows]
        lines.append(
            f"| {arm} | {len(rows)} | {_span([r['share'] for r in rows], '.2f')} | "
            f"{_span([r['mbps'] for r in rows])} | {_span(u)} | "
            f"{_span([r['total_mbps'] for r in rows])} | {_span(line, '.2f')} | "
            f"{_span([r['queue_ms'] for r in rows], '.2f')} | "
            f"{_span([r['retransmits'] for r in rows], '.0f')} |"
        )
    return "\n".join([*lines, "", verdict(means)]) + "\n"


def verdict(spans: dict[str, tuple[float, float]]) -> str:
    """Tuned better, worse, or a tie (the min–max spans of eq. 9 overlap)."""
    if set(spans) != {"default", "tuned"}:
        return "No verdict: an arm has no run."
    (dlo, dhi), (tlo, thi) = spans["default"], spans["tuned"]
    if tlo > dhi:
        return "Tuned better than the defaults on every held-out run (the spans do not overlap)."
    if thi < dlo:
        return "Tuned worse than the defaults (the spans do not overlap)."
    return "A tie: the tuned and default spans overlap."


# --- the baselines beside Gear on the held-out port --------------------------------------------

HELDOUT_BASELINES = ("gemini", "dctcp")


def baselines_plan(path: PairPath = HELDOUT_PAIR, ccs: tuple[str, ...] = HELDOUT_BASELINES) -> dict:
    """Each baseline's intra/cross pair on ``path``, once per held-out run length, as the pair
    benchmark runs them (gemini_lab.gear.pair_plan: RED marking at its K, receivers on dctcp,
    GEMINI at its scaled defaults with C = the port's rate). The two flows start together:
    ``datapath_pair`` has no staggered start."""
    port = (path.rate_mbit, path.queue_packets, list(path.rtts_ms))
    experiments = [
        gear.baseline_pair(f"{path.name}/{cc}/{d}s", cc, port, d)
        for cc in ccs
        for d, _ in HELDOUT_RUNS
    ]
    scen = replace(path.scenario(), receiver_cc="dctcp")
    return {"paths": [scen.to_dict()], "experiments": experiments}


def baselines_table(results: dict, path: PairPath = HELDOUT_PAIR,
                    ccs: tuple[str, ...] = HELDOUT_BASELINES) -> str:  # fmt: skip
    """One row per baseline: the held-out table's columns, min–max over its runs."""
    lines = [
        "| CC | runs | intra / cross | fair goodput Mbit/s | total Mbit/s | of the line | "
        "queue ms | retransmits |",
        "|---|---:|---|---|---|---|---|---|",
    ]
    for cc in ccs:
        rows = arm_rows(results, cc)
        if not rows:
            lines.append(f"| {cc} | 0 | error |")
            continue
        line = [r["total_mbps"] * gear.PACKET_BYTES / 1448 / path.rate_mbit for r in rows]
        lines.append(
            f"| {cc} | {len(rows)} | {_span([r['share'] for r in rows], '.2f')} | "
            f"{_span([r['mbps'] for r in rows])} | {_span([r['total_mbps'] for r in rows])} | "
            f"{_span(line, '.2f')} | {_span([r['queue_ms'] for r in rows], '.2f')} | "
            f"{_span([r['retransmits'] for r in rows], '.0f')} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    """``python -m gemini_lab.gear_tune OUT``: the baselines on the held-out port, one UML boot;
    prints the table (results.json under OUT)."""
    import sys
    from pathlib import Path

    from gemini_lab.host import run_plan

    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m gemini_lab.gear_tune OUT_DIR")
    results = run_plan(baselines_plan(), Path(sys.argv[1]), backend="uml", timeout_s=3600)
    print(baselines_table(results))


if __name__ == "__main__":
    main()
