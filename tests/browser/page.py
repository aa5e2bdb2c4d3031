"""Reading the dashboard from a test: waits on DOM conditions with a deadline (never sleeps),
and the id / lsn cells by their data attributes (uuids)."""
from __future__ import annotations

from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.support.ui import WebDriverWait


def until(driver, cond, timeout: float, what: str):
    """WebDriverWait that says what it waited for, and the browser's console, when it times out."""
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.1,
                             ignored_exceptions=(StaleElementReferenceException,)).until(lambda d: cond(d))
    except TimeoutException:
        logs = "\n".join(str(x) for x in driver.get_log("browser"))
        raise AssertionError(f"timed out after {timeout}s waiting for {what}\n--- browser console ---\n{logs}") from None


def cells(driver, kind: str) -> dict:
    """(row uuid, node uuid) -> (text, classes, data) of every id or lsn cell, read in one script."""
    attr = "member" if kind == "id" else "origin"
    rows = driver.execute_script(f"""
        return [...document.querySelectorAll('td.{kind}[data-{attr}]')].map(td =>
            [td.dataset.{attr}, td.dataset.node, td.textContent, td.className, td.dataset.{kind} || td.dataset.lsn || ""]);""")
    return {(r, n): (text, cls.split(), data) for r, n, text, cls, data in rows}
