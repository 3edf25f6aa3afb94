"""Where finished flows come from: the Fusion module's flow records (exact θ attribution), and
socket-diagnostics destroy events for flows of every other congestion control.

A reader thread turns each Fusion record into an aggregator Flow. The kernel counts records it
could not deliver; the listener counts receive-buffer overruns; both surface as metrics.
Flows of other CCs are counted per CC (gemini_agent_other_cc_flows); Booster's report has no
field for a CC yet, so they are not reported until A/B comparisons get one."""

from __future__ import annotations

import datetime as dt
import logging
import select
import threading
import time
from collections.abc import Callable

from gemini_agent.aggregator import Flow
from gemini_agent.metrics import AgentMetrics
from gemini_agent.sockdiag import DestroyListener
from gemini_api.aggregate import FlowStats
from gemini_api.fusion_genl import FlowRecord, FlowRecordListener

log = logging.getLogger(__name__)


def flow_from_record(rec: FlowRecord, ended: dt.datetime) -> Flow:
    stats = FlowStats(bytes_acked=rec.bytes_acked, duration_us=rec.duration_us,
                      rtt_avg_us=rec.rtt_avg_us, rtt_min_us=rec.rtt_min_us)
    return Flow(dst=rec.dst, stats=stats, theta=rec.theta, theta_version=rec.profile_version,
                ended=ended)


class _Source(threading.Thread):
    """A reader thread over one kernel socket; ``stop`` ends it within its poll timeout."""

    def __init__(self, name: str, metrics: AgentMetrics) -> None:
        super().__init__(name=name, daemon=True)
        self.metrics = metrics
        self.stopped = threading.Event()

    def stop(self) -> None:
        self.stopped.set()


class FusionRecordSource(_Source):
    def __init__(self, sink: Callable[[Flow], None], metrics: AgentMetrics) -> None:
        super().__init__("fusion-records", metrics)
        self.sink = sink
        self.listener = FlowRecordListener()

    def run(self) -> None:
        overruns = 0
        while not self.stopped.is_set():
            ready, _, _ = select.select([self.listener], [], [], 0.5)
            if not ready:
                continue
            now = dt.datetime.now(dt.UTC)
            for rec in self.listener.receive():
                self.metrics.flows.labels("fusion").inc()
                self.sink(flow_from_record(rec, now))
            if self.listener.overruns != overruns:
                self.metrics.records_dropped.labels("socket").inc(self.listener.overruns - overruns)
                overruns = self.listener.overruns
        self.listener.close()


class SockDiagSource(_Source):
    """Destroy events of every TCP socket, completed from a dump every ``dump_s`` (see
    gemini_agent.sockdiag); Fusion's own flows are left to its records."""

    def __init__(self, metrics: AgentMetrics, dump_s: float) -> None:
        super().__init__("sockdiag", metrics)
        self.dump_s = dump_s
        self.listener = DestroyListener()

    def run(self) -> None:
        next_dump = 0.0
        while not self.stopped.is_set():
            if time.monotonic() >= next_dump:
                try:
                    self.listener.snapshots.refresh()
                except OSError as exc:
                    log.warning("socket dump failed: %s", exc)
                next_dump = time.monotonic() + self.dump_s
            select.select([self.listener], [], [], min(0.5, self.dump_s))
            for flow in self.listener.read():
                # Fusion's flows come from its records; a socket with no peer and no bytes (a
                # listener, an unanswered connect) is no flow
                if flow.cc == "fusion" or (flow.dport == 0 and flow.bytes_acked == 0):
                    continue
                self.metrics.flows.labels("sockdiag").inc()
                self.metrics.other_cc_flows.labels(flow.cc).inc()
        self.listener.close()
