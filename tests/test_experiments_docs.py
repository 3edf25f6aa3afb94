"""docs/api-experiments.md's request bodies work when pasted: each ``**`METHOD /path`**``
followed by a JSON block is sent verbatim, in the page's order, to a real Booster (embedded
PostgreSQL) with an operator token, and must be accepted; the experiments it declares are then
as the page says (scheduled, with the arms and days it names)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from .conftest import OPERATOR, auth

PAGE = Path(__file__).resolve().parents[1] / "docs" / "api-experiments.md"
REQUEST = re.compile(r"^\*\*`(POST|PATCH) (/v1/\S+)`\*\*\n```json\n(.*?)\n```$", re.M | re.S)


def requests() -> list[tuple[str, str, dict]]:
    return [(m, path, json.loads(body)) for m, path, body in REQUEST.findall(PAGE.read_text())]


def test_the_page_has_its_examples() -> None:
    found = requests()
    assert [p for _, p, _ in found].count("/v1/experiments") == 2
    assert any(p.endswith("/stop") for _, p, _ in found)


def test_every_example_body_works_when_pasted(booster) -> None:
    for method, path, body in requests():
        r = booster.http.request(method, path, json=body, headers=auth(OPERATOR))
        assert r.status_code in (200, 201), (path, r.text)
    experiments = {
        e["name"]: e for e in booster.http.get("/v1/experiments", headers=auth(OPERATOR)).json()
    }
    assert experiments["fusion-vs-cubic"]["status"] == "stopped"
    rehearsal = experiments["rehearsal"]
    assert rehearsal["status"] == "scheduled" and rehearsal["day_seconds"] == 120
    assert rehearsal["crossover_at"] == "2030-04-01T08:06:00Z"  # day 3 of days of 120 s
    hosts = booster.http.get("/v1/experiments/fusion-vs-cubic", headers=auth(OPERATOR)).json()
    assert hosts["hosts"] == 6  # six declared, one joined, one left
