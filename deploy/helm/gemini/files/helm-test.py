"""`helm test`: Booster answers from inside the cluster.

Run by the test Pod (templates/tests/booster-test.yaml) with the Booster image's Python. Checks,
each until a deadline: GET /readyz through the REST Service is 200, and gRPC health checking
(grpc.health.v1) through the agents' Service says SERVING for the agent service, over TLS
when the agent port speaks it. Exits non-zero naming what failed.
"""

from __future__ import annotations

import os
import sys
import time
import urllib.request
from collections.abc import Callable

DEADLINE_S = float(os.environ.get("GEMINI_TEST_DEADLINE_S", "120"))


def until_deadline(what: str, check: Callable[[], str]) -> bool:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        try:
            print(f"ok: {what}: {check()}", flush=True)
            return True
        except Exception as exc:  # any failure is retried until the deadline
            if time.monotonic() >= deadline:
                print(f"FAILED: {what}: {exc!r}", file=sys.stderr, flush=True)
                return False
            time.sleep(2)


def readyz() -> str:
    url = os.environ["GEMINI_TEST_READYZ_URL"]
    with urllib.request.urlopen(url, timeout=10) as response:
        return f"{url} {response.status}"


def grpc_health() -> str:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    target = os.environ["GEMINI_TEST_GRPC_TARGET"]
    ca_file = os.environ.get("GEMINI_TEST_GRPC_CA_FILE", "")
    cert_file = os.environ.get("GEMINI_TEST_GRPC_CERT_FILE", "")
    if ca_file:
        with open(ca_file, "rb") as f:
            ca = f.read()
        key = cert = None
        if cert_file:  # mutual TLS: a client certificate the hosts' CA signed
            with open(cert_file, "rb") as f:
                cert = f.read()
            with open(os.environ["GEMINI_TEST_GRPC_KEY_FILE"], "rb") as f:
                key = f.read()
        channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(ca, key, cert))
    else:
        channel = grpc.insecure_channel(target)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service="gemini.booster.v1.Booster")
        reply = stub.Check(request, timeout=10)
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    if status != "SERVING":
        raise RuntimeError(f"{target} is {status}")
    return f"{target} SERVING"


def main() -> int:
    ok = until_deadline("REST /readyz", readyz)
    if os.environ.get("GEMINI_TEST_GRPC_TARGET"):
        ok = until_deadline("gRPC health", grpc_health) and ok
    else:
        print(f"skipped: gRPC health ({os.environ.get('GEMINI_TEST_GRPC_SKIPPED', '')})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
