"""The dashboard in a real headless Chromium (Debian's ``chromium`` and ``chromium-driver``,
driven by selenium) on a real worker: it asks for the token, shows the budget groups and the
amounts the API returns, the alerts, the refused input and the waste by fault type, logs no
error to the console, and shows new spend without a reload."""

from __future__ import annotations

import secrets
import shutil
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from costline.rules.money import money
from tests.conftest import forget_redis_keys, unavailable
from tests.integration.opendata import TOKEN, Site, open_site

pytestmark = pytest.mark.integration

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1366,900")


@pytest.fixture(scope="module")
def site(services: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    namespace = "t" + secrets.token_hex(5)
    yield from open_site(services, namespace, tmp_path_factory.mktemp("dashboard"))
    forget_redis_keys(services.redis_url, namespace)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        unavailable("selenium", "not installed (pip install -e '.[dev]')")
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_binary = shutil.which("chromedriver")
    if binary is None or driver_binary is None:
        unavailable("Chromium", "chromium and chromedriver are needed (Debian: apt-get install "
                    "chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'profile'}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_binary), options=options)
    try:
        yield driver
    finally:
        driver.quit()


# The page re-renders on every poll, so an element found by one WebDriver call may be gone by
# the next; each reading of the page is therefore one script, which sees one rendering whole.
SNAPSHOT = """
const text = (node) => node.textContent.trim();
const all = (selector) => Array.from(document.querySelectorAll(selector));
return {
  budgets: Object.fromEntries(all("#budgets .budget").map(
    (card) => [card.dataset.group, text(card.querySelector(".spent"))])),
  rules: all("#budgets .budget").map((card) => card.dataset.rule),
  lines: all("#budgets svg polyline").length,
  refused: Object.fromEntries(all("#refused tr[data-code]").map(
    (row) => [row.dataset.code, text(row)])),
  waste: Object.fromEntries(all("#waste .fault").map(
    (group) => [group.dataset.fault, text(group.querySelector(".amount"))])),
  alerts: all("#alerts tbody tr[data-rule]").length,
  polls: Number(document.getElementById("status").dataset.polls || 0),
};
"""


def page(driver: Any) -> dict[str, Any]:
    snapshot: dict[str, Any] = driver.execute_script(SNAPSHOT)
    return snapshot


def shown_budgets(driver: Any) -> dict[str, str]:
    budgets: dict[str, str] = page(driver)["budgets"]
    return budgets


def api_budgets(site: Site) -> dict[str, str]:
    document = site.api("/api/v1/budgets")
    return {", ".join(f"{k}={v}" for k, v in row["group"].items()):
            money(Decimal(row["spent"]), document["currency"]) for row in document["budgets"]}


def polls(driver: Any) -> int:
    return int(page(driver)["polls"])


def test_the_dashboard_shows_what_the_api_returns_and_follows_it(site: Site, browser: Any
                                                                   ) -> None:
    from selenium.webdriver.common.by import By

    usage, faults = site.events(160, seed=2)
    site.send(usage, faults)
    site.send([{**usage[0], "event_id": "refused-1", "resource_type": "gpu.b300"}],
              counted=False)
    browser.get(site.url + "/")
    # The page holds no data: it asks for the token, and then reads the API with it.
    site.wait_for("the token form", lambda: browser.find_element(By.ID, "login").is_displayed())
    browser.find_element(By.ID, "token").send_keys(TOKEN)
    browser.find_element(By.CSS_SELECTOR, "#login button").click()
    site.wait_for("a first update", lambda: polls(browser) >= 1)

    expected = api_budgets(site)
    shown = page(browser)
    assert expected and shown["budgets"] == expected
    assert set(shown["rules"]) == {"prod-monthly"}
    assert shown["lines"] == len(expected)
    assert "gpu.b300" in shown["refused"]["unknown_resource_type"]
    waste = site.api("/api/v1/spend?by=fault")
    assert shown["waste"] == {row["group"]["fault"]: money(Decimal(row["waste"]), "USD")
                              for row in waste["rows"] if row["group"]["fault"]}
    assert shown["alerts"] == len(site.api("/api/v1/alerts")["alerts"])

    # New spend for one team: the page shows the API's new figure without a reload.
    before = expected
    more = [{**event, "event_id": f"late-{i}", "ts": time.time() - 60,
             "tags": {**event["tags"], "env": "prod", "team": "eval"}}
            for i, event in enumerate(usage[:20])]
    site.send(more)
    after = site.wait_for("the API's new figure", lambda: (
        found := api_budgets(site)) != before and found)
    site.wait_for("the page's new figure", lambda: shown_budgets(browser) == after, 20)

    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == []
    browser.save_screenshot(str(site.folder / "dashboard.png"))
