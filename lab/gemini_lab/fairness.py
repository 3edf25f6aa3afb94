"""Two flows through one shared bottleneck: RTT fairness (the Gemini paper's Fig. 7) and
cubic-friendliness (Fig. 8), in the UML lab on its simulated clock.

    gemini-lab fairness [--part rtt] [--part friendliness] [--tuned-theta JSON|FILE] ...

The lab's own topology (gemini_lab.netem) gives every path its own bottleneck, so this module
builds a second one of its own beside it, in namespaces of its own:

    fair0 (172.16.0.2) ──┐ ACK delay d0
                         fairrtr ── bottleneck (tbf + netem queue) ── fairrcv (172.16.9.2)
    fair1 (172.16.1.2) ──┘ ACK delay d1

Two sender namespaces, one per flow, each with its own veth to the router; one receiver behind
the router's single egress "bneck", where a tbf sets the rate and a netem below it holds the
queue: both flows' data meet in that one queue. A flow's round-trip time is a netem delay on the
router's egress back toward its own sender, so it delays only that flow's ACKs (as
gemini_lab.netem delays ACKs, never data); a second sender namespace rather than a tc filter on
one makes the per-flow delay a plain qdisc, and gives each flow its own ``net.fusion.*`` θ (the
module's sysctls are per network namespace). Each pair gets a fresh queue and fresh delay lines;
the two flows start together and are measured like every lab flow (gemini_lab.bulk: blocking
sockets, receiver-side bytes after the first ``omit_s`` seconds).

Figures: fairness ratio = AvgTpt_base / AvgTpt_x (eq. 10: the base flow has the 10 ms RTT) and
friendliness ratio = AvgTpt / IdealTpt (eq. 11), where the ideal is half the link's goodput
(rate x 1448/1514: a full-sized segment's payload over its bytes on the wire, what tbf
counts), so that two identical flows filling the link score 1.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from gemini_api.theta import load_spec
from gemini_lab.experiment import _bulk, finish_flow
from gemini_lab.host import REPO
from gemini_lab.netem import DELAY_LIMIT, TCP_MEM, _veth, sh, tbf_args
from gemini_lab.recorded import Contender, Measurement, opening, tuned_text

RESULTS_PATH = REPO / "benchmarks" / "results" / "fairness.md"

# --- guest side ------------------------------------------------------------------------------

SENDERS = ("fair0", "fair1")
ROUTER = "fairrtr"
RECEIVER = "fairrcv"
RECEIVER_ADDR = "172.16.9.2"
BOTTLENECK_IF = "bneck"
FAIR_PORT = 5301
PAIR_GAP_S = 1.0  # lets the last pair's packets and FINs drain before the queue is rebuilt
SS_AFTER_S = 1.0  # when each sender's socket is read back with ss: connected, sending
KNOWN_CCS = ("fusion", "cubic", "bbr", "reno", "vegas")


def _sender_addr(i: int, host: int = 2) -> str:
    return f"172.16.{i}.{host}"


def _ensure_topology() -> None:
    """The shared-bottleneck namespaces, built on the first pair of a boot. Interface names
    are unique across the guest: ``ip link add`` creates a veth in the calling namespace (the
    lab's sender namespace, which has its own veth0) before moving it."""
    if Path(f"/run/netns/{ROUTER}").exists():
        return
    for ns in (*SENDERS, ROUTER, RECEIVER):
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "set", "lo", "up", ns=ns)
        for key in ("tcp_rmem", "tcp_wmem"):
            sh("sysctl", "-qw", f"net.ipv4.{key}={TCP_MEM}", ns=ns)
        # no cached ssthresh or RTT from the previous pair's flows
        sh("sysctl", "-qw", "net.ipv4.tcp_no_metrics_save=1", ns=ns)
    sh("sysctl", "-qw", "net.ipv4.ip_forward=1", ns=ROUTER)
    for i, snd in enumerate(SENDERS):
        _veth(snd, f"up{i}", _sender_addr(i), ROUTER, f"s{i}", _sender_addr(i, 1))
        sh("ip", "route", "add", "default", "via", _sender_addr(i, 1), ns=snd)
        # netem must see, queue and drop wire-sized packets, not 64 KB super-packets
        sh("ethtool", "-K", f"up{i}", "tso", "off", "gso", "off", ns=snd)
    _veth(ROUTER, BOTTLENECK_IF, "172.16.9.1", RECEIVER, "bneckrx", RECEIVER_ADDR)
    sh("ip", "route", "add", "default", "via", "172.16.9.1", ns=RECEIVER)


def _configure(rate_kbit: int, queue_packets: int, rtts_ms: list[float]) -> None:
    """A fresh bottleneck queue and fresh ACK delay lines for one pair."""

    def replace_root(dev: str, *qdisc: str) -> None:
        sh("tc", "qdisc", "del", "dev", dev, "root", ns=ROUTER, check=False)
        sh("tc", "qdisc", "add", "dev", dev, "root", *qdisc, ns=ROUTER)

    replace_root(BOTTLENECK_IF, "handle", "1:", "tbf", *tbf_args(rate_kbit))
    sh(
        "tc", "qdisc", "add", "dev", BOTTLENECK_IF, "parent", "1:1", "handle", "10:",
        "netem", "limit", str(queue_packets), ns=ROUTER,
    )  # fmt: skip
    for i, rtt in enumerate(rtts_ms):
        replace_root(f"s{i}", "netem", "delay", f"{rtt}ms", "limit", str(DELAY_LIMIT))


def _set_theta(ns: str, theta: dict[str, int]) -> None:
    """The namespace's Fusion θ: the spec's defaults with ``theta`` over them."""
    for p in load_spec().params:
        sh("sysctl", "-qw", f"net.fusion.{p.name}={theta.get(p.name, p.default)}", ns=ns)


def _cc_in_kernel(ns: str) -> str | None:
    """The congestion control the kernel runs on the namespace's connection to the receiver,
    as ``ss -ti`` names it: the flow ran the CC asked for, not a namespace default."""
    text = sh("ss", "-tin", "dst", RECEIVER_ADDR, ns=ns, check=False)
    return next((t for t in text.split() if t in KNOWN_CCS), None)


def exp_fairness(e: dict, out: Path) -> dict:
    """One pair: two flows (``e["flows"]``: cc, rtt_ms, theta) through one bottleneck of
    ``rate_kbit`` and ``queue_packets``, started together for ``duration_s``."""
    _ensure_topology()
    flows = e["flows"]
    _configure(e["rate_kbit"], e["queue_packets"], [f["rtt_ms"] for f in flows])
    for i, f in enumerate(flows):
        _set_theta(SENDERS[i], f.get("theta", {}))
    servers = []
    for i in range(len(flows)):
        server = _bulk(RECEIVER, "recv", FAIR_PORT + i, 1, e["omit_s"], e["duration_s"])
        assert server.stdout is not None
        if server.stdout.readline().strip() != "ready":
            raise RuntimeError(f"receiver {i} did not start: {server.stderr}")
        servers.append(server)
    clients = [
        _bulk(SENDERS[i], "send", RECEIVER_ADDR, FAIR_PORT + i, f["cc"], 1, e["duration_s"])
        for i, f in enumerate(flows)
    ]
    time.sleep(SS_AFTER_S)
    running = [_cc_in_kernel(SENDERS[i]) for i in range(len(flows))]
    results = [
        {**f, "cc_in_kernel": cc, **finish_flow(s, c, e["duration_s"])}
        for f, cc, s, c in zip(flows, running, servers, clients, strict=True)
    ]
    time.sleep(PAIR_GAP_S)
    return {
        "rate_kbit": e["rate_kbit"],
        "queue_packets": e["queue_packets"],
        "flows": results,
    }


# --- host side: plans ------------------------------------------------------------------------

PACKET_BYTES = 1500
# A full segment's payload (MSS 1448 with timestamps) over its bytes on the wire as tbf counts
# them (1500 + 14 of Ethernet header): the most goodput a link can give.
GOODPUT_SHARE = 1448 / 1514
MIN_QUEUE_PACKETS = 2  # below one BDP of a 1 Mbit/s, 2 ms path: two packets, never zero
BASE_RTT_MS = 10.0
RTT_XS_MS = (10.0, 20.0, 40.0, 80.0)
BUFFERS_BDP = (0.5, 1.0, 2.0, 4.0)
RTT_RATE_MBIT = 100.0  # the paper's: 1 BDP = 10 ms x 100 Mbit/s
# Fig. 8's random environments (after Copa's evaluation): bandwidth, RTT, buffer in BDP.
FRIENDLY_RATE_MBIT = (1.0, 50.0)
FRIENDLY_RTT_MS = (2.0, 100.0)
FRIENDLY_BUFFER_BDP = (0.5, 5.0)


CONTENDERS = ("fusion-default", "fusion-tuned", "cubic", "bbr")


def contenders(tuned_theta: dict[str, int] | None, only: tuple[str, ...] = ()) -> list[Contender]:
    """The CCs compared, in CONTENDERS' order (fusion-tuned only with a tuned θ)."""
    out = [Contender("fusion-default", "fusion", {})]
    if tuned_theta:
        out.append(Contender("fusion-tuned", "fusion", tuned_theta))
    out += [Contender("cubic", "cubic", {}), Contender("bbr", "bbr", {})]
    return [c for c in out if not only or c.name in only]


def queue_packets(rate_mbit: float, rtt_ms: float, buffer_bdp: float) -> int:
    bdp = rate_mbit * 1e6 * rtt_ms / 1000 / (PACKET_BYTES * 8)
    return max(MIN_QUEUE_PACKETS, math.ceil(bdp * buffer_bdp))


def _pair(
    label: str,
    rate_mbit: float,
    queue: int,
    flows: list[dict],
    duration_s: int,
    omit_s: int,
) -> dict:
    return {
        "label": label,
        "kind": "fairness",
        "rate_kbit": round(rate_mbit * 1000),
        "queue_packets": queue,
        "flows": flows,
        "duration_s": duration_s,
        "omit_s": omit_s,
    }


def _flow(c: Contender, rtt_ms: float) -> dict:
    return {"name": c.name, "cc": c.cc, "theta": c.theta, "rtt_ms": rtt_ms}


RTT_POSITIONS = {"first": "rtt/", "second": "rtt-second/"}  # where the base flow runs


def rtt_plan(
    cs: list[Contender],
    xs: tuple[float, ...],
    buffers: tuple[float, ...],
    rate_mbit: float,
    duration_s: int,
    omit_s: int,
    position: str = "first",
) -> list[dict]:
    """Fig. 7: two flows of one CC, base RTT 10 ms (marked ``base``, the first flow or the
    second: see POSITIONS) against x; buffer in BDPs of the base RTT."""
    pairs = []
    for c in cs:
        for b in buffers:
            for x in xs:
                base, other = {**_flow(c, BASE_RTT_MS), "base": True}, _flow(c, x)
                flows = [base, other] if position == "first" else [other, base]
                label = f"{RTT_POSITIONS[position]}{c.name}/buf{b:g}/x{x:g}"
                queue = queue_packets(rate_mbit, BASE_RTT_MS, b)
                pairs.append(_pair(label, rate_mbit, queue, flows, duration_s, omit_s))
    return pairs


@dataclass(frozen=True)
class Setting:
    rate_mbit: float
    rtt_ms: float
    buffer_bdp: float


def random_settings(n: int, seed: int) -> list[Setting]:
    """Fig. 8's environments, drawn uniformly; the same seed gives every CC the same ones."""
    rng = random.Random(seed)
    return [
        Setting(
            round(rng.uniform(*FRIENDLY_RATE_MBIT), 1),
            round(rng.uniform(*FRIENDLY_RTT_MS), 1),
            round(rng.uniform(*FRIENDLY_BUFFER_BDP), 2),
        )
        for _ in range(n)
    ]


# Where the CC under test runs in a friendliness pair (and the 10 ms flow in an RTT pair,
# RTT_POSITIONS): the first flow (sender fair0) or the second. The position matters on the
# simulated clock: cubic against cubic gave the first flow 1.19 of its fair share (median of
# 16 settings, 15 of 16 above 0.98; benchmarks/results/fairness.md). Our reading, not shown:
# with one RTT the two flows send in lockstep, the guest handles their events in the same
# order at every instant, and in a full queue the first flow's packet finds the room. Each
# setting run in both positions cancels it.
POSITIONS = {"first": "friendly/", "second": "friendly-second/"}


def friendliness_plan(
    cs: list[Contender],
    settings: list[Setting],
    duration_s: int,
    omit_s: int,
    position: str = "first",
) -> list[dict]:
    """Fig. 8: one flow of each CC against one cubic flow, same path, in each setting; the
    flow under test is marked ``subject``."""
    cubic = _flow(Contender("cubic", "cubic", {}), 0)
    pairs = []
    for i, s in enumerate(settings):
        for c in cs:
            subject = {**_flow(c, s.rtt_ms), "subject": True}
            other = {**cubic, "rtt_ms": s.rtt_ms}
            flows = [subject, other] if position == "first" else [other, subject]
            queue = queue_packets(s.rate_mbit, s.rtt_ms, s.buffer_bdp)
            label = f"{POSITIONS[position]}{c.name}/{i}"
            pairs.append(_pair(label, s.rate_mbit, queue, flows, duration_s, omit_s))
    return pairs


# --- host side: figures ----------------------------------------------------------------------


def goodput_capacity_mbps(pair: dict) -> float:
    return float(pair["rate_kbit"]) / 1000 * GOODPUT_SHARE


def fairness_ratio(pair: dict) -> float:
    """Eq. 10 from the receivers' bytes: the base-RTT flow (marked ``base``; else the first)
    over the other."""
    flows = pair["flows"]
    i = next((k for k, f in enumerate(flows) if f.get("base")), 0)
    base, other = flows[i]["throughput_mbps"], flows[1 - i]["throughput_mbps"]
    return float(base / other) if other else math.inf


def friendliness_ratio(pair: dict) -> float:
    """Eq. 11: the flow under test (marked ``subject``; else the first) over half the link's
    goodput."""
    flows = pair["flows"]
    subject = next((f for f in flows if f.get("subject")), flows[0])
    return float(subject["throughput_mbps"] / (goodput_capacity_mbps(pair) / 2))


def utilisation(pair: dict) -> float:
    return sum(f["throughput_mbps"] for f in pair["flows"]) / goodput_capacity_mbps(pair)


def _pairs(results: dict, prefix: str) -> dict[str, dict]:
    """label → result of the pairs under ``prefix``; an experiment that failed raises."""
    out = {}
    for label, r in results["experiments"].items():
        if label.startswith(prefix):
            if "error" in r:
                raise RuntimeError(f"{label} failed:\n{r['error']}")
            out[label] = r
    return out


FAIR_BAND = (0.8, 1.25)  # the ratios counted as fair


def _within(ratios: list[float]) -> int:
    return sum(1 for r in ratios if FAIR_BAND[0] <= r <= FAIR_BAND[1])


def _rtt_cell(pairs: dict[str, dict], key: str, position: str) -> tuple[float, float] | None:
    """(ratio, link use) of one cell; ``both``: the geometric mean of the two positions'
    ratios and the lower link use, when both ran."""
    found = [pairs.get(f"{RTT_POSITIONS[p]}{key}") for p in RTT_POSITIONS]
    if position != "both":
        pair = found[list(RTT_POSITIONS).index(position)]
        return (fairness_ratio(pair), utilisation(pair)) if pair else None
    if not all(found):
        return None
    ratios = [fairness_ratio(p) for p in found if p]
    return math.prod(ratios) ** (1 / len(ratios)), min(utilisation(p) for p in found if p)


def rtt_table(
    results: dict,
    cs: list[Contender],
    xs: tuple[float, ...],
    buffers: tuple,
    position: str = "first",
) -> str:
    """Ratios per CC and buffer, with the 10 ms flow first, second, or ``both``."""
    pairs = {**_pairs(results, "rtt/"), **_pairs(results, "rtt-second/")}
    head = "| CC | buffer (BDP of 10 ms) | " + " | ".join(f"x = {x:g} ms" for x in xs)
    lines = [
        head + " | link use | within [0.8, 1.25] |",
        "|---|---:|" + "---:|" * len(xs) + "---:|---:|",
    ]
    for c in cs:
        for b in buffers:
            cells = [_rtt_cell(pairs, f"{c.name}/buf{b:g}/x{x:g}", position) for x in xs]
            done = [cell for cell in cells if cell]
            if not done:
                continue
            ratios = " | ".join(f"{cell[0]:.2f}" if cell else "–" for cell in cells)
            use = min(u for _, u in done)
            within = _within([r for r, _ in done])
            lines.append(
                f"| {c.name} | {b:g} | {ratios} | ≥ {100 * use:.0f} % | {within} of {len(done)} |"
            )
    return "\n".join(lines)


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def _by_setting(results: dict, prefix: str) -> dict[str, dict[int, float]]:
    """CC name → setting index → friendliness ratio, for the pairs under ``prefix``."""
    out: dict[str, dict[int, float]] = {}
    for label, pair in _pairs(results, prefix).items():
        _, name, index = label.split("/")
        out.setdefault(name, {})[int(index)] = friendliness_ratio(pair)
    return out


def friendliness_ratios(results: dict, position: str = "first") -> dict[str, list[float]]:
    return {n: list(r.values()) for n, r in _by_setting(results, POSITIONS[position]).items()}


def both_positions(results: dict) -> dict[str, dict[int, float]]:
    """Per CC and setting, the mean of its ratio as first and as second flow (settings run
    in one position only are left out)."""
    first, second = (_by_setting(results, p) for p in POSITIONS.values())
    return {
        name: {i: (r + second[name][i]) / 2 for i, r in rs.items() if i in second.get(name, {})}
        for name, rs in first.items()
        if name in second
    }


def friendliness_table(results: dict, cs: list[Contender]) -> str:
    rows = {
        **{p: friendliness_ratios(results, p) for p in POSITIONS},
        "mean of both": {n: list(r.values()) for n, r in both_positions(results).items()},
    }
    lines = [
        "| CC against cubic | as flow | settings | median | quartiles | min – max | "
        "within [0.8, 1.25] |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for c in cs:
        for position, ratios in rows.items():
            r = ratios.get(c.name)
            if not r:
                continue
            q1, q2, q3 = _quartiles(r)
            lines.append(
                f"| {c.name} | {position} | {len(r)} | {q2:.2f} | {q1:.2f} – {q3:.2f} | "
                f"{min(r):.2f} – {max(r):.2f} | {_within(r)} of {len(r)} |"
            )
    return "\n".join(lines)


def settings_table(results: dict, cs: list[Contender], settings: list[Setting]) -> str:
    """Each setting's ratios, as first / as second flow."""
    pairs = {**_pairs(results, "friendly/"), **_pairs(results, "friendly-second/")}
    lines = [
        "| # | rate Mbit/s | RTT ms | buffer BDP (packets) | "
        + " | ".join(c.name for c in cs)
        + " |",
        "|---:|---:|---:|---:|" + "---:|" * len(cs),
    ]
    for i, s in enumerate(settings):
        cells = []
        queue = queue_packets(s.rate_mbit, s.rtt_ms, s.buffer_bdp)
        for c in cs:
            found = [pairs.get(f"{p}{c.name}/{i}") for p in POSITIONS.values()]
            cells.append(" / ".join(f"{friendliness_ratio(p):.2f}" if p else "–" for p in found))
        lines.append(
            f"| {i} | {s.rate_mbit:g} | {s.rtt_ms:g} | {s.buffer_bdp:g} ({queue}) | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class FairnessConfig:
    parts: tuple[str, ...]
    tuned_theta: dict[str, int] | None
    tuned_source: str
    only: tuple[str, ...] = ()  # contenders' names; empty: all
    positions: tuple[str, ...] = tuple(POSITIONS)
    xs: tuple[float, ...] = RTT_XS_MS
    buffers: tuple[float, ...] = BUFFERS_BDP
    rtt_rate_mbit: float = RTT_RATE_MBIT
    settings: int = 8
    seed: int = 1
    duration_s: int = 25
    omit_s: int = 5


def build_plan(cfg: FairnessConfig) -> dict:
    cs = contenders(cfg.tuned_theta, cfg.only)
    experiments = []
    if "rtt" in cfg.parts:
        for position in cfg.positions:
            experiments += rtt_plan(
                cs, cfg.xs, cfg.buffers, cfg.rtt_rate_mbit, cfg.duration_s, cfg.omit_s, position
            )
    if "friendliness" in cfg.parts:
        settings = random_settings(cfg.settings, cfg.seed)
        for position in cfg.positions:
            experiments += friendliness_plan(cs, settings, cfg.duration_s, cfg.omit_s, position)
    return {"paths": [], "experiments": experiments}


def render(results: dict, cfg: FairnessConfig, command: str) -> str:
    cs = contenders(cfg.tuned_theta, cfg.only)
    theta = tuned_text(cfg.tuned_theta)
    parts = [
        *opening(
            "RTT fairness and cubic-friendliness (Gemini paper, Figs. 7 and 8)", command, results
        ),
        f"Two flows share one bottleneck (tbf + netem queue; `lab/gemini_lab/fairness.py`), "
        f"each {cfg.duration_s} s from a simultaneous start, throughput counted by the "
        f"receiver after the first {cfg.omit_s} s. fusion-default is the θ spec's default; "
        f"fusion-tuned is {theta} ({cfg.tuned_source}).",
    ]
    if "rtt" in cfg.parts:
        parts += [
            "",
            f"## RTT fairness: AvgTpt(10 ms) / AvgTpt(x), {cfg.rtt_rate_mbit:g} Mbit/s",
        ]
        ran = [p for p in RTT_POSITIONS if _pairs(results, RTT_POSITIONS[p])]
        for position in ran + (["both"] if len(ran) > 1 else []):
            parts += [
                "",
                f"The 10 ms flow as the {position} flow:"
                if position != "both"
                else "Both positions (geometric mean of the two ratios, where both ran):",
                "",
                rtt_table(results, cs, cfg.xs, cfg.buffers, position),
            ]
    if "friendliness" in cfg.parts:
        settings = random_settings(cfg.settings, cfg.seed)
        parts += [
            "",
            "## Cubic-friendliness: AvgTpt / IdealTpt against one cubic flow",
            "",
            f"{cfg.settings} settings drawn with seed {cfg.seed}: rate 1–50 Mbit/s, RTT "
            "2–100 ms, buffer 0.5–5 BDP (at least 2 packets), the same for every CC; "
            "IdealTpt = half the link's goodput. The CC under test runs as the first flow, "
            "the second, or both (then a setting's figure is the mean of the two): see "
            "POSITIONS in fairness.py. Per setting: as first / as second flow.",
            "",
            friendliness_table(results, cs),
            "",
            settings_table(results, cs, settings),
        ]
    return "\n".join(parts) + "\n"


def progress_line(label: str, result: dict) -> str:
    if "error" in result:
        return f"{label}: ERROR {result['error'].strip().splitlines()[-1]}"
    tpts = " + ".join(f"{f['throughput_mbps']:.2f}" for f in result["flows"])
    return f"{label}: {tpts} Mbit/s ({100 * utilisation(result):.0f} % of the link)"


MEASUREMENT = Measurement(build_plan, render, progress_line)
