"""Reports to Booster over gRPC: spooled first, then sent oldest first with deadlines, the
agent token, and exponential backoff with full jitter while Booster is away.

A report is set aside (never sent again) only when Booster judged the report itself and no
retry can change the answer: INVALID_ARGUMENT, ALREADY_EXISTS (its id was used for other
content), and RESOURCE_EXHAUSTED marked as a quota rejection. One INVALID_ARGUMENT is answered
instead: a Booster older than the compact sketch refuses its fields as unknown, and the report
goes again at once with the same flows in dense sketches (``dense_sketches``), so an agent
upgraded before Booster loses nothing. Everything else may pass: Booster
or its database away, a policy not created yet (NOT_FOUND), a token being rotated, a message
limit or overload (plain RESOURCE_EXHAUSTED); the report stays spooled and is retried with
backoff, since dropping it would lose flows for good.
"""

from __future__ import annotations

import logging
import random
import ssl
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import grpc

from gemini_agent.config import AgentSettings
from gemini_agent.credentials import AgentToken, FileIdentity, file_identity
from gemini_agent.metrics import AgentMetrics
from gemini_agent.spool import Spool
from gemini_api import sketch as sketches
from gemini_api.service_config import channel_options, retry_after_s
from gemini_api.v1 import booster_pb2 as pb
from gemini_api.v1 import booster_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
# Booster judged the report itself: retrying the same bytes cannot help.
PERMANENT = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS}
# Trailing metadata that marks a RESOURCE_EXHAUSTED as a refused quota (not overload).
REJECTION_KEY = "gemini-rejection"
QUOTA = "quota"


# GetParameters on the read port fails so when nothing serves it there (a Booster without a read
# port, its reader process down, an upgrade in progress): asked again at once on the agent port.
READ_PORT_ABSENT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNIMPLEMENTED}
# After the read port failed so, GetParameters goes to the agent port alone for this long before
# the read port is tried again: a Booster without one is not asked twice per refresh, and a
# reader that came back (respawned, upgraded) is found within this bound.
READ_PORT_RETRY_S = 60.0


# What a Booster before the compact sketch says of its fields (validation.unknown_field_paths).
OLD_BOOSTER = "_sketch: unknown field number"


def dense_sketches(report: pb.ReportRequest) -> pb.ReportRequest | None:
    """``report`` with its compact sketches written dense, as agents before them sent them
    (the same flows; each bin's weight on the middle key of its stride); None when it has no
    compact sketch."""
    out = pb.ReportRequest()
    out.CopyFrom(report)
    changed = False
    for a in out.aggregates:
        for msg in (a.throughput_sketch, a.queue_delay_sketch):
            if msg.key_stride:
                msg.CopyFrom(sketches.to_proto(sketches.from_proto(msg)))
                changed = True
    return out if changed else None


def _is_quota(metadata: Iterable[tuple[str, str | bytes]] | None) -> bool:
    return any(k == REJECTION_KEY and v in (QUOTA, QUOTA.encode()) for k, v in metadata or ())


def set_aside_reason(err: grpc.RpcError) -> str | None:
    """Why a failed send can never succeed ('INVALID_ARGUMENT', 'ALREADY_EXISTS', 'quota'),
    or None when the report must be kept and retried."""
    code = err.code()  # an RpcError raised by a call is also a grpc.Call
    if code in PERMANENT:
        return code.name
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        trailing = getattr(err, "trailing_metadata", None)
        if trailing is not None and _is_quota(trailing()):
            return QUOTA
    return None


def open_channel(settings: AgentSettings, address: str | None = None) -> grpc.Channel:
    """The channel to Booster's agent port (or to ``address``, its read port), with the
    project's service config (retries on UNAVAILABLE, round robin over replicas, keepalive:
    gemini_api.service_config), a failed connection tried again within ``retry_max_s`` like a
    spooled report, and, where set, TLS and this host's client certificate."""
    target = address or settings.booster_address
    options = channel_options(reconnect_max_s=settings.retry_max_s)
    if not settings.tls_ca_file:
        return grpc.insecure_channel(target, options=options)
    creds = grpc.ssl_channel_credentials(
        _read(settings.tls_ca_file, "tls_ca_file"),
        private_key=_read(settings.tls_key_file, "tls_key_file"),
        certificate_chain=_read(settings.tls_cert_file, "tls_cert_file"),
    )
    return grpc.secure_channel(target, creds, options=options)


def _read(path: Path | None, setting: str) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read {setting} {path}: {exc.strerror}") from None


def _check_pair(settings: AgentSettings) -> None:
    """The client certificate and key load as a matching pair (gRPC would only find out at
    the next handshake, with every call failing until then)."""
    if settings.tls_cert_file is not None and settings.tls_key_file is not None:
        ssl.create_default_context().load_cert_chain(settings.tls_cert_file, settings.tls_key_file)


class AgentChannel:
    """The channel to Booster, rebuilt when a TLS file it was built from changes: a client
    certificate renewed by the node's bootstrap or cert-manager, or a rotated CA, is used from
    the next call on, without a restart (gRPC's client credentials are fixed per channel).
    A rewrite that does not load (a half-written pair, a key that does not match) keeps the
    current channel, said once per change; the next change is tried again."""

    def __init__(
        self,
        settings: AgentSettings,
        metrics: AgentMetrics,
        channel: grpc.Channel | None = None,
        address: str | None = None,
    ) -> None:
        """``address``: another port than ``booster_address`` (the read port)."""
        self.settings, self.metrics, self.address = settings, metrics, address
        given = (settings.tls_ca_file, settings.tls_cert_file, settings.tls_key_file)
        self.files = [p for p in given if p is not None] if channel is None else []
        self.seen = self._identities()
        self.channel = channel or self._open()
        self.stub = pb_grpc.BoosterStub(self.channel)

    def _open(self) -> grpc.Channel:
        return open_channel(self.settings, self.address)

    def _identities(self) -> tuple[FileIdentity | None, ...]:
        out: list[FileIdentity | None] = []
        for path in self.files:
            try:
                out.append(file_identity(path))
            except OSError:
                out.append(None)
        return tuple(out)

    def current(self) -> pb_grpc.BoosterStub:
        """The stub for the next call, on a channel rebuilt first if a TLS file changed."""
        now = self._identities()
        if now == self.seen:
            return self.stub
        self.seen = now
        try:
            _check_pair(self.settings)
            channel = self._open()
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            self.metrics.tls_reloads.labels("unusable").inc()
            log.error("TLS files changed but do not load (%s): keeping the current channel", exc)
            return self.stub
        old, self.channel, self.stub = self.channel, channel, pb_grpc.BoosterStub(channel)
        old.close()
        self.metrics.tls_reloads.labels("reloaded").inc()
        log.info("TLS files changed: a new channel to Booster uses them from now on")
        return self.stub


class ReadPortState:
    """Whether GetParameters should try the read port now: yes, except within
    ``READ_PORT_RETRY_S`` of its last failure. It says when the port went away and came back,
    once each, not on every refresh."""

    def __init__(self, address: str | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.address, self.clock = address, clock
        self.retry_at: float | None = None  # None: the read port is in use

    def usable(self) -> bool:
        return self.retry_at is None or self.clock() >= self.retry_at

    def failed(self, code: grpc.StatusCode) -> None:
        if self.retry_at is None:
            log.warning(
                "read port %s did not answer (%s): GetParameters on the agent port, the read "
                "port tried again every %.0f s",
                self.address,
                code.name,
                READ_PORT_RETRY_S,
            )
        self.retry_at = self.clock() + READ_PORT_RETRY_S

    def answered(self) -> None:
        if self.retry_at is not None:
            log.info("read port %s answers again: GetParameters there", self.address)
        self.retry_at = None


class Reporter:
    def __init__(
        self,
        settings: AgentSettings,
        spool: Spool,
        metrics: AgentMetrics,
        channel: grpc.Channel | None = None,
        parameters_channel: grpc.Channel | None = None,
    ) -> None:
        """``booster`` carries reports; ``parameters`` carries GetParameters: the same
        channel unless ``parameters_address`` names Booster's read port."""
        self.settings, self.spool, self.metrics = settings, spool, metrics
        self.booster = AgentChannel(settings, metrics, channel)
        self.parameters = (
            self.booster
            if settings.parameters_address is None and parameters_channel is None
            else AgentChannel(settings, metrics, parameters_channel, settings.parameters_address)
        )
        self.read_port = ReadPortState(settings.parameters_address)
        self.token = AgentToken(settings, metrics)
        self.failures = 0
        self.next_attempt = 0.0

    def get_parameters(
        self, req: pb.GetParametersRequest, timeout_s: float
    ) -> pb.GetParametersResponse:
        """Booster's answer for ``req``: from the read port when one is set, and from the agent
        port when there is none or it does not answer (``READ_PORT_ABSENT``; then for
        ``READ_PORT_RETRY_S``), so that a read port named before Booster serves one never
        leaves the host without θ."""
        metadata = self.token.metadata()
        if self.parameters is not self.booster and self.read_port.usable():
            try:
                resp = self.parameters.current().GetParameters(
                    req, metadata=metadata, timeout=timeout_s
                )
            except grpc.RpcError as err:
                if err.code() not in READ_PORT_ABSENT:
                    raise
                self.read_port.failed(err.code())
            else:
                self.read_port.answered()
                return resp
        return self.booster.current().GetParameters(req, metadata=metadata, timeout=timeout_s)

    def submit(self, report: pb.ReportRequest) -> None:
        dropped = self.spool.dropped
        self.spool.put(report.SerializeToString())
        if self.spool.dropped > dropped:
            log.warning(
                "spool over its byte budget: %d oldest reports dropped unsent",
                self.spool.dropped - dropped,
            )
            self.metrics.spool_dropped.inc(self.spool.dropped - dropped)
        self.metrics.reports.labels("spooled").inc()
        self.metrics.spool_reports.set(len(self.spool))

    def _backoff(self, hint_s: float | None = None) -> None:
        """Exponential backoff with full jitter; an overloaded replica's hint is a floor,
        stretched by up to half again at random so hosts refused together do not return
        together."""
        self.failures += 1
        cap = min(
            self.settings.retry_max_s, self.settings.retry_initial_s * 2 ** min(self.failures, 30)
        )
        wait = random.uniform(0, cap)
        if hint_s is not None:
            wait = max(wait, hint_s * random.uniform(1.0, 1.5))
        self.next_attempt = time.monotonic() + wait

    def drain_at_exit(self) -> int:
        """One last send of what the spool holds, backoff or not. A clean stop (an upgrade, a
        host leaving the fleet) delivers its last interval now; what Booster does not take
        stays spooled for the next start, as in an outage."""
        self.next_attempt = 0.0
        return self.drain()

    def _send(self, report: pb.ReportRequest) -> None:
        try:
            self.booster.current().ReportAggregates(
                report, metadata=self.token.metadata(), timeout=self.settings.rpc_deadline_s
            )
        except grpc.RpcError as err:
            dense = None
            if err.code() == grpc.StatusCode.INVALID_ARGUMENT and OLD_BOOSTER in (
                err.details() or ""
            ):
                dense = dense_sketches(report)
            if dense is None:
                raise
            log.warning("Booster predates compact sketches: report sent with dense ones")
            self.booster.current().ReportAggregates(
                dense, metadata=self.token.metadata(), timeout=self.settings.rpc_deadline_s
            )

    def drain(self) -> int:
        """Send what the spool holds, oldest first; stop at the first transient failure."""
        if time.monotonic() < self.next_attempt:
            return 0
        sent = 0
        for path, payload in self.spool.pending():
            try:
                self._send(pb.ReportRequest.FromString(payload))
            except grpc.RpcError as err:
                code = err.code()
                reason = set_aside_reason(err)
                if reason is not None:
                    log.error(
                        "report %s set aside, Booster refused it for good (%s): %s",
                        path.name,
                        reason,
                        err.details(),
                    )
                    self.spool.reject(path)
                    self.metrics.reports.labels("rejected").inc()
                    self.metrics.set_aside.labels(reason).inc()
                    continue
                log.warning(
                    "report not accepted now (%s); %d reports spooled, retrying with backoff",
                    code.name,
                    len(self.spool),
                )
                self.metrics.reports.labels("failed").inc()
                trailing = getattr(err, "trailing_metadata", None)
                self._backoff(retry_after_s(trailing()) if trailing is not None else None)
                break
            self.spool.done(path)
            self.metrics.reports.labels("sent").inc()
            self.failures = 0
            sent += 1
        self.metrics.spool_reports.set(len(self.spool))
        return sent
