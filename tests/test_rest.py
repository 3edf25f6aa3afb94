"""The operator REST API: roles, strict validation naming the field, audit, and /metrics."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gemini_booster import simulation as sim
from gemini_booster.fleet import SyntheticFleet

from .conftest import AGENT, OPERATOR, auth
from .openapi_doc import assert_refusals_documented


def create(http, token=OPERATOR, **body):
    return http.post("/v1/policies", json={"name": "cdn", **body}, headers=auth(token))


def test_operator_creates_and_updates_a_policy(booster):
    r = create(booster.http, sigma=0.1, exploration_share=0.25)
    assert r.status_code == 201, r.text
    assert r.json()["sigma"] == 0.1 and r.json()["revision"] == 1
    r = booster.http.patch("/v1/policies/cdn", json={"sigma": 10}, headers=auth(OPERATOR))
    assert r.status_code == 200 and r.json()["sigma"] == 10 and r.json()["revision"] == 2
    assert booster.booster.policies["cdn"].sigma == 10  # the service sees it at once
    audit = booster.http.get("/v1/audit", headers=auth(OPERATOR)).json()
    assert [a["action"] for a in audit[:2]] == ["policy.update", "policy.create"]
    assert audit[0]["actor"] == "bootstrap-operator"


def test_agent_token_cannot_change_policies(booster):
    assert create(booster.http, token=AGENT).status_code == 403
    create(booster.http)
    r = booster.http.patch("/v1/policies/cdn", json={"sigma": 5}, headers=auth(AGENT))
    assert r.status_code == 403
    assert booster.http.get("/v1/policies/cdn", headers=auth(OPERATOR)).json()["sigma"] == 1.0


@pytest.mark.parametrize("headers", [{}, auth("forged"), {"authorization": "Token x"}])
def test_missing_or_forged_credentials_get_401(booster, headers):
    assert booster.http.post("/v1/policies", json={"name": "x"}, headers=headers).status_code == 401
    assert booster.http.get("/v1/policies", headers=headers).status_code == 401


def test_viewer_reads_but_cannot_write(booster):
    token = booster.http.post(
        "/v1/tokens", json={"name": "ro", "role": "viewer"}, headers=auth(OPERATOR)
    ).json()["token"]
    assert booster.http.get("/v1/policies", headers=auth(token)).status_code == 200
    assert create(booster.http, token=token).status_code == 403


def test_revoked_token_stops_working(booster):
    token = booster.http.post(
        "/v1/tokens", json={"name": "tmp", "role": "operator"}, headers=auth(OPERATOR)
    ).json()["token"]
    assert booster.http.get("/v1/policies", headers=auth(token)).status_code == 200
    assert booster.http.delete("/v1/tokens/tmp", headers=auth(OPERATOR)).status_code == 204
    assert booster.http.get("/v1/policies", headers=auth(token)).status_code == 401


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"sigma": -1}, "sigma"),
        ({"colour": "blue"}, "colour"),
        ({"exploration_share": 2}, "exploration_share"),
        ({"region": "custom"}, "bounds"),
        ({"mode": "psychic"}, "mode"),
    ],
)
def test_bad_policy_is_a_422_naming_the_field(booster, body, field):
    r = create(booster.http, **body)
    assert r.status_code == 422
    assert field in r.text
    assert booster.http.get("/v1/policies", headers=auth(OPERATOR)).json() == []


def test_custom_bounds_must_lie_inside_theta_prime(booster):
    from gemini_api.theta import load_spec

    bounds = load_spec().region_bounds("wide") | {"mult_decrease": [10, 100]}
    r = create(booster.http, region="custom", bounds=bounds)
    assert r.status_code == 422 and "mult_decrease" in r.text
    ok = load_spec().region_bounds("production") | {"loss_threshold": [0, 50]}
    assert create(booster.http, region="custom", bounds=ok).status_code == 201


def test_bad_patch_keeps_the_old_policy(booster):
    create(booster.http)
    r = booster.http.patch("/v1/policies/cdn", json={"region": "custom"}, headers=auth(OPERATOR))
    assert r.status_code == 422 and "bounds" in r.text
    [problem] = r.json()["detail"]  # as FastAPI's own 422, with what was sent and why
    assert problem["loc"] == ["body"] and problem["input"] == {"region": "custom"}
    assert problem["ctx"] == {"error": "bounds: required when region is 'custom'"}
    assert booster.http.get("/v1/policies/cdn", headers=auth(OPERATOR)).json()["revision"] == 1


def test_openapi_docs_are_served(booster):
    spec = booster.http.get("/openapi.json").json()
    assert "/v1/policies" in spec["paths"]
    assert booster.http.get("/docs").status_code == 200


def test_metrics_parse_and_carry_the_service_metrics(booster):
    create(booster.http)
    booster.booster.reload_policies()
    fleet = SyntheticFleet(booster.grpc_target, AGENT, "cdn", hosts_per_context=2)
    fleet.run_round(0)
    fleet.run_round(1)
    booster.booster.refit(booster.booster.policies["cdn"])
    fleet.close()
    booster.http.post("/v1/policies", json={"name": "bad", "sigma": -1}, headers=auth(OPERATOR))
    booster.http.get("/v1/policies", headers=auth("forged"))
    body = booster.http.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(body)}
    for name in (
        "gemini_booster_reports",
        "gemini_booster_grpc_request_seconds",
        "gemini_booster_http_request_seconds",
        "gemini_booster_refit_seconds",
        "gemini_booster_incumbent_utility",
        "gemini_booster_build_info",
        "gemini_booster_auth_failures",
    ):
        assert name in families, name
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in families.values()
        for s in f.samples
    }
    assert samples[("gemini_booster_reports_total", (("outcome", "accepted"), ("reason", "")))] == 4
    contexts = {s.labels["context"] for s in families["gemini_booster_incumbent_utility"].samples}
    assert len(contexts) == len(sim.DEFAULT_CONTEXTS)
    assert any(
        s.labels.get("route") == "/v1/policies" and s.labels.get("status") == "422"
        for s in families["gemini_booster_http_request_seconds"].samples
    )


def test_trials_recompute_utility_for_another_sigma(booster):
    create(booster.http)
    booster.booster.reload_policies()
    fleet = SyntheticFleet(booster.grpc_target, AGENT, "cdn", hosts_per_context=1)
    fleet.run_round(0)
    fleet.close()
    at1 = booster.http.get("/v1/policies/cdn/trials", headers=auth(OPERATOR)).json()
    at10 = booster.http.get("/v1/policies/cdn/trials?sigma=10", headers=auth(OPERATOR)).json()
    by_ctx = {t["context"]["dst_isp"]: t for t in at10}
    for t in at1:
        other = by_ctx[t["context"]["dst_isp"]]
        expected = t["mean_throughput_mbps"] - 10 * t["mean_queue_delay_ms"]
        assert other["utility"] == pytest.approx(expected)


def test_unknown_policy_is_404_only_for_an_authenticated_reader(booster):
    assert booster.http.get("/v1/policies/nope").status_code == 401  # nothing learnt
    r = booster.http.get("/v1/policies/nope", headers=auth(OPERATOR))
    assert (r.status_code, r.json()) == (404, {"detail": "policy 'nope' not found"})
    r = booster.http.patch("/v1/policies/nope", json={"sigma": 2}, headers=auth(OPERATOR))
    assert r.status_code == 404
    assert booster.http.post("/v1/policies/nope/refit", headers=auth(OPERATOR)).status_code == 404


def test_refit_owned_by_another_replica_is_409_naming_it(booster, monkeypatch):
    from gemini_booster.service.core import RefitElsewhere

    create(booster.http)
    owned = "refits of policy 'cdn' are owned by replica-b:4242"

    def elsewhere(policy):
        raise RefitElsewhere(owned)

    monkeypatch.setattr(booster.booster, "refit", elsewhere)
    r = booster.http.post("/v1/policies/cdn/refit", headers=auth(OPERATOR))
    assert (r.status_code, r.json()) == (409, {"detail": owned})


def test_database_outage_is_503_without_the_driver_message(booster, monkeypatch):
    from sqlalchemy.exc import OperationalError

    from gemini_booster.storage import audit as audit_store

    def down(*args, **kwargs):
        raise OperationalError("SELECT", {}, Exception("password authentication failed: db.lan"))

    monkeypatch.setattr(audit_store, "audit_entries", down)
    r = booster.http.get("/v1/audit", headers=auth(OPERATOR))
    assert (r.status_code, r.json()) == (503, {"detail": "database unavailable; try again later"})


@pytest.mark.parametrize(
    ("method", "path", "statuses"),
    [
        ("get", "/v1/policies", {"200", "401", "403", "503"}),
        ("post", "/v1/policies", {"201", "401", "403", "503", "409", "413", "422"}),
        ("get", "/v1/policies/{name}", {"200", "401", "403", "503", "404", "422"}),
        ("patch", "/v1/policies/{name}", {"200", "401", "403", "503", "404", "413", "422"}),
        ("post", "/v1/policies/{name}/refit", {"200", "401", "403", "503", "404", "409", "422"}),
        ("get", "/v1/policies/{name}/comparison", {"200", "401", "403", "503", "404", "422"}),
        ("post", "/v1/tokens", {"201", "401", "403", "503", "409", "413", "422"}),
        ("delete", "/v1/tokens/{name}", {"204", "401", "403", "503", "404", "422"}),
        ("post", "/v1/tokens/rotate", {"201", "401", "403", "404", "409", "413", "422", "503"}),
        ("get", "/readyz", {"200", "503"}),
        ("get", "/livez", {"200"}),
    ],
)
def test_openapi_documents_each_refusal_with_its_schema(booster, method, path, statuses):
    spec = booster.http.get("/openapi.json").json()
    assert_refusals_documented(spec, path, method, statuses)
    assert spec["components"]["schemas"]["ErrorOut"]["required"] == ["detail"]
    if path.startswith("/v1"):
        assert spec["paths"][path][method]["security"] == [{"HTTPBearer": []}]
