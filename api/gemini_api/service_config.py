"""How a client should call Booster's agent port: gRPC's service config and channel options.

One definition, for every client (the agent's reporter, the demo fleet, load generators):

* **Retries.** Both methods are retried on UNAVAILABLE only, with exponential backoff, by gRPC
  itself: a replica restarting, a connection recycled at its maximum age, or Booster's own
  "storage unavailable; retry". Both are safe to repeat: GetParameters changes nothing, and a
  report carries its idempotency key, so a retried report is stored once. Nothing else is
  retried by the channel: INVALID_ARGUMENT can never succeed, RESOURCE_EXHAUSTED with
  ``gemini-rejection: quota`` is the agent's to set aside, and UNAUTHENTICATED or
  PERMISSION_DENIED need a new credential. RESOURCE_EXHAUSTED without that mark is an
  overloaded replica: its trailing ``gemini-retry-after-ms`` (``RETRY_AFTER_KEY``) says how
  long to wait, and the agent waits at least that, with jitter, keeping the report.
  ``retryThrottling`` stops retries when most calls
  fail, so a fleet does not multiply its load on a Booster that is down.
* **Health.** ``round_robin`` over every address the name resolves to (each Booster replica
  behind a headless Service), skipping a replica whose health service says NOT_SERVING (it is
  shutting down), so calls move before its port closes.
* **Keepalive.** A ping after ``KEEPALIVE_TIME_S`` without traffic finds a dead connection
  (a NAT that forgot it) before the next report does. The period respects Booster's
  enforcement (``GrpcLimits.min_ping_interval_s``, 30 s: pinging more often gets the
  connection closed with "too_many_pings").
* **Reconnecting.** After a connection fails, gRPC waits before the next attempt, growing to
  two minutes by default; calls made meanwhile fail at once with UNAVAILABLE. A Booster back
  from an outage would stay unseen that long, its hosts on the safe default. The caller bounds
  the wait (the agent: its own ``retry_max_s``); gRPC's jitter still spreads a fleet's
  reconnects.
"""

from __future__ import annotations

import json
from typing import Any

SERVICE = "gemini.booster.v1.Booster"
RETRY_AFTER_KEY = "gemini-retry-after-ms"  # on an overloaded replica's RESOURCE_EXHAUSTED
RETRY_AFTER_MAX_S = 600.0  # a hint longer than this is read as this: a host never goes silent

MAX_ATTEMPTS = 4  # the call and three retries
INITIAL_BACKOFF_S = 0.5
MAX_BACKOFF_S = 10.0
BACKOFF_MULTIPLIER = 2.0
KEEPALIVE_TIME_S = 60  # ≥ the server's minimum ping interval of 30 s, with margin
KEEPALIVE_TIMEOUT_S = 20
RETRY_MAX_TOKENS = 10  # gRPC's retry throttling: retries stop while tokens < half of this
RETRY_TOKEN_RATIO = 0.1  # each success earns back this much

SERVICE_CONFIG: dict[str, Any] = {
    "loadBalancingConfig": [{"round_robin": {}}],
    "healthCheckConfig": {"serviceName": SERVICE},
    "methodConfig": [
        {
            "name": [
                {"service": SERVICE, "method": "GetParameters"},
                {"service": SERVICE, "method": "ReportAggregates"},
            ],
            "retryPolicy": {
                "maxAttempts": MAX_ATTEMPTS,
                "initialBackoff": f"{INITIAL_BACKOFF_S}s",
                "maxBackoff": f"{MAX_BACKOFF_S}s",
                "backoffMultiplier": BACKOFF_MULTIPLIER,
                "retryableStatusCodes": ["UNAVAILABLE"],
            },
        }
    ],
    "retryThrottling": {"maxTokens": RETRY_MAX_TOKENS, "tokenRatio": RETRY_TOKEN_RATIO},
}


def service_config_json() -> str:
    """The service config as gRPC takes it (also what a DNS TXT record would publish)."""
    return json.dumps(SERVICE_CONFIG, separators=(",", ":"), sort_keys=True)


RECONNECT_INITIAL_S = 1.0  # gRPC's own default
RECONNECT_MAX_S = 60.0  # gRPC's default is 120 s


def channel_options(reconnect_max_s: float = RECONNECT_MAX_S) -> list[tuple[str, str | int]]:
    """Options for ``grpc.insecure_channel`` / ``grpc.secure_channel`` to Booster; a failed
    connection is tried again at most ``reconnect_max_s`` later."""
    reconnect_max_ms = max(1, int(reconnect_max_s * 1000))
    return [
        (
            "grpc.initial_reconnect_backoff_ms",
            min(int(RECONNECT_INITIAL_S * 1000), reconnect_max_ms),
        ),
        ("grpc.max_reconnect_backoff_ms", reconnect_max_ms),
        ("grpc.service_config", service_config_json()),
        ("grpc.enable_retries", 1),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_S * 1000),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_S * 1000),
        ("grpc.keepalive_permit_without_calls", 1),
        # Pings without data are what keepalive is for; gRPC's own default allows only two.
        ("grpc.http2.max_pings_without_data", 0),
    ]


def retry_after_s(trailing: Any) -> float | None:
    """The wait an overloaded replica asked for, in seconds, from a call's trailing metadata
    (None when it gave none or gave nonsense: the caller's own backoff applies then)."""
    for key, value in trailing or ():
        if key == RETRY_AFTER_KEY:
            try:
                ms = float(value)
            except (TypeError, ValueError):
                return None
            return min(ms / 1000.0, RETRY_AFTER_MAX_S) if ms > 0 else None
    return None
