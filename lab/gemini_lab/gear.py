"""Host side of Gear's lab checks (issue #36): the plan that runs Gear behind the lab's INT
switch (fusion-kmod/gear_int.c) in the UML lab (simulated clock), and the readings the tests
take from its results.

The path: 100 Mbit/s, 2 ms RTT, 200 packets of drop-tail queue, a tbf burst of 2 packets (so
the shaper's burst does not hide the queue): a datacenter hop at the spec's scale (rates / 10,
times x 10; DATAPATHS-SPEC.md section 0.3), with its bw configured at the switch.

  - ``gear/telemetry``: a Gear flow beside a cubic flow that keeps a standing, moving queue:
    what the Gear sender read from the switch (the queue its ACKs' segments left behind them)
    against the qdisc's own backlog, sampled by tc on the same clock;
  - ``gear/eta-<η>``: Gear alone at η = 95 % (the paper's) and 80 %: the window is driven so
    that u, and with it the link's rate, stand at η; out-of-region θ writes are refused.
"""

from __future__ import annotations

import bisect
import dataclasses
import statistics
from pathlib import Path

from gemini_lab.scenario import Scenario

RATE_MBIT = 100
PATH_TEXT = "100 Mbit/s, 2 ms, 200 packets of drop-tail queue, 2-packet shaper burst"
GEAR_PATH = Scenario(
    "gear-dc", PATH_TEXT, rtt_ms=2, rate_mbit=RATE_MBIT, queue_packets=200, burst_packets=2
)
ETAS = (95, 80)
# Out of Θ' (specs/gear.toml's wide bounds): each write must be refused.
OUT_OF_REGION = {"target_util": 101, "class_rtt_ratio": 1, "ai_step_bdp": 0, "max_stage": 101}
U_ONE = 1 << 16  # the module's utilisation fixed point
CROSS_FLAG = 1 << 31
RECORDS_MASK = (1 << 24) - 1  # get_info's cwnd_gain: records in bits 0-23, others' % in 24-30
OTHERS_SHIFT, OTHERS_MASK = 24, 0x7F
WIRE_BYTES_PER_US = RATE_MBIT / 8  # the line rate in bytes per µs
PACKET_BYTES = 1514


def gear_plan(telemetry_s: float = 1.5, eta_s: float = 5) -> dict:
    experiments: list[dict] = [
        {
            "label": "gear/telemetry",
            "kind": "gear_flow",
            "path": 0,
            "rate_mbit": RATE_MBIT,
            "duration_s": telemetry_s,
            "competitor_cc": "cubic",
            "sample_s": 0.003,
        },
        *(
            {
                "label": f"gear/eta-{eta}",
                "kind": "gear_flow",
                "path": 0,
                "rate_mbit": RATE_MBIT,
                "duration_s": eta_s,
                "theta": {"target_util": eta},
                "refuse": OUT_OF_REGION,
                "sample_s": 0.05,
            }
            for eta in ETAS
        ),
    ]
    for i, e in enumerate(experiments):
        e["port_offset"] = i
    experiments.append(_gear_pair(f"pair/gear/{TEST_PAIR_S}s", TEST_PAIR_S, PAIR_RTTS_MS))
    return {"paths": [GEAR_PATH.to_dict()], "experiments": experiments}


TEST_PAIR_S = 10  # test_lab_gear's intra/cross pair (the record's runs are 15-25 s)


# --- readings -------------------------------------------------------------------------------


def reads(result: dict) -> list[dict]:
    """The sender's distinct INT reads: (time µs, queue bytes), one per change of its count."""
    out, seen = [], None
    for s in gear_samples(result):
        n = (s.get("bbr_cwnd_gain") or 0) & RECORDS_MASK
        if n and n != seen:
            out.append({"ts_us": s["bbr_bw_lo"], "ql": s["bbr_bw_hi"], "n": n})
            seen = n
    return out


def unwrap(us: int, near: int) -> int:
    """A low-32-bit µs stamp as the full one closest to ``near``."""
    wrap = 1 << 32
    return near + ((us - near + wrap // 2) % wrap) - wrap // 2


def telemetry_pairs(result: dict) -> list[dict]:
    """Each INT read of the sender beside tc's backlog sampled just before and just after the
    record's time: the queue the switch saw must lie between them, give or take what can
    arrive or leave in between (``telemetry_error_bound``)."""
    s = result["samples"]
    times = [x["now_us"] for x in s]
    base = times[0]
    times = [unwrap(t, base) for t in times]
    pairs = []
    for r in reads(result):  # tc's samples are all there; the socket's may miss the first
        ts = unwrap(r["ts_us"], base)
        i = bisect.bisect_right(times, ts)
        if i == 0 or i == len(times):
            continue
        lo, hi = s[i - 1]["backlog"], s[i]["backlog"]
        pairs.append(
            {
                "ql": r["ql"],
                "before": lo,
                "after": hi,
                "dt_us": times[i] - times[i - 1],
                "interp": lo + (hi - lo) * (ts - times[i - 1]) / max(1, times[i] - times[i - 1]),
            }
        )
    return pairs


def telemetry_error_bound(pair: dict) -> float:
    """How far the switch's queue at the record's time may be from the nearer of tc's two
    samples around it: two packets (the one departing, the one the shaper holds) plus what
    the line drains in the time between the samples. Arrivals are not bounded by the line
    rate (a sender's burst lands at once), so a read outside [before, after] ± this bound
    counts as a miss."""
    return 2 * PACKET_BYTES + WIRE_BYTES_PER_US * pair["dt_us"]


def within(pair: dict) -> bool:
    lo, hi = sorted((pair["before"], pair["after"]))
    slack = telemetry_error_bound(pair)
    return lo - slack <= pair["ql"] <= hi + slack


def mean_u(result: dict, skip_s: float) -> float:
    """The utilisation the sender computed (eq. 1, HPCC's average), mean after ``skip_s``."""
    return statistics.fmean(s["bbr_min_rtt"] / U_ONE for s in gear_samples(result, skip_s))


def mean_queue_packets(result: dict, skip_s: float) -> float:
    return statistics.fmean(s["qlen"] for s in result["samples"] if s["t"] >= skip_s)


def wire_utilisation(result: dict) -> float:
    """The link's use by the flow: its goodput with each segment's headers put back."""
    return result["throughput_mbps"] * PACKET_BYTES / 1448 / RATE_MBIT


def gear_samples(result: dict, skip_s: float = 0) -> list[dict]:
    """The samples that caught the Gear socket (its record answered), after ``skip_s``."""
    return [s for s in result["samples"] if "bbr_min_rtt" in s and s["t"] >= skip_s]


# --- the 2-flow micro-benchmark (issue #36 item 3) ------------------------------------------

PAIR_RTTS_MS = [2, 40]  # intra-DC, cross-DC: CRTT/IRTT = 20 (the paper's ≈ 2500 is ns-3 scale)
PAIR_QUEUE = 500  # packets: a deep switch buffer (the paper's 10 MB per port)
PAIR_ECN_K = 20  # the datacenter path's K (DCTCP's and GEMINI's marking, RED)
PAIR_DURATIONS_S = (15, 20, 25)  # three runs; the simulated clock repeats a run exactly
PAIR_BASELINES = ("gemini", "dctcp", "cubic", "bbr")
GEAR_PAIR_THETA = {"class_rtt_ratio": 10}  # cross-DC from 20 ms (k · 2 ms); CRTT/IRTT = 20
PAIR_SAMPLE_S = 0.25
LONE_S = 10  # the intra-DC flow alone on the pair's bottleneck: eq. 7 must not yield there
# The paper's WAN-bottleneck test (10 Gbit/s DC port; the cross-DC flow's WAN receiver capped at
# 5 Gbit/s with 2 Gbit/s of background: ideal intra:cross = 7:3), rates / 100: the cross-DC
# flow's WAN limit is its 30 Mbit/s share (the background's 20 of the 50 folded into the cap).
WAN_LIMIT_MBIT = 30
WAN_QUEUE = 100  # packets: one BDP of 30 Mbit/s at the 40 ms CRTT
WAN_DURATIONS_S = (15, 20, 25)  # three runs, as the pair's
WAN_CCS = ("gear", *PAIR_BASELINES)  # the baselines as in the pair: RED marking at K
WAN_SAMPLE_S = 0.1  # each sender's packets delivered, read this often (guest clock)
# Convergence (the paper: Gear and HPCC within 100 ms, the AI-based DCTCP, TIMELY and GEMINI
# about 5 s): the share over a sliding window, within a band around the ideal 7:3, from some
# time to the run's end. The window spans 12 cross-DC round trips; the band is fixed here,
# before any run of this test was read against it.
WAN_IDEAL_SHARE = (RATE_MBIT - WAN_LIMIT_MBIT) / WAN_LIMIT_MBIT  # 70 : 30
CONVERGED_BAND = 0.2  # within ±20 % of the ideal share
CONVERGED_WINDOW_S = 0.5
SEGMENT_BYTES = 1448  # a delivered packet's payload (tcpi_delivered counts segments)


def _gear_pair(label: str, duration_s: float, rtts_ms: list[int], **more: object) -> dict:
    """One ``gear_pair`` experiment on the pair's bottleneck (Gear at GEAR_PAIR_THETA)."""
    return {
        "label": label,
        "kind": "gear_pair",
        "rate_kbit": RATE_MBIT * 1000,
        "queue_packets": PAIR_QUEUE,
        "rtts_ms": rtts_ms,
        "starts_s": [0] * len(rtts_ms),
        "dc_base_rtt_us": PAIR_RTTS_MS[0] * 1000,
        "theta": GEAR_PAIR_THETA,
        "duration_s": duration_s,
        "sample_s": PAIR_SAMPLE_S,
        **more,
    }


def wan_plan_experiments(durations: tuple[int, ...] = WAN_DURATIONS_S) -> list[dict]:
    """The 7:3 test: intra- and cross-DC flow through the DC port, the cross-DC flow also
    through its WAN limit; Gear behind the INT switch on its drop-tail queue, the baselines
    with RED marking at K as in the pair (``baseline_pair``); each sender's delivered packets
    sampled every WAN_SAMPLE_S for the convergence time."""
    wan = {"flow": 1, "rate_kbit": WAN_LIMIT_MBIT * 1000, "queue_packets": WAN_QUEUE}
    more = {"wan": wan, "sample_s": WAN_SAMPLE_S}
    port = (RATE_MBIT, PAIR_QUEUE, PAIR_RTTS_MS)
    return [
        _gear_pair(f"wan/{cc}/{d}s", d, PAIR_RTTS_MS, **more)
        if cc == "gear"
        else baseline_pair(f"wan/{cc}/{d}s", cc, port, d) | more
        for d in durations
        for cc in WAN_CCS
    ]


def baseline_pair(label: str, cc: str, port: tuple[int, int, list[int]], duration_s: float) -> dict:
    """A baseline's pair on a port (rate Mbit/s, queue packets, RTTs ms), flows started
    together: RED marking at PAIR_ECN_K, GEMINI at its scaled defaults with C = the rate."""
    from gemini_lab.datapath_signals import gemini_extra, scaled_theta

    rate_mbit, queue, rtts_ms = port
    e: dict = {
        "label": label,
        "kind": "datapath_pair",
        "rate_kbit": rate_mbit * 1000,
        "queue_packets": queue,
        "ecn_k": PAIR_ECN_K,
        "rtts_ms": rtts_ms,
        "duration_s": duration_s,
        "sample_s": 1.0,
    }
    if cc == "gemini":
        theta, extra = scaled_theta(cc), gemini_extra(rate_mbit)
        return e | {"datapath": cc, "theta": theta, "module_extra": extra}
    return e | {"cc": cc}


def pair_plan(
    durations: tuple[int, ...] = PAIR_DURATIONS_S, baselines: tuple[str, ...] = PAIR_BASELINES
) -> dict:
    """Each CC's intra/cross pair once per duration: Gear behind the INT switch on a drop-tail
    queue, the baselines with RED marking at K (``datapath_pair``); Gear's intra-DC flow alone
    on the same bottleneck; the WAN-bottleneck 7:3 test."""
    experiments: list[dict] = [_gear_pair(f"lone/gear/{LONE_S}s", LONE_S, PAIR_RTTS_MS[:1])]
    for d in durations:
        experiments.append(_gear_pair(f"pair/gear/{d}s", d, PAIR_RTTS_MS))
        for cc in baselines:
            port = (RATE_MBIT, PAIR_QUEUE, PAIR_RTTS_MS)
            experiments.append(baseline_pair(f"pair/{cc}/{d}s", cc, port, d))
    experiments += wan_plan_experiments()
    # a path whose receivers run dctcp: the guest then allows dctcp as a namespace's default,
    # which datapath_pair sets in the fairness receiver
    path = dataclasses.replace(GEAR_PATH, receiver_cc="dctcp")
    return {"paths": [path.to_dict()], "experiments": experiments}


def pair_share(result: dict) -> float:
    """Intra-DC over cross-DC goodput (the paper's normalized intra/cross throughput ratio
    with one flow each)."""
    intra, cross = (f["throughput_mbps"] for f in result["flows"])
    return intra / cross if cross else float("inf")


def runs_of(ex: dict, prefix: str) -> list[dict]:
    """The experiments labelled ``prefix``… that finished, in label order."""
    return [ex[k] for k in sorted(ex) if k.startswith(prefix) and "flows" in ex[k]]


def share_cells(runs: list[dict]) -> str:
    """Table cells: intra/cross share, intra and cross goodput, each min–max over ``runs``."""
    shares = [pair_share(r) for r in runs]
    intra = [r["flows"][0]["throughput_mbps"] for r in runs]
    cross = [r["flows"][1]["throughput_mbps"] for r in runs]
    return (
        f"{min(shares):.2f}–{max(shares):.2f} | {min(intra):.1f}–{max(intra):.1f} "
        f"| {min(cross):.1f}–{max(cross):.1f}"
    )


def render_pairs(results: dict, command: str, date: str, commit: str) -> str:
    ex = results["experiments"]
    lines = [
        f"Command: `{command}`  ",
        f"Date: {date}; commit {commit}; UML guest on its simulated clock (figures do not move "
        "with host load; two boots of one configuration are close, not identical).",
        "",
        f"One bottleneck of {RATE_MBIT} Mbit/s, {PAIR_QUEUE} packets of buffer; an intra-DC flow "
        f"with {PAIR_RTTS_MS[0]} ms RTT and a cross-DC flow with {PAIR_RTTS_MS[1]} ms RTT, started "
        "together. Gear behind the lab's INT switch (fusion-kmod/gear_int.c) on a drop-tail "
        f"queue, θ = defaults with k = {GEAR_PAIR_THETA['class_rtt_ratio']}; the baselines with "
        f"RED marking at K = {PAIR_ECN_K} packets (ECN for dctcp and gemini; a drop for cubic "
        "and bbr, which do not negotiate ECN), receivers running dctcp. GEMINI at its spec's "
        "defaults scaled by s = 10 (T = 50 ms), C = 100 Mbit/s.",
        "",
        "| CC | intra / cross goodput (min–max over runs) | intra Mbit/s | cross Mbit/s | runs |",
        "|---|---|---|---|---:|",
    ]
    for cc in ("gear", *PAIR_BASELINES):
        runs = runs_of(ex, f"pair/{cc}/")
        if not runs:
            lines.append(f"| {cc} | error | | | 0 |")
            continue
        lines.append(f"| {cc} | {share_cells(runs)} | {len(runs)} |")
    return "\n".join([*lines, *_lone_lines(ex), *_wan_lines(ex)]) + "\n"


def _lone_lines(ex: dict) -> list[str]:
    """Gear's intra-DC flow alone on the pair's bottleneck: eq. 7 must leave it at η."""
    r = ex.get(f"lone/gear/{LONE_S}s", {})
    if "flows" not in r:
        return ["", f"Lone intra-DC Gear flow: error {r.get('error', 'missing')}"]
    use = wire_utilisation(r["flows"][0])
    return [
        "",
        f"Lone intra-DC Gear flow on the same bottleneck ({LONE_S} s): goodput "
        f"{r['flows'][0]['throughput_mbps']:.1f} Mbit/s, {use:.2f} of the line on the wire "
        f"(η = 0.95), {r['flows'][0]['retransmits']} retransmissions.",
    ]


def delivered_ticks(result: dict) -> list[tuple[float, int, int]]:
    """(guest time s, intra-DC packets delivered, cross-DC packets delivered) at each sample
    that read both senders, from either experiment kind: ``gear_pair``'s samples hold both
    flows per tick, ``datapath_pair``'s are per flow with the tick's time."""
    if "samples" in result:  # gear_pair
        pairs = [
            (s["t"], *(f.get("tcpi_delivered") for f in s["flows"][:2]))
            for s in result["samples"]
            if len(s["flows"]) >= 2
        ]
    else:
        cross = {s["t"]: s.get("tcpi_delivered") for s in result["flows"][1]["samples"]}
        pairs = [
            (s["t"], s.get("tcpi_delivered"), cross.get(s["t"]))
            for s in result["flows"][0]["samples"]
        ]
    return [(t, a, b) for t, a, b in pairs if a is not None and b is not None]


def window_shares(
    ticks: list[tuple[float, int, int]], window_s: float = CONVERGED_WINDOW_S
) -> list[tuple[float, float]]:
    """(time, intra/cross share of the packets delivered over the ``window_s`` before it), for
    every tick with a full window behind it; inf where the cross flow delivered nothing."""
    out = []
    times = [t for t, _, _ in ticks]
    for t, intra, cross in ticks:
        j = bisect.bisect_right(times, t - window_s) - 1
        if j < 0:
            continue
        _, intra0, cross0 = ticks[j]
        d_cross = cross - cross0
        out.append((t, (intra - intra0) / d_cross if d_cross > 0 else float("inf")))
    return out


def convergence_s(
    shares: list[tuple[float, float]],
    ideal: float = WAN_IDEAL_SHARE,
    band: float = CONVERGED_BAND,
) -> float | None:
    """The first window end from which every window's share stays within ``band`` of
    ``ideal`` to the run's end; None when the last one is outside (not converged)."""
    lo, hi = ideal / (1 + band), ideal * (1 + band)
    start = None
    for t, share in shares:
        inside = lo <= share <= hi
        start = (start if start is not None else t) if inside else None
    return start


def _wan_lines(ex: dict) -> list[str]:
    """The WAN-bottleneck test: intra/cross goodput (ideal 7:3) and the convergence time."""
    band = f"±{100 * CONVERGED_BAND:.0f} %"
    lines = [
        "",
        f"WAN bottleneck (the paper's 7:3 test, rates / 100): the cross-DC flow also limited to "
        f"{WAN_LIMIT_MBIT} Mbit/s ({WAN_QUEUE} packets of buffer) on its own link, flows "
        f"started together, runs of {', '.join(str(d) for d in WAN_DURATIONS_S)} s; Gear on "
        "its drop-tail DC queue, the baselines with RED marking at K as above. Ideal intra / "
        f"cross: 7 : 3 = {WAN_IDEAL_SHARE:.2f} (65 : 30 = 2.17 at η = 0.95). Converged: the "
        f"share of packets delivered over each {CONVERGED_WINDOW_S:g} s window (sampled every "
        f"{WAN_SAMPLE_S:g} s) within {band} of 7:3 from that time to the run's end; never: "
        "the run ended outside it.",
        "",
        "| CC | intra / cross (min–max over runs) | intra Mbit/s | cross Mbit/s "
        "| converged after s (per run) | retransmissions intra, cross | runs |",
        "|---|---|---|---|---|---|---:|",
    ]
    for cc in WAN_CCS:
        runs = runs_of(ex, f"wan/{cc}/")
        if not runs:
            lines.append(f"| {cc} | error | | | | | 0 |")
            continue
        conv = [convergence_s(window_shares(delivered_ticks(r))) for r in runs]
        retx = [f"{r['flows'][0]['retransmits']}, {r['flows'][1]['retransmits']}" for r in runs]
        lines.append(
            f"| {cc} | {share_cells(runs)} "
            f"| {' / '.join('never' if c is None else f'{c:.1f}' for c in conv)} "
            f"| {' / '.join(retx)} | {len(runs)} |"
        )
    return lines


RESULTS_NAME = "gear.md"
# benchmarks/results/gear.md is partly hand-written (the analysis, Booster-tuned Gear): a run
# of this module replaces only the lines between these two markers, never the whole file
SECTION_BEGIN = "<!-- begin: written by python -m gemini_lab.gear; edits here are replaced -->"
SECTION_END = "<!-- end: written by python -m gemini_lab.gear -->"


def with_section(record: str, section: str) -> str:
    """``record`` with the text between its generated-section markers replaced by ``section``;
    a record without exactly one pair of markers, in order, is refused (ValueError) rather
    than overwritten."""
    counts = record.count(SECTION_BEGIN), record.count(SECTION_END)
    if counts != (1, 1) or record.index(SECTION_BEGIN) > record.index(SECTION_END):
        raise ValueError(
            f"expected one {SECTION_BEGIN!r} before one {SECTION_END!r}; found {counts[0]} "
            f"and {counts[1]}: the record's hand-written text would be lost"
        )
    head, rest = record.split(SECTION_BEGIN)
    tail = rest.split(SECTION_END)[1]
    return f"{head}{SECTION_BEGIN}\n{section.rstrip()}\n{SECTION_END}{tail}"


def work_dir(argv: list[str] | None = None) -> Path | None:
    """``--work DIR`` from the command line: where the boot's raw results are kept (None: a
    temporary directory, removed after the run). A DIR that exists and is not empty is
    refused, so an earlier run's results are never mixed in or overwritten."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m gemini_lab.gear", description=main.__doc__)
    parser.add_argument("--work", type=Path, help="keep the boot's raw results here")
    work: Path | None = parser.parse_args(argv).work
    if work is not None and work.exists() and (not work.is_dir() or any(work.iterdir())):
        parser.error(f"--work {work}: exists and is not an empty directory")
    return work


def main(argv: list[str] | None = None) -> None:
    """``python -m gemini_lab.gear``: run the pair benchmark in one UML boot and write its
    section of benchmarks/results/gear.md (the markers checked before the boot)."""
    import contextlib
    import datetime
    import subprocess
    import sys
    import tempfile

    from gemini_lab.host import REPO, run_plan

    work = work_dir(argv)
    out = REPO / "benchmarks" / "results" / RESULTS_NAME
    try:
        with_section(out.read_text(), "")
    except ValueError as exc:
        raise SystemExit(f"python -m gemini_lab.gear: {out}: {exc}") from exc
    keep = contextlib.nullcontext(str(work)) if work is not None else None
    # a temporary directory only when no --work was given (removed after the run)
    with keep or tempfile.TemporaryDirectory(prefix="gear-pairs-") as where:
        Path(where).mkdir(parents=True, exist_ok=True)
        results = run_plan(pair_plan(), Path(where), backend="uml", timeout_s=3600)
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    text = render_pairs(
        results,
        f"{Path(sys.executable).name} -m gemini_lab.gear",
        datetime.datetime.now(datetime.UTC).date().isoformat(),
        commit,
    )
    out.write_text(with_section(out.read_text(), text))
    print(text)


if __name__ == "__main__":
    main()
