"""The operator dashboard in a real browser (Debian's headless Chromium through Selenium) against
a real Booster (REST, gRPC, PostgreSQL): it shows the plans and the A/B comparison, previews σ
without saving it, saves σ with an operator token, and names what is wrong when a change is
refused. Skips where Chromium is not installed (scripts/install-browser.sh)."""

from __future__ import annotations

import shutil

import httpx
import pytest

from gemini_api.theta import load_spec
from gemini_booster.models import PolicyCreate
from gemini_booster.storage import policies as policy_store

from .conftest import OPERATOR, auth
from .test_baselines import POLICY, aggregate, send

SPEC = load_spec()
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
# Flags for a closed network: no background connections Chromium would retry at every start,
# and no origin but loopback reachable (a dead proxy for everything else, which Chromium never
# uses for loopback, and no name resolves), so the dashboard is shown to work offline.
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--proxy-server=http://127.0.0.1:9",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
)
WAIT_S = 20


@pytest.fixture
def browser(tmp_path):
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("needs chromium and chromedriver (scripts/install-browser.sh)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def ab(booster):
    """A policy with a tuned and a default Fusion θ and cubic flows in one context, planned."""
    policy_store.create_policy(booster.engine, PolicyCreate(name=POLICY, sigma=0.5), actor="test")
    booster.booster.reload_policies()
    tuned = SPEC.default() | {"mult_decrease": 70}
    send(
        booster,
        [
            aggregate([20, 30, 26], 10, theta=tuned),
            aggregate([10, 14], 5),
            aggregate([10, 10, 16], 30, "cubic"),
        ],
    )
    booster.booster.refit(booster.booster.policies[POLICY])
    return booster


class Page:
    """The dashboard as an operator sees it: by element ids, waiting for the API's answers."""

    def __init__(self, driver, base: str, query: str = ""):
        from selenium.common.exceptions import StaleElementReferenceException
        from selenium.webdriver.support.ui import WebDriverWait

        # A condition that read an element the page re-rendered meanwhile is asked again.
        self.driver = driver
        self.wait = WebDriverWait(
            driver, WAIT_S, ignored_exceptions=(StaleElementReferenceException,)
        )
        driver.get(f"{base}/dashboard/{query}")

    def el(self, element_id: str):
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.ID, element_id)

    def status_contains(self, text: str) -> str:
        self.wait.until(lambda d: text in self.el("status").text)
        return self.el("status").text

    def sign_in(self, token: str) -> None:
        self.el("token").send_keys(token)
        self.el("sign-in").submit()

    def rows(self, table: str) -> list[list[str]]:
        """The table's body cells, read in one script call: an auto-refresh that re-renders
        the table between reading a row and its cells cannot leave a stale element."""
        return self.driver.execute_script(
            "const body = document.getElementById(arguments[0]).tBodies[0];"
            "return body ? Array.from(body.rows, r => Array.from(r.cells,"
            " c => c.innerText.replace(/[ \\t]+/g, ' ').trim())) : [];",
            table,
        )

    def set_field(self, element_id: str, value: str) -> None:
        field = self.el(element_id)
        field.clear()
        field.send_keys(value)


def base_url(svc) -> str:
    return str(svc.http.base_url).rstrip("/")


def test_operator_sees_plans_and_comparison_previews_and_saves_sigma(ab, browser):
    page = Page(browser, base_url(ab))
    page.sign_in(OPERATOR)
    page.status_contains("Signed in.")
    page.wait.until(lambda _: page.rows("plans") and page.rows("comparison"))
    [plan] = page.rows("plans")
    # The tuned θ (λ 0.7, the rest at the spec's defaults) is the incumbent.
    loss = f"l {SPEC.natural(SPEC.default())['loss_threshold']:g} %"
    assert "λ 0.7," in plan[1] and loss in plan[1], plan
    arms = {row[1]: row for row in page.rows("comparison")}
    assert set(arms) == {"fusion", "incumbent", "cubic"}, arms
    assert arms["cubic"][2] == "3"
    assert "fusion − cubic" in [row[1] for row in page.rows("versus")]

    page.set_field("sigma", "10")
    page.el("preview").click()
    page.status_contains("the policy is unchanged")
    expected = httpx.get(
        f"{base_url(ab)}/v1/policies/{POLICY}/comparison?sigma=10", headers=auth(OPERATOR)
    ).json()
    cubic = next(a for a in expected[0]["arms"] if a["arm"] == "cubic")
    arms = {row[1]: row for row in page.rows("comparison")}
    assert arms["cubic"][3] == f"{cubic['utility']:.2f} ± {cubic['utility_stderr']:.2f}"
    assert page.el("comparison-sigma").text == "(at σ = 10, not saved)"
    assert page.el("rounds-sigma").text.startswith("(σ = 10,")  # the utility chart too
    assert ab.booster.policies[POLICY].sigma == 0.5

    page.set_field("sigma", "2")
    page.el("save").click()
    assert "σ = 2" in page.status_contains("Saved:")
    assert ab.booster.policies[POLICY].sigma == 2
    audit = ab.http.get("/v1/audit", headers=auth(OPERATOR)).json()
    assert (audit[0]["action"], audit[0]["actor"]) == ("policy.update", "bootstrap-operator")


def test_refused_changes_are_named_and_change_nothing(ab, browser):
    viewer = ab.http.post(
        "/v1/tokens", json={"name": "ro", "role": "viewer"}, headers=auth(OPERATOR)
    ).json()["token"]
    page = Page(browser, base_url(ab))
    page.sign_in("forged")
    assert page.status_contains("401") == "401: unknown or revoked token"

    page.sign_in(viewer)
    page.status_contains("Signed in.")
    page.set_field("sigma", "3")
    page.el("save").click()
    assert page.status_contains("403") == "403: token 'ro' (role viewer) may not write"

    page.el("sign-out").click()
    page.sign_in(OPERATOR)
    page.status_contains("Signed in.")
    page.set_field("sigma", "-1")
    page.el("save").click()
    assert "sigma: Input should be greater than or equal to 0" in page.status_contains("sigma:")
    assert ab.booster.policies[POLICY].sigma == 0.5
    audit = ab.http.get("/v1/audit", headers=auth(OPERATOR)).json()
    assert "policy.update" not in [a["action"] for a in audit], audit


def test_dashboard_is_served_with_a_strict_content_policy(booster):
    r = booster.http.get("/dashboard/")
    assert r.status_code == 200 and "Gemini Booster" in r.text
    assert r.headers["content-security-policy"].startswith("default-src 'self'")
    assert r.headers["x-content-type-options"] == "nosniff"
    assert booster.http.get("/").headers.get("location") == "/dashboard/"
