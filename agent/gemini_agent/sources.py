"""Where finished flows come from: the Fusion module's flow records (exact θ attribution).

A reader thread turns each record into an aggregator Flow. The kernel counts records it could
not deliver; the listener counts receive-buffer overruns; both surface as metrics."""

from __future__ import annotations

import datetime as dt
import logging
import select
import threading
from collections.abc import Callable

from gemini_agent.aggregator import Flow
from gemini_agent.metrics import AgentMetrics
from gemini_api.aggregate import FlowStats
from gemini_api.fusion_genl import FlowRecord, FlowRecordListener

log = logging.getLogger(__name__)


def flow_from_record(rec: FlowRecord, ended: dt.datetime) -> Flow:
    stats = FlowStats(bytes_acked=rec.bytes_acked, duration_us=rec.duration_us,
                      rtt_avg_us=rec.rtt_avg_us, rtt_min_us=rec.rtt_min_us)
    return Flow(dst=rec.dst, stats=stats, theta=rec.theta, theta_version=rec.profile_version,
                ended=ended)


class FusionRecordSource(threading.Thread):
    def __init__(self, sink: Callable[[Flow], None], metrics: AgentMetrics) -> None:
        super().__init__(name="fusion-records", daemon=True)
        self.sink, self.metrics = sink, metrics
        self.listener = FlowRecordListener()
        self.stopped = threading.Event()

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

    def stop(self) -> None:
        self.stopped.set()
