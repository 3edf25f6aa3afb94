"""Tables of lab results, for the terminal and for benchmarks/results/."""

from __future__ import annotations

import datetime as dt

from gemini_lab.host import REPO
from gemini_lab.plans import HAND_THETAS

BENCH_PATH = REPO / "benchmarks" / "results" / "fusion-lab.md"
RECORDS_PATH = REPO / "benchmarks" / "results" / "fusion-records.md"


def _flow_rows(results: dict) -> list[str]:
    rows = []
    for label, r in results["experiments"].items():
        if "throughput_mbps" not in r:
            continue
        rows.append(
            f"| {label} | {r['throughput_mbps']:.2f} | {r['queue_delay_ms']:.1f} | "
            f"{r['mean_rtt_ms']:.1f} | {r['min_rtt_ms']:.1f} | {r['retransmits']} |"
        )
    return rows


def table(results: dict) -> str:
    head = [
        "| run | throughput Mbit/s | mean queueing delay ms | mean RTT ms | min RTT ms | "
        "retransmits |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines = head + _flow_rows(results)
    for label, r in results["experiments"].items():
        if "error" in r:
            lines.append(f"\n{label}: ERROR\n{r['error']}")
    if results.get("kernel_problems"):
        lines.append("\nKERNEL PROBLEMS:\n" + "\n".join(results["kernel_problems"]))
    return "\n".join(lines)


def failures(plan: dict, results: dict) -> list[str]:
    """What went wrong in one guest run, one line each: an experiment that raised or never ran,
    the module not loading or unloading, the kernel complaining, the job's own exit status."""
    out = []
    if results.get("insmod", {}).get("rc") != 0:
        out.append(f"insmod tcp_fusion failed: {results.get('insmod')}")
    if results.get("rmmod", {}).get("rc") != 0:
        out.append(f"rmmod tcp_fusion failed: {results.get('rmmod')}")
    done = results.get("experiments", {})
    for e in plan["experiments"]:
        r = done.get(e["label"])
        if r is None:
            out.append(f"{e['label']}: did not run")
        elif "error" in r:
            last = r["error"].strip().splitlines()[-1]
            out.append(f"{e['label']}: ERROR {last}")
    out += [f"kernel: {line}" for line in results.get("kernel_problems", [])]
    if results.get("guest_rc") != 0:
        out.append(f"the guest's job exited with {results.get('guest_rc')}")
    return out


def progress_line(label: str, result: dict) -> str:
    """One line per experiment as the guest finishes it."""
    if "error" in result:
        return f"  {label}: ERROR {result['error'].strip().splitlines()[-1]}"
    figures = (
        f", {result['throughput_mbps']:.2f} Mbit/s, {result['retransmits']} retransmits"
        if "throughput_mbps" in result
        else ""
    )
    return f"  {label}: done in {result.get('elapsed_s', '?')} s (guest clock){figures}"


def _cpu_per_gb(rows: list[dict]) -> tuple[float, float, int] | None:
    """All runs of one CC at one flow count: busy seconds per GB over them, mean Mbit/s."""
    gbytes = sum(r.get("gbytes") or 0 for r in rows)
    if not rows or not gbytes:
        return None
    mbps = sum(r["throughput_mbps"] for r in rows) / len(rows)
    return sum(r["cpu_busy_s"] for r in rows) / gbytes, mbps, len(rows)


def cpu_table(results: dict) -> str:
    cpu = results["experiments"].get("cpu", {}).get("rows", [])
    lines = [
        "| flows | runs each | cubic CPU s/GB | fusion CPU s/GB | fusion / cubic | "
        "cubic Mbit/s | fusion Mbit/s |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in sorted({r["flows"] for r in cpu}):
        c = _cpu_per_gb([r for r in cpu if r["cc"] == "cubic" and r["flows"] == n])
        f = _cpu_per_gb([r for r in cpu if r["cc"] == "fusion" and r["flows"] == n])
        if c and f:
            lines.append(
                f"| {n} | {c[2]} | {c[0]:.2f} | {f[0]:.2f} | **{f[0] / c[0]:.3f}** | "
                f"{c[1]:.0f} | {f[1]:.0f} |"
            )
    return "\n".join(lines)


BACKEND_WORDS = {
    "uml": "User-Mode Linux on a simulated clock (time-travel=inf-cpu), one host core",
    "qemu": "Debian's stock kernel under qemu software emulation",
}


def _setting(results: dict) -> str:
    backend = results.get("backend", "qemu")
    return (
        f"guest kernel {results.get('kernel')}, {BACKEND_WORDS.get(backend, backend)}, "
        "on this 2-core machine"
    )


def write_benchmark(results: dict, command: str) -> None:
    cpu = "cpu" in results["experiments"]
    text = "\n".join(
        [
            "# Fusion in the lab: Table IV scenarios" + (" and CPU cost" if cpu else ""),
            "",
            f"Command: `{command}` (recorded {dt.date.today().isoformat()}, {_setting(results)}).",
            "",
            "Queueing delay is the mean smoothed RTT (the sender's tcp_info, sampled every "
            "100 ms) − the kernel's minimum RTT. Each run is one flow from a cold start "
            "(satellite runs twice as long as the others); hand-set θ: "
            + "; ".join(f"{k} = {v}" for k, v in HAND_THETAS.items())
            + ".",
            "",
            table(results),
            "",
        ]
        + (
            [
                "## CPU cost, guest CPU seconds per GB delivered (same boot, same path)",
                "",
                "The guest's whole busy time (user, system, irq, softirq) over 10 s runs on a "
                "2 ms, 150 Mbit/s path, divided by the bytes delivered; cubic and Fusion take "
                "turns, twice each. The rate is one both fill, so both deliver about the same "
                "bytes. Target: ≤ 1.05×.",
                "",
                cpu_table(results),
                "",
            ]
            if cpu
            else [
                "CPU cost is measured under qemu (`gemini-lab bench --backend qemu`): on the "
                "simulated clock CPU work takes no guest time.",
                "",
            ]
        )
    )
    BENCH_PATH.write_text(text)


def write_records(results: dict, command: str) -> None:
    runs = [
        (label, results["experiments"][label])
        for label in ("records", "records-burst")
        if label in results["experiments"]
    ]
    for label, r in runs:
        if "error" in r:
            raise RuntimeError(f"{label}: {r['error']}")
    rows = [
        f"| {'flows ended together' if label.endswith('burst') else 'one flow after another'} "
        f"| {r['flows']} | {r['failed']} | {r['seconds']:.2f} | {r['flows_per_s']:,.0f} | "
        f"{r['records_received']} | {r['records_short_of_payload']} | {r['kernel_records']} | "
        f"{r['kernel_dropped']} | {r['listener'].get('overruns')} |"
        for label, r in runs
    ]
    text = "\n".join(
        [
            "# Fusion flow records under many short flows",
            "",
            f"Command: `{command}` (recorded {dt.date.today().isoformat()}, "
            f"{_setting(results)}). Each flow is one connection carrying 1 KB under fusion "
            "over a 2 ms path; the listener is gemini_lab.records (32 MB receive buffer).",
            "",
            "- *One flow after another*: workers open, send, close and open the next; the rate is "
            "what the emulated guest reaches for whole connections (setup dominates).",
            "- *Flows ended together*: every connection is opened and its 1 KB acknowledged first; "
            "then all are closed at once (abortive close, so each socket is freed inside close() "
            "and its record sent there). The rate is flows ended ÷ the window in which they ended.",
            "",
            "| run | flows | failed | seconds | flows/s | records received | records < 1 KB | "
            "kernel: sent | kernel: dropped | listener overruns |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            *rows,
            "",
        ]
    )
    RECORDS_PATH.write_text(text)
