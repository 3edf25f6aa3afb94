"""Reports to Booster over gRPC: spooled first, then sent oldest first with deadlines, the
agent token, and exponential backoff with full jitter while Booster is away."""

from __future__ import annotations

import logging
import random
import time

import grpc

from gemini_agent.config import AgentSettings
from gemini_agent.metrics import AgentMetrics
from gemini_agent.spool import Spool
from gemini_api.v1 import booster_pb2 as pb
from gemini_api.v1 import booster_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
# Booster judged the report itself: retrying the same bytes cannot help.
PERMANENT = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS}


def open_channel(settings: AgentSettings) -> grpc.Channel:
    if settings.tls_ca_file:
        creds = grpc.ssl_channel_credentials(settings.tls_ca_file.read_bytes())
        return grpc.secure_channel(settings.booster_address, creds)
    return grpc.insecure_channel(settings.booster_address)


class Reporter:
    def __init__(
        self,
        settings: AgentSettings,
        spool: Spool,
        metrics: AgentMetrics,
        channel: grpc.Channel | None = None,
    ) -> None:
        self.settings, self.spool, self.metrics = settings, spool, metrics
        self.channel = channel or open_channel(settings)
        self.stub = pb_grpc.BoosterStub(self.channel)
        self.metadata = (("authorization", f"Bearer {settings.token.get_secret_value()}"),)
        self.failures = 0
        self.next_attempt = 0.0

    def submit(self, report: pb.ReportRequest) -> None:
        self.spool.put(report.SerializeToString())
        self.metrics.reports.labels("spooled").inc()
        self.metrics.spool_reports.set(len(self.spool))

    def _backoff(self) -> None:
        self.failures += 1
        cap = min(
            self.settings.retry_max_s, self.settings.retry_initial_s * 2 ** min(self.failures, 30)
        )
        self.next_attempt = time.monotonic() + random.uniform(0, cap)

    def drain(self) -> int:
        """Send what the spool holds, oldest first; stop at the first transient failure."""
        if time.monotonic() < self.next_attempt:
            return 0
        sent = 0
        for path, payload in self.spool.pending():
            try:
                self.stub.ReportAggregates(
                    pb.ReportRequest.FromString(payload),
                    metadata=self.metadata,
                    timeout=self.settings.rpc_deadline_s,
                )
            except grpc.RpcError as err:
                code = err.code()
                if code in PERMANENT:
                    log.error(
                        "Booster refused report %s for good: %s %s",
                        path.name,
                        code.name,
                        err.details(),
                    )
                    self.spool.reject(path)
                    self.metrics.reports.labels("rejected").inc()
                    continue
                log.warning(
                    "Booster unavailable (%s); %d reports spooled", code.name, len(self.spool)
                )
                self.metrics.reports.labels("failed").inc()
                self._backoff()
                break
            self.spool.done(path)
            self.metrics.reports.labels("sent").inc()
            self.failures = 0
            sent += 1
        self.metrics.spool_reports.set(len(self.spool))
        return sent
