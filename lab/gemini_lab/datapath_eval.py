"""The datapaths' recorded evaluation (issue #31): GEMINI and DC-Vegas on the scaled scenarios
beside cubic, bbr, dctcp (and reno, vegas for DC-Vegas' incast), in the UML lab:
``gemini-lab datapath-eval``.

Everything runs in one UML boot on the simulated clock (figures do not move with host load;
a rerun of the same plan gives the same figures, gemini_lab.determinism). The cheapest
faithful subset of the papers' experiments, scaled by s = 10 (DATAPATHS-SPEC.md 0.3, 1.7, 2.5):

- ``dc/<arm>``: one long flow on the datacenter path (100 Mbit/s, 2 ms, RED marking at K = 20
  packets, 100 packets of buffer): utilisation and the switch's queue (GEMINI's datacenter
  hop; DC-Vegas without ECN against DCTCP with it, the paper's V1/V5 in one flow);
- ``dc-matched/k<K>/<arm>``: DC-Vegas at K_dcv = K against DCTCP with its switch marking at
  K (K_dc = N · K_dcv with N = 1, DATAPATHS-SPEC.md 2.5), K = 6 and 24, on the datacenter path
  otherwise unchanged: the paper's comparison of the two queues at the same threshold;
- ``wan/<arm>``: one long flow on the cross-dc path (a 100 Mbit/s datacenter hop marking at
  50 packets, then an 80 Mbit/s WAN hop with 10 000 packets of buffer; 100 ms): WAN
  throughput and the queue on each hop (G6 with one flow);
- ``mixed/<arm>#<run>``: an intra-datacenter flow (2 ms) and an inter-datacenter one (16 ms,
  8x) started together through one 100 Mbit/s switch marking at 50 packets (G8 with 1 + 1
  flows, a harder case than the paper's): Jain's index of their throughputs; GEMINI also with
  h_min = 0.01 (``gemini-hmin1``), the floor that keeps h ∝ RTT_base for the 2 ms flow;
- ``mixed-4x4/<arm>#<run>``: the paper's G8 (Fig. 11): 4 intra- and 4 inter-datacenter flows,
  every ECN user at K = 300 packets (GEMINI's K too); Jain's index over the eight flows;
- ``incast/<arm>``: 40 senders answering 1 MB together through the dc-incast port (57
  packets, K = 20): completion, retransmission timeouts (V3/V4);
- GEMINI tuned: the paper's G6 sweep of T and β, on the cross-dc path (the training
  scenario), the θ with the best utility chosen there; then GEMINI at the defaults and tuned on
  a held-out cross-datacenter path no setting was chosen on (``heldout/<arm>``).

GEMINI's defaults are the paper's scaled: T = 5 ms × 10, C = 100 Mbit/s (``capacity_mbit``);
DC-Vegas' are its spec's (K_dcv = 6, g = 1/16).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from gemini_lab import scenario
from gemini_lab.datapath_signals import GEMINI, scaled_theta
from gemini_lab.host import REPO
from gemini_lab.recorded import flow_utility
from gemini_lab.scenario import Scenario

# of host time for one boot: a loaded 2-core host ran this plan's 29 flows past run_plan's
# default half hour (the guest's clock is simulated: host time only bounds the wait)
RUN_TIMEOUT_S = 4 * 3600
RESULTS_PATH = REPO / "benchmarks" / "results" / "datapaths-eval.md"
DCVEGAS = "dcvegas"
GOODPUT = 1448 / 1514
SIGMA = 0.1  # utility = throughput (Mbit/s) − σ · queueing delay (ms), Booster's default σ
C_MBIT = 100
# arms: (label, datapath or None, cc, θ over the spec's defaults)
BASELINES = ("dctcp", "cubic", "bbr")
DC_ARMS = ("gemini", *BASELINES, DCVEGAS, "vegas", "reno")
WAN_ARMS = ("gemini", *BASELINES)
MIXED_ARMS = ("gemini", *BASELINES)
INCAST_ARMS = (DCVEGAS, "dctcp", "reno", "vegas", "cubic")
# (senders, total bytes): the paper's 1 MB and 4 MB answers (V3); 1 MB over 40 senders is 17
# packets each, under two initial windows, so no CC acts before the first losses
INCAST_CASES = ((40, 1_000_000), (40, 4_000_000), (20, 4_000_000))


def incast_prefix(n: int, total: int) -> str:
    return "incast" if (n, total) == INCAST_CASES[0] else f"incast-{n}x{total // 1_000_000}MB"


# the G6 sweep (T in µs after scaling, β in 1/100)
T_SWEEP_US = (30_000, 50_000, 80_000)
BETA_SWEEP = (10, 20, 30)
MIXED_RTTS_MS = (2.0, 16.0)
MIXED_RUNS = 3  # repeats in one boot: each starts from what the one before left, so they differ


@dataclass(frozen=True)
class MixedSetup:
    """One G8 setup: a group of ``flows`` connections per RTT through a switch marking at K."""

    prefix: str
    flows: int
    ecn_k: int
    title: str


MIXED_SETUPS = (
    MixedSetup("mixed", 1, 50, "1 + 1 flows, RED at 50 packets"),
    MixedSetup("mixed-4x4", 4, 300, "the paper's G8: 4 + 4 flows, RED at 300 packets"),
)
H_MIN_FAIR = 1  # h_min = 0.01: below the 2 ms flow's h = H·C·RTT_base = 0.024
HELDOUT = scenario.load("cross-dc-heldout")  # no setting was chosen on it


MATCHED_K = (6, 24)  # DC-Vegas' default K_dcv, and the signal checks' second one


def dc_matched(k: int) -> Scenario:
    """The shipped datacenter path with its switch marking at ``k`` packets."""
    dc = scenario.load("datacenter")
    return dataclasses.replace(
        dc,
        name=f"datacenter-k{k}",
        description=f"datacenter path with ECN at {k} packets",
        ecn_threshold_packets=k,
    )


def _arm(label: str) -> dict:
    """The experiment fields that name what runs: a datapath at its scaled defaults, or a CC."""
    if label == GEMINI:
        return {
            "datapath": GEMINI,
            "theta": scaled_theta(GEMINI),
            "module_extra": {"capacity_mbit": C_MBIT},
        }
    if label == DCVEGAS:
        return {"datapath": DCVEGAS, "theta": scaled_theta(DCVEGAS)}
    return {"cc": label}


def mixed_arms(setup: MixedSetup) -> dict[str, dict]:
    """The G8 arms: GEMINI told the switch's K (F = 4K/(C·RTT_base + K) assumes it), on the
    1 + 1 setup also with h_min = 0.01; the baselines as they are."""
    gemini = _arm(GEMINI)
    gemini["theta"] = {**gemini["theta"], "ecn_k": setup.ecn_k}
    arms = {GEMINI: gemini}
    if setup.flows == 1:
        arms["gemini-hmin1"] = {
            **gemini,
            "theta": {**gemini["theta"], "increase_min": H_MIN_FAIR},
        }
    arms.update({b: _arm(b) for b in MIXED_ARMS if b != GEMINI})
    return arms


def eval_plan(
    flow_s: float = 10, wan_s: float = 30, sweep: bool = True, only: str | None = None
) -> dict:
    """The plan; ``only``: just the experiments whose label starts with it."""
    dc, cross, incast = (scenario.load(n) for n in ("datacenter", "cross-dc", "dc-incast"))
    ex: list[dict] = []

    def flow(label: str, arm: dict, path: int, duration_s: float, hops: list[int]) -> None:
        ex.append(
            {
                "label": label,
                "kind": "datapath_flow",
                "path": path,
                "duration_s": duration_s,
                "omit_s": 2 if path == 0 else 5,
                "sample_s": 0.1 if path == 0 else 0.2,
                "hops": hops,
                **arm,
            }
        )

    for a in DC_ARMS:
        flow(f"dc/{a}", _arm(a), 0, flow_s, [0])
    for i, k in enumerate(MATCHED_K):
        dcv = {**_arm(DCVEGAS), "theta": {**scaled_theta(DCVEGAS), "queue_threshold": k}}
        flow(f"dc-matched/k{k}/dctcp", _arm("dctcp"), 3 + i, flow_s, [0])
        flow(f"dc-matched/k{k}/{DCVEGAS}", dcv, 3 + i, flow_s, [0])
    for a in WAN_ARMS:
        flow(f"wan/{a}", _arm(a), 1, wan_s, [0, 1])
    for setup in MIXED_SETUPS:
        for a, arm in mixed_arms(setup).items():
            for run in range(MIXED_RUNS):
                ex.append(
                    {
                        "label": f"{setup.prefix}/{a}#{run}",
                        "kind": "datapath_pair",
                        "rate_kbit": C_MBIT * 1000,
                        "queue_packets": 450,
                        "ecn_k": setup.ecn_k,
                        "rtts_ms": list(MIXED_RTTS_MS),
                        "parallel": setup.flows,
                        "duration_s": 2 * flow_s,
                        "omit_s": 5,
                        **arm,
                    }
                )
    for n, total in INCAST_CASES:
        for a in INCAST_ARMS:
            ex.append(
                {
                    "label": f"{incast_prefix(n, total)}/{a}",
                    "kind": "incast",
                    "path": 2,
                    "cc": a,
                    "flows": n,
                    "total_bytes": total,
                }
            )
    if sweep:
        for t in T_SWEEP_US:
            for b in BETA_SWEEP:
                arm = _arm(GEMINI)
                arm["theta"] = {**arm["theta"], "delay_threshold_us": t, "wan_decrease": b}
                flow(f"sweep/T{t // 1000}-b{b}", arm, 1, wan_s, [0, 1])
    for i, e in enumerate(ex):
        e["port_offset"] = i
    if only:
        ex = [e for e in ex if e["label"].startswith(only)]
    # both modules loaded first: incast sets its CC per socket, which needs it registered
    ex = [
        {"label": f"load/{n}", "kind": "datapath_load", "datapath": n} for n in (GEMINI, DCVEGAS)
    ] + ex
    return {
        "paths": [
            dc.to_dict(),
            cross.to_dict(),
            incast.to_dict(),
            *(dc_matched(k).to_dict() for k in MATCHED_K),
        ],
        "experiments": ex,
    }


DC_HELDOUT = scenario.load("datacenter-heldout")  # no setting was chosen on it


def heldout_path(name: str) -> Scenario:
    """Where a datapath's tuning is held out by default: GEMINI on a second cross-datacenter
    path, DC-Vegas on a second datacenter path."""
    return HELDOUT if name == GEMINI else DC_HELDOUT


def heldout_plan(
    tuned: dict[str, int], wan_s: float = 30, name: str = GEMINI, path: Scenario | None = None
) -> dict:
    """The datapath at its (scaled) defaults and tuned, beside baselines, where no setting was
    chosen: ``path`` (default heldout_path(name)); DC-Vegas also in the 40 × 4 MB incast."""
    arms = {name: _arm(name), f"{name}-tuned": {**_arm(name), "theta": tuned}}
    baselines = ("dctcp", "cubic") if name == GEMINI else ("dctcp", "reno", "vegas")
    arms.update({b: _arm(b) for b in baselines})
    path = path or heldout_path(name)
    hops = [0, 1] if path.hops else [0]
    ex: list[dict] = [
        {"label": f"load/{name}", "kind": "datapath_load", "datapath": name},
        *(
            {
                "label": f"heldout/{k}",
                "kind": "datapath_flow",
                "path": 0,
                "duration_s": wan_s,
                "omit_s": 5,
                "sample_s": 0.2,
                "hops": hops,
                "port_offset": 200 + i,
                **a,
            }
            for i, (k, a) in enumerate(arms.items())
        ),
    ]
    paths = [path.to_dict()]
    if name != GEMINI:  # DC-Vegas: the incast too, its θ written host-wide for it
        paths.append(scenario.load("dc-incast").to_dict())
        for k, a in arms.items():
            ex.append({"label": f"heldout-incast/{k}", "kind": "datapath_incast", "path": 1,
                       "flows": 40, "total_bytes": 4_000_000, **a})  # fmt: skip
    return {"paths": paths, "experiments": ex}


# --- figures ----------------------------------------------------------------------------------


def utility(r: dict) -> float:
    return flow_utility(r["throughput_mbps"], r["queue_delay_ms"], SIGMA)


def jain(xs: list[float]) -> float:
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)) if any(xs) else math.nan


def best_sweep(results: dict) -> tuple[str, dict[str, int]]:
    """The sweep cell with the best utility on the training path, and its θ."""
    cells = {k: v for k, v in results["experiments"].items() if k.startswith("sweep/")}
    ok = {k: v for k, v in cells.items() if "error" not in v}
    label = max(ok, key=lambda k: utility(ok[k]))
    return label, ok[label]["params_ran"]


def _q(r: dict, hop: str) -> str:
    q = r.get("queues", {}).get(hop)
    return "—" if not q or q["mean_qlen"] is None else f"{q['mean_qlen']:.1f} / {q['max_qlen']}"


def _row(label: str, r: dict, hops: tuple[str, ...]) -> str:
    if "error" in r:
        return f"| {label} | error: {r['error'].strip().splitlines()[-1][:80]} |"
    cap = r.get("_cap", C_MBIT * GOODPUT)
    return (
        f"| {label} | {r['throughput_mbps']:.1f} | {100 * r['throughput_mbps'] / cap:.0f} % | "
        f"{r['queue_delay_ms']:.1f} | " + " | ".join(_q(r, h) for h in hops) + f" | "
        f"{r['retransmits']} | {utility(r):.1f} |"
    )


def render(results: dict, command: str, heldout: dict | None = None) -> str:
    exps = results["experiments"]
    lines = [
        "# GEMINI and DC-Vegas against their baselines on the scaled scenarios (UML lab)",
        "",
        f"Command: `{command}`",
        "",
        "UML guest on its simulated clock, one boot (figures do not depend on host speed; the "
        "same plan gives the same figures on a rerun, so one run per cell: runs do not differ). "
        "Scaled by s = 10 (DATAPATHS-SPEC.md 0.3): 100 Mbit/s for 1 Gbit/s, times × 10. GEMINI "
        "at the paper's defaults scaled (T = 50 ms, C = 100 Mbit/s, K = 50, β = 0.2, H = 120); "
        "DC-Vegas at its spec's defaults (K_dcv = 6, g = 1/16), never ECN-capable. Receivers run "
        "dctcp (exact CE echo). Throughput is the receiver's goodput after the first seconds "
        "(omitted: slow start); queueing delay is the sender's mean smoothed RTT − min RTT; queue "
        "is the bottleneck qdisc's length sampled on the guest clock (mean / max packets). "
        f"Utility = throughput − {SIGMA:g} · queueing delay (Booster's σ).",
        "",
        "## Datacenter path (100 Mbit/s, 2 ms, RED marking at K = 20 packets, 100 packets of "
        "buffer; one flow)",
        "",
        "| arm | goodput Mbit/s | of capacity | queueing ms | queue pkts (mean / max) | "
        "retransmits | utility |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [_row(a, exps[f"dc/{a}"], ("0",)) for a in DC_ARMS if f"dc/{a}" in exps]
    matched = [k for k in MATCHED_K if f"dc-matched/k{k}/dctcp" in exps]
    if matched:
        lines += [
            "",
            "## DC-Vegas and DCTCP at the same threshold (datacenter path, DCTCP's switch marking "
            "at K, DC-Vegas at K_dcv = K, no ECN for it; one flow)",
            "",
            "| K | arm | goodput Mbit/s | of capacity | queueing ms | queue pkts (mean / max) | "
            "retransmits | utility |",
            "|---:|---|---:|---:|---:|---:|---:|---:|",
        ]
        for k in matched:
            for a in ("dctcp", DCVEGAS):
                r = exps.get(f"dc-matched/k{k}/{a}")
                if r:
                    lines.append(f"| {k} " + _row(a, r, ("0",)))
    wan_cap = 80 * GOODPUT
    lines += [
        "",
        "## Cross-datacenter path (DC hop 100 Mbit/s marking at 50 packets; WAN hop 80 Mbit/s, "
        "10 000 packets; 100 ms; one flow of 30 s)",
        "",
        "| arm | goodput Mbit/s | of WAN capacity | queueing ms | DC hop queue | WAN hop queue | "
        "retransmits | utility |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        _row(a, {**exps[f"wan/{a}"], "_cap": wan_cap}, ("0", "1"))
        for a in WAN_ARMS
        if f"wan/{a}" in exps
    ]
    for setup in MIXED_SETUPS:
        lines += ["", mixed_table(exps, setup)]
    lines += [
        "",
        "## Incast (dc-incast: 100 Mbit/s, 0.5 ms, 57 packets, RED at 20; N senders answer "
        "a total at once; timeouts = the sender namespace's TcpExt TCPTimeouts)",
        "",
        "| N × total | arm | completed | timeouts | retransmits | FCT mean ms | FCT max ms | "
        "marks | drops |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, total in INCAST_CASES:
        for a in INCAST_ARMS:
            r = exps.get(f"{incast_prefix(n, total)}/{a}")
            case = f"{n} × {total / 1e6:g} MB"
            if not r:
                continue
            if "error" in r:
                lines.append(f"| {case} | {a} | error |")
                continue
            lines.append(
                f"| {case} | {a} | {r['completed']}/{r['flows']} | {r['timeouts']} | "
                f"{r['retransmits']} | {r['fct_ms_mean']:.0f} | {r['fct_ms_max']:.0f} | "
                f"{r['queue']['marked']} | {r['queue']['drops']} |"
            )
    sweep = {k: v for k, v in exps.items() if k.startswith("sweep/")}
    if sweep:
        best, theta = best_sweep(results)
        lines += [
            "",
            "## GEMINI tuned: the G6 sweep of T and β on the cross-dc path (training)",
            "",
            "| T, β | goodput Mbit/s | of WAN capacity | queueing ms | DC hop queue | "
            "WAN hop queue | retransmits | utility |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        lines += [_row(k[6:], {**v, "_cap": wan_cap}, ("0", "1")) for k, v in sweep.items()]
        lines += ["", f"Chosen on this path: {best[6:]} (best utility)."]
        if heldout:
            lines += ["", heldout_table(heldout, theta)]
    return "\n".join(lines) + "\n"


def pair_shares(r: dict, omit_s: float = 5.0) -> tuple[list[float], list[float]]:
    """Per-flow throughput (Mbit/s) of a datapath_pair result, intra-datacenter group first:
    the receiver's goodput of each group divided among its connections, and each connection's
    own share from the sender's delivered packets over the sampled time after ``omit_s`` (Jain
    over the eight flows of the 4 + 4 setup needs those)."""
    n = r.get("parallel", 1)
    groups = [f["throughput_mbps"] / n for f in r["flows"] for _ in range(n)]
    own: list[float] = []
    for f in r["flows"]:
        by_sock: dict[int, list[dict]] = {}
        for x in f.get("samples", []):
            if x["t"] >= omit_s and x.get("tcpi_delivered") is not None:
                by_sock.setdefault(x.get("sport", 0), []).append(x)
        for xs in by_sock.values():
            dt = xs[-1]["t"] - xs[0]["t"]
            pkts = xs[-1]["tcpi_delivered"] - xs[0]["tcpi_delivered"]
            own.append(pkts * 1448 * 8 / dt / 1e6 if dt > 0 else 0.0)
    return groups, own


def mixed_table(exps: dict, setup: MixedSetup) -> str:
    """One G8 setup over its runs: min–max of each figure."""
    lines = [
        f"## Mixed RTTs through one datacenter switch ({setup.title}; 100 Mbit/s, 450 packets "
        f"of buffer; flows of {MIXED_RTTS_MS[0]:g} ms and {MIXED_RTTS_MS[1]:g} ms started "
        f"together; {MIXED_RUNS} runs, min–max)",
        "",
        "| arm | intra Mbit/s per flow | inter Mbit/s per flow | inter / intra | Jain | "
        "Jain, each flow's own share | marks |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for a in mixed_arms(setup):
        found = (exps.get(f"{setup.prefix}/{a}#{run}") for run in range(MIXED_RUNS))
        rs: list[dict] = [r for r in found if r and "error" not in r]
        if not rs:
            continue
        shares = [pair_shares(r) for r in rs]
        intra = [g[0] for g, _ in shares]
        inter = [g[-1] for g, _ in shares]
        own = [jain(o) for _, o in shares if o]
        lines.append(
            f"| {a} | {_span(intra, 1)} | {_span(inter, 1)} | "
            f"{_span([y / x for x, y in zip(intra, inter, strict=True)], 2)} | "
            f"{_span([jain(g) for g, _ in shares], 3)} | {_span(own, 3) if own else '—'} | "
            f"{_span([r['marked'] for r in rs])} |"
        )
    return "\n".join(lines) + "\n"


def heldout_table(
    heldout: dict, theta: dict[str, int], name: str = GEMINI, path: Scenario | None = None
) -> str:
    """The held-out boot's figures (heldout_plan)."""
    h = heldout["experiments"]
    path = path or heldout_path(name)
    hops = ("0", "1") if path.hops else ("0",)
    cap = min(x.rate_mbit for x in path.hops) if path.hops else path.rate_mbit or 0
    queues = " | ".join(f"hop {x} queue" for x in hops)
    lines = [
        f"## Held out: {path.description}",
        "",
        f"| arm | goodput Mbit/s | of capacity | queueing ms | {queues} | retransmits | utility |",
        "|---|---:|---:|---:|" + "---:|" * len(hops) + "---:|---:|",
    ]
    lines += [
        _row(k[8:], {**v, "_cap": cap * GOODPUT}, hops)
        for k, v in h.items()
        if k.startswith("heldout/")
    ]
    inc = {k: v for k, v in h.items() if k.startswith("heldout-incast/")}
    if inc:
        lines += [
            "",
            "Incast, 40 × 4 MB on dc-incast, the same θ:",
            "",
            "| arm | completed | timeouts | retransmits | FCT mean ms | FCT max ms |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for k, r in inc.items():
            if "error" in r:
                lines.append(f"| {k[15:]} | error |")
                continue
            lines.append(
                f"| {k[15:]} | {r['completed']}/{r['flows']} | {r['timeouts']} | "
                f"{r['retransmits']} | {r['fct_ms_mean']:.0f} | {r['fct_ms_max']:.0f} |"
            )
    changed = {k: v for k, v in theta.items() if scaled_theta(name).get(k) != v}
    lines += ["", f"Tuned θ (spec units; off the scaled defaults): {changed or 'none'}."]
    return "\n".join(lines) + "\n"


def run_eval(
    out: Path,
    command: str,
    *,
    flow_s: float = 10,
    wan_s: float = 30,
    sweep: bool = True,
    only: str | None = None,
) -> tuple[str, dict, dict | None]:
    """Both boots (the plan, then the held-out path with the θ the sweep chose); the record's
    text, and the two results (written as JSON beside it in ``out``)."""
    import json

    from gemini_lab.host import run_plan

    def progress(label: str, r: dict) -> None:
        print(f"  {label}: {r.get('elapsed_s')} s {r.get('error', '')[-300:]}", flush=True)

    results = run_plan(
        eval_plan(flow_s, wan_s, sweep and not only, only),
        out / "eval",
        backend="uml",
        progress=progress,
        timeout_s=RUN_TIMEOUT_S,
    )
    (out / "eval.json").write_text(json.dumps(results, indent=1))
    heldout = None
    if sweep and not only:
        _, theta = best_sweep(results)
        heldout = run_plan(
            heldout_plan(theta, wan_s),
            out / "heldout",
            backend="uml",
            progress=progress,
            timeout_s=RUN_TIMEOUT_S,
        )
        (out / "heldout.json").write_text(json.dumps(heldout, indent=1))
    return render(results, command, heldout), results, heldout


def _span(values: list[float], digits: int = 0) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.{digits}f}" if lo == hi else f"{lo:.{digits}f}–{hi:.{digits}f}"


def incast_runs_table(runs: list[dict]) -> str:
    """The incast cells over several boots (each a ``--only incast`` results): min–max."""
    lines = [
        f"## Incast over {len(runs)} boots (min–max where they differ)",
        "",
        "| N × total | arm | completed | timeouts | retransmits | FCT mean ms | FCT max ms |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for n, total in INCAST_CASES:
        for a in INCAST_ARMS:
            label = f"{incast_prefix(n, total)}/{a}"
            rs = [r["experiments"][label] for r in runs if label in r["experiments"]]
            rs = [r for r in rs if "error" not in r]
            if not rs:
                continue
            lines.append(
                f"| {n} × {total / 1e6:g} MB | {a} | "
                f"{_span([r['completed'] for r in rs])}/{n} | "
                f"{_span([r['timeouts'] for r in rs])} | {_span([r['retransmits'] for r in rs])} | "
                f"{_span([r['fct_ms_mean'] for r in rs])} | "
                f"{_span([r['fct_ms_max'] for r in rs])} |"
            )
    return "\n".join(lines) + "\n"
