"""Booster's CPU to check one report (``validation.report_row``, what ``validate_report`` runs
after parsing), in µs per report, this build against a baseline build side by side.

Reports are host-minutes of benchmarks/report_size.py's realistic fleet, built by the agent's
own Aggregator, serialized once: dense sketches (what agents before the compact sketch send, and
all the baseline build knows) and compact ones (what agents send now). Each round times every
build in a fresh process on the same bytes, baseline and this build alternately, so that both
see the same machine; the median over rounds is printed with its range. The baseline build is
a ``git worktree`` of ``--baseline`` (default: the commit before the compact sketch and the
fast validation), imported ahead of this checkout's packages.

    python -m benchmarks.validation [--hosts 300] [--rounds 5] [--baseline 9814093] [--write]

``--write`` adds the figures to benchmarks/results/report-size.md (after report_size's).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "report-size.md"
SECTION = "## validate_report per report"
BASELINE = "9814093"  # the last commit before the compact sketch (f8d313b)
POLICY = "cdn"
NOTE = (
    "Parsing (``ReportRequest.FromString``, a few µs) is outside these figures, as are gRPC and "
    "the ingest writer, the rest of Booster's CPU per stored report (issue #32: ~3.5 ms in all, "
    "validation ~14 % of it). A report that fails a fast path is walked as before to name every "
    "problem; the bad-input tests check those names."
)


def build_reports(hosts: int, out: Path) -> None:
    """``hosts`` host-minutes of seed 0, each as dense and compact bytes (one JSON of hex)."""
    from benchmarks import report_size as mix
    from gemini_agent.context import ContextResolver

    with tempfile.TemporaryDirectory() as tmp:
        resolver = ContextResolver(mix.SOURCE, mix.prefix_table(Path(tmp)))
        minutes = list(mix.fleet(0, hosts))
        reports = {
            "dense": [m.report(resolver, dense=True).SerializeToString().hex() for m in minutes],
            "compact": [m.report(resolver).SerializeToString().hex() for m in minutes],
        }
    now_ms = int(mix.ENDED.timestamp() * 1000) + 60_000
    out.write_text(json.dumps({"now_ms": now_ms, **reports}))


def time_reports(path: Path, kinds: list[str], repeat: int) -> dict[str, float]:
    """In this process (whichever build it imports): best of ``repeat`` passes, µs per report
    of ``report_row`` over each kind's reports (each parsed beforehand, as the server does)."""
    from gemini_api.theta import load_spec
    from gemini_api.v1 import booster_pb2 as pb
    from gemini_booster.models import Policy
    from gemini_booster.service.validation import report_row

    data = json.loads(path.read_text())
    spec = load_spec()
    policies = {POLICY: Policy(id=1, name=POLICY, revision=1)}
    out = {}
    for kind in kinds:
        raws = [bytes.fromhex(h) for h in data[kind]]
        reqs = [pb.ReportRequest.FromString(r) for r in raws]
        for raw, req in zip(raws, reqs, strict=True):  # every report passes, in every build
            report_row(raw, req, spec, policies, 1000, data["now_ms"])
        best = float("inf")
        for _ in range(repeat):
            t0 = time.process_time()
            for raw, req in zip(raws, reqs, strict=True):
                report_row(raw, req, spec, policies, 1000, data["now_ms"])
            best = min(best, time.process_time() - t0)
        out[kind] = best / len(raws) * 1e6
    return out


def _run(pythonpath: list[str], path: Path, kinds: list[str], repeat: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*pythonpath, str(ROOT)]))
    cmd = [sys.executable, str(Path(__file__)), "--time", str(path), "--kinds", ",".join(kinds)]
    cmd += ["--repeat", str(repeat)]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def baseline_paths(worktree: Path) -> list[str]:
    """The baseline's packages ahead of this checkout's editable installs (and its migrations
    package, which the validation does not use, left as installed)."""
    return [str(worktree / d) for d in ("api", "booster", "agent")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3, help="passes per round, best kept")
    ap.add_argument("--baseline", default=BASELINE)
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--time", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--kinds", default="dense,compact", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.time:
        print(json.dumps(time_reports(args.time, args.kinds.split(","), args.repeat)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        data, worktree = Path(tmp) / "reports.json", Path(tmp) / "baseline"
        build_reports(args.hosts, data)
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-q", str(worktree), args.baseline],
            cwd=ROOT,
            check=True,
        )
        try:
            base: list[float] = []
            dense: list[float] = []
            compact: list[float] = []
            for _ in range(args.rounds):
                base.append(_run(baseline_paths(worktree), data, ["dense"], args.repeat)["dense"])
                now = _run([], data, ["dense", "compact"], args.repeat)
                dense.append(now["dense"])
                compact.append(now["compact"])
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT)
    lines = table(args, base, dense, compact)
    print("\n".join(lines))
    if args.write:
        write(args, lines)


def _fig(xs: list[float]) -> str:
    return f"{statistics.median(xs):,.0f} ({min(xs):,.0f}–{max(xs):,.0f})"


def table(args: argparse.Namespace, base: list[float], dense: list[float], compact: list[float]):
    b = statistics.median(base)
    return [
        f"CPU µs per report in ``report_row`` (process time), median of {args.rounds} rounds "
        f"(range), {args.hosts} host-minutes of seed 0, baseline {args.baseline} and this build "
        "alternately, each in a fresh process:",
        "",
        "| build | reports | µs per report | ÷ baseline |",
        "| --- | --- | --- | --- |",
        f"| baseline {args.baseline} | dense (all it knows) | {_fig(base)} | 1.00 |",
        f"| this build | dense (older agents) | {_fig(dense)} | "
        f"{statistics.median(dense) / b:.2f} |",
        f"| this build | compact (agents now) | {_fig(compact)} | "
        f"{statistics.median(compact) / b:.2f} |",
        "",
        NOTE,
    ]


def write(args: argparse.Namespace, lines: list[str]) -> None:
    text = RESULT.read_text() if RESULT.exists() else ""
    text = text.split(f"\n{SECTION}")[0].rstrip("\n")
    command = (
        f"python -m benchmarks.validation --hosts {args.hosts} --rounds {args.rounds} "
        f"--repeat {args.repeat} --baseline {args.baseline}"
    )
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    section = [
        "",
        SECTION,
        "",
        f"Command: `{command}`  ",
        f"Run: {when} on {os.cpu_count()} cores, Python {sys.version.split()[0]}",
        "",
        *lines,
    ]
    RESULT.write_text(text + "\n" + "\n".join(section) + "\n")


if __name__ == "__main__":
    main()
