"""Where finished flows come from: the flow records of each module that keeps them (Fusion,
GEMINI, DC-Vegas: ``records = "flow_records"``; exact θ attribution), and socket-diagnostics
destroy events for flows of every other congestion control.

A reader thread per such module turns each record into an aggregator Flow of its datapath.
The kernel counts records it could not deliver; the listener counts receive-buffer overruns;
both surface as metrics.
Flows of other CCs are counted per CC (gemini_agent_other_cc_flows) and aggregated per (CC,
context) without θ: Booster keeps them as the baseline of A/B comparisons, never as points of
its model. Their throughput is bytes acked over the time the socket had data to send (tcp_info's
busy time, receive-window and send-buffer limited included), their queueing delay the smoothed
RTT at close less the minimum RTT: the kernel keeps no mean RTT per socket, as Fusion does.
The agent's own connection to Booster is not a flow of the host's service and is skipped."""

from __future__ import annotations

import datetime as dt
import logging
import select
import threading
import time
from collections.abc import Callable

from gemini_agent.aggregator import Flow
from gemini_agent.metrics import AgentMetrics
from gemini_agent.sockdiag import ClosedFlow, DestroyListener
from gemini_api.aggregate import FlowStats
from gemini_api.datapaths import DEFAULT_DATAPATH, Datapath, Records, registry
from gemini_api.fusion_genl import FlowRecord, FlowRecordListener, TableFamily

log = logging.getLogger(__name__)
FIN_ONLY_BYTES = 1  # tcpi_bytes_acked of a socket that sent nothing but its FIN
# The CCs whose datapath records its own flows with the θ they ran (the table modules): sock_diag
# leaves their sockets to those records, which count each flow once and with its θ.
RECORDED_CCS = frozenset(d.cc for d in registry() if d.records is Records.FLOW_RECORDS)


def recorded_datapaths() -> list[Datapath]:
    """The datapaths whose module reports its flows on its table's family, the default first."""
    return [d for d in registry() if d.records is Records.FLOW_RECORDS and d.genl_family]


def flow_from_record(rec: FlowRecord, ended: dt.datetime, datapath: str = DEFAULT_DATAPATH) -> Flow:
    stats = FlowStats(
        bytes_acked=rec.bytes_acked,
        duration_us=rec.duration_us,
        rtt_avg_us=rec.rtt_avg_us,
        rtt_min_us=rec.rtt_min_us,
    )
    return Flow(
        dst=rec.dst,
        stats=stats,
        theta=rec.theta,
        theta_version=rec.profile_version,
        ended=ended,
        datapath=datapath,
    )


class Source(threading.Thread):
    """A reader thread over one kernel socket; ``stop`` ends it within its poll timeout."""

    def __init__(self, name: str, metrics: AgentMetrics) -> None:
        super().__init__(name=name, daemon=True)
        self.metrics = metrics
        self.stopped = threading.Event()

    def stop(self) -> None:
        self.stopped.set()


class RecordSource(Source):
    """A table module's flow records over its generic netlink family: one per finished flow,
    with the θ (profile) it ran. FusionError when the family is not there (no module)."""

    def __init__(
        self, sink: Callable[[Flow], None], metrics: AgentMetrics, datapath: Datapath | None = None
    ) -> None:
        d = datapath or registry().default
        super().__init__(f"{d.name}-records", metrics)
        self.sink = sink
        self.datapath = d.name
        self.listener = FlowRecordListener(family=TableFamily.of(d))

    def run(self) -> None:
        overruns = 0
        while not self.stopped.is_set():
            ready, _, _ = select.select([self.listener], [], [], 0.5)
            if not ready:
                continue
            now = dt.datetime.now(dt.UTC)
            for rec in self.listener.receive():
                self.metrics.flows.labels(self.datapath).inc()
                self.sink(flow_from_record(rec, now, self.datapath))
            if self.listener.overruns != overruns:
                self.metrics.records_dropped.labels("socket").inc(self.listener.overruns - overruns)
                overruns = self.listener.overruns
        self.listener.close()


def flow_from_closed(flow: ClosedFlow, ended: dt.datetime) -> Flow:
    stats = FlowStats(
        bytes_acked=flow.bytes_acked,
        duration_us=flow.busy_us,
        rtt_avg_us=flow.rtt_us,
        rtt_min_us=flow.min_rtt_us,
    )
    return Flow(dst=flow.daddr, stats=stats, theta={}, theta_version=0, ended=ended, cc=flow.cc)


class SockDiagSource(Source):
    """Destroy events of every TCP socket, completed from a dump every ``dump_s`` (see
    gemini_agent.sockdiag); the table modules' flows are left to their records. ``skip`` holds
    (address, port) peers that are not the host's service (the agent's Booster)."""

    def __init__(
        self,
        sink: Callable[[Flow], None],
        metrics: AgentMetrics,
        dump_s: float,
        skip: frozenset[tuple[str, int]] = frozenset(),
    ) -> None:
        super().__init__("sockdiag", metrics)
        self.sink, self.dump_s, self.skip = sink, dump_s, skip
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
                # recorded CCs' flows come from their records; a socket with no peer and no bytes (a
                # listener, an unanswered connect) is no flow
                if flow.cc in RECORDED_CCS or (flow.dport == 0 and flow.bytes_acked == 0):
                    continue
                if (flow.daddr, flow.dport) in self.skip:
                    continue
                self.metrics.flows.labels("sockdiag").inc()
                self.metrics.other_cc_flows.labels(flow.cc).inc()
                if flow.bytes_acked > FIN_ONLY_BYTES:  # a receiving socket sent no data
                    self.sink(flow_from_closed(flow, dt.datetime.now(dt.UTC)))
        self.listener.close()
