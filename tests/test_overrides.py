"""The operator's controls over θ (issue #35, item 1): pin, freeze, roll back, kill switch.

Two Booster replicas share one real PostgreSQL: an override set through one replica's REST
API is what the *other* replica answers at the next GetParameters, refits do not undo it,
every change is audited with the old and new θ, and removing it restores normal planning.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from urllib.parse import quote, unquote

import grpc
import pytest

from gemini_api.theta import load_spec
from gemini_api.v1 import booster_pb2 as pb
from gemini_api.v1 import booster_pb2_grpc as pb_grpc
from gemini_booster import simulation as sim
from gemini_booster.domain import ContextKey
from gemini_booster.fleet import SyntheticFleet
from gemini_booster.service.refit import RefitElsewhere
from gemini_booster.storage import credentials as token_store

from .conftest import AGENT, OPERATOR, Running, agent_md, auth, serve
from .polling import until
from .test_dashboard import Page, base_url, browser  # noqa: F401 (a fixture)

POLICY = "cdn"
SPEC = load_spec()
SAT = ContextKey(*sim.SATELLITE.key).label
ETH = ContextKey(*sim.ETHERNET.key).label
HOSTS = [f"host-{i}" for i in range(12)]


@pytest.fixture
def pair(db_url: str) -> Iterator[tuple[Running, Running]]:
    with serve(db_url, replica_name="replica-a") as a, serve(db_url, replica_name="replica-b") as b:
        yield a, b


def refit(*replicas: Running) -> None:
    """Refit the policy on whichever replica owns it."""
    for r in replicas:
        try:
            r.booster.refit(r.booster.policies[POLICY])
            return
        except RefitElsewhere:
            continue
    raise AssertionError("no replica could refit")


def planned(a: Running, b: Running) -> None:
    """The policy, data for both synthetic contexts, and a published plan on both replicas."""
    r = a.http.post(
        "/v1/policies", headers=auth(OPERATOR), json={"name": POLICY, "exploration_share": 0.5}
    )
    assert r.status_code == 201, r.text
    until(lambda: POLICY in a.booster.policies and POLICY in b.booster.policies, "policy")
    fleet = SyntheticFleet(a.grpc_target, AGENT, POLICY, hosts_per_context=2)
    try:
        fleet.run_round(0)
        fleet.run_round(1)
    finally:
        fleet.close()
    refit(a, b)
    for r in (a, b):
        until(lambda r=r: len(r.booster.plan_snapshot(r.booster.policies[POLICY].id)) == 2, "plan")


def ask(r: Running, host: str) -> pb.GetParametersResponse:
    stub = pb_grpc.BoosterStub(grpc.insecure_channel(r.grpc_target))
    req = pb.GetParametersRequest(
        policy=POLICY, host_id=host, contexts=[c.message() for c in sim.DEFAULT_CONTEXTS]
    )
    return stub.GetParameters(req, metadata=agent_md(), timeout=30)


def served(r: Running, host: str) -> dict[str, tuple[dict[str, int], bool]]:
    """context label → (θ, exploratory) as ``host`` is answered by replica ``r``."""
    out = {}
    for p in ask(r, host).parameters:
        key = ContextKey(
            p.context.src_region,
            p.context.src_isp,
            p.context.dst_region,
            p.context.dst_isp,
            p.context.hour,
        )
        out[key.label] = (SPEC.from_message(p.theta), p.exploratory)
    return out


def everywhere(r: Running, label: str, theta: dict[str, int]) -> bool:
    """Every host is answered ``theta`` in context ``label``, none of them exploring."""
    return all(served(r, h)[label] == (theta, False) for h in HOSTS)


def a_theta() -> dict[str, int]:
    """A θ inside Θ' that no refit would pick by chance: the middle of Θ'."""
    return {p.name: (p.wide[0] + p.wide[1]) // 2 for p in SPEC.params}


def incumbent(r: Running, label: str) -> dict[str, int]:
    pid = r.booster.policies[POLICY].id
    plans = {ContextKey(*k).label: p for k, p in r.booster.plan_snapshot(pid).items()}
    return SPEC.from_key(plans[label].incumbent_key)


def audit(r: Running, action: str) -> list[dict]:
    entries = r.http.get("/v1/audit", headers=auth(OPERATOR)).json()
    return [e for e in entries if e["action"] == action]


def test_pin_reaches_the_other_replica_survives_refits_and_unpin_restores(pair) -> None:
    a, b = pair
    planned(a, b)
    theta = a_theta()
    before = incumbent(b, SAT)
    r = a.http.post(
        f"/v1/policies/{POLICY}/pin",
        headers=auth(OPERATOR),
        json={"context": SAT, "theta": theta, "reason": "test"},
    )
    assert r.status_code == 200, r.text
    until(lambda: everywhere(b, SAT, theta), "pinned θ on replica b")
    assert everywhere(a, SAT, theta)
    # The other context keeps its plan (its incumbent for the exploiting hosts).
    assert any(served(b, h)[ETH] == (incumbent(b, ETH), False) for h in HOSTS)

    # New data and refits (on whichever replica owns them) do not undo the pin.
    fleet = SyntheticFleet(b.grpc_target, AGENT, POLICY, hosts_per_context=2)
    try:
        fleet.run_round(2)
    finally:
        fleet.close()
    a.booster.mark_dirty({a.booster.policies[POLICY].id})
    b.booster.mark_dirty({b.booster.policies[POLICY].id})
    a.booster.refit_dirty()
    b.booster.refit_dirty()
    refit(a, b)
    assert everywhere(a, SAT, theta) and everywhere(b, SAT, theta)

    entry = audit(a, "override.pin")[0]
    assert entry["actor"] == "bootstrap-operator" and entry["target"] == POLICY
    change = entry["detail"]["changes"][0]
    assert change == {"context": SAT, "old": before, "new": theta}
    listed = a.http.get(f"/v1/policies/{POLICY}/overrides", headers=auth(OPERATOR)).json()
    assert [(o["context"], o["kind"], o["theta"]) for o in listed["overrides"]] == [
        (SAT, "pin", theta)
    ]

    r = b.http.delete(f"/v1/policies/{POLICY}/pin", headers=auth(OPERATOR), params={"context": SAT})
    assert r.status_code == 200 and r.json()["changed"] == 1, r.text
    until(
        lambda: (
            any(served(a, h)[SAT] == (incumbent(a, SAT), False) for h in HOSTS)
            and not everywhere(a, SAT, theta)
        ),
        "normal planning again on replica a",
    )
    unpinned = audit(b, "override.unpin")[0]["detail"]["changes"][0]
    assert unpinned["old"] == theta and unpinned["new"] is None


def test_kill_switch_sends_every_context_to_the_safe_default(pair) -> None:
    a, b = pair
    planned(a, b)
    safe = SPEC.default()
    r = a.http.put(f"/v1/policies/{POLICY}/kill-switch", headers=auth(OPERATOR), json={})
    assert r.status_code == 200, r.text

    def all_safe(r: Running) -> bool:
        for h in HOSTS:
            resp = ask(r, h)
            if SPEC.from_message(resp.default_theta) != safe:
                return False
            if any(SPEC.from_message(p.theta) != safe or p.exploratory for p in resp.parameters):
                return False
        return True

    until(lambda: all_safe(b), "safe default on replica b")
    a.booster.mark_dirty({a.booster.policies[POLICY].id})
    b.booster.mark_dirty({b.booster.policies[POLICY].id})
    refit(a, b)
    assert all_safe(a) and all_safe(b)
    entry = audit(a, "override.kill")[0]
    assert entry["detail"]["changes"][0]["new"] == {"safe_default": safe}
    listed = b.http.get(f"/v1/policies/{POLICY}/overrides", headers=auth(OPERATOR)).json()
    assert listed["kill_switch"] is True

    r = b.http.delete(f"/v1/policies/{POLICY}/kill-switch", headers=auth(OPERATOR))
    assert r.status_code == 200 and r.json()["changed"] == 1, r.text
    until(lambda: any(served(a, h)[SAT][1] for h in HOSTS), "exploration again on replica a")


def test_freeze_and_rollback(pair) -> None:
    a, b = pair
    planned(a, b)
    now_sat, now_eth = incumbent(a, SAT), incumbent(a, ETH)
    r = a.http.post(f"/v1/policies/{POLICY}/freeze", headers=auth(OPERATOR), json={})
    assert r.status_code == 200 and r.json()["changed"] == 2, r.text
    until(lambda: everywhere(b, SAT, now_sat) and everywhere(b, ETH, now_eth), "frozen on b")
    assert audit(a, "override.freeze")

    # Back to before any plan: the default θ each context was served then.
    first = a.http.get("/v1/audit", headers=auth(OPERATOR)).json()[-1]["at"]
    r = a.http.post(f"/v1/policies/{POLICY}/rollback", headers=auth(OPERATOR), json={"at": first})
    assert r.status_code == 200, r.text
    default = SPEC.default()
    until(lambda: everywhere(b, SAT, default), "rolled back on b")
    # To the first refit's generation: its incumbents again.
    r = a.http.post(
        f"/v1/policies/{POLICY}/rollback",
        headers=auth(OPERATOR),
        json={"plan_generation": 1, "context": ETH},
    )
    assert r.status_code == 200, r.text
    until(lambda: everywhere(b, ETH, now_eth), "ETH at generation 1 on b")
    change = audit(a, "override.rollback")[0]["detail"]
    assert change["plan_generation"] == 1 and change["changes"][0]["new"] == now_eth

    r = a.http.delete(f"/v1/policies/{POLICY}/pin", headers=auth(OPERATOR))
    assert r.status_code == 200 and r.json()["changed"] == 2, r.text


def test_dashboard_freezes_and_rolls_back_seen_by_the_other_replica(db_url: str, browser) -> None:  # noqa: F811
    """In headless Chromium: the operator freezes the policy at its incumbents, then rolls it
    back to a time before any plan, from replica a's dashboard; replica b answers each at the
    next GetParameters, and both are audited."""
    with (
        serve(db_url, replica_name="replica-a") as a,
        serve(db_url, replica_name="replica-b") as b,
    ):
        planned(a, b)
        now_sat, now_eth = incumbent(a, SAT), incumbent(a, ETH)
        page = Page(browser, base_url(a))
        page.sign_in(OPERATOR)
        page.status_contains("Signed in.")
        page.wait.until(lambda _: len(page.rows("plans")) == 2)
        page.el("freeze").click()  # the scope selector's default: the whole policy
        page.status_contains("Frozen")
        until(lambda: everywhere(b, SAT, now_sat) and everywhere(b, ETH, now_eth), "frozen on b")

        # The policy's creation, to the next whole second (the field's precision), is before
        # the first refit (planned() runs two fleet rounds first): the default θ was served.
        created = datetime.fromisoformat(audit(a, "policy.create")[0]["at"])
        back_to = (created.replace(microsecond=0) + timedelta(seconds=1)).astimezone(UTC)
        field = page.el("rollback-at")
        browser.execute_script(
            "arguments[0].value = arguments[1]", field, back_to.strftime("%Y-%m-%dT%H:%M:%S")
        )
        page.el("rollback").click()
        page.status_contains("Rolled back")
        default = SPEC.default()
        until(lambda: everywhere(b, SAT, default) and everywhere(b, ETH, default), "back on b")
        assert audit(a, "override.rollback")


@pytest.fixture
def one(db_url: str) -> Iterator[Running]:
    with serve(db_url) as r:
        r.http.post("/v1/policies", headers=auth(OPERATOR), json={"name": POLICY})
        r.booster.reload_policies()
        yield r


@pytest.mark.parametrize("role", ["viewer", "agent"])
def test_only_operators_may_override(one: Running, role: str) -> None:
    token = token_store.create_token(one.engine, f"t-{role}", role, "test")
    one.booster.tokens_changed()
    for method, path, body in (
        ("post", "pin", {"theta": a_theta()}),
        ("post", "freeze", {}),
        ("post", "rollback", {"plan_generation": 1}),
        ("put", "kill-switch", {}),
    ):
        r = one.http.request(
            method, f"/v1/policies/{POLICY}/{path}", headers=auth(token), json=body
        )
        assert r.status_code in (401, 403) if role == "agent" else r.status_code == 403, r.text
    for path in ("pin", "kill-switch"):
        r = one.http.delete(f"/v1/policies/{POLICY}/{path}", headers=auth(token))
        assert r.status_code == 403, r.text
    assert not audit(one, "override.pin") and not audit(one, "override.kill")


def test_theta_outside_theta_prime_is_422_naming_the_parameter(one: Running) -> None:
    p = SPEC.params[1]
    theta = {**a_theta(), p.name: p.wide[1] + 1}
    r = one.http.post(f"/v1/policies/{POLICY}/pin", headers=auth(OPERATOR), json={"theta": theta})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail[0]["loc"] == ["body", "theta", p.name] and p.name in detail[0]["msg"]
    r = one.http.post(
        f"/v1/policies/{POLICY}/pin",
        headers=auth(OPERATOR),
        json={"theta": {k: v for k, v in a_theta().items() if k != p.name}},
    )
    assert r.status_code == 422 and p.name in r.text
    r = one.http.post(
        f"/v1/policies/{POLICY}/pin",
        headers=auth(OPERATOR),
        json={"theta": a_theta(), "context": "not a label"},
    )
    assert r.status_code == 422 and "context" in r.text
    r = one.http.post(
        f"/v1/policies/{POLICY}/pin",
        headers=auth(OPERATOR),
        json={"theta": a_theta(), "context": "x/y->z/w@3"},
    )
    assert r.status_code == 404 and "no context" in r.text
    r = one.http.post(f"/v1/policies/{POLICY}/rollback", headers=auth(OPERATOR), json={})
    assert r.status_code == 422 and "exactly one" in r.text
    r = one.http.post(f"/v1/policies/{POLICY}/freeze", headers=auth(OPERATOR), json={})
    assert r.status_code == 409, r.text


def test_cli_pins_kills_and_unpins_what_the_replica_serves(
    one: Running, db_url: str, tmp_path
) -> None:
    from .test_cli import booster, one_line_error

    theta = a_theta()
    done = booster("override", "pin", POLICY, "--theta", json.dumps(theta), db=db_url, tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"policy": POLICY, "changed": 1}
    # A policy-wide pin: every context, planned or not, and the default θ.
    until(lambda: everywhere(one, SAT, theta), "policy pin served")
    assert SPEC.from_message(ask(one, "host-1").default_theta) == theta

    p = SPEC.params[0]
    bad = booster(
        "override", "pin", POLICY, "--theta", json.dumps({**theta, p.name: p.wide[1] + 1}),
        db=db_url, tmp=tmp_path,
    )  # fmt: skip
    assert p.name in one_line_error(bad)

    assert booster("override", "kill", POLICY, db=db_url, tmp=tmp_path).returncode == 0
    until(lambda: everywhere(one, SAT, SPEC.default()), "kill switch served")
    listed = booster("override", "list", POLICY, db=db_url, tmp=tmp_path)
    assert json.loads(listed.stdout)["kill_switch"] is True
    assert booster("override", "release", POLICY, db=db_url, tmp=tmp_path).returncode == 0
    until(lambda: everywhere(one, SAT, theta), "the pin again once released")
    assert booster("override", "unpin", POLICY, db=db_url, tmp=tmp_path).returncode == 0
    until(lambda: served(one, "host-1")[SAT][0] == SPEC.default(), "the default without plan")
    actions = [e["action"] for e in one.http.get("/v1/audit", headers=auth(OPERATOR)).json()]
    assert actions[:5] == [
        "override.unpin",
        "override.kill_release",
        "override.kill",
        "override.pin",
        "policy.create",
    ]
    ctx = booster("override", "freeze", POLICY, "--context", "x/y->z/w@1", db=db_url, tmp=tmp_path)
    assert "no context" in one_line_error(ctx)


def test_dashboard_pins_kills_and_unpins_seen_by_the_other_replica(db_url: str, browser) -> None:  # noqa: F811
    """In headless Chromium: the operator pins θ for a context, switches the kill switch on
    and off and unpins, from the dashboard of replica a; replica b answers each at the next
    GetParameters, and the audit log has the old and new θ."""
    from selenium.webdriver.support.ui import Select

    with (
        serve(db_url, replica_name="replica-a") as a,
        serve(db_url, replica_name="replica-b") as b,
    ):
        planned(a, b)
        page = Page(browser, base_url(a))
        page.sign_in(OPERATOR)
        page.status_contains("Signed in.")
        page.wait.until(lambda _: len(page.rows("plans")) == 2)
        Select(page.el("override-scope")).select_by_value(SAT)
        theta = a_theta()
        page.set_field("pin-theta", json.dumps(theta))
        page.el("pin").click()
        page.status_contains("Pinned")
        until(lambda: everywhere(b, SAT, theta), "pinned θ on replica b")
        page.wait.until(lambda _: [r[0] for r in page.rows("overrides")] == [SAT])

        Select(page.el("override-scope")).select_by_value("")
        page.el("kill").click()
        page.status_contains("Kill switch on")
        safe = SPEC.default()
        until(lambda: everywhere(b, SAT, safe) and everywhere(b, ETH, safe), "safe on replica b")
        assert "KILL SWITCH ON" in page.el("kill-state").text
        page.el("release").click()
        page.status_contains("Kill switch released")
        until(lambda: everywhere(b, SAT, theta), "the pin again on replica b")

        Select(page.el("override-scope")).select_by_value(SAT)
        page.el("unpin").click()
        page.status_contains("Unpinned")
        until(lambda: not everywhere(b, SAT, theta), "normal planning on replica b")
        change = audit(a, "override.pin")[0]["detail"]["changes"][0]
        assert change["new"] == theta and change["old"] is not None

        # The audit view shows old and new θ; a deep link reopens the same policy and context.
        page.el("refresh").click()

        def shown(text: str) -> object:
            """A scope's θ as the audit view shows it: '<context>: <JSON>'."""
            scope, _, value = text.partition(": ")
            return json.loads(value) if scope == SAT else None

        page.wait.until(
            lambda _: any(
                r[2] == "override.pin" and shown(r[5]) == theta for r in page.rows("audit")
            )
        )
        row = next(r for r in page.rows("audit") if r[2] == "override.pin")
        assert shown(row[4]) == change["old"]
        link = f"?policy={POLICY}&context={quote(ETH)}"
        page = Page(browser, base_url(b), link)  # another replica: sign in there
        page.sign_in(OPERATOR)
        page.wait.until(lambda _: page.el("context").get_attribute("value") == ETH)
        assert page.el("policy").get_attribute("value") == POLICY
        assert ETH in unquote(browser.current_url)


def test_policy_update_is_audited_with_old_and_new(one: Running) -> None:
    r = one.http.patch(f"/v1/policies/{POLICY}", headers=auth(OPERATOR), json={"sigma": 3})
    assert r.status_code == 200, r.text
    entry = audit(one, "policy.update")[0]
    assert entry["detail"]["sigma"] == 3 and entry["detail"]["old"] == {"sigma": 1.0}


def test_csv_exports_parse_and_match_the_json(one: Running) -> None:
    """Issue #35 item 3: trials and comparison as CSV, the same rows as the JSON answer."""
    import csv
    import io

    from gemini_booster.service.rest.csvout import flatten

    fleet = SyntheticFleet(one.grpc_target, AGENT, POLICY, hosts_per_context=2)
    try:
        fleet.run_round(0)
    finally:
        fleet.close()
    for path in ("trials", "comparison"):
        url = f"/v1/policies/{POLICY}/{path}"
        as_json = one.http.get(url, headers=auth(OPERATOR)).json()
        r = one.http.get(url, headers=auth(OPERATOR), params={"format": "csv"})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv"), r.text
        rows = list(csv.DictReader(io.StringIO(r.text)))
        if path == "trials":
            assert rows and len(rows) == len(as_json)
            expected = [flatten(t) for t in as_json]
        else:
            expected = [
                flatten({"row": kind, "label": c["label"], **item})
                for c in as_json
                for kind in ("arm", "versus")
                for item in c["arms" if kind == "arm" else "versus"]
            ]
        assert len(rows) == len(expected)
        for got, want in zip(rows, expected, strict=True):
            for k, v in want.items():
                if isinstance(v, float):
                    assert float(got[k]) == pytest.approx(v), k
                elif v is None:
                    assert got[k] == "", k
                else:
                    assert got[k] == str(v), k
    r = one.http.get(
        f"/v1/policies/{POLICY}/trials", headers=auth(OPERATOR), params={"format": "x"}
    )
    assert r.status_code == 422


def test_dashboard_creates_and_stops_an_experiment_with_its_verdict(one: Running, browser) -> None:  # noqa: F811
    """Issue #35 item 2 (part): declared from the dashboard by pasting the JSON definition,
    its overall verdict on the page, stopped from the dashboard, both audited."""
    from datetime import UTC, datetime, timedelta

    from .test_dashboard import Page, base_url

    hosts = {"eu": [f"eu-{i:02d}" for i in range(10)]}
    definition = {
        "name": "fusion-vs-cubic",
        "arms": [
            {"name": "control", "cc": "cubic"},
            {"name": "fusion", "cc": "fusion", "params": "fixed", "theta": SPEC.default()},
        ],
        "population": {"regions": hosts},
        "start": (datetime.now(UTC) - timedelta(days=1)).isoformat(),
        "end": (datetime.now(UTC) + timedelta(days=3)).isoformat(),
        "sigma": 1.0,
    }
    page = Page(browser, base_url(one))
    page.sign_in(OPERATOR)
    page.status_contains("Signed in.")
    page.el("experiment-create-box").click()
    page.el("experiment-json").send_keys(json.dumps(definition))
    page.el("experiment-create").click()
    assert "fusion-vs-cubic (running, 10 hosts)" in page.status_contains("Created experiment")
    page.wait.until(lambda _: page.el("experiment-verdict").text.startswith("Overall:"))
    assert "experiment=fusion-vs-cubic" in browser.current_url
    # A deep link reopens the experiment, and a σ preview (same tab: still signed in).
    page = Page(browser, base_url(one), f"?policy={POLICY}&experiment=fusion-vs-cubic&sigma=10")
    page.wait.until(lambda _: page.el("experiment").get_attribute("value") == "fusion-vs-cubic")
    page.wait.until(lambda _: page.el("comparison-sigma").text == "(at σ = 10, not saved)")
    assert page.el("experiment-verdict").text.startswith("Overall:")
    page.el("experiment-stop").click()
    page.status_contains("Stopped experiment")
    e = one.http.get("/v1/experiments/fusion-vs-cubic", headers=auth(OPERATOR)).json()
    assert e["status"] == "stopped", e
    actions = [a["action"] for a in one.http.get("/v1/audit", headers=auth(OPERATOR)).json()]
    assert actions[:2] == ["experiment.stop", "experiment.create"]


def test_the_openapi_experiment_example_works_when_pasted(one: Running) -> None:
    """Issue #35 item 2: the example body /docs shows for POST /v1/experiments is accepted."""
    doc = one.http.get("/openapi.json").json()
    content = doc["paths"]["/v1/experiments"]["post"]["requestBody"]["content"]
    examples = content["application/json"]["examples"]
    for example in examples.values():
        r = one.http.post("/v1/experiments", headers=auth(OPERATOR), json=example["value"])
        assert r.status_code == 201, r.text
        assert r.json()["hosts"] == 20
