"""The race page in a real browser: Debian's chromium + chromium-driver via selenium, headless,
on the real gunicorn. Nothing is downloaded: selenium gets the driver's path, so its Selenium
Manager never runs."""

from __future__ import annotations

import os
import re
import shutil

import pytest
import requests

from tests.helpers import wait_until
from tests.helpers.servers import KEY

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="needs Debian's chromium and chromium-driver (`make setup` installs them with apt-get as root)",
)

KEY_STORAGE = "batching-race.api-key"  # service/static/race/api.js
RACE = "/?n=4&engines=static,vllm&mode=concurrent&max_tokens=8&run=1"


@pytest.fixture(scope="module")
def server(shared_server):
    return shared_server  # tests/e2e/conftest.py: the session's gunicorn, both engines, API keys "other-key" and KEY


@pytest.fixture
def browser(monkeypatch):
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    monkeypatch.setenv("SE_OFFLINE", "true")  # belt and braces: Selenium Manager must not download
    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--window-size=1280,800", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    if os.geteuid() == 0:
        options.add_argument("--no-sandbox")  # chromium refuses to run its sandbox as root
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_window_size(1280, 800)
    yield driver
    driver.quit()


@pytest.fixture
def page(server, browser):
    """The browser with KEY already in the tab's sessionStorage, where the page keeps the key it
    asked for (api.js): for the tests of what the page does once it has one. How it asks is
    test_with_api_key_the_page_asks_once_and_sends_it_as_a_bearer_token's, which also checks that
    the page stores it under this name."""
    browser.get(server.url + "/health")  # same origin, so the same sessionStorage as the page's
    browser.execute_script("sessionStorage.setItem(arguments[0], arguments[1])", KEY_STORAGE, KEY)
    browser.get_log("browser")  # read, so emptied: what that JSON document logged is not the page's
    return browser


def state(driver) -> str:
    return driver.execute_script("return document.body.dataset.state")


def wait_for_state(driver, wanted: str, timeout: float = 300) -> None:
    wait_until(lambda: state(driver) == wanted, timeout, f'<body data-state="{wanted}">')


def console_errors(driver) -> list[dict]:
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def rows(driver, engine: str):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, f'section[data-engine="{engine}"] .row')


def test_a_race_on_load_finishes_with_rounds_and_steps(server, page, tmp_path):
    page.get(server.url + RACE)
    wait_for_state(page, "done")
    section = {
        name: page.execute_script(f"return {{...document.querySelector('section[data-engine={name}]').dataset}}")
        for name in ("static", "vllm")
    }
    assert section["static"]["done"] == "4" and section["vllm"]["done"] == "4", section
    assert section["static"]["errors"] == "0" and section["vllm"]["errors"] == "0"
    static_rows, vllm_rows = rows(page, "static"), rows(page, "vllm")
    assert [r.get_attribute("data-state") for r in static_rows + vllm_rows] == ["done"] * 8
    rounds = {int(r.get_attribute("data-round")) for r in static_rows}
    steps = {int(r.get_attribute("data-step")) for r in vllm_rows}
    assert int(section["static"]["rounds"]) == len(rounds) >= 1
    assert int(section["vllm"]["steps"]) == len(steps) >= 1
    assert all(r.get_attribute("data-step") is None for r in static_rows)
    assert "sooner" in page.find_element("id", "verdict").text
    # the same race is in the address bar, so the URL reproduces it
    assert "n=4" in page.current_url and "engines=static%2Cvllm" in page.current_url
    assert console_errors(page) == []
    shot = tmp_path / "race.png"
    assert page.save_screenshot(str(shot)) and shot.stat().st_size > 10_000


def test_the_idle_page_asks_only_for_health_and_at_most_every_two_seconds(server, page):
    page.get(server.url + "/?n=1&engines=vllm&max_tokens=2&run=1")
    wait_for_state(page, "done")
    done_at = page.execute_script("return performance.now()")

    def health_calls() -> list[float]:
        entries = page.execute_script("return performance.getEntriesByType('resource').map(e => [e.name, e.startTime])")
        after = [(name, start) for name, start in entries if start > done_at]
        assert all(name.endswith("/health") for name, _ in after), after  # nothing else while idle
        return [start for _, start in after]

    wait_until(lambda: len(health_calls()) >= 3, 30, "three /health polls")
    starts = health_calls()
    # the next poll is scheduled 2 s after the previous answer, so starts are >= 2 s apart
    assert min(b - a for a, b in zip(starts, starts[1:], strict=False)) >= 2000
    assert console_errors(page) == []


def test_the_controls_are_reachable_by_keyboard_and_run_a_race(server, page):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    page.get(server.url + "/")
    assert state(page) == "idle"
    page.find_element(By.NAME, "prompts").click()
    for _ in range(30):  # tab from the prompts to the Run button
        page.switch_to.active_element.send_keys(Keys.TAB)
        if page.switch_to.active_element.get_attribute("id") == "run":
            break
    else:
        pytest.fail("Tab never reached the Run button")
    page.find_element(By.NAME, "max_tokens").clear()
    page.find_element(By.NAME, "max_tokens").send_keys("2")
    page.find_element(By.ID, "run").send_keys(Keys.ENTER)
    wait_for_state(page, "done")
    assert [r.get_attribute("data-state") for r in rows(page, "static")] == ["done"] * 4
    assert "max_tokens=2" in page.current_url


def static_tokens(server) -> float:
    """Tokens the static engine generated so far (no sample yet on a fresh server: 0)."""
    text = requests.get(f"{server.url}/metrics", timeout=30).text
    found = re.search(r'^generated_tokens_total\{engine="static"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def static_idle(server) -> bool:
    engine = server.engine("static")
    return engine.get("inflight") == 0 and engine.get("queued") == 0


def test_stop_ends_the_race_and_the_service_drops_its_prompts(server, page):
    from selenium.webdriver.common.by import By

    # what earlier tests on the shared server left running must not count as this race's tokens
    wait_until(lambda: static_idle(server), 300, "the static engine idle before the race")
    before = static_tokens(server)
    page.get(server.url + "/?n=8&engines=static&max_tokens=500&ignore_eos=1&run=1")
    wait_until(
        lambda: page.execute_script("return document.querySelectorAll('[data-engine=static] .track b').length") > 0,
        120,
        "a first token",
    )
    page.find_element(By.ID, "stop").click()
    wait_for_state(page, "done", 60)
    assert "stopped" in page.find_element(By.ID, "verdict").text
    wait_until(lambda: static_idle(server), 300, "the service to drop the race's prompts")
    # both rounds were cut short: the running one at its next step, the waiting one as it began
    assert static_tokens(server) - before < 8 * 500 / 2


def test_with_api_key_the_page_asks_once_and_sends_it_as_a_bearer_token(server, browser):
    from selenium.webdriver.common.by import By

    probe = requests.post(f"{server.url}/generate", json={"prompts": ["Hi"], "max_tokens": 1}, timeout=60)
    assert probe.status_code == 401  # the service enforces the key; the page must ask for it
    browser.get(server.url + "/?n=2&engines=static&max_tokens=2&run=1")
    wait_until(
        lambda: browser.find_element(By.ID, "key-dialog").get_attribute("open") is not None, 60, "the key dialog"
    )
    browser.find_element(By.ID, "key-input").send_keys(KEY)
    browser.find_element(By.CSS_SELECTOR, '#key-dialog button[value="ok"]').click()
    wait_for_state(browser, "done")
    assert [r.get_attribute("data-state") for r in rows(browser, "static")] == ["done"] * 2
    # kept where the `page` fixture puts it for the other tests
    assert browser.execute_script("return {...sessionStorage}") == {KEY_STORAGE: KEY}
    browser.get(server.url + "/?n=1&engines=static&max_tokens=2&run=1")  # same tab: no second ask
    wait_for_state(browser, "done")
    assert browser.find_element(By.ID, "key-dialog").get_attribute("open") is None
    assert [r.get_attribute("data-state") for r in rows(browser, "static")] == ["done"]


def test_without_an_api_key_the_page_never_asks_for_one(static_server, browser):
    """On the static-only gunicorn (tests/e2e/conftest.py), which sets no API_KEY."""
    from selenium.webdriver.common.by import By

    probe = requests.post(f"{static_server.url}/generate", json={"prompts": ["Hi"], "max_tokens": 1}, timeout=60)
    assert probe.status_code == 200  # the service asks for no key
    browser.get(static_server.url + "/?n=2&engines=static&max_tokens=2&run=1")
    wait_for_state(browser, "done", 120)  # a dialog would hold the race: it never gets here
    assert [r.get_attribute("data-state") for r in rows(browser, "static")] == ["done"] * 2
    assert browser.find_element(By.ID, "key-dialog").get_attribute("open") is None
    assert browser.execute_script("return sessionStorage.length") == 0
    assert console_errors(browser) == []
