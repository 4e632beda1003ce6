"""The web UI of a site with a token: the browser is asked for it once (a sign-in page),
keeps it in a cookie, and its pages and buttons work with it; without it nothing of the
API answers. Against an engine serving its own API (`engine.serve(token=)`)."""

from __future__ import annotations

from playwright.async_api import expect

import fusee
from tests.server_mode.flows import WORKFLOWS
from tests.support.http import Http

TOKEN = "ui-token-0123456789abcdef"


async def test_the_ui_asks_for_the_token_once(browser):
    async with await fusee.Engine.open(workflows=WORKFLOWS) as engine:
        served = await engine.serve("127.0.0.1:0", token=TOKEN)
        context = await browser.new_context()
        try:
            async with Http(served.url, token=TOKEN) as api:
                await api.ok("POST", "/v1/runs", {"type": "waiter", "id": "t-1", "input": 1})
                status, error = await api.request(
                    "GET", "/v1/info", headers={"Accept": "text/html"}, token=False
                )
                assert (status, error["code"]) == (401, "Rejected")  # JSON for an API call
                status, script = await api.request("GET", "/static/ui.js", token=False)
                assert status == 200 and "fusee-token" in script  # the UI's files need no token
                for climbing in ("/static/../v1/info", "/static/%2e%2e/v1/info", "/static//../v1/info"):
                    status, _ = await api.request("GET", climbing, token=False)
                    assert status in (401, 404), climbing
            page = await context.new_page()
            page.set_default_timeout(15_000)
            response = await page.goto(served.url + "/runs/t-1")
            assert response is not None and response.status == 401
            await expect(page.locator("h1")).to_have_text("Sign in")
            await page.fill("input[name=token]", "not-the-token-at-all")
            await page.click("#sign-in button")
            await expect(page.locator("#error")).to_contain_text("not one of this server's")
            await page.fill("input[name=token]", TOKEN)
            await page.click("#sign-in button")
            await expect(page.locator("#run-id")).to_have_text("t-1")  # the page asked for
            await page.fill("form[data-action=signal] input[name=name]", "go")
            await page.fill("form[data-action=signal] input[name=value]", "7")
            await page.click("text=Send signal")
            await expect(page.locator("#status")).to_have_text("ok")
            await expect(page.locator("#signals .by")).to_have_text("token")  # the worker token's kind
            await page.goto(served.url + "/")
            await expect(page.locator("#runs a.run-link")).to_have_text(["t-1"])
        finally:
            await context.close()
            await served.close()
