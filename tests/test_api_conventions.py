"""The API conventions a platform team expects, each against the real servers: gRPC health
checking (SERVING while the port serves, NOT_SERVING as it shuts down) and reflection; the
clients' service config (retries of UNAVAILABLE only); the OpenAPI document's security scheme
and error responses; and /docs served from the package, whole, without any other origin."""

from __future__ import annotations

import re
import threading
from concurrent import futures
from urllib.parse import urlsplit

import grpc
import pytest
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from gemini_api import service_config
from gemini_api.v1 import booster_pb2 as pb
from gemini_api.v1 import booster_pb2_grpc as pb_grpc
from gemini_booster.service.auth import TokenAuthority
from gemini_booster.service.grpc_server import SERVICE, AgentServer

from .conftest import AGENT, Running, agent_md
from .test_dashboard import WAIT_S, browser  # noqa: F401 (a fixture)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
HEALTH = "grpc.health.v1.Health"
REFLECTION = "grpc.reflection.v1alpha.ServerReflection"


def test_health_is_serving_for_the_server_and_the_agent_service(booster: Running) -> None:
    stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(booster.grpc_target))
    for name in ("", SERVICE):
        reply = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
        assert reply.status == SERVING, name
    with pytest.raises(grpc.RpcError) as e:
        stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_health_turns_not_serving_when_the_port_shuts_down(booster: Running) -> None:
    server = AgentServer(booster.booster, TokenAuthority(booster.engine), "127.0.0.1:0")
    channel = grpc.insecure_channel(f"127.0.0.1:{server.start()}")
    watch = health_pb2_grpc.HealthStub(channel).Watch(
        health_pb2.HealthCheckRequest(service=SERVICE), timeout=30
    )
    assert next(watch).status == SERVING
    stopping = threading.Thread(target=server.stop, kwargs={"grace": 5})
    stopping.start()
    try:
        assert next(watch).status == NOT_SERVING
    finally:
        stopping.join()
        channel.close()


def test_reflection_lists_and_describes_the_agent_service(booster: Running) -> None:
    db = ProtoReflectionDescriptorDatabase(grpc.insecure_channel(booster.grpc_target))
    assert {SERVICE, HEALTH, REFLECTION} <= set(db.get_services())
    service = DescriptorPool(db).FindServiceByName(SERVICE)
    assert {m.name for m in service.methods} == {"ReportAggregates", "GetParameters"}


class Flaky(pb_grpc.BoosterServicer):
    """Answers GetParameters with ``codes`` in turn, then OK; counts the attempts."""

    def __init__(self, codes: list[grpc.StatusCode]):
        self.codes = codes
        self.attempts = 0

    def GetParameters(self, request, context):
        self.attempts += 1
        if self.codes:
            context.abort(self.codes.pop(0), "as the test asks")
        return pb.GetParametersResponse(refresh_after_seconds=1)


def call_flaky(codes: list[grpc.StatusCode]) -> tuple[Flaky, grpc.StatusCode]:
    flaky = Flaky(codes)
    server = grpc.server(futures.ThreadPoolExecutor(2))
    pb_grpc.add_BoosterServicer_to_server(flaky, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=service_config.channel_options())
    try:
        pb_grpc.BoosterStub(channel).GetParameters(pb.GetParametersRequest(), timeout=30)
        code = grpc.StatusCode.OK
    except grpc.RpcError as e:
        code = e.code()
    finally:
        channel.close()
        server.stop(0)
    return flaky, code


def test_the_service_config_retries_unavailable_with_backoff() -> None:
    flaky, code = call_flaky([grpc.StatusCode.UNAVAILABLE] * 2)
    assert code == grpc.StatusCode.OK
    assert flaky.attempts == 3


def test_the_service_config_retries_nothing_else() -> None:
    flaky, code = call_flaky([grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAVAILABLE])
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert flaky.attempts == 1
    attempts = service_config.MAX_ATTEMPTS
    flaky, code = call_flaky([grpc.StatusCode.UNAVAILABLE] * attempts)
    assert code == grpc.StatusCode.UNAVAILABLE
    assert flaky.attempts == attempts


def test_booster_answers_a_client_with_the_service_config(booster: Running) -> None:
    """The config's health-checked round robin against the real server: it must find the
    agent service SERVING, or every call would fail UNAVAILABLE."""
    channel = grpc.insecure_channel(booster.grpc_target, options=service_config.channel_options())
    stub = pb_grpc.BoosterStub(channel)
    with pytest.raises(grpc.RpcError) as e:  # no such policy: the call got through
        stub.GetParameters(
            pb.GetParametersRequest(host_id="h", policy="none"),
            metadata=agent_md(AGENT),
            timeout=10,
        )
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    channel.close()


# -- REST ------------------------------------------------------------------------------------

ERROR_REF = "#/components/schemas/ErrorOut"
VALIDATION_REF = "#/components/schemas/HTTPValidationError"


def error_schema(op: dict, status: str) -> str:
    return op["responses"][status]["content"]["application/json"]["schema"]["$ref"]


def test_openapi_declares_bearer_auth_and_the_errors_of_every_route(booster: Running) -> None:
    doc = booster.http.get("/openapi.json").json()
    assert doc["components"]["securitySchemes"]["HTTPBearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "a token from POST /v1/tokens, or the bootstrap operator token",
    }
    checked = 0
    for path, ops in doc["paths"].items():
        if not path.startswith("/v1/"):
            continue
        for method, op in ops.items():
            checked += 1
            where = f"{method.upper()} {path}"
            assert op["security"] == [{"HTTPBearer": []}], where
            for status in ("401", "403", "503"):
                assert error_schema(op, status) == ERROR_REF, (where, status)
            if "{name}" in path:
                assert error_schema(op, "404") == ERROR_REF, where
            if "requestBody" in op:
                assert error_schema(op, "413") == ERROR_REF, where
                assert error_schema(op, "422") == VALIDATION_REF, where
    assert checked >= 13
    assert error_schema(doc["paths"]["/v1/policies"]["post"], "409") == ERROR_REF
    assert error_schema(doc["paths"]["/v1/tokens/rotate"]["post"], "404") == ERROR_REF


def same_origin_assets(html: str) -> list[str]:
    urls = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert urls
    for url in urls:
        parts = urlsplit(url)
        assert not parts.scheme and not parts.netloc and url.startswith("/"), url
    return urls


def test_docs_need_no_other_origin(booster: Running) -> None:
    page = booster.http.get("/docs")
    assert page.status_code == 200
    csp = page.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "<script>" not in page.text  # no inline script: the policy would block it
    for url in same_origin_assets(page.text):
        r = booster.http.get(url)
        assert r.status_code == 200, url
        assert len(r.content) > 0
    init = booster.http.get("/docs/init.js").text
    spec_url = re.search(r'url: "([^"]+)"', init)
    assert spec_url is not None and spec_url.group(1).startswith("/")
    view = booster.http.get(spec_url.group(1)).json()
    assert view["openapi"] == "3.0.3"
    assert "anyOf" not in str(view["components"]["schemas"]["TokenOut"])
    assert booster.http.get("/openapi.json").json()["openapi"].startswith("3.1")
    assert booster.http.get("/redoc").status_code == 404  # not served: no pinned ReDoc


def test_swagger_ui_renders_every_operation_offline(booster: Running, browser) -> None:  # noqa: F811
    """In a browser, under the page's own CSP: Swagger UI draws every path of the API."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    doc = booster.http.get("/openapi.json").json()
    # Swagger UI leaves out deprecated operations (/healthz).
    paths = {
        p for p, ops in doc["paths"].items() if not all(o.get("deprecated") for o in ops.values())
    }
    browser.get(str(booster.http.base_url).rstrip("/") + "/docs")

    def drawn(d) -> set[str]:
        found = d.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")
        return {e.get_attribute("data-path") for e in found}

    WebDriverWait(browser, WAIT_S).until(lambda d: drawn(d) == paths)
    title = browser.find_element(By.CSS_SELECTOR, ".info .title").text
    assert title.startswith("Gemini Booster")
