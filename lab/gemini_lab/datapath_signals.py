"""Host side of the datapaths' signal checks (issue #31): the plan that runs GEMINI and DC-Vegas
where each of their signals occurs, in the UML lab (simulated clock), and the readings the
tests take from its results.

Paths (DATAPATHS-SPEC.md section 0.3: rates / 10, times x 10, so every window, buffer and K is
the paper's in packets and only time-valued θ scale):
  0. ``ce-marker``: 20 Mbit/s, 20 ms, a deep netem queue that the GEMINI flows turn into a
     random CE marker of a known fraction (netem ``loss random p% ecn``): a marking fraction
     that does not depend on the queue, for α to be compared with;
  1. the shipped ``datacenter`` path (100 Mbit/s, 2 ms, RED marking at K = 20 packets);
  2. the shipped ``cross-dc`` path (a datacenter hop marking at 50 packets, then an 80 Mbit/s
     WAN hop with 10 000 packets of buffer and no ECN; 100 ms).

GEMINI runs at the paper's defaults scaled: T = 5 ms x 10 = 50 ms, C = 100 Mbit/s (its
``capacity_mbit``; C·RTT_base, and with it F and h, are the paper's). DC-Vegas runs at its
spec's defaults (K_dcv = 6 packets, g = 1/16) with no ECN anywhere on its path.
"""

from __future__ import annotations

import itertools

from gemini_api.datapaths import datapath
from gemini_lab import scenario

SCALE = 10  # DATAPATHS-SPEC.md section 0.3
GEMINI, DCVEGAS = "gemini", "dcvegas"
CE_MARKER = scenario.load("ce-marker")  # a random CE marker, not a queue, marks
# 1 %: below 16/1024, where α in DCTCP's 1/1024 fixed point was zeroed every round and read
# about g·F, a sixteenth of the fraction (cc_common.h); 10 and 30 %: congested rounds' fractions
CE_PERCENTS = (1, 10, 30)
# C for the CE-marker flows: the module's default (1 Gbit/s), above the path's 20 Mbit/s, so F is
# small (0.11) and a marked round cuts the window by about a tenth of α: the window stays tens
# of packets, and α is measured over rounds of tens of packets. (At C = 20 Mbit/s, F = 2.4 and
# every marked round halves the window down to 2 packets; α then averages per-round fractions
# of 0, 1/2 or 1 over rounds whose length the marks themselves decide, and reads high.)
CE_CAPACITY_MBIT = 1000
DCV_K_WIDE = 24  # a second K_dcv on the datacenter path: the queue must follow it


def scaled_theta(name: str) -> dict[str, int]:
    """The spec's defaults with every time-valued parameter (unit µs) multiplied by SCALE."""
    spec = datapath(name).spec
    return {p.name: p.default * SCALE if p.unit == "µs" else p.default for p in spec.params}


def gemini_extra(rate_mbit: float) -> dict[str, int]:
    """GEMINI's non-θ parameter: C, the path's bottleneck capacity."""
    return {"capacity_mbit": round(rate_mbit)}


def signals_plan() -> dict:
    dc, cross = scenario.load("datacenter"), scenario.load("cross-dc")
    gem = scaled_theta(GEMINI)

    def flow(label: str, name: str, path: int, duration_s: float, **extra: object) -> dict:
        return {
            "label": label,
            "kind": "datapath_flow",
            "datapath": name,
            "path": path,
            "duration_s": duration_s,
            **extra,
        }

    experiments = [
        *(
            flow(
                f"gemini/ce-{p}",
                GEMINI,
                0,
                20,
                theta=gem,
                module_extra={"capacity_mbit": CE_CAPACITY_MBIT},
                ce_percent=p,
                scenario=CE_MARKER.to_dict(),
                sample_s=0.05,
                hops=[0],
            )
            for p in CE_PERCENTS
        ),
        flow(
            "gemini/datacenter",
            GEMINI,
            1,
            10,
            theta=gem,
            module_extra=gemini_extra(100),
            sample_s=0.05,
            hops=[0],
        ),
        flow(
            "gemini/cross-dc",
            GEMINI,
            2,
            30,
            theta=gem,
            module_extra=gemini_extra(100),
            sample_s=0.1,
            hops=[0, 1],
        ),
        flow("dcvegas/cut", DCVEGAS, 0, 10, sample_s=0.002, hops=[]),
        flow("dcvegas/datacenter", DCVEGAS, 1, 10, sample_s=0.05, hops=[0]),
        flow(
            f"dcvegas/datacenter-k{DCV_K_WIDE}",
            DCVEGAS,
            1,
            10,
            theta={"queue_threshold": DCV_K_WIDE},
            sample_s=0.05,
            hops=[0],
        ),
    ]
    for i, e in enumerate(experiments):
        e["port_offset"] = i
    # both modules loaded first, while the build the plan names is surely there (the lab's
    # module cache keeps one build: a boot started later from changed sources replaces it)
    loads = [
        {"label": f"load/{n}", "kind": "datapath_load", "datapath": n} for n in (GEMINI, DCVEGAS)
    ]
    return {
        "paths": [CE_MARKER.to_dict(), dc.to_dict(), cross.to_dict()],
        "experiments": loads + experiments,
    }


# --- readings -------------------------------------------------------------------------------

ALPHA_ONE = 1024
CUTS_SHIFT = 16  # GEMINI's bbr_bw_hi: delay cuts << 16 | ECN cuts


def cuts(result: dict) -> tuple[int, int]:
    """(delay cuts, ECN cuts) GEMINI counted over the flow: its last sample's record."""
    last = [s for s in result["samples"] if s.get("bbr_bw_hi") is not None][-1]
    return last["bbr_bw_hi"] >> CUTS_SHIFT, last["bbr_bw_hi"] & 0xFFFF


def alpha_and_fraction(result: dict, skip_s: float) -> tuple[float, float, int]:
    """The mean α the module reported after ``skip_s`` (α starts at 1 and needs tens of rounds
    to forget it), the fraction of packets delivered CE-marked over the same time (the
    sender's tcp_info: delivered_ce / delivered), and how many samples."""
    s = [x for x in result["samples"] if x["t"] >= skip_s and x.get("dctcp_alpha") is not None]
    alpha = sum(x["dctcp_alpha"] for x in s) / len(s) / ALPHA_ONE
    delivered = s[-1]["tcpi_delivered"] - s[0]["tcpi_delivered"]
    ce = s[-1]["tcpi_delivered_ce"] - s[0]["tcpi_delivered_ce"]
    return alpha, ce / delivered, len(s)


def cut_events(result: dict) -> list[dict]:
    """Each window reduction DC-Vegas made between two consecutive samples in Open with no
    retransmission between them: the window before and after, and α after (the α the cut
    used: the round's end updates α, then cuts w·α/2)."""
    events = []
    s = result["samples"]
    for a, b in itertools.pairwise(s):
        if b["tcpi_snd_cwnd"] >= a["tcpi_snd_cwnd"]:
            continue
        if a["tcpi_ca_state"] or b["tcpi_ca_state"]:
            continue
        if b["tcpi_total_retrans"] != a["tcpi_total_retrans"]:
            continue
        events.append(
            {"before": a["tcpi_snd_cwnd"], "after": b["tcpi_snd_cwnd"], "alpha": b["dctcp_alpha"]}
        )
    return events


def predicted_cut(cwnd: int, alpha: int) -> int:
    """The window after DC-Vegas's cut w − w·(α/2), in the module's fixed point (cc_cut)."""
    f = min(alpha >> 1, ALPHA_ONE)
    return max(cwnd - ((cwnd * f) >> 10), 2)


def render(results: dict, command: str) -> str:
    """Markdown: each signal check's figures (tests/test_lab_datapath_signals.py asserts them)."""
    ex = results["experiments"]
    lines = [
        "# GEMINI and DC-Vegas react to their signals (UML lab, simulated clock)",
        "",
        f"Command: `{command}`",
        "",
        "One UML boot; figures read from the modules' own state through sock_diag on the guest "
        "clock (they do not depend on host speed; a rerun gives the same). Scaled by s = 10. "
        "Asserted by tests/test_lab_datapath_signals.py.",
        "",
        "## GEMINI's α against a known marking fraction (netem marks p % of ECN-capable packets "
        "CE at random; 20 Mbit/s, 20 ms)",
        "",
        "| p | delivered CE-marked (sender) | CE at the receiver | mean α (after 5 s) | α / "
        "fraction | ECN cuts | delay cuts |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in CE_PERCENTS:
        r = ex.get(f"gemini/ce-{p}")
        if not r or "error" in r:
            lines.append(f"| {p} % | error |")
            continue
        alpha, frac, _ = alpha_and_fraction(r, 5.0)
        got = r["netstat"]["receiver"]
        rcv = got["InCEPkts"] / max(1, got["InCEPkts"] + got["InECT0Pkts"])
        d, e = cuts(r)
        lines.append(
            f"| {p} % | {frac:.4f} | {rcv:.4f} | {alpha:.4f} | {alpha / frac:.3f} | {e} | {d} |"
        )
    lines += [
        "",
        "## GEMINI's two signals by hop (T = 50 ms, C = 100 Mbit/s)",
        "",
        "| path | goodput Mbit/s | delay cuts | ECN cuts | queue per hop (mean / max pkts) | "
        "marks |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for label in ("gemini/datacenter", "gemini/cross-dc"):
        r = ex.get(label)
        if not r or "error" in r:
            lines.append(f"| {label} | error |")
            continue
        d, e = cuts(r)
        qs = "; ".join(
            f"hop {h}: {q['mean_qlen']:.1f} / {q['max_qlen']}" for h, q in r["queues"].items()
        )
        marks = sum(q["marked"] for q in r["queues"].values())
        lines.append(f"| {label[7:]} | {r['throughput_mbps']:.1f} | {d} | {e} | {qs} | {marks} |")
    r = ex.get("dcvegas/cut")
    if r and "error" not in r:
        ev = cut_events(r)
        exact = [x for x in ev if abs(predicted_cut(x["before"], x["alpha"]) - x["after"]) <= 1]
        lines += [
            "",
            "## DC-Vegas's cut against its α, no ECN (20 Mbit/s, 20 ms, sampled every 2 ms)",
            "",
            f"{len(ev)} window reductions seen in Open with no retransmission; {len(exact)} of "
            "them equal w − w·α/2 (the module's fixed point, ±1 packet) for the α it reported "
            f"after the round; α ranged {min(x['alpha'] for x in ev) / ALPHA_ONE:.3f}–"
            f"{max(x['alpha'] for x in ev) / ALPHA_ONE:.3f}. ECN-capable packets received: "
            f"{r['netstat']['receiver']['InECT0Pkts']}.",
        ]
    lines += [
        "",
        "## DC-Vegas's queue against K_dcv (datacenter path, RED never marks: no ECT)",
        "",
        "| K_dcv | goodput Mbit/s | queue mean / max pkts | marks | drops |",
        "|---:|---:|---:|---:|---:|",
    ]
    for label, k in (("dcvegas/datacenter", 6), (f"dcvegas/datacenter-k{DCV_K_WIDE}", DCV_K_WIDE)):
        r = ex.get(label)
        if not r or "error" in r:
            lines.append(f"| {k} | error |")
            continue
        q = r["queues"]["0"]
        lines.append(
            f"| {k} | {r['throughput_mbps']:.1f} | {q['mean_qlen']:.1f} / {q['max_qlen']} | "
            f"{q['marked']} | {q['drops']} |"
        )
    return "\n".join(lines) + "\n"
