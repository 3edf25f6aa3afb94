"""The fleet on 1 to 4 Booster replicas on one PostgreSQL, side by side in one run.

What a new operator sizing a fleet would measure. Each replica is a real ``booster serve``
process (one gRPC process each) on one PostgreSQL (embedded: a real server process, logging lock
waits over 100 ms). The fleet:

- ``--hosts`` hosts, each with its own agent token bound to it (no shared token);
- reports built by the agent's own Aggregator and AggregateBuilder (compact sketches) from the
  realistic flow mix of ``benchmarks/report_size.py`` (one host-minute per host, seed
  ``--seed``), each host's report resent for successive minutes under new report ids, so every
  call stores a new report;
- ingestion at ``--concurrency`` calls in flight and GetParameters (10 of 100 planned contexts
  per call, the same hosts and tokens) at ``--get-concurrency``, at the same time, both split
  across the replicas serving, by ``benchmarks/loadgen`` (Go).

Printed per configuration (medians over ``--runs``, configurations interleaved 1, 2, 3, 4, 1, …
so each sees the same machine): stored reports/s (rows in PostgreSQL ÷ wall time), Booster CPU
and PostgreSQL CPU per stored report (user + system time of every replica process with its
children, and of the PostgreSQL server with its backends, over the run ÷ reports stored), p50
and p99 of both calls at the client, answers other than OK, and PostgreSQL's lock waits over
100 ms (``log_lock_waits``, ``deadlock_timeout`` = 100 ms). With ``--baseline TREE`` every
configuration also runs from another checkout (e.g. the commit before append-only ingest) on a
database of its own, interleaved with this one. With ``--read-port`` every configuration also
runs with this checkout's read port (``parameters_listen``: GetParameters answered by a process
of its own that stores no report) on a database of its own, and the GetParameters load goes
there instead of the agent port: the current layout and the read port side by side. With
``--floor`` every configuration also runs against as many ``benchmarks.grpc_floor`` processes,
each serving both calls the way Booster does and doing nothing else: their CPU per report
answered is what gRPC alone costs, the part of Booster's figure no change inside Booster removes.

On a 2-core machine replicas, load generators and PostgreSQL share the cores: more replicas add
no cores, so CPU per report and lock waits are what shows whether replicas scale.

    python -m benchmarks.replicas [--seconds 10] [--runs 2] [--replicas 4] [--hosts 2000]
                                  [--baseline TREE] [--read-port] [--floor]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
import numpy as np
from google.protobuf.internal.decoder import _DecodeVarint
from google.protobuf.internal.encoder import _VarintBytes
from sqlalchemy import create_engine, text

from gemini_agent.context import ContextResolver
from gemini_api.theta import load_spec
from gemini_api.v1 import booster_pb2 as pb
from gemini_api.v1 import booster_pb2_grpc as pb_grpc
from gemini_booster import simulation as sim
from gemini_booster.service.grpc_server import SERVICE, GrpcLimits
from gemini_booster.storage import credentials, database

from . import report_size as mix
from .common import OPERATOR, STREAM_METHOD, write_result
from .get_parameters import CONTEXTS, contexts
from .ingest import loadgen_binary

POLICY = mix.POLICY
GET_CONTEXTS = 10
READ_PORT = "read port"  # the side whose GetParameters go to the read port (--read-port)
FLOOR = "grpc floor"  # the side served by benchmarks.grpc_floor (--floor)
FLOOR_GO = "grpc-go floor"  # benchmarks/grpc_floor_go, as many threads as Go likes (--floor-go)
FLOOR_GO_1 = "grpc-go floor, GOMAXPROCS=1"  # the same, its Go code on one thread at a time
# The Python floor with each host's reports on one long-lived stream of its own (--floor-stream)
FLOOR_STREAM = "grpc floor, a stream per host"
FLOORS = (FLOOR, FLOOR_GO, FLOOR_GO_1, FLOOR_STREAM)
STREAMS_PER_CONNECTION = GrpcLimits().max_streams_per_connection
PYTHON_FLOOR = (sys.executable, "-m", "benchmarks.grpc_floor")  # FLOOR's command
START_S = 180
LOCK_WAIT = re.compile(r"still waiting for (\w+) on .* after ([\d.]+) ms")
ACQUIRED = re.compile(r"acquired (\w+) on .* after ([\d.]+) ms")
RELATION = re.compile(r'relation "([^"]+)"')
CPU_FIELDS = slice(13, 17)  # utime, stime, cutime, cstime in /proc/<pid>/stat
TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- CPU accounting ----------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    out = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            out += [int(c) for c in (task / "children").read_text().split()]
    except (FileNotFoundError, ProcessLookupError):
        pass
    return out


def _tree(pid: int) -> Iterator[int]:
    yield pid
    for c in _children(pid):
        yield from _tree(c)


def cpu_s(pids: list[int]) -> float:
    """CPU seconds of ``pids``, their live descendants, and the children they reaped."""
    total = 0
    for root in pids:
        for pid in _tree(root):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except FileNotFoundError:
                continue
            total += sum(int(v) for v in stat[CPU_FIELDS.start - 2 : CPU_FIELDS.stop - 2])
    return total / TICKS


def rss_mb(pids: list[int]) -> float:
    """Resident memory of ``pids`` and their live descendants, MiB."""
    kib = 0
    for root in pids:
        for pid in _tree(root):
            try:
                lines = Path(f"/proc/{pid}/status").read_text().splitlines()
            except (FileNotFoundError, ProcessLookupError):
                continue
            kib += sum(int(x.split()[1]) for x in lines if x.startswith("VmRSS:"))
    return kib / 1024


def switches(pids: list[int]) -> int:
    """Context switches (voluntary and not) of every thread of ``pids`` and their live
    descendants: a thread woken per report shows here as switches per report."""
    total = 0
    for root in pids:
        for pid in _tree(root):
            for status in Path(f"/proc/{pid}/task").glob("*/status"):
                try:
                    lines = status.read_text().splitlines()
                except (FileNotFoundError, ProcessLookupError):
                    continue
                total += sum(int(x.split()[1]) for x in lines if "ctxt_switches" in x)
    return total


# -- Booster replicas --------------------------------------------------------------------------


def tree_env(tree: Path | None, work: Path) -> dict[str, str]:
    """Environment that runs Booster from ``tree`` (another checkout) instead of this one."""
    if tree is None:
        return {}
    shim = work / "shim"
    shim.mkdir(exist_ok=True)
    link = shim / "gemini_migrations"
    if not link.exists():
        link.symlink_to(tree / "migrations")
    path = [tree / "booster", tree / "api", tree / "agent", shim]
    return {"PYTHONPATH": os.pathsep.join(str(p) for p in path)}


@dataclass
class Replica:
    name: str
    url: str
    work: Path
    tree: Path | None = None
    env: dict[str, str] = field(default_factory=dict)  # settings of this replica's own
    proc: subprocess.Popen | None = None
    grpc_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    parameters_port: int | None = None  # its read port, where GetParameters go; None: none

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def get_target(self) -> str:
        """Where the fleet's GetParameters go: the read port if it has one."""
        if self.parameters_port is None:
            return self.target
        return f"127.0.0.1:{self.parameters_port}"

    def start(self) -> Replica:
        env = (
            os.environ
            | tree_env(self.tree, self.work)
            | {
                "GEMINI_BOOSTER_DATABASE_URL": self.url,
                "GEMINI_BOOSTER_GRPC_LISTEN": self.target,
                "GEMINI_BOOSTER_HTTP_PORT": str(self.http_port),
                "GEMINI_BOOSTER_BOOTSTRAP_OPERATOR_TOKEN": OPERATOR,
                "GEMINI_BOOSTER_REFIT_INTERVAL_S": "3600",
                "GEMINI_BOOSTER_REPLICA_NAME": self.name,
                "GEMINI_BOOSTER_LOG_LEVEL": "WARNING",
                "GEMINI_BOOSTER_REFIT_PROCESSES": "1",
            }
            | self.env
        )
        if self.parameters_port is not None:
            env["GEMINI_BOOSTER_PARAMETERS_LISTEN"] = self.get_target
        log = open(self.work / f"{self.name}.log", "ab")  # noqa: SIM115 (lives with the process)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gemini_booster.cli", "serve"],
            env=env,
            cwd=self.tree or Path.cwd(),
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.http}/livez", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        tail = (self.work / f"{self.name}.log").read_text()[-2000:]
        raise RuntimeError(f"replica {self.name} did not start:\n{tail}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=60)


@dataclass
class FloorServer(Replica):
    """A gRPC floor in a process of its own, addressed as a replica is: ``benchmarks.grpc_floor``
    by default, or ``command`` (the compiled floor of ``--floor-go``)."""

    command: tuple[str, ...] = PYTHON_FLOOR

    def start(self) -> FloorServer:
        log = open(self.work / f"{self.name}.log", "ab")  # noqa: SIM115 (lives with the process)
        self.proc = subprocess.Popen(
            [*self.command, "--listen", self.target],
            env=os.environ | self.env,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "serving":
            tail = (self.work / f"{self.name}.log").read_text()[-2000:]
            raise RuntimeError(f"{self.command[0]} did not start:\n{tail}")
        return self


def build_go_floor(work: Path) -> tuple[str, ...]:
    """``benchmarks/grpc_floor_go`` built with its pinned modules, and Booster's GrpcLimits as
    its flags, so both floors apply the same limits."""
    binary = work / "grpc_floor_go"
    subprocess.run(
        ["go", "build", "-o", str(binary), "."],
        cwd=Path(__file__).parent / "grpc_floor_go",
        env=os.environ | {"GOFLAGS": "-mod=readonly"},
        check=True,
    )
    lim = GrpcLimits()
    return (
        str(binary),
        f"--service={SERVICE}",
        f"--max-message-bytes={lim.max_message_bytes}",
        f"--max-metadata-bytes={lim.max_metadata_bytes}",
        f"--max-streams-per-connection={lim.max_streams_per_connection}",
        f"--receive-timeout={lim.receive_timeout_s}s",
        f"--connection-idle={lim.connection_idle_s}s",
        f"--connection-age={lim.connection_age_s}s",
        f"--connection-age-grace={lim.connection_age_grace_s}s",
        f"--handshake-timeout={lim.handshake_timeout_s}s",
        f"--min-ping-interval={lim.min_ping_interval_s}s",
    )


# -- the fleet's requests ----------------------------------------------------------------------


@dataclass
class Fleet:
    hosts: list[str]
    templates: list[pb.ReportRequest]  # one host-minute per host

    def report_sizes(self) -> list[int]:
        return [t.ByteSize() for t in self.templates]

    def reports(
        self, now_min: int, first_minute: int, n: int, tokens: list[str]
    ) -> tuple[bytes, list[str]]:
        """``n`` reports never sent before, host by host, minute after minute backwards from
        ``first_minute`` minutes before ``now_min``, and the token of each. ``now_min`` is the
        side's fixed start: counting from the clock instead would reuse as many minutes of the
        run before as have passed since, and send duplicates."""
        out, sent_with = bytearray(), []
        for i in range(n):
            h = i % len(self.hosts)
            minute = now_min - 2 - first_minute - i // len(self.hosts)
            req = pb.ReportRequest()
            req.CopyFrom(self.templates[h])
            req.interval_start_unix_ms = minute * 60_000
            req.interval_end_unix_ms = (minute + 1) * 60_000
            req.report_id = f"{self.hosts[h]}:{minute}"
            body = req.SerializeToString()
            out += _VarintBytes(len(body)) + body
            sent_with.append(tokens[h])
        return bytes(out), sent_with

    def gets(self, n: int, tokens: list[str]) -> tuple[bytes, list[str]]:
        rng = np.random.default_rng(1)
        msgs = [c.message() for c in contexts()]
        out, sent_with = bytearray(), []
        for _ in range(n):
            h = int(rng.integers(len(self.hosts)))
            chosen = rng.choice(CONTEXTS, size=GET_CONTEXTS, replace=False)
            body = pb.GetParametersRequest(
                host_id=self.hosts[h], policy=POLICY, contexts=[msgs[i] for i in chosen]
            ).SerializeToString()
            out += _VarintBytes(len(body)) + body
            sent_with.append(tokens[h])
        return bytes(out), sent_with


def build_fleet(hosts: int, seed: int, work: Path, *, dense: bool = False) -> Fleet:
    """One host-minute per host from the agent's builder (dense: the sketches agents sent
    before the compact encoding, for a baseline that predates it)."""
    resolver = ContextResolver(mix.SOURCE, mix.prefix_table(work))
    rng = np.random.default_rng(seed)
    theta = load_spec().default()
    names, templates = [], []
    for h in range(hosts):
        name = f"edge-{seed}-{h:05d}.cdn.example.net"
        minute = mix.host_minute(rng, name, theta)
        names.append(name)
        templates.append(minute.report(resolver, dense=dense))
    return Fleet(names, templates)


def host_tokens(url: str, hosts: list[str]) -> list[str]:
    engine = database.make_engine(url)
    try:
        return [
            credentials.create_token(engine, f"agent-{h}", "agent", actor="bench", host_id=h)
            for h in hosts
        ]
    finally:
        engine.dispose()


# -- one database's set-up ---------------------------------------------------------------------


@dataclass
class Side:
    """One build (this checkout, or ``--baseline``'s) on a database of its own."""

    label: str
    url: str  # '' for the gRPC floor, which stores nothing
    replicas: list[Replica]
    tokens: list[str] = field(default_factory=list)
    minute: int = 0  # minutes of reports used so far, back from start_min
    start_min: int = field(default_factory=lambda: int(time.time() // 60))
    fleet: Fleet | None = None  # its own reports (--baseline-dense); None: the common fleet
    report_method: str = "ReportAggregates"
    report_flags: tuple[str, ...] = ()  # the report load generator's further options

    def stored(self) -> int:
        if not self.url:
            return 0
        engine = create_engine(self.url)
        with engine.connect() as conn:
            n = conn.execute(text("SELECT count(*) FROM reports")).scalar_one()
        engine.dispose()
        return n


def create_database(admin_url: str, name: str) -> str:
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    engine.dispose()
    return admin_url.replace("/postgres?", f"/{name}?")


def migrate(url: str, tree: Path | None, work: Path) -> None:
    env = os.environ | tree_env(tree, work) | {"GEMINI_BOOSTER_DATABASE_URL": url}
    subprocess.run(
        [sys.executable, "-m", "gemini_booster.cli", "migrate"],
        env=env,
        cwd=tree or Path.cwd(),
        check=True,
        stdout=subprocess.DEVNULL,
    )


def seed_plans(side: Side, fleet: Fleet) -> None:
    """A policy with a plan for each of the 100 contexts, served by every replica."""
    a = side.replicas[0]
    h = {"authorization": f"Bearer {OPERATOR}"}
    httpx.post(f"{a.http}/v1/policies", json={"name": POLICY}, headers=h).raise_for_status()
    rng = np.random.default_rng(0)
    default = load_spec().default()
    aggs = [sim.make_aggregate(c, default, 1.0, 20, rng) for c in contexts()]
    aggs_contexts = [c.message() for c in contexts()]
    md = (("authorization", f"Bearer {side.tokens[0]}"),)
    stub = pb_grpc.BoosterStub(grpc.insecure_channel(a.target))
    stub.ReportAggregates(sim.make_report(fleet.hosts[0], POLICY, aggs), metadata=md)
    deadline = time.monotonic() + START_S
    while True:  # whichever replica holds the policy's lease refits (the others answer 409)
        codes = []
        for r in side.replicas:
            resp = httpx.post(f"{r.http}/v1/policies/{POLICY}/refit", headers=h, timeout=600)
            codes.append(resp.status_code)
            if resp.status_code == 200:
                break
        if 200 in codes:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"no replica refitted the seed policy: {codes}")
        time.sleep(1)
    ask = pb.GetParametersRequest(host_id=fleet.hosts[0], policy=POLICY, contexts=aggs_contexts)
    for r in side.replicas:  # where the fleet asks: the agent port, or the read port
        get = pb_grpc.BoosterStub(grpc.insecure_channel(r.get_target)).GetParameters
        while not all(p.plan_version >= 1 for p in get(ask, metadata=md, timeout=60).parameters):
            if time.monotonic() > deadline:
                raise RuntimeError(f"replica {r.name} never served the plans")
            time.sleep(0.2)


# -- one measured run --------------------------------------------------------------------------


@dataclass
class Run:
    side: str
    replicas: int
    stored_per_s: float
    booster_ms: float
    postgres_ms: float
    report: dict
    get: dict
    lock_waits: list[LockWait]
    seconds: float = 0.0  # the calls' offered duration
    switches: float = 0.0  # Booster's context switches per stored report
    rss_mb: float = 0.0  # Booster's resident memory, connections and streams open, all processes


def loadgen(
    binary: Path,
    target: str,
    data: Path,
    tokens: Path,
    method: str,
    secs: int,
    conc: int,
    *flags: str,
):
    """The Go load generator on ``method``, connected and waiting for a line on its stdin to
    start (``started``); ``flags`` add its other options (-rate, -timeout)."""
    return subprocess.Popen(
        [
            str(binary),
            f"-target={target}",
            f"-requests={data}",
            f"-tokens={tokens}",
            f"-method=/gemini.booster.v1.Booster/{method}",
            f"-concurrency={conc}",
            f"-connections={max(conc // 8, 1)}",
            f"-duration={secs}s",
            "-wait-go",
            *flags,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def ready(procs: list[subprocess.Popen]) -> None:
    """Wait until every load generator is connected, its streams open: what a run measures
    starts after this, so it leaves out the connections' and streams' setup, which a fleet's
    agents pay once, not per report. On a failure the others are stopped."""
    for p in procs:
        assert p.stderr is not None
        line = p.stderr.readline().strip()
        if line != "ready":
            for q in procs:
                q.kill()
            raise RuntimeError(f"load generator did not start: {line} {p.stderr.read()[-2000:]}")


def go(procs: list[subprocess.Popen]) -> None:
    """Start every ready load generator's load."""
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()  # communicate() closes it


def started(procs: list[subprocess.Popen]) -> None:
    """``ready``, then ``go``."""
    ready(procs)
    go(procs)


def merged(results: list[dict]) -> dict:
    if not results:
        return {"calls": 0, "p50_ms": 0.0, "p99_ms": 0.0, "codes": {}}
    codes: dict[str, int] = {}
    messages: dict[str, int] = {}
    for r in results:
        for k, v in r["codes"].items():
            codes[k] = codes.get(k, 0) + v
        for k, v in (r.get("messages") or {}).items():
            messages[k] = messages.get(k, 0) + v
    return {
        "calls": sum(r["calls"] for r in results),
        "p50_ms": max(r["p50_ms"] for r in results),
        "p99_ms": max(r["p99_ms"] for r in results),
        "codes": codes,
        "messages": messages,  # each refusal's code and message, as the client saw it
    }


@dataclass(frozen=True)
class LockWait:
    ms: float
    relation: str  # the relation whose row or index entry it waited for ('' if not named)


def lock_waits(log: Path, offset: int) -> list[LockWait]:
    """Every lock wait over deadlock_timeout that ended after ``offset`` of the server's log
    (its whole length, from the 'acquired' line), with the relation its CONTEXT names."""
    waits: list[LockWait] = []
    with open(log, errors="replace") as f:
        f.seek(offset)
        lines = f.readlines()
    for i, line in enumerate(lines):
        m = ACQUIRED.search(line)
        if m is None:
            continue
        context = next((x for x in lines[i + 1 : i + 4] if "CONTEXT:" in x), "")
        rel = RELATION.search(context)
        waits.append(LockWait(float(m.group(2)), rel.group(1) if rel else ""))
    return waits


def split(data: bytes, tokens: list[str], parts: int) -> list[tuple[bytes, list[str]]]:
    """Deal length-prefixed requests (and their tokens) into ``parts`` files, so that no two
    replicas are sent the same report (a report sent twice is a duplicate, not a store)."""
    out = [(bytearray(), list[str]()) for _ in range(parts)]
    pos, i = 0, 0
    while pos < len(data):
        n, start = _DecodeVarint(data, pos)
        body, toks = out[i % parts]
        body += data[pos : start + n]
        toks.append(tokens[i])
        pos, i = start + n, i + 1
    return [(bytes(b), t) for b, t in out]


def measure(
    binary: Path, side: Side, n: int, fleet: Fleet, args, pg_pid: int, pg_log: Path, work: Path
) -> Run:
    serving = side.replicas[:n]
    share = 1 if args.per_replica else n  # open-loop rates are per replica, or split
    offered = args.report_rate * n / share  # reports/s offered to the replicas serving, open loop
    per_run = args.seconds * (int(offered * 1.2) + 1 if offered > 0 else args.max_rate)
    body, tokens = fleet.reports(side.start_min, side.minute, per_run, side.tokens)
    side.minute += -(-per_run // len(fleet.hosts))
    gets, get_tokens = fleet.gets(20_000, side.tokens)
    files: dict[str, list[tuple[Path, Path]]] = {"reports": [], "gets": []}
    for name, (data, toks) in (("reports", (body, tokens)), ("gets", (gets, get_tokens))):
        for k, (part, part_tokens) in enumerate(split(data, toks, n)):
            d, t = work / f"{name}-{k}.bin", work / f"{name}-{k}.tokens"
            d.write_bytes(part)
            t.write_text("\n".join(part_tokens) + "\n")
            files[name].append((d, t))
    log_offset = pg_log.stat().st_size
    booster_pids = [r.proc.pid for r in side.replicas if r.proc is not None]
    conc, gconc = max(args.concurrency // n, 1), max(args.get_concurrency // n, 1)
    get_rate = [f"-rate={args.get_rate / share:g}"] if args.get_rate > 0 else []
    report_rate = [f"-rate={args.report_rate / share:g}"] if args.report_rate > 0 else []
    report_flags = [*report_rate, *side.report_flags]
    procs = [  # --concurrency 0: GetParameters alone, the control for its latency under ingest
        loadgen(binary, r.target, d, t, side.report_method, args.seconds, conc, *report_flags)
        for r, (d, t) in zip(serving, files["reports"], strict=True)
        if args.concurrency > 0
    ]
    get_procs = [
        loadgen(binary, r.get_target, d, t, "GetParameters", args.seconds, gconc, *get_rate)
        for r, (d, t) in zip(serving, files["gets"], strict=True)
    ]
    ready([*procs, *get_procs])
    rss = rss_mb(booster_pids)  # with every connection and stream open, before the load
    s0 = switches(booster_pids)
    n0, b0, p0, t0 = side.stored(), cpu_s(booster_pids), cpu_s([pg_pid]), time.monotonic()
    go([*procs, *get_procs])
    reports = merged([json.loads(p.communicate()[0]) for p in procs])
    got = merged([json.loads(p.communicate()[0]) for p in get_procs])
    wall = time.monotonic() - t0
    b1, p1, n1 = cpu_s(booster_pids), cpu_s([pg_pid]), side.stored()
    s1 = switches(booster_pids)
    # The floor stores nothing: its figures are per report answered.
    stored = max(n1 - n0 if side.url else reports["codes"].get("OK", 0), 1)
    return Run(
        side.label,
        n,
        stored / wall,
        (b1 - b0) * 1000 / stored,
        (p1 - p0) * 1000 / stored,
        reports,
        got,
        lock_waits(pg_log, log_offset),
        args.seconds,
        (s1 - s0) / stored,
        rss,
    )


# -- the report --------------------------------------------------------------------------------


def _median(runs: list[Run], key) -> float:
    return float(np.median([key(r) for r in runs]))


def _others(runs: list[Run]) -> str:
    codes: dict[str, int] = {}
    for r in runs:
        for which, d in (("report", r.report), ("get", r.get)):
            for k, v in d["codes"].items():
                if k != "OK":
                    codes[f"{which} {k}"] = codes.get(f"{which} {k}", 0) + v
    return ", ".join(f"{k} {v}" for k, v in sorted(codes.items())) or "none"


def summary(runs: list[Run], labels: list[str], max_n: int) -> list[str]:
    lines = [
        "| build | replicas | stored reports/s | Booster CPU ms/report | PostgreSQL CPU "
        "ms/report | Report p50 / p99 ms | GetParameters p50 / p99 ms | lock waits > 100 ms "
        "(max ms; on) | answers not OK |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label in labels:
        for n in range(1, max_n + 1):
            rs = [r for r in runs if r.side == label and r.replicas == n]
            if not rs:
                continue
            waits = [w.ms for r in rs for w in r.lock_waits]
            rels = sorted({w.relation for r in rs for w in r.lock_waits})
            lines.append(
                f"| {label} | {n} | {_median(rs, lambda r: r.stored_per_s):,.0f} | "
                f"{_median(rs, lambda r: r.booster_ms):.2f} | "
                f"{_median(rs, lambda r: r.postgres_ms):.2f} | "
                f"{_median(rs, lambda r: r.report['p50_ms']):.1f} / "
                f"{_median(rs, lambda r: r.report['p99_ms']):.1f} | "
                f"{_median(rs, lambda r: r.get['p50_ms']):.1f} / "
                f"{_median(rs, lambda r: r.get['p99_ms']):.1f} | "
                f"{len(waits)} ({max(waits, default=0):.0f}{'; ' if rels else ''}"
                f"{', '.join(rels)}) | {_others(rs)} |"
            )
    return lines


def ratios(runs: list[Run], label: str, max_n: int) -> list[str]:
    one = [r for r in runs if r.side == label and r.replicas == 1]
    if not one:
        return []
    base = {
        "rate": _median(one, lambda r: r.stored_per_s),
        "b": _median(one, lambda r: r.booster_ms),
        "p": _median(one, lambda r: r.postgres_ms),
    }
    out = []
    for n in range(2, max_n + 1):
        rs = [r for r in runs if r.side == label and r.replicas == n]
        if rs:
            out.append(
                f"- {label}, {n} replicas ÷ 1: stored reports/s "
                f"{_median(rs, lambda r: r.stored_per_s) / base['rate']:.2f}×, Booster CPU per "
                f"report {_median(rs, lambda r: r.booster_ms) / base['b']:.2f}×, PostgreSQL CPU "
                f"per report {_median(rs, lambda r: r.postgres_ms) / base['p']:.2f}×"
            )
    return out


def _spread(runs: list[Run], key, fmt: str) -> str:
    """Median (min–max) of ``key`` over ``runs``."""
    vals = [key(r) for r in runs]
    return f"{np.median(vals):{fmt}} ({min(vals):{fmt}}–{max(vals):{fmt}})"


def layouts(runs: list[Run], max_n: int) -> list[str]:
    """The agent port's layout against the read port's, each figure's median (min–max) over
    the runs and the read port's ratio to it."""
    lines = [
        "| replicas | GetParameters on | GetParameters p50 ms | GetParameters p99 ms | stored "
        "reports/s | Booster CPU ms/report | GetParameters/s |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    figures = (
        (lambda r: r.get["p50_ms"], ".1f"),
        (lambda r: r.get["p99_ms"], ".1f"),
        (lambda r: r.stored_per_s, ",.0f"),
        (lambda r: r.booster_ms, ".2f"),
        (lambda r: r.get["calls"] / r.seconds, ",.0f"),
    )
    for n in range(1, max_n + 1):
        agent = [r for r in runs if r.side == "this" and r.replicas == n]
        read = [r for r in runs if r.side == READ_PORT and r.replicas == n]
        if not (agent and read):
            continue
        for where, rs in (("agent port", agent), ("read port", read)):
            cells = " | ".join(_spread(rs, key, fmt) for key, fmt in figures)
            lines.append(f"| {n} | {where} | {cells} |")
        ratio = " | ".join(
            f"{_median(read, key) / max(_median(agent, key), 1e-9):.2f}×" for key, _ in figures
        )
        lines.append(f"| {n} | read ÷ agent port | {ratio} |")
    return lines if len(lines) > 2 else []


def refusals(runs: list[Run]) -> list[str]:
    """What each answer other than OK said, summed per build and call (none: no lines)."""
    seen: dict[tuple[str, str, str], int] = {}
    for r in runs:
        for which, d in (("ReportAggregates", r.report), ("GetParameters", r.get)):
            for message, n in d.get("messages", {}).items():
                key = (r.side, which, message)
                seen[key] = seen.get(key, 0) + n
    lines = [f"- {side}, {which}: {n} × `{msg[:200]}`" for (side, which, msg), n in seen.items()]
    return ["Answers other than OK, as the client saw them:", "", *lines, ""] if lines else []


def _open_loop(rate: float, unit: str, args) -> str:
    each = " per replica serving" if args.per_replica else ""
    return f"at {rate:g} {unit}/s{each} (open loop)"


def get_load(args) -> str:
    """How the GetParameters load was offered, for the record."""
    if args.get_rate > 0:
        return _open_loop(args.get_rate, "calls", args)
    return f"at {args.get_concurrency} in flight (closed loop)"


def report_load(args) -> str:
    """How the reports were offered, for the record."""
    if args.report_rate > 0:
        return _open_loop(args.report_rate, "reports", args)
    return f"at {args.concurrency} calls in flight"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--hosts", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--get-concurrency", type=int, default=4)
    ap.add_argument(
        "--get-rate",
        type=float,
        default=0,
        help="GetParameters started per second, whatever the answers (open loop, as a fleet "
        "asks); 0: closed loop at --get-concurrency",
    )
    ap.add_argument("--max-rate", type=int, default=1500, help="distinct reports per second")
    ap.add_argument(
        "--report-rate",
        type=float,
        default=0,
        help="reports started per second, whatever the answers (open loop, as a fleet "
        "reports); 0: closed loop at --concurrency",
    )
    ap.add_argument(
        "--per-replica",
        action="store_true",
        help="--report-rate and --get-rate are offered to each replica serving, so N "
        "replicas carry N times the load (equal load per replica: what shows whether "
        "replicas slow each other, when they share the cores)",
    )
    ap.add_argument("--baseline", type=Path, default=None, help="another checkout to compare")
    ap.add_argument("--record", default="replicas", help="benchmarks/results/<record>.md")
    ap.add_argument(
        "--read-port",
        action="store_true",
        help="also run this checkout with GetParameters on a read port (parameters_listen)",
    )
    ap.add_argument(
        "--floor",
        action="store_true",
        help="also run each configuration against as many benchmarks.grpc_floor processes "
        "(gRPC serving both calls as Booster does, and nothing else)",
    )
    ap.add_argument(
        "--floor-stream",
        action="store_true",
        help="also against benchmarks.grpc_floor with each host's reports as messages on one "
        "long-lived stream of its own (ReportStream, which Booster does not serve)",
    )
    ap.add_argument(
        "--floor-go",
        action="store_true",
        help="also against benchmarks/grpc_floor_go (the same floor in grpc-go; needs go), "
        "with Go's default GOMAXPROCS and with GOMAXPROCS=1",
    )
    ap.add_argument(
        "--baseline-dense",
        action="store_true",
        help="the baseline gets the same host-minutes with dense sketches, as agents sent "
        "them before the compact encoding (a baseline older than it refuses compact ones)",
    )
    ap.add_argument(
        "--env",
        action="append",
        default=None,
        metavar="NAME=VALUE",
        help="a setting for this checkout's replicas only (e.g. a variant against --baseline)",
    )
    args = ap.parse_args()
    binary = loadgen_binary()
    work = Path(tempfile.mkdtemp(prefix="gemini-fleet-"))
    os.environ.setdefault("XDG_RUNTIME_DIR", str(work))
    admin = database.start_embedded(work / "pg")
    engine = create_engine(admin, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text("ALTER SYSTEM SET log_lock_waits = on"))
        conn.execute(text("ALTER SYSTEM SET deadlock_timeout = '100ms'"))
        conn.execute(text("SELECT pg_reload_conf()"))
        pgdata = Path(conn.execute(text("SHOW data_directory")).scalar_one())
    engine.dispose()
    pg_pid = int((pgdata / "postmaster.pid").read_text().split()[0])
    pg_log = pgdata / "log"
    print(f"building {args.hosts} hosts' reports with the agent's builder…", file=sys.stderr)
    fleet = build_fleet(args.hosts, args.seed, work)
    sizes = fleet.report_sizes()
    trees: list[tuple[str, Path | None, bool]] = [("this", None, False)]
    if args.read_port:
        trees.append((READ_PORT, None, True))
    if args.baseline is not None:
        trees.append(("baseline", args.baseline.resolve(), False))
    sides: list[Side] = []
    try:
        for label, tree, read_port in trees:
            url = create_database(admin, f"fleet_{label.replace(' ', '_')}")
            migrate(url, tree, work)
            env = dict(kv.split("=", 1) for kv in args.env or ()) if tree is None else {}
            reps = [
                Replica(
                    f"{label.replace(' ', '-')}-{i + 1}",
                    url,
                    work,
                    tree,
                    env,
                    parameters_port=free_port() if read_port else None,
                ).start()
                for i in range(args.replicas)
            ]
            side = Side(label, url, reps, host_tokens(url, fleet.hosts))
            if label == "baseline" and args.baseline_dense:
                side.fleet = build_fleet(args.hosts, args.seed, work, dense=True)
            seed_plans(side, fleet)
            sides.append(side)
        # Streams need a connection per STREAMS_PER_CONNECTION hosts: with --floor-stream the
        # call floor's reports use as many, so the two differ in streams against calls alone.
        per_connection = STREAMS_PER_CONNECTION - 2  # room for GetParameters' calls
        stream_connections = f"-connections={-(-args.hosts // per_connection)}"
        if args.floor:  # as many floor processes as replicas, so each layout has its floor
            floors = [FloorServer(f"grpc-floor-{i + 1}", "", work) for i in range(args.replicas)]
            side = Side(FLOOR, "", [f.start() for f in floors], sides[0].tokens)
            if args.floor_stream:
                side.report_flags = (stream_connections,)
            sides.append(side)
        if args.floor_stream:
            floors = [
                FloorServer(f"grpc-floor-stream-{i + 1}", "", work) for i in range(args.replicas)
            ]
            side = Side(FLOOR_STREAM, "", [f.start() for f in floors], sides[0].tokens)
            side.report_method = STREAM_METHOD
            side.report_flags = ("-streams", stream_connections)
            sides.append(side)
        if args.floor_go:
            command = build_go_floor(work)
            for label, name, env in (
                (FLOOR_GO, "grpc-go-floor", {}),
                (FLOOR_GO_1, "grpc-go-floor-1p", {"GOMAXPROCS": "1"}),
            ):
                floors = [
                    FloorServer(f"{name}-{i + 1}", "", work, env=env, command=command)
                    for i in range(args.replicas)
                ]
                sides.append(Side(label, "", [f.start() for f in floors], sides[0].tokens))
        runs: list[Run] = []
        for _ in range(args.runs):
            for n in range(1, args.replicas + 1):
                for side in sides:
                    run = measure(binary, side, n, side.fleet or fleet, args, pg_pid, pg_log, work)
                    print(run, file=sys.stderr)
                    runs.append(run)
    finally:
        for side in sides:
            for r in side.replicas:
                r.stop()
    labels = [s.label for s in sides]
    lines = [
        f"{args.hosts:,} hosts (seed {args.seed}), each with its own token; reports from the "
        "agent's builder over the realistic mix of benchmarks/report_size.py: "
        f"mean {np.mean(sizes):,.0f} B, p99 {np.percentile(sizes, 99):,.0f} B. Ingestion "
        f"{report_load(args)} and GetParameters ({GET_CONTEXTS} of {CONTEXTS} "
        f"planned contexts) {get_load(args)}, at the same time, split across the "
        f"replicas serving; {args.seconds} s per run, {args.runs} runs per configuration "
        f"(medians), configurations interleaved. {os.cpu_count()} cores shared by every "
        "replica (all of them running, the unused ones idle), the load generators and "
        "PostgreSQL: CPU per stored report counts every replica and every PostgreSQL process, "
        "and so includes serving the GetParameters calls made meanwhile (their rate is in the "
        "last table).",
        *dense_note(sides),
        "",
        *summary(runs, labels, args.replicas),
        "",
        *[line for label in labels for line in ratios(runs, label, args.replicas)],
        "",
        *floor_lines(runs, labels, args.replicas),
        *layouts(runs, args.replicas),
        "",
        *refusals(runs),
        "Every run:",
        "",
        "| build | replicas | stored/s | Booster ms | PostgreSQL ms | Report p99 | Get p99 | "
        "GetParameters/s | lock waits | Booster switches/report | Booster RSS MiB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *[
            f"| {r.side} | {r.replicas} | {r.stored_per_s:,.0f} | {r.booster_ms:.2f} | "
            f"{r.postgres_ms:.2f} | {r.report['p99_ms']:.1f} | {r.get['p99_ms']:.1f} | "
            f"{r.get['calls'] / args.seconds:,.0f} | {len(r.lock_waits)} | {r.switches:.1f} | "
            f"{r.rss_mb:,.0f} |"
            for r in runs
        ],
    ]
    write_result(
        args.record,
        "python -m benchmarks.replicas " + command_line(args),
        lines,
    )


def floor_lines(runs: list[Run], labels: list[str], max_n: int) -> list[str]:
    """Each build's CPU per report against each gRPC floor's with as many processes (medians)."""
    floors = [f for f in FLOORS if any(r.side == f for r in runs)]
    if not floors:
        return []
    lines = [
        "The floor rows serve both calls as Booster does and nothing else, one process per "
        'replica; their "stored reports/s" and CPU are per report answered. '
        f"{FLOOR}: `benchmarks.grpc_floor`, Python gRPC as Booster runs it (same core "
        "experiments, channel arguments, asyncio server on a uvloop thread, stream-unary "
        f"with the metadata and both reads). {FLOOR_GO}: `benchmarks/grpc_floor_go`, the same "
        "calls in grpc-go with the same limits, messages left as bytes. Medians:",
        "",
    ]
    for floor in floors:
        for n in range(1, max_n + 1):
            mine = [r for r in runs if r.side == floor and r.replicas == n]
            if not mine:
                continue
            base = _median(mine, lambda r: r.booster_ms)
            for label in labels:
                rs = [r for r in runs if r.side == label and r.replicas == n]
                if label not in FLOORS and rs:
                    b = _median(rs, lambda r: r.booster_ms)
                    lines.append(
                        f"- {label}, {n} replica{'s' if n > 1 else ''}: {b:.2f} ms per report, "
                        f"{b / base:.2f}× the {floor}'s {base:.2f} ms; {b - base:.2f} ms above it"
                    )
    return [*lines, ""]


def dense_note(sides: list[Side]) -> list[str]:
    """What the sides with their own (dense) reports sent, for the record."""
    return [
        f"The {s.label} side was sent the same host-minutes with dense sketches (as agents sent "
        f"them before the compact encoding): mean {np.mean(sizes):,.0f} B, p99 "
        f"{np.percentile(sizes, 99):,.0f} B."
        for s in sides
        if s.fleet is not None
        for sizes in [s.fleet.report_sizes()]
    ]


def command_line(args: argparse.Namespace) -> str:
    """The options as given again on a command line (a flag by its name alone)."""
    words = []
    for k, vs in vars(args).items():
        flag = f"--{k.replace('_', '-')}"
        if isinstance(vs, bool):
            words += [flag] if vs else []
            continue
        for v in vs if isinstance(vs, list) else [vs]:
            if v is not None:
                words.append(f"{flag} {v}")
    return " ".join(words)


if __name__ == "__main__":
    main()
