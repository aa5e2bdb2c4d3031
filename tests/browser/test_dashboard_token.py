"""The dashboard on a cluster with a client token: the page asks for it and sends it as a header
to the node that served it; another member gets it (cross-origin, with a preflight) only once
the user asked for that on the member's card, which names its address. Member addresses are
learned from the cluster, and anyone holding the cluster secret can register a member at an
address it listens on: such a listener must never see the token. The token is also taken from
the URL fragment without leaving it in the address bar."""
from __future__ import annotations

import uuid

import pytest

pytest.importorskip("selenium", reason="browser tests need selenium (pip install -e '.[dev]')")
from aiohttp import web  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

from tests.adversary.attacker import register_member  # noqa: E402
from tests.browser.page import until  # noqa: E402
from tests.integration.fakepeer import FakePeer, running  # noqa: E402
from tests.integration.harness import PortReservation, mesh  # noqa: E402

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


def up(driver, node) -> bool:
    return bool(driver.find_elements(By.CSS_SELECTOR, f'article.card[data-address="{node.address}"][data-state="up"]'))


def _share_buttons(driver, node) -> list:
    return driver.find_elements(By.CSS_SELECTOR, f'article.card[data-address="{node.address}"] button.share-token')


def share_button_text(driver, node) -> str:
    """The text of the button on `node`'s card that sends it the token, once the card offers it."""
    return until(driver, lambda d: (b := _share_buttons(d, node)) and b[0].text, 20,
                 f"{node.address}'s card to offer the token")


def click_share(driver, node) -> None:
    """Click it (the cards are rebuilt with every snapshot: a stale button is looked up again)."""
    until(driver, lambda d: (b := _share_buttons(d, node)) and (b[0].click() or True), 20,
          f"a click on {node.address}'s token button")


def test_without_a_token_the_page_asks_for_it_and_sends_it_to_another_member_when_asked(driver, pair):
    a, b = pair
    driver.get(a.url + "/ui")
    form = until(driver, lambda d: d.find_element(By.ID, "token-form").is_displayed() and d.find_element(By.ID, "token-form"),
                 15, "the token form")
    assert nodes_up(driver) == 0
    form.find_element(By.NAME, "token").send_keys(TOKEN)
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    until(driver, lambda d: nodes_up(d) == 1, 20, "A read with the token")
    text = share_button_text(driver, b)             # B answered 401: the token was not sent to it
    assert b.address in text and nodes_up(driver) == 1
    click_share(driver, b)
    until(driver, lambda d: nodes_up(d) == 2, 20, "B read with the token once asked (cross-origin)")
    assert not driver.find_element(By.ID, "token-form").is_displayed()
    assert driver.execute_script("return sessionStorage.getItem('replog.token')") == TOKEN


def test_a_token_in_the_fragment_is_used_and_taken_out_of_the_address_bar(driver, pair):
    a, b = pair
    driver.get(b.url + f"/ui#token={TOKEN}")       # another origin: a fresh sessionStorage
    until(driver, lambda d: nodes_up(d) == 1, 20, "B read with the fragment's token")
    assert driver.execute_script("return location.hash") == ""
    assert TOKEN not in driver.current_url
    assert not driver.find_element(By.ID, "token-form").is_displayed()
    click_share(driver, a)
    until(driver, lambda d: nodes_up(d) == 2, 20, "A read with the token once asked")


class Listener:
    """What a secret holder registers as a member's address (this cluster runs without a
    secret): answers CORS for any page and 401 for the stream, inviting a token, and records
    every Authorization header it gets (tests/adversary/attacker.py's Listener answers no CORS,
    so a browser would not even try)."""

    def __init__(self) -> None:
        self._reservation = PortReservation(client_port=False)   # held until stop(): no test's node takes it
        self.port = self._reservation.port
        self.address = f"127.0.0.1:{self.port}"
        self.requests: list[tuple[str, str | None]] = []
        self.runner: web.AppRunner | None = None

    async def start(self) -> None:
        async def any_request(request: web.Request) -> web.Response:
            self.requests.append((request.method, request.headers.get("Authorization")))
            cors = {"Access-Control-Allow-Origin": request.headers.get("Origin", "*"),
                    "Access-Control-Allow-Headers": "Authorization", "Access-Control-Allow-Methods": "GET"}
            if request.method == "OPTIONS":
                return web.Response(status=204, headers=cors)
            return web.json_response({"error": {"code": "unauthorized", "message": "token please"}}, status=401,
                                     headers=cors)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", any_request)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        await self.runner.cleanup()
        self._reservation.close()

    def tokens(self) -> list[str]:
        return [auth for _, auth in self.requests if auth]


def test_a_member_registered_at_a_listeners_address_never_gets_the_token_unless_the_user_sends_it(driver, pair):
    a, b = pair
    listener = Listener()
    with running(FakePeer(b"")) as (_, thread):               # a loop in a thread for the listener
        thread.call(listener.start())
        try:
            thread.call(register_member(a.address, b"", str(uuid.uuid4()), listener.address))
            driver.get(a.url + f"/ui#token={TOKEN}")
            until(driver, lambda d: up(d, a), 20, "A read with the token")
            until(driver, lambda d: any(method == "GET" for method, _ in listener.requests), 20,
                  "the page to find the registered member and open its stream")
            assert listener.tokens() == [], listener.requests      # ... without the token
            share_button_text(driver, listener)             # it answered 401: the card offers to send it
            assert listener.tokens() == [], listener.requests
            click_share(driver, listener)                   # the user's own choice: now it goes there
            until(driver, lambda d: listener.tokens(), 15, "the token sent where the user asked")
            assert listener.tokens()[0] == f"Bearer {TOKEN}"
        finally:
            thread.call(listener.stop())
