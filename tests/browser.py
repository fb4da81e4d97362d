"""Headless Chromium for the tests that open pages in a real browser (tests/test_report.py, tests/test_site.py)."""

import shutil

import pytest


def require_chromium() -> tuple[str, str]:
    """Chromium's and chromedriver's paths; skips the test, saying how to install them, where either is missing (a
    test that builds what the browser opens asks first, rather than build it for nothing)."""
    pytest.importorskip("selenium.webdriver")
    browser, driver = shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")
    if not browser or not driver:
        pytest.skip("Chromium and chromedriver are not installed (apt install chromium chromium-driver; .ci/run does)")
    return browser, driver


def chromium(offline: bool = False):
    """A headless Chromium that keeps the browser's console log; skips the test, saying how to install them, where
    Chromium or its driver is missing. `offline`: every host but this machine fails at once, rather than after the
    resolver's timeout (5 s a page for mkdocs-material's web fonts where there is no network)."""
    browser, driver = require_chromium()
    webdriver = pytest.importorskip("selenium.webdriver")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    flags = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,2000"]
    if offline:
        flags.append("--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1")
    for flag in flags:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    from selenium.webdriver.chrome.service import Service

    return webdriver.Chrome(options=options, service=Service(driver))
