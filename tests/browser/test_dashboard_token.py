"""The dashboard on a cluster with a client token: the page asks for it, sends it as a header
on every stream (to its own node and, cross-origin with a preflight, to the other member),
and takes it from the URL fragment without leaving it in the address bar."""
from __future__ import annotations

import pytest

pytest.importorskip("selenium", reason="browser tests need selenium (pip install -e '.[dev]')")
from selenium.webdriver.common.by import By  # noqa: E402

from tests.browser.page import until  # noqa: E402
from tests.integration.harness import mesh  # noqa: E402

TOKEN = "dash-token"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dashboard-token")
    token_file = tmp / "token"
    token_file.write_text(TOKEN)
    nodes = mesh(tmp, 2, extra=["--token-file", str(token_file)])
    try:
        for n in nodes:
            n.token = TOKEN
        yield nodes
    finally:
        for n in nodes:
            n.kill9()


def nodes_up(driver) -> int:
    return len(driver.find_elements(By.CSS_SELECTOR, 'article.card[data-state="up"]'))


def test_without_a_token_the_page_asks_for_it_then_reads_every_member(driver, pair):
    a, b = pair
    driver.get(a.url + "/ui")
    form = until(driver, lambda d: d.find_element(By.ID, "token-form").is_displayed() and d.find_element(By.ID, "token-form"),
                 15, "the token form")
    assert nodes_up(driver) == 0
    form.find_element(By.NAME, "token").send_keys(TOKEN)
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    until(driver, lambda d: nodes_up(d) == 2, 20, "both members read with the token (B cross-origin)")
    assert not driver.find_element(By.ID, "token-form").is_displayed()
    assert driver.execute_script("return sessionStorage.getItem('replog.token')") == TOKEN


def test_a_token_in_the_fragment_is_used_and_taken_out_of_the_address_bar(driver, pair):
    a, b = pair
    driver.get(b.url + f"/ui#token={TOKEN}")       # another origin: a fresh sessionStorage
    until(driver, lambda d: nodes_up(d) == 2, 20, "both members read with the fragment's token")
    assert driver.execute_script("return location.hash") == ""
    assert TOKEN not in driver.current_url
    assert not driver.find_element(By.ID, "token-form").is_displayed()
