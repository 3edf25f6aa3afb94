"""Per-interval aggregation of finished flows by (θ, θ version, context), and flows of other
congestion controls by (CC, context) as the baseline of A/B comparisons."""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field

from gemini_agent.context import ContextResolver, Place
from gemini_api.aggregate import AggregateBuilder, FlowStats
from gemini_api.datapaths import DEFAULT_DATAPATH, Message, datapath
from gemini_api.v1 import booster_pb2 as pb

REPORT_NAMESPACE = uuid.UUID("5f3c1a4e-2b7d-4c8e-9a61-0d2f7e9b4c13")


@dataclass(frozen=True)
class Flow:
    dst: str
    stats: FlowStats
    theta: dict[str, int]
    theta_version: int
    ended: dt.datetime
    cc: str = ""  # '' for a recorded flow (θ known); else the CC that ran (its flows have no θ)
    datapath: str = DEFAULT_DATAPATH  # a recorded flow's: whose module recorded it, whose θ


@dataclass
class _Slot:
    theta: dict[str, int]
    version: int
    context: pb.Context
    cc: str
    datapath: str
    builder: AggregateBuilder = field(default_factory=AggregateBuilder)

    def to_proto(self, tuned: str | None, dense: bool) -> pb.Aggregate:
        """A recorded flow's aggregate carries its θ in its datapath's message when the policy
        reported under tunes that datapath; else it is a baseline of that datapath's CC (a
        GEMINI flow under a Fusion policy: Booster has no model of its θ there)."""
        if self.cc or self.datapath != tuned:
            cc = self.cc or datapath(self.datapath).cc
            return self.builder.to_proto({}, self.version, self.context, cc, dense=dense)
        if datapath(self.datapath).message is Message.THETA:
            return self.builder.to_proto(self.theta, self.version, self.context, dense=dense)
        # the θ travels as DatapathTheta: built as a baseline's, then made the datapath's trial
        agg = self.builder.to_proto({}, self.version, self.context, self.datapath, dense=dense)
        agg.cc = ""
        agg.datapath_theta.CopyFrom(pb.DatapathTheta(datapath=self.datapath, values=self.theta))
        return agg


class Aggregator:
    def __init__(self, resolver: ContextResolver, host_id: str, policy: str) -> None:
        self.resolver, self.host_id, self.policy = resolver, host_id, policy
        self._slots: dict[tuple, _Slot] = {}
        self._lock = threading.Lock()
        self.skipped = 0
        # Flows per destination place, halved every interval: which places matter most now,
        # for choosing what the kernel's table holds when not every place fits. The ranking
        # is taken when an interval closes, so it holds still until the next one.
        self._recent_flows: Counter[Place] = Counter()
        self._ranking: list[Place] = []
        # The θ of a host-wide datapath (CUBIC's module parameters) the host runs for its
        # policy: its flows of that CC are reported as the policy's trials of that θ. The agent
        # closes the interval before changing it.
        self.datapath_theta: pb.DatapathTheta | None = None
        # The datapath the policy reported under tunes (None: one this agent has no spec of):
        # recorded flows of another datapath are reported as baselines of its CC. The agent
        # closes the interval before changing it.
        self.tuned: str | None = DEFAULT_DATAPATH
        # Whether the policy's objective needs the completion sums (Booster says so in
        # GetParameters); without, they are left out of the report (about 40 bytes an aggregate).
        self.completion_sums = False

    def add(self, flow: Flow) -> None:
        if not flow.stats.usable:
            self.skipped += 1
            return
        # the source side of the context is the host's own: place and hour decide the rest
        place, hour = self.resolver.place(flow.dst), flow.ended.hour
        theta = tuple(sorted(flow.theta.items()))
        key = (flow.cc, flow.datapath, theta, flow.theta_version, place, hour)
        with self._lock:
            slot = self._slots.get(key)
            if slot is None:
                ctx = self.resolver.message(place, hour)
                slot = _Slot(flow.theta, flow.theta_version, ctx, flow.cc, flow.datapath)
                self._slots[key] = slot
            slot.builder.add(flow.stats)
            self._recent_flows[place] += 1

    def busiest_places(self) -> list[Place]:
        """Places by recent flows as of the last closed interval, most first (places without
        flows are not listed)."""
        with self._lock:
            return list(self._ranking)

    def close_interval(
        self, start_ms: int, end_ms: int, *, dense_sketches: bool = False
    ) -> pb.ReportRequest | None:
        """The interval's report, or None when no flow finished. Its id is fixed by host,
        policy and interval, so a report retried after a restart is the same report (Booster
        keys reports by host and id, so no other host can take it). Sketches are compact;
        ``dense_sketches`` encodes them as agents before the compact sketch did."""
        with self._lock:
            slots, self._slots = self._slots, {}
            self._ranking = [place for place, _ in self._recent_flows.most_common()]
            self._recent_flows = Counter(
                {p: n // 2 for p, n in self._recent_flows.items() if n > 1}
            )
        if not slots:
            return None
        report_id = uuid.uuid5(REPORT_NAMESPACE, f"{self.host_id}/{self.policy}/{start_ms}")
        aggregates = [s.to_proto(self.tuned, dense_sketches) for s in slots.values()]
        if not self.completion_sums:
            for agg in aggregates:
                agg.ClearField("completion")
        ran = self.datapath_theta
        for agg in aggregates:
            if ran is not None and agg.cc == ran.datapath:
                # The policy's own CC: its flows are trials of the θ that ran, not a baseline
                # (cc left empty, as for Fusion's flows; the θ in the datapath's message).
                agg.cc = ""
                agg.datapath_theta.CopyFrom(ran)
        return pb.ReportRequest(
            report_id=str(report_id),
            host_id=self.host_id,
            policy=self.policy,
            interval_start_unix_ms=start_ms,
            interval_end_unix_ms=end_ms,
            aggregates=aggregates,
        )
