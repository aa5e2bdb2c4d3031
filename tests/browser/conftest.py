"""A real headless Chromium (Debian's `chromium` + `chromium-driver`) driven by Selenium.

Every test in this directory is skipped, with the reason, when the browser, its driver or
selenium is missing; `scripts/test.sh` installs them with apt where it can, so CI runs them.
Chromium starts with a fresh profile and without background networking (this machine has no
internet, and nothing but the page under test should make requests). Selenium is given both
paths, so it never tries to download a browser or driver."""
from __future__ import annotations

import os
import shutil
import tempfile

import pytest

BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome")
DRIVER_PATHS = ("chromedriver", "/usr/lib/chromium/chromedriver")
WINDOW = (1500, 1180)


def find_browser() -> tuple[str | None, str | None, str]:
    """(chromium path, chromedriver path, why not) — why not is "" when both are there."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return None, None, "selenium is not installed (pip install -e '.[dev]')"
    browser = next((p for p in map(shutil.which, BROWSER_NAMES) if p), None)
    driver = next((p for p in map(shutil.which, DRIVER_PATHS) if p), None)
    missing = [name for name, p in (("chromium", browser), ("chromedriver", driver)) if p is None]
    if missing:
        return browser, driver, f"{' and '.join(missing)} not found (apt-get install chromium chromium-driver)"
    return browser, driver, ""


def pytest_collection_modifyitems(config, items):
    _, _, why = find_browser()
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.browser)
            if why:
                item.add_marker(pytest.mark.skip(reason=f"browser tests need a real Chromium: {why}"))


@pytest.fixture(scope="module")
def driver():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    browser, chromedriver, why = find_browser()
    assert not why, why
    profile = tempfile.mkdtemp(prefix="replog-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                f"--user-data-dir={profile}", f"--window-size={WINDOW[0]},{WINDOW[1]}"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(options=opts, service=Service(chromedriver))
    try:
        yield d
    finally:
        d.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(autouse=True)
def no_script_errors(request):
    """After every browser test: the page threw nothing (network errors of a killed node are fine)."""
    yield
    if "driver" not in request.fixturenames:
        return
    d = request.getfixturevalue("driver")
    errors = [e for e in d.get_log("browser") if e.get("source") == "javascript" or "Uncaught" in e.get("message", "")]
    assert not errors, f"the page threw: {errors}"
