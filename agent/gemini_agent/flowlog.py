"""Flows of a user-space transport from the log it appends to (``records = "flow_log"``:
FlashPass's lab prototype, gemini_lab.flashpass.sender): one JSON line per finished flow, with
what a kernel flow record carries and the θ (and θ version) the flow read at its start.

The log sits beside the transport's θ file, its suffix replaced (``flashpass.flows`` beside
``flashpass.toml``). It is tailed as ``tail -F`` would: from its end when the agent starts (the
lines before were a previous agent's to report), from its start when it appears later or is
replaced (rotated: the old file is read to its end first) or cut short (truncated). A line is
taken only once its newline is there, so a write the file system split is never half-read.
A line that is not a record (not JSON, a field missing or of the wrong type, a θ outside the
spec's wide region Θ') is dropped and counted (gemini_agent_records_dropped_total{where=
"malformed"}), and logged once per interval with how many there were: a transport writing
garbage neither stops the agent nor floods its log.

Each record becomes an aggregator Flow of the datapath, with its θ: the aggregator reports it
as that datapath's trial when the policy tunes it, and as a baseline of its CC otherwise. A
flow the transport gave up on delivered no byte it knows of, so it is counted as an unusable
flow (the aggregator's ``skipped``), as a kernel flow without data is.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from gemini_agent.aggregator import Flow
from gemini_agent.datapath import ConfigFile, HostTheta
from gemini_agent.metrics import AgentMetrics
from gemini_agent.sources import Source
from gemini_api.aggregate import FlowStats
from gemini_api.datapaths import Datapath, Records, registry
from gemini_api.theta import ThetaError

log = logging.getLogger(__name__)
FLOW_LOG_SUFFIX = ".flows"
MALFORMED = "malformed"  # gemini_agent_records_dropped_total's label for a line not a record
POLL_S = 0.5  # how often the log is looked at; a finished flow waits at most this long
NS_PER_S = 1_000_000_000
# the record's integer fields the agent reads (besides dst, theta and finished)
INT_FIELDS = (
    "bytes_delivered",
    "duration_us",
    "rtt_avg_us",
    "rtt_min_us",
    "theta_version",
    "end_unix_ns",
)


class FlowLogError(ValueError):
    """A flow-log line that is not a flow record; the message says what is wrong."""


def flow_log_datapaths() -> list[Datapath]:
    """The datapaths whose flows come from a transport's flow log."""
    return [d for d in registry() if d.records is Records.FLOW_LOG]


def flow_log_path(theta_file: Path) -> Path:
    """The transport's flow log beside its θ file."""
    return theta_file.with_suffix(FLOW_LOG_SUFFIX)


def flow_log_sources(
    sink: Callable[[Flow], None],
    metrics: AgentMetrics,
    writers: Mapping[str, HostTheta],
    log_every_s: float,
) -> list[FlowLogSource]:
    """A source for each flow-log datapath installed here (its θ file's directory is there):
    the log beside the file its writer in ``writers`` writes (the spec's target without one)."""
    sources = []
    for d in flow_log_datapaths():
        writer = writers.get(d.name)
        theta_file = writer.path if isinstance(writer, ConfigFile) else Path(d.spec.target)
        if theta_file.parent.is_dir():
            path = flow_log_path(theta_file)
            sources.append(FlowLogSource(sink, metrics, d, path, log_every_s))
        else:
            log.info("no %s here (no %s): its flow log is not read", d.name, theta_file.parent)
    return sources


def _int(record: dict, name: str) -> int:
    value = record.get(name)
    if type(value) is not int or value < 0:  # bool is not a count
        raise FlowLogError(f"{name}: {value!r} is not a non-negative integer")
    return value


def _address(record: dict) -> str:
    dst = record.get("dst")
    try:
        return str(ipaddress.ip_address(dst))  # type: ignore[arg-type]
    except ValueError:
        raise FlowLogError(f"dst: {dst!r} is not an IP address") from None


def flow_from_line(line: str, d: Datapath) -> Flow:
    """The flow a log line records, as a flow of ``d`` with the θ it ran; FlowLogError naming
    what is wrong otherwise (a θ outside Θ' among them: the transport refuses to run one)."""
    try:
        record = json.loads(line)
    except ValueError as exc:
        raise FlowLogError(f"not JSON: {exc}") from None
    if not isinstance(record, dict):
        raise FlowLogError(f"not a JSON object: {line[:40]!r}")
    values = {name: _int(record, name) for name in INT_FIELDS}
    theta = record.get("theta")
    if not isinstance(theta, dict) or not all(type(v) is int for v in theta.values()):
        raise FlowLogError(f"theta: {theta!r} is not a θ in integer units")
    try:
        checked = d.spec.validate(theta, d.spec.limits)
    except ThetaError as exc:
        raise FlowLogError(f"theta: {exc}") from None
    finished = record.get("finished")
    if not isinstance(finished, bool):
        raise FlowLogError(f"finished: {finished!r} is not true or false")
    stats = FlowStats(
        bytes_acked=values["bytes_delivered"] if finished else 0,
        duration_us=values["duration_us"],
        rtt_avg_us=values["rtt_avg_us"],
        rtt_min_us=values["rtt_min_us"],
    )
    ended = dt.datetime.fromtimestamp(values["end_unix_ns"] / NS_PER_S, dt.UTC)
    return Flow(_address(record), stats, checked, values["theta_version"], ended, datapath=d.name)


@dataclass
class _Open:
    file: IO[bytes]
    ino: tuple[int, int]  # (st_dev, st_ino): the file the path named when it was opened


class LogTail:
    """The complete lines appended to the file at ``path`` since the last ``lines``: from the
    end of a file there at the start, from the start of one that appears, is replaced or is
    truncated later. A partial last line waits for its newline; one left behind by a replaced
    or truncated file is returned as it is, for the caller to refuse."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._open: _Open | None = None
        self._partial = b""
        try:
            self._reopen(at_end=True)
        except OSError as exc:  # unreadable now: read from its start once it is
            log.warning("cannot read %s yet: %s", path, exc)

    def _reopen(self, at_end: bool = False) -> bool:
        try:
            f = self.path.open("rb")
        except FileNotFoundError:
            return False
        st = os.fstat(f.fileno())
        if at_end:
            f.seek(0, os.SEEK_END)
        self._open = _Open(f, (st.st_dev, st.st_ino))
        return True

    def _drain(self) -> list[bytes]:
        assert self._open is not None
        data = self._partial + self._open.file.read()
        *lines, self._partial = data.split(b"\n")
        return lines

    def _replaced(self) -> bool:
        """The path now names another file, or none; or this one was cut below where we are."""
        assert self._open is not None
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return True
        if (st.st_dev, st.st_ino) != self._open.ino:
            return True
        return st.st_size < self._open.file.tell()

    def lines(self) -> list[bytes]:
        if self._open is None and not self._reopen():
            return []
        out = self._drain()
        if self._replaced():
            out += self._drain()  # what the old file got before it was replaced
            if self._partial:
                out.append(self._partial)  # never to be completed
            self._partial = b""
            self.close()
            if self._reopen():
                out += self._drain()
        return out

    def close(self) -> None:
        if self._open is not None:
            self._open.file.close()
            self._open = None


class FlowLogSource(Source):
    """A transport's flow log tailed every ``poll_s``; each record a Flow of its datapath, each
    line that is not one counted and, once per ``log_every_s``, logged."""

    def __init__(
        self,
        sink: Callable[[Flow], None],
        metrics: AgentMetrics,
        datapath: Datapath,
        path: Path,
        log_every_s: float,
        poll_s: float = POLL_S,
    ) -> None:
        super().__init__(f"{datapath.name}-flow-log", metrics)
        self.sink, self.datapath, self.poll_s = sink, datapath, poll_s
        self.log_every_s = log_every_s
        self.tail = LogTail(path)
        self._refused: list[str] = []  # why each line refused since the last log was
        self._logged_at = -log_every_s

    def poll(self) -> None:
        """Read what was appended since the last poll; a log that cannot be read (permissions,
        I/O) is logged, as refused lines are, and read again at the next poll."""
        try:
            lines = self.tail.lines()
        except OSError as exc:
            self._warn(f"cannot read {self.tail.path}: {exc}")
            return
        for raw in lines:
            try:
                flow = flow_from_line(raw.decode(errors="replace"), self.datapath)
            except FlowLogError as exc:
                self.metrics.records_dropped.labels(MALFORMED).inc()
                self._refused.append(str(exc))
                continue
            self.metrics.flows.labels(self.datapath.name).inc()
            self.sink(flow)
        if self._refused:
            n, first = len(self._refused), self._refused[0]
            if self._warn(f"{n} line(s) of {self.tail.path} are not flow records (first: {first})"):
                self._refused = []

    def _warn(self, message: str) -> bool:
        """Log ``message`` unless a warning went out less than ``log_every_s`` ago; whether
        it was logged."""
        now = time.monotonic()
        if now - self._logged_at < self.log_every_s:
            return False
        log.warning("%s", message)
        self._logged_at = now
        return True

    def run(self) -> None:
        while not self.stopped.wait(self.poll_s):
            self.poll()
        self.poll()  # what the last flows appended before the agent stops
        self.tail.close()
