"""Limits of the operator REST API, against a real Booster: bodies above the limit are refused
before they are read (by Content-Length, or counted as a chunked body streams), a body is not
read before its sender is authenticated, every 422 has the documented schema, policy settings
have ranges, and the probes tell liveness from readiness."""

from __future__ import annotations

import socket
from typing import Any

import pytest
import uvicorn

from gemini_booster.service.auth import TokenAuthority
from gemini_booster.service.rest import create_app, uvicorn_limits

from .conftest import OPERATOR, auth

MB = 1_000_000
CHUNK = 64 * 1024


def limit(svc) -> int:
    return svc.server.settings.max_request_body_bytes


def head(
    svc, path: str, headers: dict[str, str], method: str = "POST", length: int | None = None
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"host: 127.0.0.1:{svc.server.http_port}"]
    lines += ["content-type: application/json"]
    lines += [f"content-length: {length}"] if length is not None else ["transfer-encoding: chunked"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The response on ``sock``, read until the server closes the connection."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass  # the server closed with our unread body in its buffer: what came before counts
    status_line, _, rest = data.partition(b"\r\n")
    raw_headers, _, body = rest.partition(b"\r\n\r\n")
    headers = {}
    for line in raw_headers.decode().split("\r\n"):
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, body


JSON = {"content-type": "application/json"}


def send_part(svc, request_head: bytes, part: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """Send the head and ``part`` of a body, never the rest, and read the answer: it can only
    come if the server answered without waiting for the body."""
    with socket.create_connection(("127.0.0.1", svc.server.http_port), timeout=10) as sock:
        sock.sendall(request_head + part)
        return answer(sock)


def test_100_mb_without_a_token_is_refused_unread(booster):
    status, headers, body = send_part(
        booster, head(booster, "/v1/policies", {}, length=100 * MB), b"x" * 1024
    )
    assert status in (401, 413), body
    assert headers["connection"] == "close"


def test_a_body_is_not_read_before_its_sender_is_authenticated(booster):
    """A body the size limit allows, without a token or with a forged or read-only one: the
    refusal comes after the headers alone, with the route's own status and message."""
    viewer = booster.http.post(
        "/v1/tokens", json={"name": "ro", "role": "viewer"}, headers=auth(OPERATOR)
    ).json()["token"]
    cases = [
        ({}, 401, "missing credential"),
        (auth("forged"), 401, "unknown or revoked token"),
        (auth(viewer), 403, "token 'ro' (role viewer) may not write"),
    ]
    for headers, expected, message in cases:
        request = head(booster, "/v1/policies", headers, length=limit(booster))
        status, got, body = send_part(booster, request, b'{"name": ')
        assert status == expected, body
        assert message in body.decode()
        assert got["www-authenticate"] == "Bearer"
    failures = booster.booster.metrics.auth_failures
    assert failures.labels("rest", "missing")._value.get() == 1
    assert failures.labels("rest", "forbidden")._value.get() == 1


def test_oversize_body_with_an_operator_token_is_413(booster):
    request = head(booster, "/v1/policies", auth(OPERATOR), length=limit(booster) + 1)
    status, headers, body = send_part(booster, request)
    assert status == 413 and headers["connection"] == "close"
    assert body.decode() == f'{{"detail": "request body above {limit(booster)} bytes"}}'


def test_a_body_of_exactly_the_limit_is_read_and_validated(booster):
    padding = limit(booster) - len(b'{"name": ""}')
    body = b'{"name": "' + b"a" * padding + b'"}'
    assert len(body) == limit(booster)
    r = booster.http.post("/v1/policies", content=body, headers=auth(OPERATOR) | JSON)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "name"]


def test_chunked_oversize_body_is_cut_off_at_the_limit(booster):
    """No Content-Length to check up front: the body is counted as it streams and refused as
    soon as it passes the limit, before its end (never sent here)."""
    with socket.create_connection(("127.0.0.1", booster.server.http_port), timeout=10) as sock:
        sock.sendall(head(booster, "/v1/policies", auth(OPERATOR)))
        sent = 0
        while sent <= limit(booster):
            size = min(CHUNK, limit(booster) + 1 - sent)
            sock.sendall(f"{size:x}\r\n".encode() + b"x" * size + b"\r\n")
            sent += size
        status, headers, body = answer(sock)
    assert status == 413 and headers["connection"] == "close", body


def test_chunked_body_within_the_limit_reaches_the_route(booster):
    parts = iter([b'{"name": ', b'"chunky", ', b'"sigma": 2}'])
    r = booster.http.post("/v1/policies", content=parts, headers=auth(OPERATOR) | JSON)
    assert r.status_code == 201, r.text
    assert r.request.headers["transfer-encoding"] == "chunked"
    assert booster.booster.policies["chunky"].sigma == 2


def conforms(value: Any, schema: dict[str, Any], spec: dict[str, Any]) -> bool:
    """``value`` against the part of JSON Schema the OpenAPI document uses for errors."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return conforms(value, spec["components"]["schemas"][name], spec)
    if "anyOf" in schema:
        return any(conforms(value, s, spec) for s in schema["anyOf"])
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties", {})
        return (
            isinstance(value, dict)
            and all(k in value for k in schema.get("required", []))
            and all(conforms(value[k], s, spec) for k, s in props.items() if k in value)
        )
    if kind == "array":
        items = schema.get("items", {})
        return isinstance(value, list) and all(conforms(v, items, spec) for v in value)
    checks = {"string": str, "integer": int, "number": (int, float), "boolean": bool}
    return kind is None or isinstance(value, checks[kind])


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"region": "custom"}, "bounds"),  # checked on the merged policy, after FastAPI's own
        ({"history_hours": 1e308}, "history_hours"),  # FastAPI's own validation
    ],
)
def test_patch_422_has_the_documented_schema(booster, change, field):
    assert booster.http.post(
        "/v1/policies", json={"name": "cdn"}, headers=auth(OPERATOR)
    ).is_success
    r = booster.http.patch("/v1/policies/cdn", json=change, headers=auth(OPERATOR))
    assert r.status_code == 422 and field in r.text
    spec = booster.http.get("/openapi.json").json()
    documented = spec["paths"]["/v1/policies/{name}"]["patch"]["responses"]["422"]
    schema = documented["content"]["application/json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/HTTPValidationError"}
    assert conforms(r.json(), schema, spec), r.json()
    assert all(e["loc"][0] == "body" for e in r.json()["detail"])
    assert not conforms({"detail": "a string"}, schema, spec)  # the check can fail


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("history_hours", 1e308),  # made every refit fail (no timedelta that long)
        ("history_hours", 0.5),
        ("min_flows", 2**31),  # above the int32 column: was a 500
        ("min_flows", 10**7),
        ("max_contexts", 100_001),
        ("n_initial_points", 2**31),
    ],
)
def test_policy_settings_out_of_range_are_422_naming_the_field(booster, field, value):
    r = booster.http.post(
        "/v1/policies", json={"name": "cdn", field: value}, headers=auth(OPERATOR)
    )
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", field], r.text
    created = booster.http.post("/v1/policies", json={"name": "cdn"}, headers=auth(OPERATOR))
    assert created.status_code == 201
    r = booster.http.patch("/v1/policies/cdn", json={field: value}, headers=auth(OPERATOR))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", field], r.text
    assert booster.http.get("/v1/policies/cdn", headers=auth(OPERATOR)).json()["revision"] == 1


def test_non_finite_numbers_are_a_422_not_a_500(booster):
    """Python's JSON parser takes NaN and Infinity; they are refused, and echoed as strings."""
    for literal in ("NaN", "Infinity", "-Infinity"):
        body = f'{{"name": "cdn", "sigma": {literal}}}'
        r = booster.http.post(
            "/v1/policies",
            content=body,
            headers=auth(OPERATOR) | JSON,
        )
        assert r.status_code == 422, r.text
        [problem] = r.json()["detail"]
        assert problem["loc"] == ["body", "sigma"] and isinstance(problem["input"], str)


def test_livez_and_readyz(booster):
    assert booster.http.get("/livez").json() == {"status": "alive"}
    assert booster.http.get("/readyz").json() == {"status": "ready", "policies": 0}
    assert booster.http.get("/healthz").status_code == 200


def test_not_ready_is_503_with_the_reason_while_still_alive(booster, monkeypatch):
    reason = "database unreachable; serving the last plans loaded"
    monkeypatch.setattr(booster.booster, "ready", lambda: reason, raising=False)
    for probe in ("/readyz", "/healthz"):
        r = booster.http.get(probe)
        assert (r.status_code, r.json()) == (503, {"detail": reason})
    assert booster.http.get("/livez").status_code == 200


def test_a_failing_readiness_check_does_not_leak_its_message(booster, monkeypatch):
    def broken() -> str | None:
        raise RuntimeError("password authentication failed for user 'booster' at db.internal")

    monkeypatch.setattr(booster.booster, "ready", broken, raising=False)
    r = booster.http.get("/readyz")
    assert (r.status_code, r.json()) == (503, {"detail": "readiness check failed"})


def test_uvicorn_limits_are_accepted_by_uvicorn(booster):
    settings = booster.server.settings
    app = create_app(booster.booster, TokenAuthority(booster.engine), settings)
    config = uvicorn.Config(app, **uvicorn_limits(settings))
    assert config.limit_concurrency and config.timeout_keep_alive
    assert config.h11_max_incomplete_event_size and config.http == "h11"
