"""The dashboard on a cluster that expelled a member: its row in the id and vclock matrices is
greyed and marked "expelled" on every node's account, and the page does not read it (issue 21:
"expelled members greyed")."""
from __future__ import annotations

import pytest

pytest.importorskip("selenium", reason="browser tests need selenium (pip install -e '.[dev]')")
from selenium.webdriver.common.by import By  # noqa: E402

from tests.browser.page import until  # noqa: E402
from tests.integration.conftest import procs  # noqa: E402,F401 (every started process is killed after the test)
from tests.integration.harness import ReplogProcess, mesh, wait_for  # noqa: E402


def test_an_expelled_member_is_greyed_and_marked_in_both_matrices(driver, tmp_path, procs):
    a, b = mesh(tmp_path, 2)
    procs.extend([a, b])
    c = ReplogProcess(tmp_path, "c", peers=[a])
    procs.append(c)
    c.start()
    cu = c.uuid()
    wait_for(lambda: cu in b.cluster(), 30, "B learns C")
    c.kill9()
    s, d = a.delete(f"/v1/cluster/{cu}")
    assert s == 200 and d["state"] == "expelled", d
    wait_for(lambda: b.cluster()[cu]["state"] == "expelled", 30, "B learns the expel")
    driver.get(a.url + "/ui")
    until(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, 'article.card[data-state="up"]')) == 2, 20,
          "A and B read")
    for table in ("ids", "vclocks"):
        # read in one script from a row found then: the page redraws its tables as it polls, and
        # an element found in one call may be gone by the next
        sel = f'#{table} tr[data-member="{cu}"], #{table} tr[data-origin="{cu}"]'
        classes, opacity = until(driver, lambda d: d.execute_script(
            "const r = document.querySelector(arguments[0]);"
            "return r ? [r.className, getComputedStyle(r.cells[0]).opacity] : null;", sel), 20,
            f"C's row in #{table}")
        assert "expelled" in classes.split(), (table, classes)
        assert float(opacity) < 1, (table, opacity)
    badge = until(driver, lambda d: d.execute_script(
        "const b = document.querySelector(arguments[0]); return b ? b.textContent : null;",
        f'#ids tr[data-member="{cu}"] .badge.expelled'), 20, "C's badge")
    assert badge.strip() == "expelled", badge
    assert not driver.find_elements(By.CSS_SELECTOR, f'article.card[data-node="{cu}"]'), "the page read C"
