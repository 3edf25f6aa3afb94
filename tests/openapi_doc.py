"""Checks on the Booster's published OpenAPI document shared by the REST test modules."""

from __future__ import annotations


def assert_refusals_documented(doc: dict, path: str, method: str, statuses: set[str]) -> None:
    """``method path`` documents exactly ``statuses``; each refusal with its body's schema
    (FastAPI's HTTPValidationError for 422, the Booster's ErrorOut for any other)."""
    responses = doc["paths"][path][method]["responses"]
    assert set(responses) == statuses
    for status, documented in responses.items():
        if status.startswith("2"):
            continue
        schema = documented["content"]["application/json"]["schema"]["$ref"]
        expected = "HTTPValidationError" if status == "422" else "ErrorOut"
        assert schema == f"#/components/schemas/{expected}", (status, schema)
