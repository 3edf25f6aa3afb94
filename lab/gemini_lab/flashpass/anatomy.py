"""Where a FlashPass run's time goes on the flow-size mix (issue #36), from a boot's records
(gemini_lab.flashpass.fctmix ``run``: its plan.json and result.json), nothing rerun.

For each FlashPass arm of the boot, and each TCP arm beside it:
  - each flow's mean rate (its bytes over its FCT) against its max-min fair share over its
    lifetime: on one bottleneck with every active flow backlogged, the share at t is the
    link ÷ the flows active at t in that arm's own run (each flow from its arrival to its
    end), so the fair bytes are ∫ link / n(t) dt over the flow's lifetime; the ratio of its
    bytes to that, per size class;
  - (FlashPass) the credits per second, all flows together, in BIN_S bins, against the
    emulation class's rate (one credit per data frame the link can carry): the share of the
    busy time (some flow active) whose bins fall under half and under 90 % of it;
  - (FlashPass) after each flow's end, how long the remaining flows' credits take to regrow
    to 90 % of the class's rate (the freed share taken back), censored by the next arrival;
  - the fluid max-min schedule of the same arrivals and sizes (each flow at its fair share at
    every instant, no loss, no start-up): each flow's FCT against it, and the schedule's mean
    FCT with the link cut to each transport's payload ceiling (CEILINGS);
  - (FlashPass) Algorithm 2's cuts: how many, and how many within CUT_AFTER_ARRIVAL_S of
    another flow's arrival (a new flow starts emulating at the maximum rate);
  - (FlashPass) credit waste (credits that came when nothing was left to send), and the
    emulation and data queues' drops.

    python -m gemini_lab.flashpass.anatomy DIR/seedN ...
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import math
from collections.abc import Sequence
from pathlib import Path

from gemini_lab.flashpass import evaluate, fctmix, wire
from gemini_lab.flashpass.lab import FLASHPASS_ARMS
from gemini_lab.flashpass.switch import DATA_QDISC, EMULATION_QDISC

NS = 1_000_000_000
BIN_S = 0.1  # the credit rate's bins
REGROWN = 0.9  # a freed share is taken back once the credits reach this share of the class's
CUT_AFTER_ARRIVAL_S = 0.15  # a cut this soon after an arrival is counted as that arrival's
# payload shares of the link: TCP's 1448/1514, FlashPass's 1449.3/1612 (benchmarks/results/
# flashpass.md, "Why the steady credit rate is 89.9 % of the link"), and that with the credits
# at 85 % of the class's rate while busy (the mix's FlashPass runs)
CEILINGS = (1.0, 1448 / 1514, 1449.3 / 1612, 0.85 * 1449.3 / 1612)


def lifetimes(result: dict, flows: Sequence[dict]) -> dict[int, tuple[float, float]]:
    """Each flow's (start, end) in seconds from the run's start: its scheduled arrival and
    its completion time (gemini_lab.flashpass.lab starts each flow at its arrival)."""
    fct = dict(zip(result["flow_ids"], result["fct_s"], strict=True))
    return {f["flow"]: (f["start_ms"] / 1000, f["start_ms"] / 1000 + fct[f["flow"]]) for f in flows}


def fair_bytes(life: dict[int, tuple[float, float]], link_bps: float) -> dict[int, float]:
    """Each flow's max-min fair bytes over its lifetime: ∫ link / n(t) dt, n(t) the flows
    active at t (every active flow taken as backlogged: one bottleneck, no other limit)."""
    edges = sorted({t for span in life.values() for t in span})
    out = dict.fromkeys(life, 0.0)
    for a, b in itertools.pairwise(edges):
        active = [f for f, (s, e) in life.items() if s <= a and e >= b]
        for f in active:
            out[f] += link_bps / 8 * (b - a) / len(active)
    return out


def share_ratios(result: dict, flows: Sequence[dict], link_bps: float) -> list[list[float]]:
    """Per size class (fctmix.CLASSES), each flow's bytes ÷ its fair bytes."""
    life = lifetimes(result, flows)
    fair = fair_bytes(life, link_bps)
    out: list[list[float]] = [[] for _ in fctmix.CLASSES]
    for f in flows:
        out[fctmix.size_class(f["bytes"])].append(f["bytes"] / fair[f["flow"]])
    return out


def max_min(
    active: Sequence[int], sender: dict[int, int], link_bps: float, access_bps: float = 0
) -> dict[int, float]:
    """The max-min fair rates of ``active`` flows on one bottleneck of ``link_bps`` behind
    their senders' access links of ``access_bps`` each (0: none), by progressive filling:
    every unfrozen flow at one level, raised until a link is full, whose flows then freeze."""
    rate: dict[int, float] = {}
    left = set(active)
    while left:
        used = sum(rate.values())
        level, binding = (link_bps - used) / len(left), set(left)
        if access_bps:
            for s in {sender[f] for f in left}:
                mine = [f for f in left if sender[f] == s]
                frozen = sum(r for f, r in rate.items() if sender[f] == s)
                cap = (access_bps - frozen) / len(mine)
                if cap < level:
                    level, binding = cap, set(mine)
        for f in binding:
            rate[f] = level
        left -= binding
    return rate


def fluid_fcts(flows: Sequence[dict], link_bps: float, access_bps: float = 0) -> dict[int, float]:
    """Each flow's FCT (s) in the fluid max-min schedule of ``flows`` (their arrivals and
    bytes): the fair share at every instant, with no loss, no start-up and no round trip."""
    todo = sorted(flows, key=lambda f: f["start_ms"])
    sender = {f["flow"]: f.get("sender", 0) for f in flows}
    left: dict[int, float] = {}  # bits still to send, of the active flows
    start = {f["flow"]: f["start_ms"] / 1000 for f in flows}
    out: dict[int, float] = {}
    t, i = 0.0, 0
    while i < len(todo) or left:
        rate = max_min(list(left), sender, link_bps, access_bps) if left else {}
        arrive = todo[i]["start_ms"] / 1000 if i < len(todo) else math.inf
        finish = min((left[f] / rate[f] for f in left), default=math.inf)
        step = min(arrive - t, finish)
        for f in list(left):
            left[f] -= rate[f] * step
            if left[f] <= 1e-6 * link_bps:
                out[f] = t + step - start[f]
                del left[f]
        t += step
        while i < len(todo) and todo[i]["start_ms"] / 1000 <= t:
            left[todo[i]["flow"]] = todo[i]["bytes"] * 8
            i += 1
    return out


def run_zero(senders: Sequence[dict], flows: Sequence[dict]) -> int:
    """The run's zero on the senders' clock (ns): each sender started its flow at the flow's
    scheduled arrival, so its start less that arrival, the earliest over the senders."""
    start = {f["flow"]: f["start_ms"] / 1000 for f in flows}
    return min(s["start_ns"] - int(start[s["flow"]] * NS) for s in senders)


def credit_bins(senders: Sequence[dict], t0_ns: int, bin_s: float = BIN_S) -> list[int]:
    """Credits that arrived in each ``bin_s`` bin from ``t0_ns``, all flows together."""
    counts: list[int] = []
    for s in senders:
        for _, _, arrival in s["credits"]:
            b = int((arrival - t0_ns) / NS / bin_s)
            counts.extend([0] * (b + 1 - len(counts)))
            counts[b] += 1
    return counts


def busy_bins(life: dict[int, tuple[float, float]], n: int, bin_s: float = BIN_S) -> list[bool]:
    """Whether some flow is active through the whole of each bin."""
    return [
        any(s <= i * bin_s and e >= (i + 1) * bin_s for s, e in life.values()) for i in range(n)
    ]


def regrowth(
    life: dict[int, tuple[float, float]],
    bins: Sequence[int],
    full_per_bin: float,
    bin_s: float = BIN_S,
) -> tuple[list[float], int]:
    """After each flow's end with some flow still active, the time until a bin's credits
    reach REGROWN of ``full_per_bin``; (those times, how many were cut short by the next
    arrival first, or by the run's end)."""
    starts = sorted(s for s, _ in life.values())
    times, censored = [], 0
    for _, end in life.values():
        if not any(s < end < e for s, e in life.values()):
            continue
        i = bisect.bisect_right(starts, end)
        nxt = starts[i] if i < len(starts) else math.inf
        first = math.ceil(end / bin_s - 1e-9)  # the first whole bin after the end
        hit = next(
            (
                (i + 1) * bin_s - end
                for i in range(first, len(bins))
                if (i + 1) * bin_s <= nxt and bins[i] >= REGROWN * full_per_bin
            ),
            None,
        )
        if hit is None:
            censored += 1
        else:
            times.append(hit)
    return times, censored


def cuts(senders: Sequence[dict], flows: Sequence[dict]) -> tuple[int, int]:
    """Algorithm 2's cuts (a step whose rate fell), and those within CUT_AFTER_ARRIVAL_S after
    another flow's arrival."""
    start = {f["flow"]: f["start_ms"] / 1000 for f in flows}
    arrivals = sorted(start.values())
    t0 = run_zero(senders, flows)
    total = after = 0
    for s in senders:
        prev = None
        for t_ns, rate in s["rates"]:
            if prev is not None and rate < prev:
                total += 1
                at = (s["start_ns"] + t_ns - t0) / NS
                i = bisect.bisect_right(arrivals, at) - 1
                if i >= 0 and at - arrivals[i] <= CUT_AFTER_ARRIVAL_S:
                    after += arrivals[i] != start[s["flow"]]
            prev = rate
    return total, after


def _q(result: dict, handle: str) -> tuple[int, int]:
    q = evaluate._qdisc(result, handle)
    return q["drops"], q["packets"] + q["drops"]


def median(xs: Sequence[float]) -> float:
    return fctmix.percentile(xs, 0.5)


def analyse(seed_dir: Path) -> list[str]:
    plan = json.loads((seed_dir / "plan.json").read_text())
    results = json.loads((seed_dir / "result.json").read_text())
    lines = [f"## {seed_dir}"]
    for run, res in zip(plan["runs"], results, strict=False):
        if "error" in res:
            continue
        flows = run["flows"]
        link = run["rate_kbit"] * 1000
        ratios = share_ratios(res, flows, link)
        cells = [
            f"{c}: median {median(r):.2f} ({min(r):.2f}–{max(r):.2f}, {len(r)})"
            for (c, _, _), r in zip(fctmix.CLASSES, ratios, strict=True)
            if r
        ]
        lines.append(f"- {res['transport']}: bytes ÷ fair bytes, " + "; ".join(cells))
        access = run.get("access_kbit", 0) * 1000
        ideal = fluid_fcts(flows, link, access)
        fct = dict(zip(res["flow_ids"], res["fct_s"], strict=True))
        slow: list[list[float]] = [[] for _ in fctmix.CLASSES]
        for f in flows:
            slow[fctmix.size_class(f["bytes"])].append(fct[f["flow"]] / ideal[f["flow"]])
        mean = sum(fct.values()) / len(fct)
        lines.append(
            "  FCT ÷ the fluid max-min FCT (the whole link, no ceiling): "
            + "; ".join(
                f"{c}: median {median(r):.2f}"
                for (c, _, _), r in zip(fctmix.CLASSES, slow, strict=True)
                if r
            )
            + f"; overall mean {1000 * mean:.0f} ms against the fluid's "
            f"{1000 * sum(ideal.values()) / len(ideal):.0f} ms"
        )
        if res["transport"] not in FLASHPASS_ARMS:
            continue
        senders = res["senders"]
        life = lifetimes(res, flows)
        bins = credit_bins(senders, run_zero(senders, flows))
        full = wire.max_emulation_pps(link) * BIN_S
        busy = busy_bins(life, len(bins))
        on = [b for b, x in zip(bins, busy, strict=True) if x]
        under_half = sum(b < 0.5 * full for b in on) / max(1, len(on))
        under_90 = sum(b < 0.9 * full for b in on) / max(1, len(on))
        mean_busy = sum(on) / max(1, len(on)) / full
        lines.append(
            f"  credits while busy: mean {100 * mean_busy:.0f} % of the class's "
            f"{full / BIN_S:.1f}/s; bins under 50 %: {100 * under_half:.0f} %, "
            f"under 90 %: {100 * under_90:.0f} % ({len(on)} bins of {BIN_S:g} s)"
        )
        times, cens = regrowth(life, bins, full)
        if times:
            lines.append(
                f"  regrowth to 90 % after a flow's end: median {median(times):.2f} s, "
                f"p90 {fctmix.percentile(times, 0.9):.2f} s ({len(times)} ends; {cens} cut "
                "short by the next arrival first)"
            )
        else:
            lines.append(f"  regrowth to 90 %: never before the next event ({cens} ends)")
        total, after = cuts(senders, flows)
        lines.append(
            f"  Algorithm 2 cuts: {total}, of which {after} ({100 * after / max(1, total):.0f} %) "
            f"within {CUT_AFTER_ARRIVAL_S:g} s after another flow's arrival"
        )
        credits = sum(len(s["credits"]) for s in senders)
        wasted = sum(s["wasted_credits"] for s in senders)
        ed, eo = _q(res, EMULATION_QDISC)
        dd, do = _q(res, DATA_QDISC)
        lines.append(
            f"  credit waste: {wasted} of {credits} ({100 * wasted / max(1, credits):.1f} %); "
            f"emulation queue drops {ed} of {eo} ({100 * ed / max(1, eo):.1f} %); "
            f"data queue drops {dd} of {do}"
        )
    return lines


def ceilings(seed_dir: Path, shares: Sequence[float] = CEILINGS) -> list[str]:
    """The fluid max-min schedule's overall mean FCT with the link cut to each of ``shares``
    (the payload a transport can carry): how much of an FCT gap a capacity gap alone makes."""
    run = json.loads((seed_dir / "plan.json").read_text())["runs"][0]
    link, access = run["rate_kbit"] * 1000, run.get("access_kbit", 0) * 1000
    cells = []
    for share in shares:
        ideal = fluid_fcts(run["flows"], link * share, access * share)
        cells.append(f"{100 * share:.1f} %: {1000 * sum(ideal.values()) / len(ideal):.0f} ms")
    return ["  fluid overall mean FCT with the link at " + "; ".join(cells)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", type=Path, nargs="+", help="a fctmix boot's seed directories")
    a = ap.parse_args(argv)
    for d in a.dirs:
        print("\n".join(analyse(d) + ceilings(d)), flush=True)


if __name__ == "__main__":
    main()
