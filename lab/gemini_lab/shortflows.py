"""Short flows: how long a transfer of a given size takes, per congestion control, on the lab's
paths (the Gemini paper's speed-test case), in the UML lab on its simulated clock.

    gemini-lab shortflows [--scenario S ...] [--tuned-theta JSON|FILE] [--transfers N] [--mix N]

Two workloads per path and CC, each a series of transfers one after another, every one on a
fresh connection from a cold start (the lab sets ``net.ipv4.tcp_no_metrics_save=1`` in every
namespace, gemini_lab.netem, so no cached ssthresh, RTT or window carries from one connection
to the next; each experiment reads the sysctl back):

- ``1mb``: N transfers of 1 MB (10^6 bytes), the speed-test case;
- ``mix``: M transfers of sizes fixed by M and a seed, the same sizes in the same order for
  every CC. The sizes are web objects after SURGE's model of Web server file sizes
  (Barford and Crovella, SIGMETRICS 1998): a log-normal body (μ = 9.357, σ = 1.318 in ln bytes,
  median 11.6 KB) with a Pareto tail (k = 133 KB, α = 1.1) above 133 KB. Web objects, not a
  data-centre flow-size distribution (web search, data mining): the paths here are wide-area
  paths of 40–800 ms, where what a user waits for is a page's objects. Above 133 KB the tail
  takes the body's own share beyond the cut (3.2 %). The M sizes are the mix's quantiles at
  (i + 0.5) / M, in an order shuffled by the seed: a sample that holds the distribution, tail
  included, where M random draws miss a 3 % tail more often than not at M = 40 (seed 1's did).
  Sizes are capped at MIX_MAX_BYTES (α = 1.1 has no useful mean; one object of 100 MB would
  take a satellite run hours) and floored at MIX_MIN_BYTES.

Completion time is measured on the guest's clock (``time.monotonic`` inside the UML guest is
simulated time, the same clock in every namespace): from just before the sender's
``connect()`` to the moment the receiver has read the transfer's last byte. It includes the
handshake (one round trip before the first byte is sent). The transfer's first 8 bytes carry
its size, so the receiver knows when it has all of it; it then notes the time, replies with
one byte (the sender's cue that the transfer is done, and the instant its ``tcp_info`` is
final: retransmits, minimum RTT) and reads on to EOF, so the bytes it reports are every byte
the connection carried. ``reply_s``, to the sender's reading of that byte, is kept beside it:
what a request/response application would see, one return trip later.

The CC each transfer ran is read back from the kernel (``getsockopt(TCP_CONGESTION)`` on the
sender's socket after the transfer); Fusion's θ is the sender namespace's (``net.fusion.*``,
the module's sysctls are per network namespace), set before a CC's series and read back.

A path with a rate schedule (the cellular trace) is put back at its first row before each
transfer and the transfer starts TRACE_STEP_S × i (mod TRACE_SPAN_S) seconds into it: transfer
i of every CC meets the same capacities, and the series samples more of the trace than its
first second. On a path with random loss the path's netem queue draws its losses from one
sequence as packets pass (a fixed seed per queue: lab/uml/netem-fixed-seed.patch), continued
from one transfer to the next: two CCs meet other draws (more transfers even that out, not the
same draws); the same plan's transfers repeat from run to run as the lab's bulk flows do
(tests/test_lab_uml.py).
"""

from __future__ import annotations

import json
import math
import random
import socket
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gemini_api.theta import load_spec
from gemini_lab import plans, scenario
from gemini_lab.bulk import CHUNK_BYTES, tcp_info
from gemini_lab.experiment import read_sysctl, set_default_theta
from gemini_lab.host import REPO
from gemini_lab.netem import SENDER_NS, RateSchedule, python_in, receiver_addr, receiver_ns
from gemini_lab.recorded import Contender, Measurement, opening, tuned_text

RESULTS_PATH = REPO / "benchmarks" / "results" / "short-flows.md"

# --- guest side ------------------------------------------------------------------------------

SHORT_PORT = 5401
GUEST_MODULE = "gemini_lab.shortflows"  # the receiver runs as ``python -m`` of this module
SIZE_HEADER = struct.Struct("!Q")  # the transfer's own size, in its first bytes
DONE_BYTE = b"\x01"
TRANSFER_TIMEOUT_S = 600.0  # simulated: a stalled transfer fails its series, never hangs it
CC_NAME_LEN = 16  # TCP_CA_NAME_MAX


def _read_exactly(conn: socket.socket, n: int, buf: bytearray) -> int:
    """Read up to ``n`` bytes (fewer only at EOF); returns how many came."""
    got = 0
    view = memoryview(buf)
    while got < n:
        k = conn.recv_into(view, min(n - got, len(buf)))
        if k == 0:
            break
        got += k
    return got


def _serve_one(conn: socket.socket, buf: bytearray) -> dict:
    """One transfer: its size from the header, the time its last byte was read, a byte back,
    then everything else the connection carries (nothing, when the sender is right)."""
    header = bytearray(SIZE_HEADER.size)
    got = _read_exactly(conn, SIZE_HEADER.size, header)
    size = SIZE_HEADER.unpack(header)[0] if got == SIZE_HEADER.size else got
    got += _read_exactly(conn, size - got, buf)
    done_at = time.monotonic()
    conn.sendall(DONE_BYTE)
    while k := conn.recv_into(buf):
        got += k
    return {"bytes": got, "size_header": size, "done_at": done_at}


def serve(port: int) -> None:
    """Transfers one at a time, forever: a JSON line per connection once it has closed."""
    lsock = socket.create_server(("0.0.0.0", port))
    print("ready", flush=True)
    buf = bytearray(CHUNK_BYTES)
    while True:
        conn, peer = lsock.accept()
        with conn:
            line = {"port": peer[1], **_serve_one(conn, buf)}
        print(json.dumps(line), flush=True)


def transfer(addr: str, port: int, cc: str, size: int) -> dict:
    """One transfer of ``size`` bytes on a fresh connection under ``cc``; times on the
    guest's clock. TCP_NODELAY: the last partial segment goes at once, as a server sending
    an object sets it."""
    payload = bytearray(size)
    payload[: SIZE_HEADER.size] = SIZE_HEADER.pack(size)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(TRANSFER_TIMEOUT_S)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        started = time.monotonic()
        s.connect((addr, port))
        s.sendall(payload)
        if s.recv(1) != DONE_BYTE:
            raise RuntimeError(f"transfer of {size} bytes: the receiver closed without a reply")
        replied = time.monotonic()
        cc_run = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, CC_NAME_LEN)
        info = tcp_info(s)
        return {
            "started": started,
            "reply_s": replied - started,
            "port": s.getsockname()[1],
            "cc_in_kernel": cc_run.rstrip(b"\0").decode(),
            "retransmits": info["total_retrans"],
            "min_rtt_ms": info["min_rtt_us"] / 1000,
        }


def _start_receiver(path: int, port: int) -> subprocess.Popen:
    """``python -m gemini_lab.shortflows serve`` in the path's receiver namespace."""
    server = subprocess.Popen(
        python_in(receiver_ns(path), GUEST_MODULE, "serve", str(port)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    if (ready := server.stdout.readline().strip()) != "ready":
        server.kill()
        raise RuntimeError(f"short-flow receiver did not start: {ready!r}")
    return server


def _received(server: subprocess.Popen, port: int) -> dict:
    """The receiver's line for the connection from ``port``."""
    assert server.stdout is not None and server.stderr is not None
    line = server.stdout.readline()
    if not line:
        raise RuntimeError(f"short-flow receiver exited: {server.stderr.read()[-500:]}")
    got = json.loads(line)
    if got["port"] != port:
        raise RuntimeError(f"receiver reported port {got['port']}, the transfer used {port}")
    return dict(got)


class Aligner:
    """Puts a path's rate schedule at the same point for transfer i of every CC (see the
    module's docstring); a path without a schedule has nothing to align."""

    def __init__(self, schedule: RateSchedule | None) -> None:
        self.schedule = schedule

    def __call__(self, offset_s: float) -> None:
        if self.schedule is None:
            return
        self.schedule.restart()
        time.sleep(offset_s)


def _theta_in_kernel() -> dict[str, int]:
    return {p.name: read_sysctl(f"net.fusion.{p.name}") for p in load_spec().params}


def exp_shortflows(e: dict, out: Path, schedules: Mapping[int, RateSchedule]) -> dict:
    """One series: ``e["sizes"]`` transfers one after another on path ``e["path"]`` under
    ``e["cc"]`` (Fusion with ``e["theta"]`` over the spec's defaults)."""
    path, port = e["path"], e.get("port", SHORT_PORT)
    set_default_theta({**load_spec().default(), **e.get("theta", {})})
    align = Aligner(schedules.get(path))
    server = _start_receiver(path, port)
    transfers = []
    try:
        theta = _theta_in_kernel()
        _warm_up(path, port, e["cc"], server)
        for size, offset_s in zip(e["sizes"], e["offsets_s"], strict=True):
            align(offset_s)
            sent = transfer(receiver_addr(path), port, e["cc"], size)
            got = _received(server, sent["port"])
            transfers.append(_row(size, sent, got))
    finally:
        server.kill()
        server.wait()
        set_default_theta(load_spec().default())
    return {
        "cc": e["cc"],
        "theta_in_kernel": theta,
        "no_metrics_save": read_sysctl("net.ipv4.tcp_no_metrics_save", SENDER_NS),
        "transfers": transfers,
    }


WARM_UP_BYTES = 64


def _warm_up(path: int, port: int, cc: str, server: subprocess.Popen) -> None:
    """One small transfer, not counted: the first packet of a boot to a path's receiver waits
    for ARP, whose reply crosses the path's delay line, so the first series on each path would
    pay one round trip more in its first transfer than any other transfer does."""
    sent = transfer(receiver_addr(path), port, cc, WARM_UP_BYTES)
    _received(server, sent["port"])


def _row(size: int, sent: dict, got: dict) -> dict:
    completion = got["done_at"] - sent["started"]
    return {
        "size": size,
        "bytes_received": got["bytes"],
        "completion_s": completion,
        "reply_s": sent["reply_s"],
        "throughput_mbps": size * 8 / completion / 1e6,
        "cc_in_kernel": sent["cc_in_kernel"],
        "retransmits": sent["retransmits"],
        "min_rtt_ms": sent["min_rtt_ms"],
    }


# --- host side: plans ------------------------------------------------------------------------

ONE_MB = 10**6
# SURGE's Web file sizes (Barford and Crovella 1998): log-normal body, Pareto tail.
MIX_BODY_MU, MIX_BODY_SIGMA = 9.357, 1.318  # ln bytes
MIX_TAIL_K, MIX_TAIL_ALPHA = 133_000, 1.1
MIX_MIN_BYTES = 64  # at least the size header, and a handful of bytes more
MIX_MAX_BYTES = 8 * 10**6
TRACE_STEP_S = 1.7  # transfer i starts 1.7·i s (mod the span) into the path's rate schedule
TRACE_SPAN_S = 12.0
WORKLOADS = ("1mb", "mix")
DEFAULT_SCENARIOS = ("ethernet", "satellite", "cellular", "deep-buffer", plans.LOSSY.name)
BASELINES = ("cubic", "bbr", "vegas", "reno")
CONTENDERS = ("fusion-default", "fusion-tuned", *BASELINES)


_BODY = statistics.NormalDist(MIX_BODY_MU, MIX_BODY_SIGMA)  # of ln(size)
_TAIL_FROM = _BODY.cdf(math.log(MIX_TAIL_K))  # the body's share below the cut


def mix_quantile(p: float) -> float:
    """The size mix's inverse CDF: the log-normal body up to the cut, the Pareto tail above
    it carrying the body's own share beyond the cut."""
    if p <= _TAIL_FROM:
        return math.exp(_BODY.inv_cdf(p))
    return MIX_TAIL_K * ((1 - _TAIL_FROM) / (1 - p)) ** (1 / MIX_TAIL_ALPHA)


def size_mix(n: int, seed: int) -> list[int]:
    """``n`` web-object sizes in bytes: the mix's quantiles at (i + 0.5) / n, in an order
    shuffled by ``seed`` (see the module docstring)."""
    sizes = [round(mix_quantile((i + 0.5) / n)) for i in range(n)]
    random.Random(seed).shuffle(sizes)
    return [min(MIX_MAX_BYTES, max(MIX_MIN_BYTES, s)) for s in sizes]


def contenders(tuned_theta: dict[str, int] | None, only: Iterable[str] = ()) -> list[Contender]:
    """The CCs compared, in CONTENDERS' order (fusion-tuned only with a tuned θ)."""
    out = [Contender("fusion-default", "fusion", {})]
    if tuned_theta:
        out.append(Contender("fusion-tuned", "fusion", tuned_theta))
    out += [Contender(cc, cc, {}) for cc in BASELINES]
    chosen = set(only)
    return [c for c in out if not chosen or c.name in chosen]


def load_path(name: str) -> scenario.Scenario:
    """A shipped scenario by name, or the lab's lossy path (plans.LOSSY)."""
    return plans.LOSSY if name == plans.LOSSY.name else scenario.load(name)


def trace_offsets(path: scenario.Scenario, n: int) -> list[float]:
    """Where in the rate schedule each transfer starts (0 on a fixed-rate path)."""
    if len(path.schedule()) == 1:
        return [0.0] * n
    return [round(TRACE_STEP_S * i % TRACE_SPAN_S, 3) for i in range(n)]


@dataclass(frozen=True)
class ShortConfig:
    scenarios: tuple[str, ...] = DEFAULT_SCENARIOS
    tuned_theta: dict[str, int] | None = None
    tuned_source: str = "given"
    only: tuple[str, ...] = ()  # contenders' names; empty: all
    transfers: int = 20  # 1 MB transfers per path and CC
    mix: int = 40  # transfers of the size mix per path and CC
    seed: int = 1
    # fewer transfers on these paths: name → (1 MB transfers, mix transfers)
    fewer: tuple[tuple[str, int, int], ...] = ()

    def counts(self, name: str) -> tuple[int, int]:
        return next(((a, b) for n, a, b in self.fewer if n == name), (self.transfers, self.mix))


def _series(label: str, path: int, c: Contender, sizes: list[int], offsets: list[float]) -> dict:
    return {
        "label": label,
        "kind": "shortflows",
        "path": path,
        "cc": c.cc,
        "theta": c.theta,
        "sizes": sizes,
        "offsets_s": offsets,
    }


def build_plan(cfg: ShortConfig) -> dict:
    """Per path, each CC's 1 MB series then each CC's mix series."""
    paths = [load_path(n) for n in cfg.scenarios]
    cs = contenders(cfg.tuned_theta, cfg.only)
    experiments = []
    for i, p in enumerate(paths):
        n_1mb, n_mix = cfg.counts(p.name)
        workloads = {"1mb": [ONE_MB] * n_1mb, "mix": size_mix(n_mix, cfg.seed)}
        for w, sizes in workloads.items():
            offsets = trace_offsets(p, len(sizes))
            experiments += [
                _series(f"{p.name}/{c.name}/{w}", i, c, sizes, offsets) for c in cs if sizes
            ]
    return {"paths": [p.to_dict() for p in paths], "experiments": experiments}


# --- host side: figures ----------------------------------------------------------------------


def _p95(values: list[float]) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=20, method="inclusive")[18]


def summary(series: dict) -> dict:
    """A series' figures: completion time (mean, median, p95), mean throughput (of each
    transfer's size / completion time), retransmits per transfer."""
    ts = series["transfers"]
    times = [t["completion_s"] for t in ts]
    return {
        "transfers": len(ts),
        "bytes": sum(t["size"] for t in ts),
        "mean_s": statistics.fmean(times),
        "median_s": statistics.median(times),
        "p95_s": _p95(times),
        "mean_mbps": statistics.fmean(t["throughput_mbps"] for t in ts),
        "retransmits": statistics.fmean(t["retransmits"] for t in ts),
        "ccs_in_kernel": sorted({t["cc_in_kernel"] for t in ts}),
    }


def _cell(label: str, series: dict | None) -> str:
    if series is None:
        return ""
    name = label.split("/")[1]
    if "error" in series:
        last = series["error"].strip().splitlines()[-1]
        return f"| {name} | failed: {last} | | | | | |"
    s = summary(series)
    return (
        f"| {name} | {s['transfers']} | {s['mean_s']:.3f} | {s['median_s']:.3f} | "
        f"{s['p95_s']:.3f} | {s['mean_mbps']:.2f} | {s['retransmits']:.1f} |"
    )


TABLE_HEAD = (
    "| CC | transfers | mean s | median s | p95 s | mean Mbit/s | retransmits / transfer |\n"
    "|---|---:|---:|---:|---:|---:|---:|"
)


def table(results: dict, path: str, workload: str, cs: list[Contender]) -> str:
    """One path's and workload's rows, one per CC that ran."""
    rows = []
    for c in cs:
        label = f"{path}/{c.name}/{workload}"
        if cell := _cell(label, results["experiments"].get(label)):
            rows.append(cell)
    return "\n".join([TABLE_HEAD, *rows]) if rows else ""


def _path_line(p: scenario.Scenario) -> str:
    rate = f"{p.rate_mbit:g} Mbit/s" if p.rate_mbit else f"trace {p.rate_trace}"
    loss = f", {p.loss_percent:g} % loss" if p.loss_percent else ""
    return f"{p.name}: {p.rtt_ms:g} ms, {rate}{loss}, queue {p.queue_limit()} packets"


def _mix_line(cfg: ShortConfig) -> str:
    sizes = size_mix(cfg.mix, cfg.seed)
    if not sizes:
        return "No size mix ran."
    return (
        f"Size mix: {len(sizes)} sizes, seed {cfg.seed}: median {statistics.median(sizes):,.0f} "
        f"bytes, mean {statistics.fmean(sizes):,.0f}, largest {max(sizes):,}, "
        f"{sum(1 for s in sizes if s > MIX_TAIL_K)} above {MIX_TAIL_K:,} (the tail)."
    )


def render(results: dict, cfg: ShortConfig, command: str) -> str:
    cs = contenders(cfg.tuned_theta, cfg.only)
    theta = tuned_text(cfg.tuned_theta)
    parts = [
        *opening(
            "Short flows: completion time of 1 MB transfers and of a web-object size mix",
            command,
            results,
        ),
        "Transfers one after another, each on a fresh connection from a cold start; completion "
        "time from the sender's connect() to the receiver having read the last byte "
        "(handshake included); throughput = size / completion time, averaged over transfers. "
        f"`lab/gemini_lab/shortflows.py` says how and why. fusion-default is the θ spec's "
        f"default; fusion-tuned is {theta} ({cfg.tuned_source}).",
        "",
        _mix_line(cfg),
        "",
    ]
    for name in cfg.scenarios:
        p = load_path(name)
        for w in WORKLOADS:
            if text := table(results, name, w, cs):
                title = "1 MB transfers" if w == "1mb" else "size mix"
                parts += [f"## {name}, {title}", "", _path_line(p), "", text, ""]
    return "\n".join(parts)


def _checked(results: dict, cfg: ShortConfig) -> list[str]:
    """Transfers that did not deliver their size or ran another CC than asked: a run with
    any of these is not a measurement."""
    wrong = []
    for label, series in results["experiments"].items():
        for t in series.get("transfers", []):
            asked = series["cc"]
            if t["bytes_received"] != t["size"] or t["cc_in_kernel"] != asked:
                wrong.append(f"{label}: {t}")
    return wrong


def progress_line(label: str, series: dict) -> str:
    if "error" in series:
        return f"{label}: ERROR {series['error'].strip().splitlines()[-1]}"
    s = summary(series)
    return (
        f"{label}: {s['transfers']} transfers, mean {s['mean_s']:.3f} s, "
        f"p95 {s['p95_s']:.3f} s, {s['mean_mbps']:.2f} Mbit/s "
        f"({series.get('elapsed_s')} s of guest time)"
    )


def parse_fewer(text: str) -> tuple[str, int, int]:
    """``satellite=5,10`` → fewer transfers on that path: 5 of 1 MB, 10 of the mix."""
    name, _, counts = text.partition("=")
    one, _, mix = counts.partition(",")
    if not (name and one.isdigit() and mix.isdigit()):
        raise ValueError(f"{text!r}: expected PATH=N_1MB,N_MIX, e.g. satellite=5,10")
    return name, int(one), int(mix)


def main() -> None:
    if sys.argv[1:2] != ["serve"] or len(sys.argv) != 3:
        raise SystemExit("usage: python -m gemini_lab.shortflows serve PORT")
    serve(int(sys.argv[2]))


if __name__ == "__main__":
    main()


MEASUREMENT = Measurement(build_plan, render, progress_line, _checked)
