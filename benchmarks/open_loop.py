"""Open loop: reports and GetParameters started at fixed rates whatever the answers, as a fleet
whose agents each call once a minute does, against one Booster replica (``booster serve``) on
one PostgreSQL; prints every answer's code and message, so a share of refusals is diagnosed,
not guessed at.

The issue that asked for it saw 35 % of both calls answered UNAVAILABLE at 150 reports/s +
150 GetParameters/s. Each call carries the agent's own deadline (``rpc_deadline_s``, 10 s)
unless ``--deadline-s`` says otherwise. With ``--baseline TREE`` the same load runs against
another checkout too, interleaved.

    python -m benchmarks.open_loop [--rate 150] [--seconds 30] [--hosts 2000] [--baseline TREE]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
from pathlib import Path

from gemini_booster.storage import database

from .common import write_result
from .ingest import loadgen_binary
from .replicas import (
    Replica,
    Side,
    build_fleet,
    cpu_s,
    create_database,
    host_tokens,
    loadgen,
    migrate,
    seed_plans,
    started,
)

AGENT_DEADLINE_S = 10.0  # gemini_agent.config: rpc_deadline_s


def run(binary: Path, side: Side, fleet, args, work: Path) -> dict:
    """One open-loop run against ``side``'s one replica: each call's summary and CPU."""
    n = int(args.rate * args.seconds) + 1
    body, tokens = fleet.reports(side.start_min, side.minute, n, side.tokens)
    side.minute += -(-n // len(fleet.hosts))
    gets, get_tokens = fleet.gets(n, side.tokens)
    procs = {}
    stored0, cpu0 = side.stored(), cpu_s([r.proc.pid for r in side.replicas if r.proc])
    for method, (data, toks) in (
        ("ReportAggregates", (body, tokens)),
        ("GetParameters", (gets, get_tokens)),
    ):
        d, t = work / f"{side.label}-{method}.bin", work / f"{side.label}-{method}.tokens"
        d.write_bytes(data)
        t.write_text("\n".join(toks) + "\n")
        procs[method] = loadgen(
            binary,
            side.replicas[0].target,
            d,
            t,
            method,
            args.seconds,
            8 * args.connections,  # with -rate, -concurrency only sets the connections (÷ 8)
            f"-rate={args.rate}",
            f"-timeout={args.deadline_s}s",
        )
    started(list(procs.values()))
    out = {m: json.loads(p.communicate()[0]) for m, p in procs.items()}
    cpu = cpu_s([r.proc.pid for r in side.replicas if r.proc]) - cpu0
    out["stored"] = side.stored() - stored0
    out["booster_cpu_s"] = cpu
    return out


def rows(label: str, result: dict, seconds: int) -> list[str]:
    lines = []
    for method in ("ReportAggregates", "GetParameters"):
        r = result[method]
        codes = ", ".join(f"{k} {v}" for k, v in sorted(r["codes"].items()))
        lines.append(
            f"| {label} | {method} | {r['calls']} | {r['p50_ms']:.1f} / {r['p99_ms']:.1f} | "
            f"{codes} |"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=150.0, help="calls/s of each method")
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--hosts", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=3000)
    ap.add_argument("--deadline-s", type=float, default=AGENT_DEADLINE_S)
    ap.add_argument("--connections", type=int, default=8, help="client connections per call")
    ap.add_argument(
        "--server-nofile",
        type=int,
        default=None,
        help="the replicas' open-file limit (RLIMIT_NOFILE soft), e.g. a shell's default 1024",
    )
    ap.add_argument("--baseline", type=Path, default=None, help="another checkout to compare")
    args = ap.parse_args()
    binary = loadgen_binary()
    work = Path(tempfile.mkdtemp(prefix="gemini-open-"))
    os.environ.setdefault("XDG_RUNTIME_DIR", str(work))
    admin = database.start_embedded(work / "pg")
    print(f"building {args.hosts} hosts' reports with the agent's builder…", file=sys.stderr)
    fleet = build_fleet(args.hosts, args.seed, work)
    trees: list[tuple[str, Path | None]] = [("this", None)]
    if args.baseline is not None:
        trees.append(("baseline", args.baseline.resolve()))
    sides: list[Side] = []
    results: list[tuple[str, dict]] = []
    try:
        for label, tree in trees:
            url = create_database(admin, f"open_{label}")
            migrate(url, tree, work)
            side = Side(label, url, [Replica(f"{label}-1", url, work, tree).start()])
            if args.server_nofile is not None:
                for r in side.replicas:
                    assert r.proc is not None
                    hard = resource.prlimit(r.proc.pid, resource.RLIMIT_NOFILE)[1]
                    resource.prlimit(r.proc.pid, resource.RLIMIT_NOFILE, (args.server_nofile, hard))
            side.tokens = host_tokens(url, fleet.hosts)
            seed_plans(side, fleet)
            sides.append(side)
        for _ in range(args.runs):
            for side in sides:
                result = run(binary, side, fleet, args, work)
                print(side.label, json.dumps(result), file=sys.stderr)
                results.append((side.label, result))
    finally:
        for side in sides:
            for r in side.replicas:
                r.stop()
    lines = [
        f"One replica, {args.hosts:,} hosts with their own tokens, reports from the agent's "
        f"builder (benchmarks/replicas.py's fleet); ReportAggregates and GetParameters each "
        f"started at {args.rate:g} calls/s for {args.seconds} s whatever the answers, each "
        f"call with a {args.deadline_s:g} s deadline, over {args.connections} connections "
        f"per call; replicas' open-file limit {args.server_nofile or 'as inherited'}; "
        f"{args.runs} run(s) per build, interleaved.",
        "",
        "| build | call | calls | p50 / p99 ms | answers |",
        "| --- | --- | --- | --- | --- |",
        *[line for label, r in results for line in rows(label, r, args.seconds)],
        "",
        "| build | stored reports/s | Booster CPU s |",
        "| --- | --- | --- |",
        *[
            f"| {label} | {r['stored'] / args.seconds:,.0f} | {r['booster_cpu_s']:.1f} |"
            for label, r in results
        ],
        "",
        "Refusals' messages (count):",
        "",
        *[
            f"- {label} {method}: {msg} ({count})"
            for label, r in results
            for method in ("ReportAggregates", "GetParameters")
            for msg, count in sorted(r[method].get("messages", {}).items())
        ],
    ]
    write_result(
        "open-loop",
        "python -m benchmarks.open_loop "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None),
        lines,
    )


if __name__ == "__main__":
    main()
