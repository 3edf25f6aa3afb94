"""FlashPass against CUBIC, BBR and GEMINI on a flow-size mix with Poisson arrivals: the
paper's FCT claim (its dynamic experiment: "lower FCT than Cubic on a WAN flow-size mix") at
the lab's scale.

The paper's dynamic experiment draws flow sizes from Alibaba's WAN distribution, of which
DATAPATHS-SPEC.md gives only the mean (65 MB) and the share above 10 MB (84.2 %); no CDF of
it is public here, and none is invented. The stated substitute is the DCTCP web-search CDF
already used by the GEMINI FCT experiment (gemini_lab.websearch, ``workloads/websearch.cdf``:
Alizadeh et al., SIGCOMM 2010, as tabulated in alibaba-edu/High-Precision-Congestion-Control
``traffic_gen/WebSearch_distribution.txt``; mean 1.71 MB, 54 % of flows under 100 KB, 3 %
over 10 MB), with its sampling, its Poisson schedule and its size classes.

Rescaling: G9 ran this CDF's sizes unchanged on a 100 Mbit/s datacenter hop and an
80 Mbit/s WAN hop (s = 10). This path is FlashPass's 10 Mbit/s one, so every size is divided
by ``SIZE_SCALE`` = 10: a flow then takes as long alone on this link as the unscaled flow on
a 100 Mbit/s one (mean 171 KB, at most 3 MB; 4.6 BDPs of the longest, 30 ms, path; the
Alibaba mix's 65 MB is 0.65–1.3 BDPs of the paper's 40–80 ms WAN round trips at 10 Gbit/s).
The classes are the CDF's, before scaling: small < 100 KB (< 10 KB = 1–7 packets here),
large > 10 MB (> 1 MB here).

The path is the N = 20 static experiment's (gemini_lab.flashpass.evaluate, ``--senders 20``:
10 Mbit/s, the 16-packet data bfifo, 20 senders with one-way delays U(0, 20 ms) drawn by the
seed as there, 10 ms return). Arrivals are Poisson at ``load`` of the link, λ = load · 10
Mbit/s / mean size; each flow goes from a sender drawn uniformly among the 20. A seed fixes
the delays, the schedule and the senders; every transport runs the same draw, one after
another in one UML boot per seed, each on a fresh topology. Each flow is one process (the
FlashPass sender, or a TCP ``gemini_lab.bulk put``), its FCT the guest clock from its start
to its exit: the receiver's DONE (FlashPass) or close (TCP) back at the sender.

``--transports dctcp`` adds DCTCP, whose data queue is RED marking ECN from DCTCP_K packets on
(the others meet the bfifo); ``--transports flashpass-star`` adds FlashPass*, the paper's
Aeolus-enhanced variant whose FCTs its headline reports: the pre-credit phase and a data queue
that drops unscheduled data above 2 packets (gemini_lab.flashpass.sender and .switch).
``--theta NAME=UNITS ...`` runs FlashPass's arms at the paper's θ with those settings in place
(refused outside Θ'). ``--access-ratio 10`` puts every arm's senders behind their own link at
a tenth of the bottleneck's rate (the paper's dynamic experiment: 1 Gbit/s hosts on a
10 Gbit/s WAN; gemini_lab.flashpass.lab, ``access_kbit``), FlashPass's senders taking it as
their line rate; without it the senders' links never limit. ``--wan-rtts`` gives each sender
one of the paper's WAN round trips (40, 60 or 80 ms) instead of the N = 20 path's 10-30 ms.
``table`` gathers a seed's arms from every directory given, each run's figures made again from
its boot's result.json (FlashPass's data lost on credits and before them, told apart there).

    python -m gemini_lab.flashpass.fctmix run --seed 1 --work DIR   one boot, DIR/seed1/
    python -m gemini_lab.flashpass.fctmix table DIR ... --held-out 4
"""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from gemini_lab.flashpass import evaluate
from gemini_lab.flashpass.lab import FLASHPASS_ARMS
from gemini_lab.flashpass.switch import DATA_QDISC, EMULATION_QDISC
from gemini_lab.websearch import (
    LARGE_BYTES,
    SMALL_BYTES,
    SizeCdf,
    arrival_rate,
    load_cdf,
    schedule,
)

SIZE_SCALE = 10  # the CDF's sizes ÷ this (see the module's notes)
LOAD = 0.8  # of the link: the paper's higher load (it ran 0.4 and 0.8)
FLOWS = 120
SENDERS = 20  # the N = 20 path
ACCESS_RATIO = 10  # the paper's dynamic experiment: hosts' 1 Gbit/s links, a 10 Gbit/s WAN
SENDER_SALT = 7919  # the senders' draw: its own generator, apart from the schedule's
TRANSPORTS = ("flashpass", "cubic", "bbr", "gemini")  # the default arms
DCTCP = "dctcp"
FLASHPASS, FLASHPASS_STAR = FLASHPASS_ARMS  # FlashPass and FlashPass* (pre-credit phase)
# dctcp and FlashPass* only when asked: their data queues differ (DCTCP_K, selective drop)
ARMS = (FLASHPASS, FLASHPASS_STAR, *TRANSPORTS[1:], DCTCP)
# dctcp's data queue marks ECN from K packets on (RED, the same 16-packet limit), where the
# others meet the plain bfifo: K > C·RTT/7 (DCTCP's guideline) at 10 Mbit/s of 1514-byte
# frames and the path's longest RTT, 30 ms, is 3.5 packets, so 4.
DCTCP_K = 4
# `run --buffer`: the bottleneck's data buffer, packets. evaluate.BUFFER_PACKETS (16) is half
# the longest path's BDP; the paper's 20 KB per Gbit/s is 0.2-0.4 % of its 40-80 ms paths'
# BDP, under a packet at 10 Mbit/s, so shallower buffers are the direction of the paper's.
# FlashPass*'s selective drop starts above 2 packets, and dctcp marks at half the buffer:
MIN_BUFFER_PACKETS = 4
# `run --wan-rtts`: the paper's dynamic experiment's round trips. Its three datacentres are 20,
# 30 and 40 ms apart one way, so a WAN flow's base RTT is 40, 60 or 80 ms; the N = 20 path's
# U(0, 20 ms) + 10 ms gives 10-30 ms. Each sender is given one of the three, drawn by the seed
# from its own generator, as its one-way delay plus the path's return (evaluate.RETURN_MS).
WAN_RTTS_MS = (40.0, 60.0, 80.0)
WAN_SALT = 104729
RUN_TIMEOUT_S = 3 * 3600  # host seconds for one boot (the guest's clock is simulated)
# the classes, in the CDF's (unscaled) bytes: label, lower bound, upper bound (exclusive)
CLASSES = (
    ("< 100 KB", 0, SMALL_BYTES),
    ("100 KB–1 MB", SMALL_BYTES, 1_000_000),
    ("1–10 MB", 1_000_000, LARGE_BYTES),
    ("> 10 MB", LARGE_BYTES, math.inf),
)


def scaled_cdf(cdf: SizeCdf, scale: float = SIZE_SCALE) -> SizeCdf:
    """``cdf`` with every size divided by ``scale``."""
    return SizeCdf(tuple((x / scale, p) for x, p in cdf.points))


def mix_flows(seed: int, flows: int = FLOWS, load: float = LOAD) -> list[dict]:
    """The seed's flows for gemini_lab.flashpass.lab: Poisson arrivals at ``load`` of the
    link, sizes from the scaled web-search CDF (gemini_lab.websearch.schedule), each from a
    sender drawn uniformly among ``SENDERS``."""
    cdf = scaled_cdf(load_cdf())
    rate = arrival_rate(load, evaluate.RATE_KBIT / 1000, cdf.mean())
    pick = random.Random(SENDER_SALT + seed)
    return [
        {
            "flow": i + 1,
            "bytes": f.size,
            "sender": pick.randrange(SENDERS),
            "start_ms": 1000 * f.at_s,
        }
        for i, f in enumerate(schedule(cdf, flows, rate, seed))
    ]


def wan_delays(seed: int, senders: int = SENDERS) -> list[float]:
    """Each sender's one-way delay under ``--wan-rtts``: a WAN_RTTS_MS round trip drawn by the
    seed, less the path's return."""
    pick = random.Random(WAN_SALT + seed)
    return [pick.choice(WAN_RTTS_MS) - evaluate.RETURN_MS for _ in range(senders)]


def mix_runs(
    seed: int,
    flows: int = FLOWS,
    load: float = LOAD,
    transports: Sequence[str] = TRANSPORTS,
    theta: dict[str, int] | None = None,
    access_ratio: int = 0,
    buffer_packets: int = evaluate.BUFFER_PACKETS,
    wan_rtts: bool = False,
) -> list[dict]:
    """One run per transport: the N = 20 path of ``seed`` (evaluate.seed_runs: the same
    delays) carrying the seed's mix instead of one 1 MB flow per sender; FlashPass's arms at
    ``theta`` (the paper's when None). ``access_ratio`` > 0 gives every sender, in every arm,
    an access link at the bottleneck's rate ÷ that ratio (ACCESS_RATIO: the paper's 1 Gbit/s
    hosts on its 10 Gbit/s WAN); 0, no access link (the senders' links never limit).
    ``buffer_packets`` is the bottleneck's data buffer; the access queues keep
    evaluate.BUFFER_PACKETS whatever it is, so that a sweep moves the bottleneck only.
    ``wan_rtts`` replaces the senders' delays with wan_delays (the paper's 40-80 ms round
    trips); it runs without access links only, whose netem queue would hold the longer delay's
    packets too and so be shallower than the shorter paths' (lab.sender_egress)."""
    if wan_rtts and access_ratio:
        raise ValueError(
            "wan_rtts: runs without access links only (an access queue also holds the packets "
            "still in its delay, so longer delays would make it shallower)"
        )
    if buffer_packets < MIN_BUFFER_PACKETS:
        raise ValueError(
            f"buffer_packets: {buffer_packets} is below {MIN_BUFFER_PACKETS}, the shallowest "
            "data buffer FlashPass*'s selective drop and dctcp's marking can run on"
        )
    mix = mix_flows(seed, flows, load)
    arms = evaluate.seed_runs(seed, theta, SENDERS, tuple(transports))
    access = (
        {"access_kbit": evaluate.RATE_KBIT // access_ratio,
         "access_buffer_packets": evaluate.BUFFER_PACKETS}
        if access_ratio
        else {}
    )  # fmt: skip
    depth = {"data_buffer_packets": buffer_packets}
    delays = {"sender_delays_ms": wan_delays(seed)} if wan_rtts else {}
    runs = [r | {"flows": mix} | access | depth | delays for r in arms]
    k = min(DCTCP_K, buffer_packets // 2)  # a mark before the limit on a shallow buffer
    dctcp = {"data_ecn_k_packets": k, "receiver_cc": DCTCP}
    return [r | dctcp if r["transport"] == DCTCP else r for r in runs]


def size_class(lab_bytes: int) -> int:
    """The index in CLASSES of a flow of ``lab_bytes`` (classed by its unscaled size)."""
    size = lab_bytes * SIZE_SCALE
    return next(i for i, (_, lo, hi) in enumerate(CLASSES) if lo <= size < hi)


def percentile(xs: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (nan for none)."""
    if not xs:
        return math.nan
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


@dataclass(frozen=True)
class MixFigures:
    class_mean_ms: tuple[float, ...]  # per CLASSES, over the completed flows (nan: none)
    class_flows: tuple[int, ...]
    small_p99_ms: float
    overall_mean_ms: float
    utilisation: float  # delivered bytes / (link · first arrival's start to last completion)
    data_loss: float
    emulation_loss: float | None  # FlashPass only
    complete: int  # flows that finished
    flows: int
    access_loss: float | None = None  # the senders' access queues' drops (with access links)
    # FlashPass's arms: the data its senders sent on credits (scheduled) and in FlashPass*'s
    # pre-credit phase (unscheduled) that never reached the receiver, each ÷ what was sent
    scheduled_loss: float | None = None
    unscheduled_loss: float | None = None


def figures(result: dict, flows: Sequence[dict]) -> MixFigures:
    """A run's figures from the lab's result and the flows it ran."""
    by_id = {f["flow"]: f for f in flows}
    fct = dict(zip(result["flow_ids"], result["fct_s"], strict=True))
    ok = dict(zip(result["flow_ids"], [rc == 0 for rc in result["sender_rc"]], strict=True))
    for s in result.get("senders", []):
        ok[s["flow"]] = ok[s["flow"]] and s["finished"]
    done = [f for f in flows if ok[f["flow"]]]
    per_class: list[list[float]] = [[] for _ in CLASSES]
    for f in done:
        per_class[size_class(f["bytes"])].append(1000 * fct[f["flow"]])
    counts = [0] * len(CLASSES)
    for f in flows:
        counts[size_class(f["bytes"])] += 1
    data = evaluate._qdisc(result, DATA_QDISC)
    emu = None
    if result["transport"] in FLASHPASS_ARMS:
        q = evaluate._qdisc(result, EMULATION_QDISC)
        emu = q["drops"] / max(1, q["packets"] + q["drops"])
    first = min(f["start_ms"] for f in flows) / 1000
    delivered = sum(by_id[f["flow"]]["bytes"] for f in done)
    all_ms = [1000 * fct[f["flow"]] for f in done]
    return MixFigures(
        class_mean_ms=tuple(sum(c) / len(c) if c else math.nan for c in per_class),
        class_flows=tuple(counts),
        small_p99_ms=percentile(per_class[0], 0.99),
        overall_mean_ms=sum(all_ms) / len(all_ms) if all_ms else math.nan,
        utilisation=delivered * 8 / (evaluate.RATE_KBIT * 1000 * (result["makespan_s"] - first)),
        data_loss=data["drops"] / max(1, data["packets"] + data["drops"]),
        emulation_loss=emu,
        complete=len(done),
        flows=len(flows),
        access_loss=access_loss(result),
        **data_losses(result),
    )


def data_losses(result: dict) -> dict[str, float | None]:
    """A FlashPass arm's data lost by kind, from its senders' and receiver's logs: every data
    packet sent (retransmissions included) less every one that arrived (duplicates included),
    the unscheduled ones told apart by their missing emulation timestamp. {} for TCP, and for a
    result without the receiver's counts."""
    if result["transport"] not in FLASHPASS_ARMS or "receiver" not in result:
        return {}
    received = result["receiver"]
    sent = unscheduled = arrived = unscheduled_in = 0
    for s in result["senders"]:
        r = received.get(str(s["flow"]), {})
        sent += len(s["data_sends"])
        unscheduled += len(s.get("unscheduled_sends", ()))
        arrived += r.get("received", 0) + r.get("duplicates", 0)
        unscheduled_in += r.get("unscheduled_in", 0)
    return {
        "scheduled_loss": (sent - (arrived - unscheduled_in)) / sent if sent else None,
        "unscheduled_loss": (unscheduled - unscheduled_in) / unscheduled if unscheduled else None,
    }


def access_loss(result: dict) -> float | None:
    """The senders' access queues' drops ÷ the packets offered them (None: no access link)."""
    qs = result.get("access_qdiscs")
    if not qs:
        return None
    drops = sum(q["drops"] for q in qs)
    return drops / max(1, drops + sum(q["packets"] for q in qs))


def offered(flows: Sequence[dict]) -> float:
    """The schedule's offered load: its bytes over its arrivals' span, as a share of the link."""
    span = (max(f["start_ms"] for f in flows) - min(f["start_ms"] for f in flows)) / 1000
    bits = sum(f["bytes"] for f in flows) * 8
    return bits / span / (evaluate.RATE_KBIT * 1000) if span > 0 else math.nan


def run_seed(
    seed: int,
    out: Path,
    flows: int,
    load: float,
    transports: Sequence[str],
    theta: dict[str, int] | None = None,
    access_ratio: int = 0,
    buffer_packets: int = evaluate.BUFFER_PACKETS,
    wan_rtts: bool = False,
) -> dict:
    """One UML boot: the seed's mix under each transport; ``out``/summary.json."""
    from gemini_lab.uml import run_in_uml

    out.mkdir(parents=True, exist_ok=True)
    runs = mix_runs(seed, flows, load, transports, theta, access_ratio, buffer_packets, wan_rtts)
    plan: dict = {"runs": runs}
    if evaluate.GEMINI in transports:
        from gemini_lab.uml import build_kernel, build_module

        plan["module"] = str(build_module(build_kernel()))
    (out / "plan.json").write_text(json.dumps(plan))
    files = '"$GEMINI_LAB_OUT/plan.json" "$GEMINI_LAB_OUT/result.json"'
    run_in_uml(
        f"{sys.executable} -m gemini_lab.flashpass.lab {files}", out, timeout_s=RUN_TIMEOUT_S
    )
    results = json.loads((out / "result.json").read_text())
    summary: dict = {"seed": seed, "flows": flows, "load": load, "runs": {}}
    summary["theta"] = runs[0]["theta"]
    summary["access_kbit"] = runs[0].get("access_kbit", 0)
    summary["data_buffer_packets"] = buffer_packets
    for run, res in zip(runs, results, strict=True):
        t = run["transport"]
        if "error" in res:
            summary["runs"][t] = {"error": res["error"]}
            continue
        per_flow = [
            {"flow": i, "fct_s": s} for i, s in zip(res["flow_ids"], res["fct_s"], strict=True)
        ]
        if t in FLASHPASS_ARMS:  # the sender's own FCT beside the process's
            own = {s["flow"]: s["fct_s"] for s in res["senders"]}
            per_flow = [p | {"sender_fct_s": own.get(p["flow"])} for p in per_flow]
        summary["runs"][t] = {
            "figures": figures(res, runs[0]["flows"]).__dict__,
            "per_flow": per_flow,
        }
    summary["delays_ms"] = runs[0]["sender_delays_ms"]
    summary["flows_run"] = runs[0]["flows"]
    summary["offered"] = offered(runs[0]["flows"])
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def refigured(seed_dir: Path) -> dict:
    """A boot's summary.json with each run's figures made again from the boot's own
    result.json and plan.json when they are kept beside it, so that a figure added since the
    boot covers it too; the summary as written otherwise."""
    summary = json.loads((seed_dir / "summary.json").read_text())
    result, plan = seed_dir / "result.json", seed_dir / "plan.json"
    if not (result.exists() and plan.exists()):
        return summary
    runs = json.loads(plan.read_text())["runs"]
    for run, res in zip(runs, json.loads(result.read_text()), strict=True):
        if "error" not in res and run["transport"] in summary["runs"]:
            summary["runs"][run["transport"]]["figures"] = figures(res, run["flows"]).__dict__
    return summary


def _span(xs: Sequence[float], fmt: str) -> str:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    if not xs:
        return "—"
    lo, hi = format(min(xs), fmt), format(max(xs), fmt)
    return lo if lo == hi else f"{lo}–{hi}"


def table(summaries: Sequence[dict], transports: Sequence[str] = ARMS) -> list[str]:
    """One row per transport that ran, min–max over the summaries' seeds."""
    if not summaries:
        return ["(none)"]
    transports = [t for t in transports if any(t in s["runs"] for s in summaries)]
    access = _has_figure(summaries, "access_loss")  # only when the senders had access links
    kinds = _has_figure(summaries, "scheduled_loss")  # FlashPass's data lost by kind
    lines = [
        "| transport | small < 100 KB: mean FCT ms | small: p99 ms | large > 10 MB: mean ms "
        "| 1–10 MB: mean ms | overall mean ms | utilisation | data-queue loss | emulation loss % "
        + ("| access-queue loss " if access else "")
        + ("| data lost: scheduled / unscheduled % " if kinds else "")
        + "| complete |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        + ("---:|" if access else "")
        + ("---:|" if kinds else ""),
    ]
    for t in transports:
        figs = [s["runs"][t]["figures"] for s in summaries if "figures" in s["runs"].get(t, {})]
        if not figs:
            lines.append(f"| {t} | error |")
            continue
        lines.append(
            f"| {t} | {_span([f['class_mean_ms'][0] for f in figs], '.0f')} "
            f"| {_span([f['small_p99_ms'] for f in figs], '.0f')} "
            f"| {_span([f['class_mean_ms'][3] for f in figs], '.0f')} "
            f"| {_span([f['class_mean_ms'][2] for f in figs], '.0f')} "
            f"| {_span([f['overall_mean_ms'] for f in figs], '.0f')} "
            f"| {_span([100 * f['utilisation'] for f in figs], '.1f')} % "
            f"| {_span([100 * f['data_loss'] for f in figs], '.2f')} % "
            f"| {_span([100 * e for f in figs if (e := f['emulation_loss']) is not None], '.1f')} "
            + (
                f"| {_span([100 * (f.get('access_loss') or 0) for f in figs], '.2f')} % "
                if access
                else ""
            )
            + (f"| {_kinds(figs)} " if kinds else "")
            + f"| {sum(f['complete'] for f in figs)}/{sum(f['flows'] for f in figs)} |"
        )
    return lines


def _has_figure(summaries: Sequence[dict], name: str) -> bool:
    """Whether any run of ``summaries`` has figure ``name`` (a table column only then)."""
    return any(
        r.get("figures", {}).get(name) is not None for s in summaries for r in s["runs"].values()
    )


def _kinds(figs: Sequence[dict]) -> str:
    """The data-lost-by-kind cell: scheduled / unscheduled, min–max (— for TCP)."""
    sched = [100 * x for f in figs if (x := f.get("scheduled_loss")) is not None]
    if not sched:
        return "—"
    unsched = [100 * x for f in figs if (x := f.get("unscheduled_loss")) is not None]
    return f"{_span(sched, '.2f')} / {_span(unsched, '.1f')}"


def per_seed(summaries: Sequence[dict], transports: Sequence[str] = ARMS) -> list[str]:
    """Each seed's class means per transport, the flows in each class in brackets."""
    lines = [
        "| seed | offered | transport | "
        + " | ".join(f"{c} ms" for c, _, _ in CLASSES)
        + " | small p99 ms | overall ms |",
        "|---:|---:|---|" + "---:|" * (len(CLASSES) + 2),
    ]
    for s in summaries:
        for t in transports:
            f = s["runs"].get(t, {}).get("figures")
            if f is None:
                continue
            cells = [
                "—" if math.isnan(m) else f"{m:.0f} ({n})"
                for m, n in zip(f["class_mean_ms"], f["class_flows"], strict=True)
            ]
            lines.append(
                f"| {s['seed']} | {100 * s['offered']:.0f} % | {t} | "
                + " | ".join(cells)
                + f" | {f['small_p99_ms']:.0f} | {f['overall_mean_ms']:.0f} |"
            )
    return lines


def against(summaries: Sequence[dict], ref: str = FLASHPASS, other: str = "cubic") -> list[str]:
    """``ref``'s small-flow mean and p99, large and overall mean against ``other``'s per seed
    (the ``ref`` column only for FlashPass*)."""
    out = []
    for s in summaries:
        r, o = s["runs"].get(ref, {}).get("figures"), s["runs"].get(other, {}).get("figures")
        if r is None or o is None:
            continue

        def pct(a: float, b: float) -> str:
            return "—" if math.isnan(a) or math.isnan(b) else f"{100 * (a - b) / b:+.0f} %"

        arm = "" if ref == FLASHPASS else f"{ref} vs "
        out.append(
            f"| {s['seed']} | {arm}{other} | {pct(r['class_mean_ms'][0], o['class_mean_ms'][0])} "
            f"| {pct(r['small_p99_ms'], o['small_p99_ms'])} "
            f"| {pct(r['class_mean_ms'][3], o['class_mean_ms'][3])} "
            f"| {pct(r['overall_mean_ms'], o['overall_mean_ms'])} |"
        )
    return out


def buffer_of(summary: dict) -> int:
    """The data buffer a summary's boot ran (summaries from before ``--buffer``: the 16)."""
    return int(summary.get("data_buffer_packets", evaluate.BUFFER_PACKETS))


def merge(summaries: Sequence[dict]) -> list[dict]:
    """One summary per seed, its runs gathered from every boot of that seed (an arm run
    apart, as dctcp's, joins the others'), by seed; the mix must be the same."""
    by_seed: dict[int, dict] = {}
    for s in summaries:
        have = by_seed.setdefault(s["seed"], s | {"runs": {}})
        if have["flows_run"] != s["flows_run"]:
            raise ValueError(f"seed {s['seed']}: two boots ran different mixes")
        if buffer_of(have) != buffer_of(s):
            raise ValueError(
                f"seed {s['seed']}: two boots ran different data buffers "
                f"({buffer_of(have)} and {buffer_of(s)} packets)"
            )
        if have.get("delays_ms") != s.get("delays_ms"):
            raise ValueError(f"seed {s['seed']}: two boots ran different senders' delays")
        have["runs"] = have["runs"] | s["runs"]
    return [by_seed[k] for k in sorted(by_seed)]


def report(summaries: Sequence[dict], held_out: set[int]) -> str:
    main = [s for s in summaries if s["seed"] not in held_out]
    held = [s for s in summaries if s["seed"] in held_out]
    head = "| seed | against | small mean | small p99 | large mean | overall mean |"
    rows = [head, "|---:|---|---:|---:|---:|---:|"]
    for ref in FLASHPASS_ARMS:
        for t in [FLASHPASS, *ARMS[2:]] if ref == FLASHPASS_STAR else ARMS[2:]:
            rows += against(summaries, ref, t)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    lines = [
        f"Seeds {[s['seed'] for s in main]} (min–max over seeds):",
        "",
        *table(main),
        "",
        f"Held-out seeds {[s['seed'] for s in held]} (nothing was chosen on them):",
        "",
        *table(held),
        "",
        "FlashPass's (and FlashPass*'s) change against each other arm, per seed "
        "((FlashPass − other) / other):",
        "",
        *rows,
        "",
        "Per seed and size class (classes in the CDF's sizes; flows in brackets):",
        "",
        *per_seed(summaries),
        "",
        f"Tables made {datetime.now(UTC):%Y-%m-%d %H:%M} UTC at commit {commit.stdout.strip()}.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="one UML boot per seed")
    r.add_argument("--seed", type=int, action="append", required=True)
    r.add_argument("--work", type=Path, default=Path("var/lab/flashpass-fctmix"))
    r.add_argument("--flows", type=int, default=FLOWS)
    r.add_argument("--load", type=float, default=LOAD)
    r.add_argument("--transports", nargs="+", default=list(TRANSPORTS), choices=ARMS)
    r.add_argument("--theta", nargs="*", default=[], metavar="NAME=UNITS", type=evaluate._setting)
    r.add_argument(
        "--access-ratio",
        type=int,
        default=0,
        help=f"senders' access links at the link ÷ this (the paper's: {ACCESS_RATIO}); 0: none",
    )
    r.add_argument(
        "--buffer",
        type=int,
        default=evaluate.BUFFER_PACKETS,
        help=f"the bottleneck's data buffer in packets (at least {MIN_BUFFER_PACKETS})",
    )
    r.add_argument(
        "--wan-rtts",
        action="store_true",
        help="the paper's WAN round trips, 40, 60 or 80 ms per sender (no access links)",
    )
    t = sub.add_parser("table", help="the tables from the seeds' summary.json files")
    t.add_argument("dirs", type=Path, nargs="+")
    t.add_argument("--held-out", type=int, nargs="*", default=[4])
    a = ap.parse_args(argv)
    if a.cmd == "run":
        theta = evaluate.flashpass_theta(a.theta)  # the paper's, with --theta in place
        setting = (a.flows, a.load, a.transports, theta, a.access_ratio, a.buffer, a.wan_rtts)
        try:  # mix_runs's refusals (buffer, access links with --wan-rtts) before any boot
            mix_runs(a.seed[0], *setting)
        except ValueError as exc:
            ap.error(str(exc))
        for seed in a.seed:
            s = run_seed(seed, a.work / f"seed{seed}", *setting)
            print(report([s], set()), flush=True)
        return
    found = [refigured(p.parent) for d in a.dirs for p in d.glob("seed*/summary.json")]
    print(report(merge(found), set(a.held_out)))


if __name__ == "__main__":
    main()
